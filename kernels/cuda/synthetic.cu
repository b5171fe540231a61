// Seeded synthetic fill (synthetic.h): one thread per element of a run, runs over grid.y; the
// values come from the generator shared with the CPU reference.
#include <algorithm>

#include "../cpu/synthetic_validate.h"
#include "common.cuh"
#include "hyserve/kernels/synthetic.h"

namespace hyserve::kernels {
namespace cuda_detail {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridX = int64_t{1} << 20;
constexpr int64_t kMaxGridY = 65535;

template <class T>
__global__ void __launch_bounds__(kThreads) synthetic_fill_kernel(const synthetic_fill_params p) {
  T* out = static_cast<T*>(p.out);
  for (int64_t o = blockIdx.y; o < p.outer; o += gridDim.y) {
    const int64_t src = o * p.stride + p.offset;
    T* dst = out + o * p.out_stride;
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < p.width;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x)
      dst[c] = from_float<T>(synthetic::value(p.dist, p.mean, p.stddev, synthetic::element_hash(p.base, src + c)));
  }
}

template <dtype D>
using storage_t = std::conditional_t<D == dtype::kBF16, __nv_bfloat16, float>;

}  // namespace
}  // namespace cuda_detail

void run_cuda(const synthetic_fill_params& p, void* stream) {
  using namespace cuda_detail;
  cpu_detail::validate_synthetic_fill(p);
  if (p.width == 0) return;
  const dim3 grid(static_cast<unsigned>(std::min(ceil_div(p.width, int64_t{kThreads}), kMaxGridX)),
                  static_cast<unsigned>(std::min(p.outer, kMaxGridY)));
  cpu_detail::dispatch_storage(p.out_dtype, "synthetic_fill", "out_dtype", [&](auto tag) {
    synthetic_fill_kernel<storage_t<decltype(tag)::value>><<<grid, kThreads, 0, as_stream(stream)>>>(p);
  });
  HYSERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::kernels
