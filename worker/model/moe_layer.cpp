#include "moe_layer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "hyserve/kernels/activation.h"
#include "hyserve/kernels/row_ops.h"
#include "hyserve/kernels/graph.h"
#include "hyserve/kernels/run.h"
#include "load_util.h"

namespace hyserve::worker::layers {

namespace {

void load_swiglu(const weight_source& ws, const std::string& p, int64_t hidden, int64_t inter, tp_placement tp,
                 const char* what, mlp_weights& w) {
  const int64_t il = tp_split(inter, tp.size, what);
  const int64_t b = tp.rank * il, e = b + il;
  w.gate = ws.load_slice(p + "gate_proj.weight", {inter, hidden}, 0, b, e);
  w.up = ws.load_slice(p + "up_proj.weight", {inter, hidden}, 0, b, e);
  w.down = ws.load_slice(p + "down_proj.weight", {hidden, inter}, 1, b, e);
}

// down · (silu(gate · x) ⊙ up · x) on this rank's slice of the intermediate dimension: a partial
// sum over tp.
tensor swiglu_partial(const mlp_weights& w, const tensor& x, const exec_context& ctx) {
  const tensor act = swiglu_linear(w, x, ctx);
  return linear(act, w.down, ctx);
}

}  // namespace

moe_weights load_moe(const weight_source& ws, const std::string& prefix, const model_config& mc, tp_placement tp) {
  const int64_t H = mc.hidden_size, E = mc.num_experts;
  moe_weights w;
  w.top_k = mc.num_experts_per_tok;
  w.norm_topk_prob = mc.norm_topk_prob;
  w.router = ws.load(prefix + "gate.weight", {E, H});
  w.experts.resize(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    load_swiglu(ws, prefix + "experts." + std::to_string(e) + ".", H, mc.moe_intermediate_size, tp,
                "moe_intermediate_size", w.experts[static_cast<size_t>(e)]);
  if (mc.shared_expert_intermediate_size > 0) {
    load_swiglu(ws, prefix + "shared_expert.", H, mc.shared_expert_intermediate_size, tp,
                "shared_expert_intermediate_size", w.shared);
    w.shared_gate = ws.load(prefix + "shared_expert_gate.weight", {1, H});
  }
  return w;
}

void place(moe_weights& w, device_kind device, dtype weight_type) {
  place_weight(w.router, device, weight_type);
  for (mlp_weights& e : w.experts) place(e, device, weight_type);
  place(w.shared, device, weight_type);
  place_weight(w.shared_gate, device, weight_type);
}

bool dense_routing_pays(int64_t experts, device_kind device) { return device == device_kind::kCuda && experts <= 16; }

namespace {

// Device routing: dense [E, T] weights, every expert over every token.
void routed_experts_dense(const moe_weights& w, const tensor& x, tensor& out, const exec_context& ctx) {
  const int64_t T = x.shape()[0], H = x.shape()[1];
  const int64_t E = static_cast<int64_t>(w.experts.size());
  if (T == 0) return;
  const tensor logits = linear(x, w.router, ctx);  // [T, E]
  tensor dense = tensor::f32({E, T}, ctx.device);
  kernels::moe_route_params r;
  r.logits = logits.as<float>();
  r.weights = dense.as<float>();
  r.tokens = T;
  r.experts = E;
  r.top_k = w.top_k;
  r.logits_stride = E;
  r.weights_stride = T;
  r.norm_topk_prob = w.norm_topk_prob;
  kernels::run(r, ctx);
  // Experts in index order, like the host path; unrouted tokens add 0 · y.
  for (int64_t e = 0; e < E; ++e) {
    const tensor ye = swiglu_partial(w.experts[static_cast<size_t>(e)], x, ctx);
    kernels::row_add_params p;
    p.x = ye.as<float>();
    p.out = out.as<float>();
    p.weights = dense.as<float>() + e * T;
    p.rows = T;
    p.cols = H;
    p.x_stride = p.out_stride = H;
    kernels::run(p, ctx);
  }
}

// Host routing: softmax over experts, the k largest (ties to the lower index), optionally
// renormalised. Tokens and their weights are then grouped by expert.
void host_routed_experts(const moe_weights& w, const tensor& x, tensor& out, const exec_context& ctx) {
  const int64_t T = x.shape()[0], H = x.shape()[1];
  const int64_t E = static_cast<int64_t>(w.experts.size()), k = w.top_k;
  const tensor logits = linear(x, w.router, ctx).to_host();  // [T, E]
  std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(E));
  std::vector<std::vector<float>> weights(static_cast<size_t>(E));
  std::vector<float> prob(static_cast<size_t>(E));
  std::vector<int64_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits.as<float>() + t * E;
    const float mx = *std::max_element(l, l + E);
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) sum += (prob[static_cast<size_t>(e)] = std::exp(l[e] - mx));
    for (float& p : prob) p /= sum;
    std::iota(order.begin(), order.end(), int64_t{0});
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
      return prob[static_cast<size_t>(a)] > prob[static_cast<size_t>(b)] ||
             (prob[static_cast<size_t>(a)] == prob[static_cast<size_t>(b)] && a < b);
    });
    float top_sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) top_sum += prob[static_cast<size_t>(order[static_cast<size_t>(j)])];
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = order[static_cast<size_t>(j)];
      tokens[static_cast<size_t>(e)].push_back(static_cast<int32_t>(t));
      weights[static_cast<size_t>(e)].push_back(w.norm_topk_prob ? prob[static_cast<size_t>(e)] / top_sum
                                                                 : prob[static_cast<size_t>(e)]);
    }
  }

  // Experts in index order, each over the tokens routed to it (distinct rows, so the weighted
  // scatter-add into out has no conflicts).
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<int32_t>& idx = tokens[static_cast<size_t>(e)];
    if (idx.empty()) continue;
    const tensor rows = upload_i32(idx, ctx);
    const tensor wt = tensor::from_host(weights[static_cast<size_t>(e)].data(), dtype::kF32,
                                        static_cast<int64_t>(idx.size()), ctx.device);
    const tensor ye = swiglu_partial(w.experts[static_cast<size_t>(e)], gather_rows(x, rows, ctx), ctx);
    kernels::row_add_params p;
    p.x = ye.as<float>();
    p.out = out.as<float>();
    p.out_rows = rows.as<int32_t>();
    p.weights = wt.as<float>();
    p.rows = static_cast<int64_t>(idx.size());
    p.cols = H;
    p.x_stride = p.out_stride = H;
    kernels::run(p, ctx);
  }
}

