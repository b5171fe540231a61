#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <map>
#include <string>
#include <vector>

#include "hyserve/common/error.h"
#include "hyserve/kernels/sampling.h"

namespace hyserve::kernels {
namespace {

sample_params params(const std::vector<float>& logits) {
  sample_params p;
  p.logits = logits.data();
  p.vocab = static_cast<int64_t>(logits.size());
  return p;
}

TEST(Sample, GreedyTakesFirstMaximumAndReportsLogprob) {
  const std::vector<float> l = {0.5f, 2.0f, 2.0f, -1.0f};
  const sample_output o = sample_cpu(params(l));
  EXPECT_EQ(o.token, 1);
  double z = 0;
  for (float v : l) z += std::exp(v);
  EXPECT_NEAR(o.logprob, 2.0 - std::log(z), 1e-6);
}

// Greedy equals std::max_element's index (the first of equal maxima, NaN never chosen over a
// value) over rows with repeated maxima at varied positions and lengths (multiples of 8 and
// not), signed zeros, infinities and NaNs (x[0] NaN included).
TEST(Sample, GreedyMatchesMaxElementOnTiesZerosInfinitiesAndNans) {
  std::mt19937 rng(5);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t V = 1 + static_cast<int64_t>(rng() % 300);
    std::vector<float> x(static_cast<size_t>(V));
    for (float& v : x) v = static_cast<float>(static_cast<int>(rng() % 7) - 3);  // many ties
    const int specials = static_cast<int>(rng() % 4);
    for (int k = 0; k < specials; ++k) {
      const float pick[] = {nan, inf, -inf, 0.0f, -0.0f};
      x[rng() % static_cast<size_t>(V)] = pick[rng() % 5];
    }
    if (trial % 50 == 0) x[0] = nan;
    sample_params p;
    p.logits = x.data();
    p.vocab = V;
    p.temperature = 0.0f;
    EXPECT_EQ(sample_cpu(p).token, std::max_element(x.begin(), x.end()) - x.begin())
        << "trial " << trial << ", V " << V;
  }
}

TEST(Sample, SameSeedAndCounterGiveSameToken) {
  std::vector<float> l(64);
  for (size_t i = 0; i < l.size(); ++i) l[i] = std::sin(static_cast<float>(i));
  sample_params p = params(l);
  p.temperature = 1.0f;
  p.seed = 42;
  int argmax_draws = 0;
  const auto top = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  for (uint64_t c = 0; c < 50; ++c) {
    p.counter = c;
    const int32_t t = sample_cpu(p).token;
    EXPECT_EQ(t, sample_cpu(p).token);
    argmax_draws += t == top ? 1 : 0;
  }
  // Different counters draw different tokens: the argmax has probability e / Σ e^sin(i) ≈ 0.033
  // here, so 50 draws expect 1.7 of it; 10 or more has probability below 1e-5 (binomial tail).
  EXPECT_LT(argmax_draws, 10) << "sampling at temperature 1 keeps returning the argmax";
}

TEST(Sample, TopKOneIsGreedy) {
  std::vector<float> l = {0.1f, 0.3f, 3.0f, 0.2f};
  sample_params p = params(l);
  p.temperature = 5.0f;
  p.top_k = 1;
  for (uint64_t c = 0; c < 100; ++c) {
    p.counter = c;
    EXPECT_EQ(sample_cpu(p).token, 2);
  }
}

TEST(Sample, FrequenciesFollowSoftmaxWithinTolerance) {
  const std::vector<float> l = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};  // p = 0.1 .. 0.4
  sample_params p = params(l);
  p.temperature = 1.0f;
  p.seed = 7;
  std::map<int32_t, int> count;
  const int n = 20000;
  for (int c = 0; c < n; ++c) {
    p.counter = static_cast<uint64_t>(c);
    ++count[sample_cpu(p).token];
  }
  for (int t = 0; t < 4; ++t) EXPECT_NEAR(count[t] / static_cast<double>(n), (t + 1) / 10.0, 0.015) << t;
}

