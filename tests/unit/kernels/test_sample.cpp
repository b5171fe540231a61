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
  for (uint64_t c = 0; c < 50; ++c) {
    p.counter = c;
    EXPECT_EQ(sample_cpu(p).token, sample_cpu(p).token);
  }
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

TEST(Sample, TopPKeepsSmallestNucleus) {
  const std::vector<float> l = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  sample_params p = params(l);
  p.temperature = 1.0f;
  p.top_p = 0.65f;  // 0.4 + 0.3 ≥ 0.65 → tokens 3 and 2 only
  for (uint64_t c = 0; c < 2000; ++c) {
    p.counter = c;
    const int32_t t = sample_cpu(p).token;
    EXPECT_TRUE(t == 3 || t == 2) << t;
  }
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

}  // namespace
}  // namespace hyserve::kernels
