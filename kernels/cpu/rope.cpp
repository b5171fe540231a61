#include "hyserve/kernels/rope.h"

#include <cmath>
#include <string>
#include <vector>

#include "dense_validate.h"
#include "validate.h"

namespace hyserve::kernels {

using namespace cpu_detail;

namespace {

// Rotates the first rd dims of each of n_heads heads of one token row in place.
void rotate_heads(float* row, int64_t n_heads, int64_t head_dim, int64_t half, const float* cos_v, const float* sin_v) {
  for (int64_t h = 0; h < n_heads; ++h) {
    float* x1 = row + h * head_dim;
    float* x2 = x1 + half;
    for (int64_t i = 0; i < half; ++i) {
      const float a = x1[i];
      const float b = x2[i];
      x1[i] = a * cos_v[i] - b * sin_v[i];
      x2[i] = b * cos_v[i] + a * sin_v[i];
    }
  }
}

}  // namespace

void run_cpu(const rope_params& p) {
  constexpr const char* op = "rope";
  check_rope(p, op);

  const int64_t half = p.rotary_dim / 2;
  // Same float32 arithmetic as the Hugging Face reference:
  //   inv_freq = 1 / theta^(arange(0, rd, 2) / rd); angle = float(position) · inv_freq.
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(p.rotary_dim);
    inv_freq[i] = 1.0f / std::pow(p.theta, expo);
  }

#pragma omp parallel
  {
    std::vector<float> cos_v(static_cast<size_t>(half)), sin_v(static_cast<size_t>(half));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < p.n_tokens; ++t) {
      const float pos = static_cast<float>(p.positions[t]);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[i];
        cos_v[i] = std::cos(angle);
        sin_v[i] = std::sin(angle);
      }
      rotate_heads(p.q + t * p.q_stride, p.n_q_heads, p.head_dim, half, cos_v.data(), sin_v.data());
      if (p.n_kv_heads > 0)
        rotate_heads(p.k + t * p.k_stride, p.n_kv_heads, p.head_dim, half, cos_v.data(), sin_v.data());
    }
  }
}

}  // namespace hyserve::kernels
