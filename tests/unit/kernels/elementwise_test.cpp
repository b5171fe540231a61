// SwiGLU, argmax and the vocab-parallel embedding against direct formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "hyserve/kernels/activation.h"
#include "hyserve/kernels/embedding.h"
#include "hyserve/kernels/sampling.h"
#include "kernel_test_util.h"

namespace hyserve::kernels {
namespace {

using test::expect_close;
using test::random_floats;

class Swiglu : public testing::TestWithParam<int> {};

TEST_P(Swiglu, MatchesFormula) {
  const int64_t rows = 5, cols = GetParam();
  const int64_t gs = cols + 1, us = cols + 2, os = cols + 3;
  auto gate = random_floats(static_cast<size_t>(rows * gs), 61u, -8.0f, 8.0f);
  const auto up = random_floats(static_cast<size_t>(rows * us), 62u, -2.0f, 2.0f);
  gate[0] = -100.0f;  // e^100 overflows fp32: silu must still give -0, not NaN
  gate[1 % cols] = 100.0f;
  std::vector<float> out(static_cast<size_t>(rows * os), 9.0f);
  std::vector<double> ref(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < cols; ++i) {
      const double g = gate[r * gs + i];
      ref[r * cols + i] = g / (1.0 + std::exp(-g)) * up[r * us + i];
    }
  }
  swiglu_params p;
  p.gate = gate.data();
  p.up = up.data();
  p.out = out.data();
  p.rows = rows;
  p.cols = cols;
  p.gate_stride = gs;
  p.up_stride = us;
  p.out_stride = os;
  run_cpu(p);
  for (int64_t r = 0; r < rows; ++r) {
    expect_close(out.data() + r * os, ref.data() + r * cols, static_cast<size_t>(cols), 1e-6, 1e-6,
                 "row " + std::to_string(r));
    for (int64_t e = cols; e < os; ++e) ASSERT_EQ(out[r * os + e], 9.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, Swiglu, testing::Values(1, 7, 256 + 3),
                         [](const testing::TestParamInfo<int>& i) { return "rows5_cols" + std::to_string(i.param); });

TEST(Argmax, TiesGoToLowestIndex) {
  const int64_t vocab = 10, stride = 12;
  std::vector<float> logits(static_cast<size_t>(6 * stride), -1.0f);
  const float ninf = -std::numeric_limits<float>::infinity();
  // row 0: max 5 at 3 and 7 → 3
  logits[0 * stride + 3] = 5.0f;
  logits[0 * stride + 7] = 5.0f;
  // row 1: all equal → 0
  for (int64_t v = 0; v < vocab; ++v) logits[1 * stride + v] = 2.0f;
  // row 2: max at the last index; padding beyond vocab is larger but must be ignored
  logits[2 * stride + 9] = 1.0f;
  logits[2 * stride + 10] = 100.0f;
  // row 3: -inf everywhere except one
  for (int64_t v = 0; v < vocab; ++v) logits[3 * stride + v] = ninf;
  logits[3 * stride + 4] = -1e30f;
  // row 4: NaN is never chosen
  logits[4 * stride + 0] = std::numeric_limits<float>::quiet_NaN();
  logits[4 * stride + 6] = 0.5f;
  // row 5: negative maxima tie
  for (int64_t v = 0; v < vocab; ++v) logits[5 * stride + v] = -3.0f;
  logits[5 * stride + 8] = -2.0f;
  logits[5 * stride + 2] = -2.0f;
  std::vector<int32_t> out(6, -9);
  argmax_params p;
  p.logits = logits.data();
  p.out = out.data();
  p.rows = 6;
  p.vocab = vocab;
  p.stride = stride;
  run_cpu(p);
  EXPECT_EQ(out, (std::vector<int32_t>{3, 0, 9, 4, 6, 2}));
}

TEST(Argmax, LargeRandomRowsMatchScan) {
  const int64_t rows = 9, vocab = 32000 + 17;
  const auto logits = random_floats(static_cast<size_t>(rows * vocab), 71u, -10.0f, 10.0f);
  std::vector<int32_t> out(rows);
  argmax_params p;
  p.logits = logits.data();
  p.out = out.data();
  p.rows = rows;
  p.vocab = vocab;
  p.stride = vocab;
  run_cpu(p);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t best = 0;
    for (int64_t v = 1; v < vocab; ++v) {
      if (logits[r * vocab + v] > logits[r * vocab + best]) best = v;
    }
    EXPECT_EQ(out[r], best) << "row " << r;
  }
}

TEST(Embedding, VocabRangeGivesZeroRowsOutside) {
  const int64_t hidden = 6, vocab_start = 100, vocab_end = 150;
  const auto table = random_floats(static_cast<size_t>((vocab_end - vocab_start) * hidden), 81u);
  const std::vector<int32_t> ids{100, 149, 150, 99, 0, 123, 1000000, 100};
  std::vector<float> out(ids.size() * hidden, 7.0f);
  embedding_params p;
  p.ids = ids.data();
  p.table = table.data();
  p.out = out.data();
  p.n_tokens = static_cast<int64_t>(ids.size());
  p.hidden = hidden;
  p.vocab_start = vocab_start;
  p.vocab_end = vocab_end;
  run_cpu(p);
  for (size_t t = 0; t < ids.size(); ++t) {
    const bool local = ids[t] >= vocab_start && ids[t] < vocab_end;
    for (int64_t e = 0; e < hidden; ++e) {
      const float want = local ? table[(ids[t] - vocab_start) * hidden + e] : 0.0f;
      EXPECT_EQ(out[t * hidden + e], want) << "token " << t << " id " << ids[t];
    }
  }
}

TEST(Embedding, FullVocab) {
  const int64_t hidden = 3, vocab = 5;
  const auto table = random_floats(static_cast<size_t>(vocab * hidden), 82u);
  const std::vector<int32_t> ids{4, 0, 2};
  std::vector<float> out(ids.size() * hidden);
  embedding_params p;
  p.ids = ids.data();
  p.table = table.data();
  p.out = out.data();
  p.n_tokens = 3;
  p.hidden = hidden;
  p.vocab_end = vocab;
  run_cpu(p);
  for (size_t t = 0; t < ids.size(); ++t) {
    for (int64_t e = 0; e < hidden; ++e) EXPECT_EQ(out[t * hidden + e], table[ids[t] * hidden + e]);
  }
}

}  // namespace
}  // namespace hyserve::kernels
