// RMSNorm and gated RMSNorm (norm after or before the gate) against direct formulas in double;
// the two-phase (tensor-parallel) gated path against the one-phase result. Tolerance 1e-5 abs +
// 1e-5 rel. Also rmsnorm_linear's squared-ReLU epilogue and its normed_out.
#include "hyserve/kernels/norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernel_test_util.h"

namespace hyserve::kernels {
namespace {

using test::expect_close;
using test::random_floats;
using test_support::expect_invalid;

constexpr double kAtol = 1e-5;
constexpr double kRtol = 1e-5;

struct rms_case {
  int rows, cols;
  bool in_place;
};

class RmsNorm : public testing::TestWithParam<rms_case> {};

TEST_P(RmsNorm, MatchesFormula) {
  const rms_case& c = GetParam();
  const int64_t x_stride = c.cols + 3, out_stride = c.in_place ? x_stride : c.cols + 1;
  auto x = random_floats(static_cast<size_t>(c.rows * x_stride), 3u + static_cast<uint32_t>(c.cols), -2.0f, 2.0f);
  const auto w = random_floats(static_cast<size_t>(c.cols), 4u, 0.5f, 1.5f);
  const float eps = 1e-5f;
  std::vector<double> ref(static_cast<size_t>(c.rows * c.cols));
  for (int64_t r = 0; r < c.rows; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < c.cols; ++i) ss += static_cast<double>(x[r * x_stride + i]) * x[r * x_stride + i];
    const double inv = 1.0 / std::sqrt(ss / c.cols + eps);
    for (int64_t i = 0; i < c.cols; ++i) ref[r * c.cols + i] = x[r * x_stride + i] * inv * w[i];
  }
  std::vector<float> out(static_cast<size_t>(c.rows * out_stride));
  rmsnorm_params p;
  p.x = x.data();
  p.weight = w.data();
  p.out = c.in_place ? x.data() : out.data();
  p.rows = c.rows;
  p.cols = c.cols;
  p.x_stride = x_stride;
  p.out_stride = out_stride;
  p.eps = eps;
  run_cpu(p);
  const float* got = c.in_place ? x.data() : out.data();
  for (int64_t r = 0; r < c.rows; ++r) {
    expect_close(got + r * out_stride, ref.data() + r * c.cols, static_cast<size_t>(c.cols), kAtol, kRtol,
                 "row " + std::to_string(r));
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, RmsNorm,
                         testing::Values(rms_case{1, 1, false}, rms_case{7, 64, false}, rms_case{7, 64, true},
                                         rms_case{3, 4096 + 32, false}),
                         [](const testing::TestParamInfo<rms_case>& i) {
                           return "rows" + std::to_string(i.param.rows) + "_cols" + std::to_string(i.param.cols) +
                                  (i.param.in_place ? "_inplace" : "");
                         });

// groups: per-head norms on the rows of a stacked projection (Qwen3-Next's q | k heads), each
// head with its own weight (weight_stride = cols) or one weight for all (0), in place and not.
TEST(RmsNormGroups, EachVectorOfARowNormalisedWithItsWeight) {
  constexpr int64_t rows = 3, cols = 16, groups = 5, x_stride = groups * cols + 24;
  const float eps = 1e-6f;
  for (const int64_t weight_stride : {int64_t{0}, cols, cols + 4}) {
    for (const bool in_place : {false, true}) {
      auto x = random_floats(static_cast<size_t>(rows * x_stride), 51u, -2.0f, 2.0f);
      const auto w = random_floats(static_cast<size_t>(groups * (cols + 4)), 52u, 0.5f, 1.5f);
      const std::vector<float> x0 = x;
      std::vector<float> out(static_cast<size_t>(rows * x_stride), -7.0f);
      rmsnorm_params p;
      p.x = x.data();
      p.weight = w.data();
      p.out = in_place ? x.data() : out.data();
      p.rows = rows;
      p.cols = cols;
      p.groups = groups;
      p.weight_stride = weight_stride;
      p.x_stride = p.out_stride = x_stride;
      p.eps = eps;
      run_cpu(p);
      const float* got = in_place ? x.data() : out.data();
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t g = 0; g < groups; ++g) {
          const float* v = x0.data() + r * x_stride + g * cols;
          double ss = 0.0;
          for (int64_t i = 0; i < cols; ++i) ss += static_cast<double>(v[i]) * v[i];
          const double inv = 1.0 / std::sqrt(ss / cols + eps);
          std::vector<double> ref(static_cast<size_t>(cols));
          for (int64_t i = 0; i < cols; ++i) ref[static_cast<size_t>(i)] = v[i] * inv * w[g * weight_stride + i];
          expect_close(got + r * x_stride + g * cols, ref.data(), static_cast<size_t>(cols), kAtol, kRtol,
                       "row " + std::to_string(r) + " group " + std::to_string(g) + " weight_stride " +
                           std::to_string(weight_stride));
        }
        // The columns past the groups are not touched.
        for (int64_t i = groups * cols; i < x_stride; ++i)
          EXPECT_EQ(got[r * x_stride + i], in_place ? x0[r * x_stride + i] : -7.0f) << "row " << r << " col " << i;
      }
    }
  }
  rmsnorm_params bad;
  std::vector<float> buf(64, 1.0f);
  bad.x = bad.out = buf.data();
  bad.weight = buf.data();
  bad.rows = 1;
  bad.cols = 8;
  bad.groups = 4;
  bad.x_stride = bad.out_stride = 24;  // < groups · cols
  expect_invalid([&] { run_cpu(bad); }, "x_stride");
  bad.x_stride = bad.out_stride = 32;
  bad.weight_stride = 4;  // < cols
  expect_invalid([&] { run_cpu(bad); }, "weight_stride");
}