// Shared expert, gated per token. The gate is a scalar per token, so it scales this rank's
// partial sum before the reduction.
void shared_expert(const moe_weights& w, const tensor& x, tensor& out, const exec_context& ctx) {
  const int64_t T = x.shape()[0], H = x.shape()[1];
  if (!w.shared.gate.empty() && T > 0) {
    const tensor ys = swiglu_partial(w.shared, x, ctx);
    const tensor gl = w.shared_gate.empty() ? tensor() : linear(x, w.shared_gate, ctx);  // [T, 1]
    kernels::row_add_params p;
    p.x = ys.as<float>();
    p.out = out.as<float>();
    p.gate_logits = gl.empty() ? nullptr : gl.as<float>();
    p.gate_stride = 1;
    p.rows = T;
    p.cols = H;
    p.x_stride = p.out_stride = H;
    kernels::run(p, ctx);
  }
}

}  // namespace

tensor moe_forward(const moe_weights& w, const tensor& x, collective* comm, const exec_context& ctx) {
  const int64_t T = x.shape()[0], H = x.shape()[1];
  tensor out = tensor::f32({T, H}, ctx.device);
  // The experts accumulate into out: it starts from zero also where allocations are not
  // zero-filled (inside a CUDA graph capture).
  if (ctx.device == device_kind::kCuda) kernels::fill_zero_async(out.data(), out.nbytes(), ctx.stream);
  if (w.device_routing)
    routed_experts_dense(w, x, out, ctx);
  else
    host_routed_experts(w, x, out, ctx);
  shared_expert(w, x, out, ctx);
  reduce_partial(out, comm);
  return out;
}

}  // namespace hyserve::worker::layers
