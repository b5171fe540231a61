#include "hyserve/kernels/synthetic.h"

#include "dtype_dispatch.h"
#include "synthetic_validate.h"

namespace hyserve::kernels {

using namespace cpu_detail;

void run_cpu(const synthetic_fill_params& p) {
  validate_synthetic_fill(p);
  dispatch_storage(p.out_dtype, "synthetic_fill", "out_dtype", [&](auto tag) {
    using T = typename host_storage<decltype(tag)::value>::type;
    T* out = static_cast<T*>(p.out);
#pragma omp parallel for collapse(2) schedule(static) if (p.outer * p.width > (int64_t{1} << 16))
    for (int64_t o = 0; o < p.outer; ++o)
      for (int64_t c = 0; c < p.width; ++c) {
        const uint64_t h = synthetic::element_hash(p.base, o * p.stride + p.offset + c);
        out[o * p.out_stride + c] = from_f32<T>(synthetic::value(p.dist, p.mean, p.stddev, h));
      }
  });
}

}  // namespace hyserve::kernels
