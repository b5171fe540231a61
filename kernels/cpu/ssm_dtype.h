#pragma once
// Element types of the SSM ops (shared by the CPU and CUDA backends): x, dt, B, C, y in
// io_dtype and the states in state_dtype, each f32 or bf16. Anything else is rejected before
// any memory is touched.
#include "hyserve/common/dtype.h"
#include "hyserve/kernels/ssm.h"
#include "validate.h"

namespace hyserve::kernels::cpu_detail {

inline bool ssm_dtype_supported(dtype t) { return t == dtype::kF32 || t == dtype::kBF16; }

inline void require_ssm_dtypes(const ssm_common_params& p, const char* op) {
  if (!ssm_dtype_supported(p.io_dtype)) fail(op, "io_dtype", dtype_name(p.io_dtype), "supported: f32, bf16");
  if (!ssm_dtype_supported(p.state_dtype)) fail(op, "state_dtype", dtype_name(p.state_dtype), "supported: f32, bf16");
}

}  // namespace hyserve::kernels::cpu_detail
