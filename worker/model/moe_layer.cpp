#include "moe_layer.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "hyserve/common/error.h"
#include "hyserve/kernels/device.h"
#include "hyserve/kernels/row_ops.h"
#include "hyserve/kernels/run.h"
#include "load_util.h"

namespace hyserve::worker::layers {

expert_stack::expert_stack(int64_t experts, int64_t inter_local, int64_t hidden, dtype type, device_kind device)
    : experts_(experts),
      inter_(inter_local),
      hidden_(hidden),
      gate_up_(type, {experts, 2 * inter_local, hidden}, device),
      down_(type, {experts, hidden, inter_local}, device) {}

namespace {

void copy_bytes(void* dst, const tensor& src, device_kind device) {
  if (device == device_kind::kCuda)
    kernels::device_copy_d2d(dst, src.data(), src.nbytes());
  else
    std::memcpy(dst, src.data(), src.nbytes());
}

}  // namespace

void expert_stack::set(int64_t e, const tensor& gate, const tensor& up, const tensor& down) {
  const shape_t gs{inter_, hidden_}, ds{hidden_, inter_};
  HYSERVE_CHECK(e >= 0 && e < experts_ && gate.shape() == gs && up.shape() == gs && down.shape() == ds &&
                    gate.type() == gate_up_.type() && up.type() == gate_up_.type() && down.type() == down_.type() &&
                    gate.device() == gate_up_.device() && up.device() == gate_up_.device() &&
                    down.device() == down_.device(),
                "expert_stack: expert " + std::to_string(e) + " gate " + gate.shape().str() + ", up " +
                    up.shape().str() + ", down " + down.shape().str() + " do not fit the stack");
  const size_t block = gate.nbytes();
  char* gu = static_cast<char*>(gate_up_.data()) + static_cast<size_t>(e) * 2 * block;
  copy_bytes(gu, gate, gate_up_.device());
  copy_bytes(gu + block, up, gate_up_.device());
  copy_bytes(static_cast<char*>(down_.data()) + static_cast<size_t>(e) * down.nbytes(), down, down_.device());
}

void expert_stack::finish(moe_weights& w) {
  w.gate_up = std::move(gate_up_);
  w.down = std::move(down_);
  w.num_experts = experts_;
  w.inter_local = inter_;
}

moe_weights load_moe(weight_loader& ld, const weight_source& ws, const std::string& prefix, const model_config& mc,
                     tp_placement tp, dtype weight_type) {
  const int64_t H = mc.hidden_size, E = mc.num_experts, I = mc.moe_intermediate_size;
  moe_weights w;
  w.top_k = mc.num_experts_per_tok;
  w.norm_topk_prob = mc.norm_topk_prob;
  w.router = ws.load(prefix + "gate.weight", {E, H});
  const int64_t il = tp_split(I, tp.size, "moe_intermediate_size");
  const int64_t b = tp.rank * il, end = b + il;
  expert_stack stack(E, il, H, weight_type, ld.device());
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = prefix + "experts." + std::to_string(e) + ".";
    const tensor gate = ld.load_slice(p + "gate_proj.weight", {I, H}, 0, b, end, weight_type);
    const tensor up = ld.load_slice(p + "up_proj.weight", {I, H}, 0, b, end, weight_type);
    const tensor down = ld.load_slice(p + "down_proj.weight", {H, I}, 1, b, end, weight_type);
    stack.set(e, gate, up, down);
  }
  stack.finish(w);
  if (mc.shared_expert_intermediate_size > 0) {
    const int64_t Is = mc.shared_expert_intermediate_size;
    const int64_t sl = tp_split(Is, tp.size, "shared_expert_intermediate_size");
    const int64_t sb = tp.rank * sl, se = sb + sl;
    const std::string p = prefix + "shared_expert.";
    w.shared.gate = ws.load_slice(p + "gate_proj.weight", {Is, H}, 0, sb, se);
    w.shared.up = ws.load_slice(p + "up_proj.weight", {Is, H}, 0, sb, se);
    w.shared.down = ws.load_slice(p + "down_proj.weight", {H, Is}, 1, sb, se);
    w.shared_gate = ws.load(prefix + "shared_expert_gate.weight", {1, H});
  }
  return w;
}

void place(moe_weights& w, device_kind device, dtype weight_type) {
  place_weight(w.router, device, weight_type);
  place_weight(w.gate_up, device, weight_type);
  place_weight(w.down, device, weight_type);
  place(w.shared, device, weight_type);
  place_weight(w.shared_gate, device, weight_type);
}

tensor moe_forward(const moe_weights& w, const tensor& h, const tensor& norm, float eps, collective* comm,
                   const exec_context& ctx, tensor* residual) {
  const int64_t T = h.shape()[0], H = h.shape()[1];
  const bool into = residual != nullptr && (comm == nullptr || comm->size() == 1);
  tensor out = into ? tensor() : tensor::f32({T, H}, ctx.device);
  tensor& dst = into ? *residual : out;
  if (T > 0) {
    tensor x;  // rmsnorm(h), written by the router's op
    const tensor logits = norm_linear(h, &norm, eps, w.router, ctx, false, &x);  // [T, E]
    profile(ctx, "moe.router", nbytes(w.router) + 2 * nbytes(h) + nbytes(norm) + nbytes(logits));
    kernels::moe_experts_params p;
    p.x = x.as<float>();
    p.router_logits = logits.as<float>();
    p.gate_up = w.gate_up.data();
    p.down = w.down.data();
    p.out = dst.as<float>();  // written whole, or added to (into the residual)
    p.accumulate = into;
    p.tokens = T;
    p.hidden = H;
    p.inter = w.inter_local;
    p.experts = w.num_experts;
    p.top_k = w.top_k;
    p.x_stride = p.out_stride = H;
    p.logits_stride = w.num_experts;
    p.scoring = w.scoring;
    p.norm_topk_prob = w.norm_topk_prob;
    p.w_dtype = w.gate_up.type();
    if (!w.shared.gate.empty()) {  // the shared expert, gated per token or not, in the same op
      p.shared_gate = w.shared.gate.data();
      p.shared_up = w.shared.up.data();
      p.shared_down = w.shared.down.data();
      p.shared_gate_w = w.shared_gate.empty() ? nullptr : w.shared_gate.data();
      p.shared_inter = w.shared.gate.shape()[0];
      HYSERVE_CHECK(w.shared.gate.type() == p.w_dtype && w.shared.up.type() == p.w_dtype &&
                        w.shared.down.type() == p.w_dtype && (w.shared_gate.empty() || w.shared_gate.type() == p.w_dtype),
                    "moe_forward: the shared expert's weights are not in the experts' type");
    }
    kernels::run(p, ctx);
    // The bytes of the experts the step can touch at most (the routing is on the device), and
    // the shared expert's.
    const int64_t touched = std::min(w.num_experts, T * w.top_k);
    const double shared = w.shared.gate.empty()
                              ? 0.0
                              : nbytes(w.shared.gate) + nbytes(w.shared.up) + nbytes(w.shared.down) +
                                    (w.shared_gate.empty() ? 0.0 : nbytes(w.shared_gate));
    profile(ctx, "moe.experts",
            (nbytes(w.gate_up) + nbytes(w.down)) * static_cast<double>(touched) / static_cast<double>(w.num_experts) +
                shared + 2 * nbytes(x));
  }
  if (into) return tensor();
  reduce_partial(out, comm);
  if (residual == nullptr) return out;
  add_inplace(*residual, out, ctx);
  return tensor();
}

}  // namespace hyserve::worker::layers