// rmsnorm_linear with a gate on the CPU: normed_out is the gated_rmsnorm op's output bit for bit,
// out the gemm on it (within 1e-5 of a double-precision product); and its parameter checks.
TEST(RmsNormLinearGated, IsTheGatedNormThenTheGemm) {
  constexpr int64_t m = 3, n = 9, k = 64, zs = 80;
  const auto x = random_floats(static_cast<size_t>(m * k), 61u, -2.0f, 2.0f);
  const auto z = random_floats(static_cast<size_t>(m * zs), 62u, -3.0f, 3.0f);
  const auto g = random_floats(static_cast<size_t>(k), 63u, 0.5f, 1.5f);
  const auto w = random_floats(static_cast<size_t>(n * k), 64u, -0.5f, 0.5f);
  const auto out0 = random_floats(static_cast<size_t>(m * n), 65u, -1.0f, 1.0f);
  for (const bool before : {false, true}) {
    for (const int64_t group : {int64_t{0}, int64_t{16}}) {
      std::vector<float> out = out0, xn(static_cast<size_t>(m * k));
      rmsnorm_linear_params p;
      p.x = x.data();
      p.norm_weight = g.data();
      p.eps = 1e-6f;
      p.w = w.data();
      p.out = out.data();
      p.m = m;
      p.n = n;
      p.k = k;
      p.x_stride = p.w_stride = k;
      p.out_stride = n;
      p.beta = 1.0f;
      p.gate = z.data();
      p.gate_stride = zs;
      p.norm_group = group;
      p.norm_before_gate = before;
      p.normed_out = xn.data();
      run_cpu(p);

      std::vector<float> want_xn(static_cast<size_t>(m * k)), want = out0;
      gated_rmsnorm_params gn;
      gn.x = x.data();
      gn.gate = z.data();
      gn.weight = g.data();
      gn.out = want_xn.data();
      gn.rows = m;
      gn.cols = k;
      gn.x_stride = gn.out_stride = k;
      gn.gate_stride = zs;
      gn.group_size = group > 0 ? group : k;
      gn.eps = 1e-6f;
      gn.norm_before_gate = before;
      run_cpu(gn);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < n; ++j) {  // the gemm in double, compared within 1e-5
          double d = 0.0;
          for (int64_t i = 0; i < k; ++i) d += static_cast<double>(want_xn[r * k + i]) * w[j * k + i];
          want[r * n + j] += static_cast<float>(d);
        }
      EXPECT_EQ(xn, want_xn) << "normed_out, before_gate " << before << " group " << group;
      expect_close(out.data(), std::vector<double>(want.begin(), want.end()).data(), want.size(), kAtol, kRtol,
                   "out, before_gate " + std::to_string(before) + " group " + std::to_string(group));
    }
  }
  rmsnorm_linear_params bad;
  std::vector<float> buf(256, 1.0f);
  bad.x = bad.out = buf.data();
  bad.w = buf.data();
  bad.m = 1;
  bad.n = 2;
  bad.k = 16;
  bad.x_stride = bad.w_stride = 16;
  bad.out_stride = 2;
  bad.gate = buf.data();
  bad.gate_stride = 16;
  expect_invalid([&] { run_cpu(bad); }, "gate");  // without norm_weight
  bad.norm_weight = buf.data();
  bad.gate_stride = 8;
  expect_invalid([&] { run_cpu(bad); }, "gate_stride");
  bad.gate_stride = 16;
  bad.norm_group = 5;
  expect_invalid([&] { run_cpu(bad); }, "norm_group");
}

