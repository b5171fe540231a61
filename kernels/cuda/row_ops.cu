// Row-wise glue ops (row_ops.h): one thread per element, rows over grid.y.
#include <algorithm>

#include "../cpu/dense_validate.h"
#include "common.cuh"
#include "hyserve/kernels/row_ops.h"
#include "launch.cuh"

namespace hyserve::kernels {
namespace cuda_detail {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;

__device__ __forceinline__ float sigmoidf(float v) { return 1.0f / (1.0f + expf(-v)); }

__global__ void __launch_bounds__(kThreads) row_add_kernel(const row_add_params p) {
  pdl_begin();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= p.cols) return;
  for (int64_t i = blockIdx.y; i < p.rows; i += gridDim.y) {
    float w = p.weights ? p.weights[i] : 1.0f;
    if (p.gate_logits) w *= sigmoidf(p.gate_logits[i * p.gate_stride]);
    const int64_t dst = p.out_rows ? p.out_rows[i] : i;
    p.out[dst * p.out_stride + c] += w * p.x[i * p.x_stride + c];
  }
}

__global__ void __launch_bounds__(kThreads) sigmoid_mul_kernel(const sigmoid_mul_params p) {
  pdl_begin();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= p.cols) return;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y)
    p.out[r * p.out_stride + c] = p.x[r * p.x_stride + c] * sigmoidf(p.gate[r * p.gate_stride + c]);
}

// One warp per token: softmax over the experts, then top_k rounds of a warp argmax (ties to the
// lower index) over the experts not yet taken. Lane j holds experts j, j + 32, …
constexpr int kRouteMaxPerLane = 32;  // experts ≤ 1024

__global__ void __launch_bounds__(kThreads) moe_route_kernel(const moe_route_params p) {
  pdl_begin();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (t >= p.tokens) return;
  const int lane = threadIdx.x & 31;
  const float* l = p.logits + t * p.logits_stride;
  const int n = static_cast<int>(p.experts);
  float v[kRouteMaxPerLane];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kRouteMaxPerLane; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < n ? l[e] : -INFINITY;
    mx = fmaxf(mx, v[i]);
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kRouteMaxPerLane; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < n ? expf(v[i] - mx) : 0.0f;
    sum += v[i];
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  unsigned taken = 0;  // bit i: expert lane + 32·i of this lane is selected
#pragma unroll
  for (int i = 0; i < kRouteMaxPerLane; ++i) v[i] /= sum;
  float top_sum = 0.0f;
  for (int64_t j = 0; j < p.top_k; ++j) {
    float best = -1.0f;
    int best_e = n;
#pragma unroll
    for (int i = 0; i < kRouteMaxPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < n && !(taken >> i & 1u) && v[i] > best) {  // ascending e per lane: first wins ties
        best = v[i];
        best_e = e;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (ob > best || (ob == best && oe < best_e)) {
        best = ob;
        best_e = oe;
      }
    }
    if (best_e % 32 == lane) taken |= 1u << (best_e / 32);
    top_sum += best;
  }
#pragma unroll
  for (int i = 0; i < kRouteMaxPerLane; ++i) {
    const int e = lane + 32 * i;
    if (e < n)
      p.weights[e * p.weights_stride + t] = (taken >> i & 1u) ? (p.norm_topk_prob ? v[i] / top_sum : v[i]) : 0.0f;
  }
}

dim3 grid_for(int64_t rows, int64_t cols) {
  return dim3(static_cast<unsigned>(ceil_div(cols, kThreads)), static_cast<unsigned>(std::min(rows, kMaxGridY)));
}

}  // namespace
}  // namespace cuda_detail

void run_cuda(const row_add_params& p, void* stream) {
  using namespace cuda_detail;
  constexpr const char* op = "row_add";
  cpu_detail::check_row_add(p, op);
  if (p.rows == 0 || p.cols == 0) return;
  launch_pdl(row_add_kernel, grid_for(p.rows, p.cols), dim3(kThreads), 0, as_stream(stream), p);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

void run_cuda(const moe_route_params& p, void* stream) {
  using namespace cuda_detail;
  constexpr const char* op = "moe_route";
  cpu_detail::check_moe_route(p, op);
  if (p.experts > 32 * kRouteMaxPerLane) fail(op, "experts", p.experts, "exceeds the CUDA kernel's 1024");
  if (p.tokens == 0) return;
  const auto blocks = static_cast<unsigned>(ceil_div(p.tokens, int64_t{kThreads / 32}));
  launch_pdl(moe_route_kernel, dim3(blocks), dim3(kThreads), 0, as_stream(stream), p);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

void run_cuda(const sigmoid_mul_params& p, void* stream) {
  using namespace cuda_detail;
  constexpr const char* op = "sigmoid_mul";
  cpu_detail::check_sigmoid_mul(p, op);
  if (p.rows == 0 || p.cols == 0) return;
  launch_pdl(sigmoid_mul_kernel, grid_for(p.rows, p.cols), dim3(kThreads), 0, as_stream(stream), p);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::kernels
