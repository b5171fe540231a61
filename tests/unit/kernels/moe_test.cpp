// The routed-experts op on the CPU (kernels/moe.h) against a naive per-token reference: route
// token by token (scores, the top k by score with ties to the lower index, renormalised or
// not), then each selected expert's SwiGLU MLP on that token alone in double, summed with its
// weight. Softmax and sigmoid scoring, f32 and bf16 weights, router ties, experts that get no
// token, accumulate into out. Outputs within 1e-5 + 1e-4·|ref|; routing (ids) exact, weights
// within 1e-6.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "hyserve/common/dtype.h"
#include "hyserve/kernels/moe.h"
#include "kernel_test_util.h"

namespace hyserve::kernels {
namespace {

using test::expect_close;
using test::random_floats;

struct moe_case {
  int64_t T, H, I, E, k;
  moe_scoring scoring = moe_scoring::kSoftmax;
  bool norm = true;
  bool bf16 = false;
  bool ties = false;        // logits on a coarse grid: many exact ties
  bool accumulate = false;
};

struct naive_out {
  std::vector<float> out;
  std::vector<int32_t> ids;
  std::vector<float> wts;
};

naive_out naive(const moe_case& c, const std::vector<float>& x, const std::vector<float>& logits,
                const std::vector<float>& gate_up, const std::vector<float>& down, const std::vector<float>& out0) {
  naive_out r;
  r.out = out0;
  for (int64_t t = 0; t < c.T; ++t) {
    const float* l = logits.data() + t * c.E;
    std::vector<float> s(static_cast<size_t>(c.E));
    if (c.scoring == moe_scoring::kSoftmax) {
      float mx = l[0];
      for (int64_t e = 1; e < c.E; ++e) mx = std::max(mx, l[e]);
      float sum = 0.0f;
      for (int64_t e = 0; e < c.E; ++e) sum += (s[static_cast<size_t>(e)] = std::exp(l[e] - mx));
      for (float& v : s) v /= sum;
    } else {
      for (int64_t e = 0; e < c.E; ++e) s[static_cast<size_t>(e)] = 1.0f / (1.0f + std::exp(-l[e]));
    }
    std::vector<int32_t> order(static_cast<size_t>(c.E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return s[static_cast<size_t>(a)] > s[static_cast<size_t>(b)]; });
    float top = 0.0f;
    for (int64_t j = 0; j < c.k; ++j) top += s[static_cast<size_t>(order[static_cast<size_t>(j)])];
    std::vector<int32_t> sel(order.begin(), order.begin() + c.k);
    std::sort(sel.begin(), sel.end());
    for (int32_t e : sel) {
      const float w = c.norm ? s[static_cast<size_t>(e)] / top : s[static_cast<size_t>(e)];
      r.ids.push_back(e);
      r.wts.push_back(w);
      const float* g = gate_up.data() + e * 2 * c.I * c.H;
      const float* u = g + c.I * c.H;
      const float* d = down.data() + e * c.H * c.I;
      const float* xt = x.data() + t * c.H;
      std::vector<double> act(static_cast<size_t>(c.I));
      for (int64_t i = 0; i < c.I; ++i) {
        double gv = 0, uv = 0;
        for (int64_t h = 0; h < c.H; ++h) {
          gv += static_cast<double>(g[i * c.H + h]) * xt[h];
          uv += static_cast<double>(u[i * c.H + h]) * xt[h];
        }
        act[static_cast<size_t>(i)] = gv / (1.0 + std::exp(-gv)) * uv;
      }
      for (int64_t h = 0; h < c.H; ++h) {
        double y = 0;
        for (int64_t i = 0; i < c.I; ++i) y += static_cast<double>(d[h * c.I + i]) * act[static_cast<size_t>(i)];
        r.out[static_cast<size_t>(t * c.H + h)] += static_cast<float>(w * y);
      }
    }
  }
  return r;
}

void check_case(const moe_case& c, uint32_t seed) {
  const std::string what = "T " + std::to_string(c.T) + " E " + std::to_string(c.E) + " k " + std::to_string(c.k) +
                           (c.scoring == moe_scoring::kSoftmax ? " softmax" : " sigmoid") + (c.norm ? " norm" : " raw") +
                           (c.bf16 ? " bf16" : " f32") + (c.ties ? " ties" : "") + (c.accumulate ? " accumulate" : "");
  const std::vector<float> x = random_floats(static_cast<size_t>(c.T * c.H), seed, -1, 1);
  std::vector<float> logits = random_floats(static_cast<size_t>(c.T * c.E), seed + 1, -3, 3);
  if (c.ties)
    for (float& v : logits) v = std::round(v);  // 7 distinct values
  // The upper half of the experts never wins (no tokens), unless k needs them.
  if (c.E >= 2 * c.k)
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t e = c.E / 2; e < c.E; ++e) logits[static_cast<size_t>(t * c.E + e)] = -20.0f;
  std::vector<float> gate_up = random_floats(static_cast<size_t>(c.E * 2 * c.I * c.H), seed + 2, -0.3f, 0.3f);
  std::vector<float> down = random_floats(static_cast<size_t>(c.E * c.H * c.I), seed + 3, -0.3f, 0.3f);
  std::vector<uint16_t> gate_up16, down16;
  if (c.bf16) {
    gate_up = test::round_bf16(gate_up);
    down = test::round_bf16(down);
    for (float v : gate_up) gate_up16.push_back(f32_to_bf16(v));
    for (float v : down) down16.push_back(f32_to_bf16(v));
  }
  const std::vector<float> out0 =
      c.accumulate ? random_floats(static_cast<size_t>(c.T * c.H), seed + 4) : std::vector<float>(c.T * c.H, 0.0f);
  const naive_out want = naive(c, x, logits, gate_up, down, out0);

