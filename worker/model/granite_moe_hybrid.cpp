// Granite-4.0-H (GraniteMoeHybridForCausalLM): Mamba2 and attention layers, each followed by a
// top-k mixture of SwiGLU experts plus an ungated shared SwiGLU MLP (moe_layer.h). The muP
// multipliers are folded into the weights at load: the embedding (embedding_multiplier), every
// block's output projection (residual_multiplier), the lm_head (1 / logits_scaling); the
// attention's softmax scale is attention_multiplier. Attention has no positional embedding when
// position_embedding_type is "nope".
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "families.h"
#include "hybrid_model.h"
#include "hyserve/common/error.h"
#include "load_util.h"
#include "moe_layer.h"

namespace hyserve::worker {
namespace {

struct granite_layer {
  tensor input_norm;
  tensor post_attention_norm;
  hybrid_model::mixer mixer;  // Mamba2 or attention
  bool moe = false;
  layers::moe_weights moe_block;  // experts + the shared MLP (moe)
  layers::mlp_weights shared;     // the shared MLP alone (no experts)
};

// Rows [r0, r0 + n) and columns [c0, c0 + m) of a row-major [rows, cols] block at src, scaled.
host_tensor sub_block(const float* src, int64_t cols, int64_t r0, int64_t n, int64_t c0, int64_t m, float scale) {
  host_tensor t = tensor::f32({n, m});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) t.as<float>()[i * m + j] = src[(r0 + i) * cols + c0 + j] * scale;
  return t;
}

class granite_moe_hybrid_model final : public layer_stack<granite_layer> {
 public:
  explicit granite_moe_hybrid_model(const family_args& a) : layer_stack(a, "Granite-4.0-H") {
    const model_config& mc = a.mc;
    const weight_source& ws = a.weights;
    if (mc.attention_bias) throw config_error("Granite-4.0-H: attention_bias = true is not supported");
    const int64_t H = mc.hidden_size;
    const float rm = mc.residual_multiplier;
    mixer_source src;
    src.mamba_out_scale = rm;
    src.attention.o = rm;
    load_layers(ws, {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight", "model.layers."},
                [&](granite_layer& L, int64_t i, const std::string& p, weight_loader& ld, block_loader& blocks) {
                  L.input_norm = ld.load(p + "input_layernorm.weight", {H}, dtype::kF32);
                  L.post_attention_norm = ld.load(p + "post_attention_layernorm.weight", {H}, dtype::kF32);
                  src.mamba_prefix = p + "mamba.";
                  src.attention_prefix = p + "self_attn.";
                  L.mixer = load_mixer(blocks, i, src, "is not a Mamba2 or attention layer (supported: mamba, attention)");
                  layers::mlp_weights shared;
                  if (mc.shared_expert_intermediate_size > 0) shared = load_shared(ld, p + "shared_mlp.");
                  L.moe = mc.num_experts > 0;
                  if (L.moe) {
                    L.moe_block = load_experts(ld, ws, p + "block_sparse_moe.");
                    L.moe_block.shared = std::move(shared);
                    layers::place(L.moe_block, ctx_.device, weight_type_);
                  } else {
                    L.shared = std::move(shared);
                  }
                });
    start(a.graphs, attention_layers(), state_layers());
  }

 private:
  // shared_mlp.input_linear [2·Is, H] = gate | up; output_linear [H, Is] (· residual_multiplier).
  layers::mlp_weights load_shared(weight_loader& ld, const std::string& p) {
    const int64_t H = mc_.hidden_size, I = mc_.shared_expert_intermediate_size;
    const int64_t il = tp_split(I, tp_.size, "shared_intermediate_size");
    const int64_t b = tp_.rank * il, e = b + il;
    layers::mlp_weights w;
    w.gate = ld.load_slice(p + "input_linear.weight", {2 * I, H}, 0, b, e, weight_type_);
    w.up = ld.load_slice(p + "input_linear.weight", {2 * I, H}, 0, I + b, I + e, weight_type_);
    w.down = ld.load_selection(p + "output_linear.weight", {H, I}, weight_selection{1, {{b, e}}}, weight_type_,
                               {mc_.residual_multiplier});
    return w;
  }

  // Experts stored fused: input_linear [E, 2·I, H] (gate | up of each), output_linear [E, H, I];
  // router.layer [E, H] (replicated). Each rank keeps its slice of every expert's I channels.
  // With tp = 1 the checkpoint's layout is the stacked layout (moe_layer.h): input_linear goes
  // to the device as is (generated there for synthetic weights), output_linear scaled.
  layers::moe_weights load_experts(weight_loader& ld, const weight_source& ws, const std::string& p) {
    const int64_t H = mc_.hidden_size, E = mc_.num_experts, I = mc_.moe_intermediate_size;
    const int64_t il = tp_split(I, tp_.size, "intermediate_size");
    const int64_t b = tp_.rank * il;
    layers::moe_weights w;
    w.top_k = mc_.num_experts_per_tok;
    w.norm_topk_prob = true;  // softmax over the top-k router logits
    w.router = ws.load(p + "router.layer.weight", {E, H});
    if (tp_.size == 1) {
      w.gate_up = ld.load(p + "input_linear.weight", {E, 2 * I, H}, weight_type_);
      w.down = ld.load_selection(p + "output_linear.weight", {E, H, I}, {}, weight_type_, {mc_.residual_multiplier});
      w.num_experts = E;
      w.inter_local = I;
      return w;
    }
    const host_tensor in = ws.load(p + "input_linear.weight", {E, 2 * I, H});
    const host_tensor out = ws.load(p + "output_linear.weight", {E, H, I});
    // Stacked on the host in f32 (placed, converted to the weight type, by the caller).
    layers::expert_stack stack(E, il, H, dtype::kF32, device_kind::kCpu);
    for (int64_t e = 0; e < E; ++e) {
      const float* ie = in.as<float>() + e * 2 * I * H;
      stack.set(e, sub_block(ie, H, b, il, 0, H, 1.0f), sub_block(ie, H, I + b, il, 0, H, 1.0f),
                sub_block(out.as<float>() + e * H * I, I, 0, H, b, il, mc_.residual_multiplier));
    }
    stack.finish(w);
    return w;
  }

  void forward_layer(granite_layer& L, size_t, tensor& h, const layers::step_inputs& in, const model_context& ctx,
                     const kernels::exec_context& ex) override {
    mixer_forward(L.mixer, h, L.input_norm, in, ctx, ex);
    if (L.moe)
      layers::moe_forward(L.moe_block, h, L.post_attention_norm, mc_.rms_norm_eps, comm_, ex, &h);
    else
      mlp_block(L.shared, h, L.post_attention_norm, ex);
  }
};

}  // namespace

std::unique_ptr<model> make_granite_moe_hybrid(const family_args& a) {
  return std::make_unique<granite_moe_hybrid_model>(a);
}

}  // namespace hyserve::worker