// Only the nucleus is drawn from, and within it by renormalised probability: 4/7 and 3/7, not
// always the argmax. With n = 2000 draws the standard deviation of a frequency is
// sqrt(p(1-p)/n) ≈ 0.011; the bound 0.055 is 5 standard deviations.
TEST(Sample, TopPKeepsSmallestNucleus) {
  const std::vector<float> l = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  sample_params p = params(l);
  p.temperature = 1.0f;
  p.seed = 3;
  p.top_p = 0.65f;  // 0.4 + 0.3 ≥ 0.65 → tokens 3 and 2 only
  const int n = 2000;
  int count[4] = {0, 0, 0, 0};
  for (int c = 0; c < n; ++c) {
    p.counter = static_cast<uint64_t>(c);
    const int32_t t = sample_cpu(p).token;
    ASSERT_TRUE(t == 3 || t == 2) << t;
    ++count[t];
  }
  EXPECT_NEAR(count[3] / static_cast<double>(n), 4.0 / 7.0, 0.055);
  EXPECT_NEAR(count[2] / static_cast<double>(n), 3.0 / 7.0, 0.055);
}

TEST(Sample, RejectsBadValues) {
  const std::vector<float> l = {1.0f, 2.0f};
  sample_params p = params(l);
  p.temperature = -1.0f;
  EXPECT_THROW(sample_cpu(p), invalid_argument_error);
  p.temperature = 1.0f;
  p.top_p = 0.0f;
  EXPECT_THROW(sample_cpu(p), invalid_argument_error);
}

// The batched op of a step (sample_rows_params) is sample_cpu row by row: same tokens, same
// logprobs (or 0 without want_logprob), rows at a stride wider than the vocabulary.
TEST(SampleRows, EqualsSampleCpuRowByRow) {
  const int64_t V = 97, stride = 128, rows = 60;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(static_cast<size_t>(rows * stride), 50.0f);  // padding columns would win
  std::vector<sample_settings> s(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t v = 0; v < V; ++v) logits[static_cast<size_t>(r * stride + v)] = normal(rng);
    sample_settings& st = s[static_cast<size_t>(r)];
    st.temperature = r % 3 == 0 ? 0.0f : 0.5f + 0.25f * static_cast<float>(r % 4);
    st.top_k = r % 5 == 1 ? 10 : 0;
    st.top_p = r % 4 == 2 ? 0.8f : 1.0f;
    st.seed = 77 + static_cast<uint64_t>(r);
    st.counter = static_cast<uint64_t>(r * 7);
    st.want_logprob = r % 2;
  }
  std::vector<sample_output> out(static_cast<size_t>(rows));
  run_cpu(sample_rows_params{logits.data(), s.data(), out.data(), rows, V, stride});
  for (int64_t r = 0; r < rows; ++r) {
    const sample_settings& st = s[static_cast<size_t>(r)];
    sample_params p;
    p.logits = logits.data() + r * stride;
    p.vocab = V;
    p.temperature = st.temperature;
    p.top_k = st.top_k;
    p.top_p = st.top_p;
    p.seed = st.seed;
    p.counter = st.counter;
    p.want_logprob = st.want_logprob != 0;
    const sample_output want = sample_cpu(p);
    EXPECT_EQ(out[static_cast<size_t>(r)].token, want.token) << "row " << r;
    EXPECT_EQ(out[static_cast<size_t>(r)].logprob, want.logprob) << "row " << r;
    EXPECT_LT(out[static_cast<size_t>(r)].token, V);
  }
}

TEST(SampleRows, RejectsBadSettingsNamingTheField) {
  const std::vector<float> l = {1.0f, 2.0f};
  sample_settings s;
  sample_output o;
  s.top_k = -1;
  try {
    run_cpu(sample_rows_params{l.data(), &s, &o, 1, 2, 2});
    FAIL() << "top_k -1 accepted";
  } catch (const invalid_argument_error& e) {
    EXPECT_NE(std::string(e.what()).find("top_k"), std::string::npos) << e.what();
  }
  s.top_k = 0;
  s.want_logprob = 2;
  EXPECT_THROW(check_sample_settings(s), invalid_argument_error);
}

// The overlapped loop's token feed: sampled tokens scattered by slot, placeholders -(s + 1)
// resolved from it, other ids untouched.
TEST(LastToken, ScatterThenResolve) {
  const std::vector<sample_output> sampled = {{11, 0.f}, {22, 0.f}, {33, 0.f}};
  const std::vector<int32_t> slots = {2, -1, 0};
  std::vector<int32_t> last(4, 7);
  run_cpu(last_token_scatter_params{sampled.data(), slots.data(), last.data(), 3, 4});
  EXPECT_EQ(last, (std::vector<int32_t>{33, 7, 11, 7}));
  std::vector<int32_t> ids = {5, -1, -3, 0, -2};
  run_cpu(token_resolve_params{ids.data(), last.data(), static_cast<int64_t>(ids.size()), 4});
  EXPECT_EQ(ids, (std::vector<int32_t>{5, 33, 11, 0, 7}));
}


