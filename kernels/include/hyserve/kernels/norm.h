#pragma once
// RMSNorm and gated RMSNorm.
#include <cstdint>

namespace hyserve::kernels {

// out[r, :] = x[r, :] * rsqrt(mean(x[r, :]²) + eps) * weight. out may alias x.
struct rmsnorm_params {
  const float* x = nullptr;                    // [rows, cols], row stride x_stride
  const float* __restrict__ weight = nullptr;  // [cols]
  float* out = nullptr;                        // [rows, cols], row stride out_stride
  int64_t rows = 0, cols = 0;
  int64_t x_stride = 0, out_stride = 0;
  float eps = 1e-6f;
};

void run_cpu(const rmsnorm_params& p);
void run_cuda(const rmsnorm_params& p, void* stream = nullptr);

// Gated RMSNorm (Mamba2, norm_before_gate = false):
//   h = x · silu(gate); out = h * rsqrt(mean_over_group(h²) + eps) * weight
// where the mean runs over contiguous groups of group_size channels (group_size = cols for a
// single group; Mamba2 uses intermediate_size / n_groups).
//
// Tensor parallelism with one group split over ranks: call once with sumsq_out set (writes the
// per-row, per-group Σh² and returns without normalising), all-reduce it, then call again with
// sumsq_in set and group_count = the global channel count of a group.
struct gated_rmsnorm_params {
  const float* x = nullptr;                    // [rows, cols], row stride x_stride
  const float* __restrict__ gate = nullptr;    // [rows, cols], row stride gate_stride
  const float* __restrict__ weight = nullptr;  // [cols]
  float* out = nullptr;                        // [rows, cols], row stride out_stride; may alias x
  int64_t rows = 0, cols = 0;
  int64_t x_stride = 0, gate_stride = 0, out_stride = 0;
  int64_t group_size = 0;            // channels per normalisation group (local); divides cols
  float eps = 1e-6f;
  float* sumsq_out = nullptr;        // null: normal mode. else [rows, cols/group_size]: phase 1
  const float* sumsq_in = nullptr;   // null: computed locally. else [rows, cols/group_size]
  int64_t group_count = 0;           // divisor of the mean when sumsq_in is set (0 = group_size)
};

void run_cpu(const gated_rmsnorm_params& p);
void run_cuda(const gated_rmsnorm_params& p, void* stream = nullptr);

}  // namespace hyserve::kernels
