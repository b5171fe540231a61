// Row-wise glue ops (row_ops.h): one thread per element, rows over grid.y.
#include <algorithm>

#include "common.cuh"
#include "hyserve/kernels/row_ops.h"

namespace hyserve::kernels {
namespace cuda_detail {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;

__device__ __forceinline__ float sigmoidf(float v) { return 1.0f / (1.0f + expf(-v)); }

__global__ void __launch_bounds__(kThreads) row_add_kernel(const row_add_params p) {
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
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= p.cols) return;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y)
    p.out[r * p.out_stride + c] = p.x[r * p.x_stride + c] * sigmoidf(p.gate[r * p.gate_stride + c]);
}

dim3 grid_for(int64_t rows, int64_t cols) {
  return dim3(static_cast<unsigned>(ceil_div(cols, kThreads)), static_cast<unsigned>(std::min(rows, kMaxGridY)));
}

}  // namespace
}  // namespace cuda_detail

void run_cuda(const row_add_params& p, void* stream) {
  using namespace cuda_detail;
  constexpr const char* op = "row_add";
  require_ptr(p.x, op, "x");
  require_ptr(p.out, op, "out");
  require_non_negative(p.rows, op, "rows");
  require_non_negative(p.cols, op, "cols");
  require_stride(p.x_stride, p.cols, op, "x_stride");
  require_stride(p.out_stride, p.cols, op, "out_stride");
  if (p.gate_logits) require_positive(p.gate_stride, op, "gate_stride");
  if (p.rows == 0 || p.cols == 0) return;
  row_add_kernel<<<grid_for(p.rows, p.cols), kThreads, 0, as_stream(stream)>>>(p);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

void run_cuda(const sigmoid_mul_params& p, void* stream) {
  using namespace cuda_detail;
  constexpr const char* op = "sigmoid_mul";
  require_ptr(p.x, op, "x");
  require_ptr(p.gate, op, "gate");
  require_ptr(p.out, op, "out");
  require_non_negative(p.rows, op, "rows");
  require_non_negative(p.cols, op, "cols");
  require_stride(p.x_stride, p.cols, op, "x_stride");
  require_stride(p.gate_stride, p.cols, op, "gate_stride");
  require_stride(p.out_stride, p.cols, op, "out_stride");
  if (p.rows == 0 || p.cols == 0) return;
  sigmoid_mul_kernel<<<grid_for(p.rows, p.cols), kThreads, 0, as_stream(stream)>>>(p);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::kernels
