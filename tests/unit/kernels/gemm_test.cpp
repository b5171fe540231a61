// gemm against a triple loop in double, over transposes, padded leading dimensions and
// alpha/beta. Tolerance 1e-5 abs + 1e-5 rel (k <= 80, values in [-1, 1)). And the CPU op's row
// invariance: a row of C is the same bits whatever m is and whatever the other rows hold.
#include "hyserve/kernels/gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "kernel_test_util.h"

namespace hyserve::kernels {
namespace {

using test::expect_close;
using test::random_floats;

struct gemm_case {
  int m, n, k;
  bool trans_a, trans_b;
  int pad;  // extra elements per row of a, b and c
  float alpha, beta;
};

std::string gemm_name(const testing::TestParamInfo<gemm_case>& info) {
  const auto& c = info.param;
  std::string s = "m" + std::to_string(c.m) + "_n" + std::to_string(c.n) + "_k" + std::to_string(c.k);
  s += c.trans_a ? "_ta" : "";
  s += c.trans_b ? "_tb" : "";
  s += "_pad" + std::to_string(c.pad);
  if (c.beta != 0.0f || c.alpha != 1.0f) s += "_alphabeta";
  return s;
}

class Gemm : public testing::TestWithParam<gemm_case> {};

TEST_P(Gemm, MatchesTripleLoop) {
  const gemm_case& c = GetParam();
  const int64_t a_rows = c.trans_a ? c.k : c.m, a_cols = c.trans_a ? c.m : c.k;
  const int64_t b_rows = c.trans_b ? c.n : c.k, b_cols = c.trans_b ? c.k : c.n;
  const int64_t lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.n + c.pad;
  const auto a = random_floats(static_cast<size_t>(a_rows * lda), 11u + static_cast<uint32_t>(c.m));
  const auto b = random_floats(static_cast<size_t>(b_rows * ldb), 12u + static_cast<uint32_t>(c.n));
  // beta == 0 must ignore C entirely, even NaN (callers pass uninitialised buffers).
  auto cm = c.beta == 0.0f ? std::vector<float>(static_cast<size_t>(c.m * ldc), std::numeric_limits<float>::quiet_NaN())
                           : random_floats(static_cast<size_t>(c.m * ldc), 13u);

  std::vector<double> ref(static_cast<size_t>(c.m * c.n));
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double acc = 0.0;
      for (int64_t l = 0; l < c.k; ++l) {
        const double av = c.trans_a ? a[l * lda + i] : a[i * lda + l];
        const double bv = c.trans_b ? b[j * ldb + l] : b[l * ldb + j];
        acc += av * bv;
      }
      ref[i * c.n + j] = c.alpha * acc + (c.beta != 0.0f ? c.beta * cm[i * ldc + j] : 0.0);
    }
  }

  gemm_params p;
  p.a = a.data();
  p.b = b.data();
  p.c = cm.data();
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  p.lda = lda;
  p.ldb = ldb;
  p.ldc = ldc;
  p.trans_a = c.trans_a;
  p.trans_b = c.trans_b;
  p.alpha = c.alpha;
  p.beta = c.beta;
  run_cpu(p);

  for (int64_t i = 0; i < c.m; ++i) {
    expect_close(cm.data() + i * ldc, ref.data() + i * c.n, static_cast<size_t>(c.n), 1e-5, 1e-5,
                 "row " + std::to_string(i));
  }
}

std::vector<gemm_case> gemm_grid() {
  std::vector<gemm_case> v;
  for (auto [m, n, k] : {std::tuple{1, 1, 1}, std::tuple{3, 5, 7}, std::tuple{17, 33, 9}, std::tuple{64, 48, 80}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        v.push_back({m, n, k, ta, tb, 0, 1.0f, 0.0f});
        v.push_back({m, n, k, ta, tb, 3, 0.5f, 2.0f});
      }
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Grid, Gemm, testing::ValuesIn(gemm_grid()), gemm_name);

TEST(Linear, MatchesTripleLoopAndAccumulates) {
  const int64_t m = 6, n = 10, k = 12;
  const auto x = random_floats(static_cast<size_t>(m * k), 21u);
  const auto w = random_floats(static_cast<size_t>(n * k), 22u);
  const auto y0 = random_floats(static_cast<size_t>(m * n), 23u);
  std::vector<double> prod(static_cast<size_t>(m * n)), acc(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t l = 0; l < k; ++l) s += static_cast<double>(x[i * k + l]) * w[j * k + l];
      prod[i * n + j] = s;
      acc[i * n + j] = s + y0[i * n + j];
    }
  }
  std::vector<float> y = y0;
  linear_cpu(x.data(), w.data(), y.data(), m, n, k);
  expect_close(y, prod, 1e-5, 1e-5, "y = x·wᵀ");
  y = y0;
  linear_cpu(x.data(), w.data(), y.data(), m, n, k, true);
  expect_close(y, acc, 1e-5, 1e-5, "y += x·wᵀ");
}

