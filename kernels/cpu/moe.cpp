// The reference of the routed-experts op (moe.h): route every token, group the (token, weight)
// pairs by expert, then for each expert in index order gather its tokens and run the gemm and
// swiglu ops (the arithmetic the MoE layer used before this op existed), adding w · y into out.
#include "hyserve/kernels/moe.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "hyserve/kernels/activation.h"
#include "hyserve/kernels/gemm.h"
#include "moe_shared.h"
#include "moe_validate.h"

namespace hyserve::kernels {

using namespace cpu_detail;

void moe_route_token(const float* l, int64_t experts, int64_t top_k, moe_scoring scoring, bool norm_topk_prob,
                     int32_t* ids, float* weights) {
  std::vector<float> score(static_cast<size_t>(experts));
  if (scoring == moe_scoring::kSoftmax) {
    const float mx = *std::max_element(l, l + experts);
    float sum = 0.0f;
    for (int64_t e = 0; e < experts; ++e) sum += (score[static_cast<size_t>(e)] = std::exp(l[e] - mx));
    for (float& s : score) s /= sum;
  } else {
    for (int64_t e = 0; e < experts; ++e) score[static_cast<size_t>(e)] = 1.0f / (1.0f + std::exp(-l[e]));
  }
  std::vector<int32_t> order(static_cast<size_t>(experts));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int32_t a, int32_t b) {
    const float sa = score[static_cast<size_t>(a)], sb = score[static_cast<size_t>(b)];
    return sa > sb || (sa == sb && a < b);
  });
  float top_sum = 0.0f;
  for (int64_t j = 0; j < top_k; ++j) top_sum += score[static_cast<size_t>(order[static_cast<size_t>(j)])];
  std::sort(order.begin(), order.begin() + top_k);
  for (int64_t j = 0; j < top_k; ++j) {
    const int32_t e = order[static_cast<size_t>(j)];
    ids[j] = e;
    weights[j] = norm_topk_prob ? score[static_cast<size_t>(e)] / top_sum : score[static_cast<size_t>(e)];
  }
}

void run_cpu(const moe_experts_params& p) {
  constexpr const char* op = "moe_experts";
  check_moe_experts_fields(p, op);
  const int64_t T = p.tokens, H = p.hidden, I = p.inter, E = p.experts, k = p.top_k;
  if (T == 0) return;
  if (!p.accumulate)
    for (int64_t t = 0; t < T; ++t) std::fill(p.out + t * p.out_stride, p.out + t * p.out_stride + H, 0.0f);

  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  std::vector<float> wts(static_cast<size_t>(T * k));
  for (int64_t t = 0; t < T; ++t)
    moe_route_token(p.router_logits + t * p.logits_stride, E, k, p.scoring, p.norm_topk_prob, ids.data() + t * k,
                    wts.data() + t * k);
  if (p.topk_ids) std::memcpy(p.topk_ids, ids.data(), ids.size() * sizeof(int32_t));
  if (p.topk_weights) std::memcpy(p.topk_weights, wts.data(), wts.size() * sizeof(float));

  // (token, weight) pairs per expert, tokens ascending.
  std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(E));
  std::vector<std::vector<float>> weights(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const auto e = static_cast<size_t>(ids[static_cast<size_t>(t * k + j)]);
      tokens[e].push_back(static_cast<int32_t>(t));
      weights[e].push_back(wts[static_cast<size_t>(t * k + j)]);
    }

  const size_t wsize = dtype_size(p.w_dtype);
  std::vector<float> xg, gate, up, act, y;
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<int32_t>& rows = tokens[static_cast<size_t>(e)];
    const auto n = static_cast<int64_t>(rows.size());
    if (n == 0) continue;
    xg.resize(static_cast<size_t>(n * H));
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(xg.data() + i * H, p.x + rows[static_cast<size_t>(i)] * p.x_stride, static_cast<size_t>(H) * sizeof(float));
    gate.resize(static_cast<size_t>(n * I));
    up.resize(static_cast<size_t>(n * I));
    act.resize(static_cast<size_t>(n * I));
    y.resize(static_cast<size_t>(n * H));
    const char* gu = static_cast<const char*>(p.gate_up) + static_cast<size_t>(e * 2 * I * H) * wsize;
    linear_cpu(xg.data(), gu, p.w_dtype, gate.data(), n, I, H);
    linear_cpu(xg.data(), gu + static_cast<size_t>(I * H) * wsize, p.w_dtype, up.data(), n, I, H);
    swiglu_params s;
    s.gate = gate.data();
    s.up = up.data();
    s.out = act.data();
    s.rows = n;
    s.cols = I;
    s.gate_stride = s.up_stride = s.out_stride = I;
    run_cpu(s);
    linear_cpu(act.data(), static_cast<const char*>(p.down) + static_cast<size_t>(e * H * I) * wsize, p.w_dtype,
               y.data(), n, H, I);
    const std::vector<float>& w = weights[static_cast<size_t>(e)];
    for (int64_t i = 0; i < n; ++i) {
      float* o = p.out + rows[static_cast<size_t>(i)] * p.out_stride;
      const float* yi = y.data() + i * H;
      const float wi = w[static_cast<size_t>(i)];
      for (int64_t c = 0; c < H; ++c) o[c] += wi * yi[c];
    }
  }
  if (p.shared_inter > 0) {
    const bool gated = p.shared_gate_w != nullptr;
    std::vector<float> sact(static_cast<size_t>(T * p.shared_inter)), ys(gated ? static_cast<size_t>(T * H) : 0),
        gl(gated ? static_cast<size_t>(T) : 0);
    run_moe_shared_unfused(p, sact.data(), ys.data(), gl.data(), [](const auto& q) { run_cpu(q); });
  }
}

}  // namespace hyserve::kernels
