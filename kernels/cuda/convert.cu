// Element-type conversion of a 2-D block (convert.h): one kernel template over (source,
// destination) types, rows over grid.y.
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "../cpu/validate.h"
#include "common.cuh"
#include "convert.h"

namespace hyserve::kernels::cuda_detail {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridX = int64_t{1} << 20;
constexpr int64_t kMaxGridY = 65535;

template <class T>
__device__ __forceinline__ float widen(T v) {
  if constexpr (std::is_same_v<T, __half>)
    return __half2float(v);
  else
    return to_float<T>(v);
}

template <class S, class D>
__global__ void __launch_bounds__(kThreads)
    convert_kernel(D* __restrict__ dst, int64_t dst_pitch, const S* __restrict__ src, int64_t rows, int64_t cols) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x)
      dst[r * dst_pitch + c] = from_float<D>(widen(src[r * cols + c]));
}

template <class S, class D>
void launch(void* dst, int64_t dst_pitch, const void* src, int64_t rows, int64_t cols, void* stream) {
  const dim3 grid(static_cast<unsigned>(std::min(ceil_div(cols, int64_t{kThreads}), kMaxGridX)),
                  static_cast<unsigned>(std::min(rows, kMaxGridY)));
  convert_kernel<S, D><<<grid, kThreads, 0, as_stream(stream)>>>(static_cast<D*>(dst), dst_pitch,
                                                                 static_cast<const S*>(src), rows, cols);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

template <class D>
void launch_from(dtype src_type, void* dst, int64_t dst_pitch, const void* src, int64_t rows, int64_t cols,
                 void* stream) {
  switch (src_type) {
    case dtype::kF32:
      return launch<float, D>(dst, dst_pitch, src, rows, cols, stream);
    case dtype::kBF16:
      return launch<__nv_bfloat16, D>(dst, dst_pitch, src, rows, cols, stream);
    case dtype::kF16:
      return launch<__half, D>(dst, dst_pitch, src, rows, cols, stream);
    default:
      cpu_detail::fail("convert_block", "src_type", dtype_name(src_type), "supported: f32, bf16, f16");
  }
}

}  // namespace

void convert_block(void* dst, dtype dst_type, int64_t dst_pitch, const void* src, dtype src_type, int64_t rows,
                   int64_t cols, void* stream) {
  if (rows <= 0 || cols <= 0) return;
  switch (dst_type) {
    case dtype::kF32:
      return launch_from<float>(src_type, dst, dst_pitch, src, rows, cols, stream);
    case dtype::kBF16:
      return launch_from<__nv_bfloat16>(src_type, dst, dst_pitch, src, rows, cols, stream);
    default:
      cpu_detail::fail("convert_block", "dst_type", dtype_name(dst_type), "supported: f32, bf16");
  }
}

}  // namespace hyserve::kernels::cuda_detail