double silu_ref(double v) { return v / (1.0 + std::exp(-v)); }

// Gated reference: h = x·silu(z); out = h · rsqrt(mean_group(h²) + eps) · w. Before the gate:
// h = x; out = h · rsqrt(mean_group(h²) + eps) · w · silu(z).
std::vector<double> gated_ref(const std::vector<float>& x, const std::vector<float>& z, const std::vector<float>& w,
                              int64_t rows, int64_t cols, int64_t stride, int64_t group, float eps,
                              bool before_gate = false) {
  std::vector<double> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g0 = 0; g0 < cols; g0 += group) {
      std::vector<double> h(static_cast<size_t>(group));
      double ss = 0.0;
      for (int64_t i = 0; i < group; ++i) {
        const double xv = x[r * stride + g0 + i];
        h[i] = before_gate ? xv : xv * silu_ref(z[r * stride + g0 + i]);
        ss += h[i] * h[i];
      }
      const double inv = 1.0 / std::sqrt(ss / group + eps);
      for (int64_t i = 0; i < group; ++i) {
        const double gate = before_gate ? silu_ref(z[r * stride + g0 + i]) : 1.0;
        out[r * cols + g0 + i] = h[i] * inv * w[g0 + i] * gate;
      }
    }
  }
  return out;
}

struct gated_case {
  int rows, cols, group_size;
  bool in_place;
  bool before_gate = false;
};

class GatedRmsNorm : public testing::TestWithParam<gated_case> {};