// Row i of C computed in a product of m rows (the other rows random) equals, bit for bit, the
// same row computed alone (m = 1), for every m from 1 to 70 and at 300, f32 and bf16 weights,
// both layouts of B, trans_a, k not a multiple of the 8 lanes; and the same holds for the
// values produced through a transposed B (same per-element order).
TEST(GemmRowInvariance, RowOfAnyBatchEqualsTheRowAloneBitForBit) {
  for (const dtype bt : {dtype::kF32, dtype::kBF16}) {
    for (const bool trans_b : {true, false}) {
      for (const bool trans_a : {false, true}) {
        const int64_t n = 37, k = 203;
        const auto bf = random_floats(static_cast<size_t>(n * k), 31u);
        std::vector<uint16_t> bh(bf.size());
        for (size_t i = 0; i < bf.size(); ++i) bh[i] = f32_to_bf16(bf[i]);
        const void* b = bt == dtype::kF32 ? static_cast<const void*>(bf.data()) : static_cast<const void*>(bh.data());
        const auto row = random_floats(static_cast<size_t>(k), 32u);
        auto product = [&](int64_t m, int64_t at, uint32_t seed) {
          // m rows of A: random, with `row` at index at; returns C's row at.
          std::vector<float> a = random_floats(static_cast<size_t>(m * k), seed);
          std::copy(row.begin(), row.end(), a.begin() + at * k);
          std::vector<float> at_layout;
          if (trans_a) {  // A stored [k, m]
            at_layout.resize(a.size());
            for (int64_t i = 0; i < m; ++i)
              for (int64_t l = 0; l < k; ++l) at_layout[static_cast<size_t>(l * m + i)] = a[static_cast<size_t>(i * k + l)];
          }
          std::vector<float> c(static_cast<size_t>(m * n), std::numeric_limits<float>::quiet_NaN());
          gemm_params p;
          p.a = trans_a ? at_layout.data() : a.data();
          p.lda = trans_a ? m : k;
          p.trans_a = trans_a;
          p.m = m;
          p.n = n;
          p.k = k;
          p.c = c.data();
          p.ldc = n;
          p.b_dtype = bt;
          p.trans_b = trans_b;
          std::vector<float> bt_f32;
          std::vector<uint16_t> bt_h;
          if (trans_b) {
            p.b = b;
            p.ldb = k;
          } else {  // B stored [k, n]: the transpose of the [n, k] weight
            bt_f32.resize(bf.size());
            bt_h.resize(bh.size());
            for (int64_t j = 0; j < n; ++j)
              for (int64_t l = 0; l < k; ++l) {
                bt_f32[static_cast<size_t>(l * n + j)] = bf[static_cast<size_t>(j * k + l)];
                bt_h[static_cast<size_t>(l * n + j)] = bh[static_cast<size_t>(j * k + l)];
              }
            p.b = bt == dtype::kF32 ? static_cast<const void*>(bt_f32.data()) : static_cast<const void*>(bt_h.data());
            p.ldb = n;
          }
          run_cpu(p);
          return std::vector<float>(c.begin() + at * n, c.begin() + (at + 1) * n);
        };
        const std::vector<float> alone = product(1, 0, 40u);
        std::vector<int64_t> ms;
        for (int64_t m = 2; m <= 70; ++m) ms.push_back(m);
        ms.push_back(300);
        for (int64_t m : ms) {
          const int64_t at = (m * 7 + 3) % m;
          const std::vector<float> got = product(m, at, 41u + static_cast<uint32_t>(m));
          ASSERT_EQ(std::memcmp(got.data(), alone.data(), alone.size() * sizeof(float)), 0)
              << "m " << m << " row " << at << " b " << dtype_name(bt) << (trans_b ? " trans_b" : "")
              << (trans_a ? " trans_a" : "");
        }
      }
    }
  }
}

// A product large enough to be split over the OpenMP threads (m = 64: 2^25 multiply-adds) gives
// each row the bits of the same row computed alone, on one thread.
TEST(GemmRowInvariance, ThreadedProductRowEqualsTheRowAlone) {
  const int64_t n = 1024, k = 512, m = 64;
  const auto w = random_floats(static_cast<size_t>(n * k), 51u);
  const auto x = random_floats(static_cast<size_t>(m * k), 52u);
  std::vector<float> all(static_cast<size_t>(m * n)), one(static_cast<size_t>(n));
  linear_cpu(x.data(), w.data(), all.data(), m, n, k);
  for (int64_t i = 0; i < m; i += 9) {
    linear_cpu(x.data() + i * k, w.data(), one.data(), 1, n, k);
    ASSERT_EQ(std::memcmp(one.data(), all.data() + i * n, one.size() * sizeof(float)), 0) << "row " << i;
  }
}

}  // namespace
}  // namespace hyserve::kernels
