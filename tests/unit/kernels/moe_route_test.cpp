// moe_route (kernels/row_ops.h) on the CPU: dense expert-major routing weights worked out from
// the softmax by hand, ties to the lower index, unnormalised weights, and parameter checks.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "hyserve/common/error.h"
#include "hyserve/kernels/row_ops.h"

namespace hyserve::kernels {
namespace {

// Softmax of one row in double (the reference the f32 op must match within 1e-6).
std::vector<double> softmax(const std::vector<float>& l) {
  double mx = l[0];
  for (float v : l) mx = std::max(mx, static_cast<double>(v));
  std::vector<double> p;
  double s = 0;
  for (float v : l) s += p.emplace_back(std::exp(v - mx));
  for (double& v : p) v /= s;
  return p;
}

TEST(MoeRoute, TopTwoRenormalisedExpertMajor) {
  // Token 0 prefers experts 2 then 0; token 1 prefers 3 then 1.
  const std::vector<float> logits = {1.0f, -1.0f, 2.0f, 0.0f,  //
                                     -2.0f, 0.5f, 0.0f, 3.0f};
  std::vector<float> w(4 * 3, -7.0f);  // weights_stride 3 > tokens: column 2 untouched
  moe_route_params p;
  p.logits = logits.data();
  p.weights = w.data();
  p.tokens = 2;
  p.experts = 4;
  p.top_k = 2;
  p.logits_stride = 4;
  p.weights_stride = 3;
  p.norm_topk_prob = true;
  run_cpu(p);
  const std::vector<double> p0 = softmax({1.0f, -1.0f, 2.0f, 0.0f}), p1 = softmax({-2.0f, 0.5f, 0.0f, 3.0f});
  EXPECT_NEAR(w[0 * 3 + 0], p0[0] / (p0[0] + p0[2]), 1e-6);
  EXPECT_EQ(w[1 * 3 + 0], 0.0f);
  EXPECT_NEAR(w[2 * 3 + 0], p0[2] / (p0[0] + p0[2]), 1e-6);
  EXPECT_EQ(w[3 * 3 + 0], 0.0f);
  EXPECT_EQ(w[0 * 3 + 1], 0.0f);
  EXPECT_NEAR(w[1 * 3 + 1], p1[1] / (p1[1] + p1[3]), 1e-6);
  EXPECT_EQ(w[2 * 3 + 1], 0.0f);
  EXPECT_NEAR(w[3 * 3 + 1], p1[3] / (p1[1] + p1[3]), 1e-6);
  for (int e = 0; e < 4; ++e) EXPECT_EQ(w[e * 3 + 2], -7.0f);  // beyond tokens
}

TEST(MoeRoute, TiesGoToTheLowerIndexAndRawProbabilitiesWithoutNorm) {
  const std::vector<float> logits = {0.5f, 1.0f, 1.0f, 1.0f};
  std::vector<float> w(4);
  moe_route_params p;
  p.logits = logits.data();
  p.weights = w.data();
  p.tokens = 1;
  p.experts = 4;
  p.top_k = 2;
  p.logits_stride = 4;
  p.weights_stride = 1;
  p.norm_topk_prob = false;
  run_cpu(p);
  const std::vector<double> pr = softmax(logits);
  EXPECT_EQ(w[0], 0.0f);
  EXPECT_NEAR(w[1], pr[1], 1e-6);
  EXPECT_NEAR(w[2], pr[2], 1e-6);
  EXPECT_EQ(w[3], 0.0f);  // tied with 1 and 2, higher index
}

TEST(MoeRoute, RejectsTopKAboveExperts) {
  const std::vector<float> logits(4);
  std::vector<float> w(4);
  moe_route_params p;
  p.logits = logits.data();
  p.weights = w.data();
  p.tokens = 1;
  p.experts = 4;
  p.top_k = 5;
  p.logits_stride = 4;
  p.weights_stride = 1;
  EXPECT_THROW(run_cpu(p), invalid_argument_error);
}

}  // namespace
}  // namespace hyserve::kernels
