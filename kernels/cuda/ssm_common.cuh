#pragma once
// Pieces shared by the SSD chunk scan and the decode state update.
#include <string>

#include "../cpu/ssm_dtype.h"
#include "common.cuh"
#include "hyserve/kernels/ssm.h"

namespace hyserve::kernels::cuda_detail {

// Same threshold as torch.nn.functional.softplus (and the CPU op).
__device__ __forceinline__ float softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

// Step size of head h from the raw projection output: bias, softplus, clamp to the limits.
__device__ __forceinline__ float step_size(const ssm_common_params& p, float raw, int64_t h) {
  float v = raw + (p.dt_bias != nullptr ? p.dt_bias[h] : 0.0f);
  if (p.dt_softplus) v = softplus(v);
  return fminf(fmaxf(v, p.dt_min), p.dt_max);
}

// The CPU op's checks of the host-visible fields; state_indices (device memory) are not read:
// a slot < 0 is a padding row.
inline void check_ssm_common(const ssm_common_params& p, const char* op) {
  cpu_detail::require_ssm_dtypes(p, op);
  if (p.io_dtype != dtype::kF32) fail(op, "io_dtype", dtype_name(p.io_dtype), "the CUDA kernels take f32");
  if (p.state_dtype != dtype::kF32) fail(op, "state_dtype", dtype_name(p.state_dtype), "the CUDA kernels take f32");
  require_ptr(p.x, op, "x");
  require_ptr(p.dt, op, "dt");
  require_ptr(p.A_log, op, "A_log");
  require_ptr(p.B, op, "B");
  require_ptr(p.C, op, "C");
  require_ptr(p.y, op, "y");
  require_ptr(p.ssm_states, op, "ssm_states");
  require_ptr(p.state_indices, op, "state_indices");
  require_positive(p.batch, op, "batch");
  require_positive(p.heads, op, "heads");
  require_positive(p.head_dim, op, "head_dim");
  require_positive(p.d_state, op, "d_state");
  require_positive(p.n_groups, op, "n_groups");
  if (p.heads % p.n_groups != 0) {
    fail(op, "n_groups", p.n_groups, ("must divide heads = " + std::to_string(p.heads)).c_str());
  }
  require_stride(p.x_stride, p.heads * p.head_dim, op, "x_stride");
  require_stride(p.dt_stride, p.heads, op, "dt_stride");
  require_stride(p.bc_stride, p.n_groups * p.d_state, op, "bc_stride");
  require_stride(p.y_stride, p.heads * p.head_dim, op, "y_stride");
  if (!(p.dt_min <= p.dt_max))
    fail(op, "dt_min", p.dt_min, ("must be <= dt_max = " + std::to_string(p.dt_max)).c_str());
  // CUDA-specific limits: grid dimensions and the 16-byte state accesses.
  if (p.batch > 65535) fail(op, "batch", p.batch, "exceeds the CUDA grid (65535)");
  if (p.heads > 0x7fffffff) fail(op, "heads", p.heads, "exceeds the CUDA grid");
  if (p.head_dim > 0x7fffffff) fail(op, "head_dim", p.head_dim, "exceeds the int range");
  if (p.d_state % 4 != 0) fail(op, "d_state", p.d_state, "must be a multiple of 4 for the CUDA kernels");
  require_aligned16(p.ssm_states, op, "ssm_states");
}

}  // namespace hyserve::kernels::cuda_detail