  std::vector<float> out = c.accumulate ? out0 : std::vector<float>(static_cast<size_t>(c.T * c.H), 123.0f);
  std::vector<int32_t> ids(static_cast<size_t>(c.T * c.k), -1);
  std::vector<float> wts(static_cast<size_t>(c.T * c.k), -1.0f);
  moe_experts_params p;
  p.x = x.data();
  p.router_logits = logits.data();
  p.gate_up = c.bf16 ? static_cast<const void*>(gate_up16.data()) : gate_up.data();
  p.down = c.bf16 ? static_cast<const void*>(down16.data()) : down.data();
  p.w_dtype = c.bf16 ? dtype::kBF16 : dtype::kF32;
  p.out = out.data();
  p.topk_ids = ids.data();
  p.topk_weights = wts.data();
  p.tokens = c.T;
  p.hidden = c.H;
  p.inter = c.I;
  p.experts = c.E;
  p.top_k = c.k;
  p.x_stride = p.out_stride = c.H;
  p.logits_stride = c.E;
  p.scoring = c.scoring;
  p.norm_topk_prob = c.norm;
  p.accumulate = c.accumulate;
  run_cpu(p);
  EXPECT_EQ(ids, want.ids) << what;
  expect_close(wts, want.wts, 1e-6, 1e-6, what + " weights");
  expect_close(out, want.out, 1e-5, 1e-4, what + " out");
}

TEST(MoeExperts, CpuMatchesNaivePerToken) {
  uint32_t seed = 10;
  const moe_case cases[] = {
      {5, 16, 8, 8, 2},
      {7, 24, 16, 8, 3, moe_scoring::kSoftmax, false},
      {6, 16, 8, 6, 2, moe_scoring::kSigmoid, true},
      {6, 16, 8, 6, 2, moe_scoring::kSigmoid, false},
      {9, 32, 16, 16, 4, moe_scoring::kSoftmax, true, true},
      {9, 32, 16, 16, 4, moe_scoring::kSoftmax, true, false, true},
      {9, 32, 16, 16, 4, moe_scoring::kSigmoid, true, true, true},
      {4, 16, 8, 4, 4, moe_scoring::kSoftmax, true, false, false, true},
      {1, 16, 8, 64, 10, moe_scoring::kSoftmax, true, true, true},
      {3, 8, 8, 4, 1},
  };
  for (const moe_case& c : cases) check_case(c, seed += 10);
}

TEST(MoeExperts, TiesGoToTheLowerExpert) {
  // All logits equal: the first k experts win, each with weight 1/k (normalised).
  const int64_t E = 8, k = 3;
  const std::vector<float> logits(static_cast<size_t>(E), 0.5f);
  int32_t ids[k];
  float wts[k];
  moe_route_token(logits.data(), E, k, moe_scoring::kSoftmax, true, ids, wts);
  for (int j = 0; j < k; ++j) {
    EXPECT_EQ(ids[j], j);
    EXPECT_FLOAT_EQ(wts[j], 1.0f / 3.0f);
  }
  // A tie at the cut: experts 5 and 2 share the k-th score; 2 wins.
  const float l2[E] = {0.0f, 3.0f, 1.0f, 0.0f, 4.0f, 1.0f, 0.0f, 0.0f};
  moe_route_token(l2, E, k, moe_scoring::kSigmoid, false, ids, wts);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
  EXPECT_EQ(ids[2], 4);
}

TEST(MoeExperts, ZeroTokensAndInvalidFields) {
  moe_experts_params p;
  p.hidden = 8;
  p.inter = 8;
  p.experts = 4;
  p.top_k = 2;
  run_cpu(p);  // no tokens: nothing read or written
  p.top_k = 5;
  test::expect_invalid([&] { run_cpu(p); }, "top_k");
  p.top_k = 2;
  p.w_dtype = dtype::kI32;
  test::expect_invalid([&] { run_cpu(p); }, "w_dtype");
  p.w_dtype = dtype::kF32;
  p.tokens = 1;
  test::expect_invalid([&] { run_cpu(p); }, "x");
}

}  // namespace
}  // namespace hyserve::kernels
