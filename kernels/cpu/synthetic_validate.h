#pragma once
// Parameter checks of synthetic_fill, shared by the CPU and CUDA entry points.
#include "dtype_dispatch.h"
#include "hyserve/kernels/synthetic.h"
#include "validate.h"

namespace hyserve::kernels::cpu_detail {

inline void validate_synthetic_fill(const synthetic_fill_params& p) {
  constexpr const char* op = "synthetic_fill";
  require_ptr(p.out, op, "out");
  require_storage(p.out_dtype, op, "out_dtype");
  require_positive(p.outer, op, "outer");
  require_non_negative(p.width, op, "width");
  require_non_negative(p.offset, op, "offset");
  if (p.outer > 1) {
    require_stride(p.stride, p.width, op, "stride");
    require_stride(p.out_stride, p.width, op, "out_stride");
  }
}

}  // namespace hyserve::kernels::cpu_detail