TEST_P(GatedRmsNorm, MatchesFormula) {
  const gated_case& c = GetParam();
  const int64_t stride = c.cols + 2;
  auto x = random_floats(static_cast<size_t>(c.rows * stride), 31u + static_cast<uint32_t>(c.cols), -2.0f, 2.0f);
  const auto z = random_floats(static_cast<size_t>(c.rows * stride), 32u, -3.0f, 3.0f);
  const auto w = random_floats(static_cast<size_t>(c.cols), 33u, 0.5f, 1.5f);
  const auto ref = gated_ref(x, z, w, c.rows, c.cols, stride, c.group_size, 1e-6f, c.before_gate);
  std::vector<float> out(static_cast<size_t>(c.rows * stride));
  gated_rmsnorm_params p;
  p.x = x.data();
  p.gate = z.data();
  p.weight = w.data();
  p.out = c.in_place ? x.data() : out.data();
  p.rows = c.rows;
  p.cols = c.cols;
  p.x_stride = p.gate_stride = p.out_stride = stride;
  p.group_size = c.group_size;
  p.norm_before_gate = c.before_gate;
  run_cpu(p);
  const float* got = c.in_place ? x.data() : out.data();
  for (int64_t r = 0; r < c.rows; ++r) {
    expect_close(got + r * stride, ref.data() + r * c.cols, static_cast<size_t>(c.cols), kAtol, kRtol,
                 "row " + std::to_string(r));
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, GatedRmsNorm,
                         testing::Values(gated_case{5, 64, 64, false}, gated_case{5, 64, 16, false},
                                         gated_case{4, 96, 32, true}, gated_case{2, 4096 + 32, 1032, false},
                                         gated_case{5, 64, 64, false, true}, gated_case{5, 64, 16, false, true},
                                         gated_case{4, 96, 32, true, true}),
                         [](const testing::TestParamInfo<gated_case>& i) {
                           return "rows" + std::to_string(i.param.rows) + "_cols" + std::to_string(i.param.cols) +
                                  "_groups" + std::to_string(i.param.cols / i.param.group_size) +
                                  (i.param.in_place ? "_inplace" : "") + (i.param.before_gate ? "_before_gate" : "");
                         });

// One normalisation group of 2·half channels split over two "ranks" of half channels each:
// phase 1 per half, the sums added (the all-reduce), phase 2 per half with group_count = 2·half.
void split_group_equals_one_phase(bool before_gate) {
  const int64_t rows = 3, half = 40, cols = 2 * half;
  const auto x = random_floats(static_cast<size_t>(rows * cols), 41u, -2.0f, 2.0f);
  const auto z = random_floats(static_cast<size_t>(rows * cols), 42u, -3.0f, 3.0f);
  const auto w = random_floats(static_cast<size_t>(cols), 43u, 0.5f, 1.5f);

  std::vector<float> whole(static_cast<size_t>(rows * cols));
  gated_rmsnorm_params p;
  p.x = x.data();
  p.gate = z.data();
  p.weight = w.data();
  p.out = whole.data();
  p.rows = rows;
  p.cols = cols;
  p.x_stride = p.gate_stride = p.out_stride = cols;
  p.group_size = cols;
  p.norm_before_gate = before_gate;
  run_cpu(p);
  expect_close(whole, gated_ref(x, z, w, rows, cols, cols, cols, 1e-6f, before_gate), kAtol, kRtol, "one phase");

  std::vector<float> sums[2] = {std::vector<float>(rows), std::vector<float>(rows)};
  auto half_params = [&](int rank) {
    gated_rmsnorm_params q;
    q.x = x.data() + rank * half;
    q.gate = z.data() + rank * half;
    q.weight = w.data() + rank * half;
    q.rows = rows;
    q.cols = half;
    q.x_stride = q.gate_stride = q.out_stride = cols;
    q.group_size = half;
    q.norm_before_gate = before_gate;
    return q;
  };
  for (int rank = 0; rank < 2; ++rank) {
    auto q = half_params(rank);
    q.sumsq_out = sums[rank].data();  // phase 1: out untouched (null)
    run_cpu(q);
  }
  std::vector<float> total(rows);
  for (int64_t r = 0; r < rows; ++r) total[r] = sums[0][r] + sums[1][r];
  std::vector<float> split(static_cast<size_t>(rows * cols));
  for (int rank = 0; rank < 2; ++rank) {
    auto q = half_params(rank);
    q.out = split.data() + rank * half;
    q.sumsq_in = total.data();
    q.group_count = cols;
    run_cpu(q);
  }
  expect_close(split, whole, kAtol, kRtol, "two phase");

  // Phase 1 reports Σh² of the local channels (h = x before the gate).
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < half; ++i) {
      const double xv = x[r * cols + i];
      const double h = before_gate ? xv : xv * silu_ref(z[r * cols + i]);
      ss += h * h;
    }
    EXPECT_NEAR(sums[0][r], ss, 1e-5 * ss + 1e-6);
  }
}

TEST(GatedRmsNormTwoPhase, SplitGroupEqualsOnePhase) { split_group_equals_one_phase(false); }

// Falcon-H1 (norm_before_gate): Σx² is what the ranks reduce; silu(z) multiplies after the norm.
TEST(GatedRmsNormTwoPhase, SplitGroupBeforeGateEqualsOnePhase) { split_group_equals_one_phase(true); }

// Several groups per rank: sumsq_out is [rows, cols/group_size]; feeding it back unchanged with
// group_count 0 reproduces the local result.
TEST(GatedRmsNormTwoPhase, MultiGroupRoundTrip) {
  const int64_t rows = 2, cols = 48, group = 12;
  const auto x = random_floats(static_cast<size_t>(rows * cols), 51u, -2.0f, 2.0f);
  const auto z = random_floats(static_cast<size_t>(rows * cols), 52u, -3.0f, 3.0f);
  const auto w = random_floats(static_cast<size_t>(cols), 53u, 0.5f, 1.5f);
  std::vector<float> sums(static_cast<size_t>(rows * cols / group)), out(static_cast<size_t>(rows * cols));
  gated_rmsnorm_params p;
  p.x = x.data();
  p.gate = z.data();
  p.weight = w.data();
  p.rows = rows;
  p.cols = cols;
  p.x_stride = p.gate_stride = p.out_stride = cols;
  p.group_size = group;
  p.sumsq_out = sums.data();
  run_cpu(p);
  p.sumsq_out = nullptr;
  p.sumsq_in = sums.data();
  p.out = out.data();
  run_cpu(p);
  expect_close(out, gated_ref(x, z, w, rows, cols, cols, group, 1e-6f), kAtol, kRtol, "round trip");
}

