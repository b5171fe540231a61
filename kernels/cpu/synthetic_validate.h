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
  require_counts(op, {{p.width, "width"}, {p.offset, "offset"}});
  if (p.outer > 1) {
    require_strides(p.width, op, {{p.stride, "stride"}, {p.out_stride, "out_stride"}});
  }
}

}  // namespace hyserve::kernels::cpu_detail
