#include "hyserve/kernels/norm.h"

#include <cmath>
#include <string>
#include <vector>

#include "hyserve/kernels/gemm.h"
#include "norm_linear_unfused.h"
#include "dense_validate.h"
#include "validate.h"

namespace hyserve::kernels {

using namespace cpu_detail;

namespace {

// Σ v² accumulated in double: the mean of up to ~10⁵ squares stays exact to fp32 precision.
double sum_squares(const float* v, int64_t n) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(v[i]) * v[i];
  return s;
}

float silu(float g) { return g / (1.0f + std::exp(-g)); }

}  // namespace

void run_cpu(const rmsnorm_params& p) {
  constexpr const char* op = "rmsnorm";
  check_rmsnorm(p, op);

#pragma omp parallel for schedule(static)
  for (int64_t rg = 0; rg < p.rows * p.groups; ++rg) {
    const int64_t r = rg / p.groups, g = rg % p.groups;
    const float* x = p.x + r * p.x_stride + g * p.cols;
    float* o = p.out + r * p.out_stride + g * p.cols;  // may alias x: element i is read before it is written
    const float* w = p.weight + g * p.weight_stride;
    const float inv = static_cast<float>(1.0 / std::sqrt(sum_squares(x, p.cols) / static_cast<double>(p.cols) + p.eps));
    for (int64_t i = 0; i < p.cols; ++i) o[i] = x[i] * inv * w[i];
  }
}

void run_cpu(const gated_rmsnorm_params& p) {
  constexpr const char* op = "gated_rmsnorm";
  check_gated_rmsnorm(p, op);

  const int64_t n_groups = p.cols / p.group_size;
  const int64_t gs = p.group_size;
  // Divisor of the mean: the local group size, or the global one after a tp all-reduce.
  const double divisor = static_cast<double>(p.sumsq_in != nullptr && p.group_count > 0 ? p.group_count : gs);

#pragma omp parallel
  {
    std::vector<float> h(static_cast<size_t>(gs));  // x · silu(gate) of one group, or x before the gate
#pragma omp for schedule(static)
    for (int64_t r = 0; r < p.rows; ++r) {
      for (int64_t g = 0; g < n_groups; ++g) {
        const float* x = p.x + r * p.x_stride + g * gs;
        const float* z = p.gate + r * p.gate_stride + g * gs;
        if (p.norm_before_gate) {
          for (int64_t i = 0; i < gs; ++i) h[i] = x[i];
        } else {
          for (int64_t i = 0; i < gs; ++i) h[i] = x[i] * silu(z[i]);
        }
        if (p.sumsq_out != nullptr) {
          p.sumsq_out[r * n_groups + g] = static_cast<float>(sum_squares(h.data(), gs));
          continue;
        }
        const double ss = p.sumsq_in != nullptr ? p.sumsq_in[r * n_groups + g] : sum_squares(h.data(), gs);
        const float inv = static_cast<float>(1.0 / std::sqrt(ss / divisor + p.eps));
        float* o = p.out + r * p.out_stride + g * gs;  // may alias x; x of this group is already in h
        const float* w = p.weight + g * gs;
        if (p.norm_before_gate) {
          for (int64_t i = 0; i < gs; ++i) o[i] = h[i] * inv * w[i] * silu(z[i]);
        } else {
          for (int64_t i = 0; i < gs; ++i) o[i] = h[i] * inv * w[i];
        }
      }
    }
  }
}

void run_cpu(const rmsnorm_linear_params& p) {
  cpu_detail::check_rmsnorm_linear(p);
  if (p.m == 0) return;
  std::vector<float> xn(p.norm_weight != nullptr && p.normed_out == nullptr ? static_cast<size_t>(p.m * p.k) : 0);
  cpu_detail::run_rmsnorm_linear_unfused(p, xn.data(), [](const auto& q) { run_cpu(q); });
}

}  // namespace hyserve::kernels