// rmsnorm_linear with the squared-ReLU epilogue (Nemotron-H's MLP up projection): the normed
// rows times the weight, then max(v, 0)², against the formula in double (1e-5 abs + 1e-5 rel on
// the product, so 3e-5 rel on its square); relu2 with up_w or beta 1 is an error naming it.
TEST(RmsNormLinearRelu2, MatchesFormulaAndRejectsOtherEpilogues) {
  const int64_t m = 3, n = 37, k = 64, out_stride = n + 2;
  const auto x = random_floats(static_cast<size_t>(m * k), 61u, -2.0f, 2.0f);
  const auto g = random_floats(static_cast<size_t>(k), 62u, 0.5f, 1.5f);
  const auto w = random_floats(static_cast<size_t>(n * k), 63u, -0.2f, 0.2f);
  std::vector<float> out(static_cast<size_t>(m * out_stride), -7.0f);
  rmsnorm_linear_params p;
  p.x = x.data();
  p.norm_weight = g.data();
  p.eps = 1e-5f;
  p.w = w.data();
  p.w_dtype = dtype::kF32;
  p.out = out.data();
  p.m = m;
  p.n = n;
  p.k = k;
  p.x_stride = p.w_stride = k;
  p.out_stride = out_stride;
  p.relu2 = true;
  run_cpu(p);
  int positive = 0;
  for (int64_t r = 0; r < m; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < k; ++i) ss += static_cast<double>(x[r * k + i]) * x[r * k + i];
    const double inv = 1.0 / std::sqrt(ss / k + 1e-5);
    for (int64_t j = 0; j < n; ++j) {
      double v = 0.0;
      for (int64_t i = 0; i < k; ++i) v += x[r * k + i] * inv * g[i] * w[j * k + i];
      const double want = v > 0.0 ? v * v : 0.0;
      positive += v > 0.0;
      EXPECT_NEAR(out[r * out_stride + j], want, 1e-5 + 3e-5 * want) << "row " << r << " col " << j;
    }
    EXPECT_EQ(out[r * out_stride + n], -7.0f) << "the padding after row " << r << " is not written";
  }
  EXPECT_GT(positive, 0);
  EXPECT_LT(positive, m * n);  // both signs: the ReLU is exercised
  rmsnorm_linear_params with_up = p;
  with_up.up_w = w.data();
  expect_invalid([&] { run_cpu(with_up); }, "relu2");
  rmsnorm_linear_params with_beta = p;
  with_beta.beta = 1.0f;
  expect_invalid([&] { run_cpu(with_beta); }, "relu2");
}

// rmsnorm_linear's normed_out: the normed rows written beside the product, equal bit for bit to
// the rmsnorm op's output, and the product unchanged; normed_out without a norm is an error
// naming it.
TEST(RmsNormLinearNormedOut, IsTheRmsnormOpsOutput) {
  const int64_t m = 2, n = 19, k = 48;
  const auto x = random_floats(static_cast<size_t>(m * k), 71u, -2.0f, 2.0f);
  const auto g = random_floats(static_cast<size_t>(k), 72u, 0.5f, 1.5f);
  const auto w = random_floats(static_cast<size_t>(n * k), 73u, -0.2f, 0.2f);
  rmsnorm_linear_params p;
  p.x = x.data();
  p.norm_weight = g.data();
  p.eps = 1e-5f;
  p.w = w.data();
  p.w_dtype = dtype::kF32;
  p.m = m;
  p.n = n;
  p.k = k;
  p.x_stride = p.w_stride = k;
  p.out_stride = n;
  std::vector<float> plain(static_cast<size_t>(m * n)), with(static_cast<size_t>(m * n));
  std::vector<float> normed(static_cast<size_t>(m * k), -7.0f), op(static_cast<size_t>(m * k));
  p.out = plain.data();
  run_cpu(p);
  p.out = with.data();
  p.normed_out = normed.data();
  run_cpu(p);
  rmsnorm_params r;
  r.x = x.data();
  r.weight = g.data();
  r.out = op.data();
  r.rows = m;
  r.cols = k;
  r.x_stride = r.out_stride = k;
  r.eps = 1e-5f;
  run_cpu(r);
  EXPECT_EQ(normed, op);
  EXPECT_EQ(with, plain);
  rmsnorm_linear_params no_norm = p;
  no_norm.norm_weight = nullptr;
  expect_invalid([&] { run_cpu(no_norm); }, "normed_out");
}

}  // namespace
}  // namespace hyserve::kernels