// The batched op (what a step samples with) draws from the truncated, tempered softmax, not the
// argmax: 8 tokens with p ∝ v + 1, one arm per setting, n = 6000 rows per arm that differ only
// in their counter. Each token's frequency is within 5 standard deviations (sqrt(p(1-p)/n)) of
// its exact probability, tokens outside the kept set never appear, and the argmax's share stays
// below its probability + 5 standard deviations, well under 1 (a sampler that degenerates to
// the argmax fails every arm). A correct sampler fails one of the 25 two-sided 5-sigma checks
// with probability about 25 · 6e-7 (the draws are seeded, so the outcome is fixed).
TEST(SampleRows, FrequenciesFollowTheTruncatedSoftmaxNotTheArgmax) {
  const int64_t V = 8, n = 6000;
  std::vector<float> row(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v) row[static_cast<size_t>(v)] = std::log(static_cast<float>(v + 1));
  struct arm {
    float temperature;
    int32_t top_k;
    float top_p;
    std::vector<double> prob;  // exact, per token
  };
  auto normalise = [](std::vector<double> w) {
    double z = 0;
    for (double x : w) z += x;
    for (double& x : w) x /= z;
    return w;
  };
  const std::vector<arm> arms = {
      {1.0f, 0, 1.0f, normalise({1, 2, 3, 4, 5, 6, 7, 8})},
      // T = 0.5 squares the weights.
      {0.5f, 0, 1.0f, normalise({1, 4, 9, 16, 25, 36, 49, 64})},
      // top_k 3: tokens 5, 6, 7.
      {1.0f, 3, 1.0f, normalise({0, 0, 0, 0, 0, 6, 7, 8})},
      // top_p 0.4: 8/36 = 0.222, + 7/36 = 0.417 ≥ 0.4 → tokens 7 and 6.
      {1.0f, 0, 0.4f, normalise({0, 0, 0, 0, 0, 0, 7, 8})},
  };
  for (size_t a = 0; a < arms.size(); ++a) {
    const arm& A = arms[a];
    std::vector<float> logits(static_cast<size_t>(n * V));
    std::vector<sample_settings> s(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) {
      std::copy(row.begin(), row.end(), logits.begin() + r * V);
      sample_settings& st = s[static_cast<size_t>(r)];
      st.temperature = A.temperature;
      st.top_k = A.top_k;
      st.top_p = A.top_p;
      st.seed = 1000 + a;
      st.counter = static_cast<uint64_t>(r);
    }
    std::vector<sample_output> out(static_cast<size_t>(n));
    run_cpu(sample_rows_params{logits.data(), s.data(), out.data(), n, V, V});
    std::vector<int64_t> count(static_cast<size_t>(V), 0);
    for (const sample_output& o : out) {
      ASSERT_GE(o.token, 0);
      ASSERT_LT(o.token, V);
      ++count[static_cast<size_t>(o.token)];
    }
    for (int64_t v = 0; v < V; ++v) {
      const double p = A.prob[static_cast<size_t>(v)];
      const double f = static_cast<double>(count[static_cast<size_t>(v)]) / static_cast<double>(n);
      if (p == 0.0) {
        EXPECT_EQ(count[static_cast<size_t>(v)], 0) << "arm " << a << ": token " << v << " is outside the kept set";
      } else {
        EXPECT_NEAR(f, p, 5.0 * std::sqrt(p * (1.0 - p) / static_cast<double>(n))) << "arm " << a << ", token " << v;
      }
    }
    const double p_top = A.prob[static_cast<size_t>(V - 1)];
    const double f_top = static_cast<double>(count[static_cast<size_t>(V - 1)]) / static_cast<double>(n);
    EXPECT_LT(f_top, p_top + 5.0 * std::sqrt(p_top * (1.0 - p_top) / static_cast<double>(n)))
        << "arm " << a << ": the argmax is drawn too often";
    EXPECT_LT(p_top, 0.7) << "arm " << a << ": the check would not tell sampling from the argmax";
  }
}

}  // namespace
}  // namespace hyserve::kernels
