#include "hyserve/kernels/activation.h"

#include <cmath>

#include "dense_validate.h"
#include "validate.h"

namespace hyserve::kernels {

using namespace cpu_detail;

void run_cpu(const swiglu_params& p) {
  constexpr const char* op = "swiglu";
  check_swiglu(p, op);

#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* g = p.gate + r * p.gate_stride;
    const float* u = p.up + r * p.up_stride;
    float* o = p.out + r * p.out_stride;
    for (int64_t i = 0; i < p.cols; ++i) {
      // silu(g) = g / (1 + e^-g); for g → -inf e^-g overflows to inf and the quotient is -0.
      o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
  }
}

void run_cpu(const relu2_params& p) {
  constexpr const char* op = "relu2";
  check_relu2(p, op);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < p.rows; ++r) {
    float* x = p.x + r * p.stride;
    for (int64_t i = 0; i < p.cols; ++i) {
      const float v = x[i] > 0.0f ? x[i] : 0.0f;
      x[i] = v * v;
    }
  }
}

}  // namespace hyserve::kernels
