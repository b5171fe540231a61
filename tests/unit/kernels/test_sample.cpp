#include <gtest/gtest.h>

#include <cmath>
#include <map>
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

}  // namespace
}  // namespace hyserve::kernels
