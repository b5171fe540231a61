// swiglu_linear (kernels/gemm.h) on the CPU against a double-precision loop:
// out = silu(x · gateᵀ) ⊙ (x · upᵀ), f32 and bf16 weights, padded strides; within
// 1e-5 + 1e-5·|want|.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "hyserve/common/dtype.h"
#include "hyserve/common/error.h"
#include "hyserve/kernels/gemm.h"

namespace hyserve::kernels {
namespace {

TEST(SwigluLinear, MatchesADoubleLoop) {
  const int64_t m = 3, n = 5, k = 7, xs = 9, ws = 8, os = 6;
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * xs)), g(static_cast<size_t>(n * ws)), u(static_cast<size_t>(n * ws));
  for (auto* v : {&x, &g, &u})
    for (float& e : *v) e = d(gen);
  for (const dtype t : {dtype::kF32, dtype::kBF16}) {
    std::vector<uint16_t> g16(g.size()), u16(u.size());
    std::vector<float> gq = g, uq = u;  // the weights as the op sees them
    for (size_t i = 0; i < g.size(); ++i) {
      g16[i] = f32_to_bf16(g[i]);
      u16[i] = f32_to_bf16(u[i]);
      if (t == dtype::kBF16) {
        gq[i] = bf16_to_f32(g16[i]);
        uq[i] = bf16_to_f32(u16[i]);
      }
    }
    std::vector<float> out(static_cast<size_t>(m * os), -9.0f);
    swiglu_linear_params p;
    p.x = x.data();
    p.gate_w = t == dtype::kF32 ? static_cast<const void*>(g.data()) : g16.data();
    p.up_w = t == dtype::kF32 ? static_cast<const void*>(u.data()) : u16.data();
    p.w_dtype = t;
    p.out = out.data();
    p.m = m;
    p.n = n;
    p.k = k;
    p.x_stride = xs;
    p.w_stride = ws;
    p.out_stride = os;
    run_cpu(p);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double a = 0, b = 0;
        for (int64_t c = 0; c < k; ++c) {
          a += static_cast<double>(x[static_cast<size_t>(i * xs + c)]) * gq[static_cast<size_t>(j * ws + c)];
          b += static_cast<double>(x[static_cast<size_t>(i * xs + c)]) * uq[static_cast<size_t>(j * ws + c)];
        }
        const double want = a / (1.0 + std::exp(-a)) * b;
        EXPECT_NEAR(out[static_cast<size_t>(i * os + j)], want, 1e-5 + 1e-5 * std::abs(want)) << i << "," << j;
      }
      EXPECT_EQ(out[static_cast<size_t>(i * os + n)], -9.0f);  // padding column untouched
    }
  }
}

TEST(SwigluLinear, RejectsAStrideShorterThanK) {
  std::vector<float> x(8), w(8), out(2);
  swiglu_linear_params p;
  p.x = x.data();
  p.gate_w = w.data();
  p.up_w = w.data();
  p.out = out.data();
  p.m = 1;
  p.n = 2;
  p.k = 4;
  p.x_stride = 3;  // < k
  p.w_stride = 4;
  p.out_stride = 2;
  EXPECT_THROW(run_cpu(p), invalid_argument_error);
  p.x_stride = 4;
  p.w_dtype = dtype::kF16;
  EXPECT_THROW(run_cpu(p), invalid_argument_error);
}

}  // namespace
}  // namespace hyserve::kernels
