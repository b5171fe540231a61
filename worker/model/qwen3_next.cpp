// Qwen3-Next (Qwen3NextForCausalLM): Gated DeltaNet and gated attention decoder layers, each
// followed by a sparse MoE block (or a dense SwiGLU MLP), with zero-centred RMSNorms.
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "families.h"
#include "gated_attention.h"
#include "gdn_layer.h"
#include "hybrid_model.h"
#include "hyserve/common/error.h"
#include "layers.h"
#include "load_util.h"
#include "moe_layer.h"
#include "step_driver.h"

namespace hyserve::worker {
namespace {

std::string layer_prefix(int64_t i) { return "model.layers." + std::to_string(i) + "."; }

struct qwen3_next_layer {
  layer_kind kind = layer_kind::kGatedDeltaNet;
  bool moe = false;
  tensor input_norm;           // [hidden], 1 + w
  tensor post_attention_norm;  // [hidden], 1 + w
  layers::gdn_weights gdn;
  layers::gated_attention_weights attn;
  layers::moe_weights moe_block;
  layers::mlp_weights mlp;
  int32_t cache_index = 0;  // index among layers of the same cache (KV or recurrent state)
};

// Every RMSNorm of the decoder (layer norms, q/k norms, the final norm) is zero-centred: it
// scales by 1 + w, and is loaded as the plain weight 1 + w. The GDN output norm is not.
class qwen3_next_model final : public layer_stack<qwen3_next_layer> {
 public:
  explicit qwen3_next_model(const family_args& a) : layer_stack(a, "Qwen3-Next") {
    const model_config& mc = a.mc;
    const weight_source& ws = a.weights;
    const tp_placement tp = a.tp;
    const dtype weight_type = a.weight_type;
    const kernels::gdn_prefill_kernel prefill_kernel = layers::gdn_prefill_for(a.gdn_prefill, weight_type);
    if (mc.attention_bias) throw config_error("Qwen3-Next: attention_bias = true is not supported");
    const int r = tp.rank, n = tp.size;
    const int64_t H = mc.hidden_size;
    tp_kv_heads(mc.num_attention_heads, mc.num_kv_heads, r, n);  // a split that does not fit is a start-up error
    weight_loader ld(ws, a.ctx);
    load_globals(ld, "model.embed_tokens.weight", "lm_head.weight");
    set_final_norm(load_zero_centered_norm(ws, "model.norm.weight", H));

    // Each layer is placed on the device (and converted to the weight type) as soon as it is
    // loaded: the host holds one layer's f32 weights at a time, not the whole model's.
    load_progress progress(label(), mc.num_layers);
    int32_t n_attn = 0, n_recurrent = 0;
    layers_.resize(static_cast<size_t>(mc.num_layers));
    for (int64_t i = 0; i < mc.num_layers; ++i) {
      qwen3_next_layer& L = layers_[static_cast<size_t>(i)];
      const std::string p = layer_prefix(i);
      L.kind = mc.layer_kinds[static_cast<size_t>(i)];
      L.input_norm = load_zero_centered_norm(ws, p + "input_layernorm.weight", H);
      L.post_attention_norm = load_zero_centered_norm(ws, p + "post_attention_layernorm.weight", H);
      switch (L.kind) {
        case layer_kind::kGatedDeltaNet:
          L.gdn = layers::load_gdn(ws, p + "linear_attn.", mc, tp);
          L.gdn.prefill_kernel = prefill_kernel;
          L.cache_index = n_recurrent++;
          break;
        case layer_kind::kAttention:
          L.attn = layers::load_gated_attention(ws, p + "self_attn.", mc, tp);
          L.cache_index = n_attn++;
          break;
        case layer_kind::kMamba2:
        case layer_kind::kMlp:
        case layer_kind::kParallelHybrid:
          throw config_error("Qwen3-Next: layer " + std::to_string(i) +
                             " is not a linear_attention or full_attention layer; Qwen3-Next has only those");
      }
      L.moe = mc.is_moe_layer(i);
      if (L.moe) {
        L.moe_block = layers::load_moe(ld, ws, p + "mlp.", mc, tp, weight_type);
      } else {
        const int64_t I = mc.intermediate_size;
        const int64_t il = tp_split(I, n, "intermediate_size");
        L.mlp.gate = ws.load_slice(p + "mlp.gate_proj.weight", {I, H}, 0, r * il, (r + 1) * il);
        L.mlp.up = ws.load_slice(p + "mlp.up_proj.weight", {I, H}, 0, r * il, (r + 1) * il);
        L.mlp.down = ws.load_slice(p + "mlp.down_proj.weight", {H, I}, 1, r * il, (r + 1) * il);
      }
      place_layer(L);
      progress.layer_done(i + 1);
    }
    start(a.graphs, n_attn, n_recurrent);
  }

  // The recurrent-state cache holds the GDN layers: conv window over q | k | v, state
  // [heads_v, V, K] (head_dim = V, d_state = K; kernels/gdn.h).
  mamba_state_shape mamba_shape() const override {
    const int64_t hk = mc_.linear_num_key_heads / tp_.size;
    const int64_t hv = mc_.linear_num_value_heads / tp_.size;
    mamba_state_shape s;
    s.heads = static_cast<int32_t>(hv);
    s.head_dim = static_cast<int32_t>(mc_.linear_value_head_dim);
    s.d_state = static_cast<int32_t>(mc_.linear_key_head_dim);
    s.conv_width = static_cast<int32_t>(mc_.linear_conv_kernel_dim);
    s.conv_dim = static_cast<int32_t>(2 * hk * mc_.linear_key_head_dim + hv * mc_.linear_value_head_dim);
    return s;
  }

 private:
  void forward_layer(qwen3_next_layer& L, size_t, tensor& h, const layers::step_inputs& in, const model_context& ctx,
                     const kernels::exec_context& ex) override {
    // The mixer's output projection adds into h (block_output). The Gated DeltaNet mixer's input
    // norm runs inside its in_proj (one rmsnorm_linear op, the same bits), gated attention's
    // inside its stacked q | k | v | gate projection.
    switch (L.kind) {
      case layer_kind::kGatedDeltaNet:
        layers::gdn_forward(L.gdn, h, in, ctx.mamba->layer(L.cache_index), comm_, ex,
                            ctx.mamba_steps ? &ctx.mamba_steps->layer(L.cache_index) : nullptr, &h, &L.input_norm,
                            mc_.rms_norm_eps);
        break;
      case layer_kind::kAttention:
        layers::gated_attention_forward(L.attn, h, in, ctx.kv->layer(L.cache_index), comm_, ex, &h, L.input_norm,
                                        mc_.rms_norm_eps);
        break;
      case layer_kind::kMamba2:
      case layer_kind::kMlp:
      case layer_kind::kParallelHybrid:
        throw error("Qwen3-Next: unexpected layer kind");  // rejected at load
    }
    // The MoE layer's router, experts and shared expert read one normed input; a dense MLP's
    // norm runs inside its gate/up projection.
    if (L.moe)
      layers::moe_forward(L.moe_block, h, L.post_attention_norm, mc_.rms_norm_eps, comm_, ex, &h);
    else
      layers::mlp_forward(L.mlp, h, comm_, ex, &h, &L.post_attention_norm, mc_.rms_norm_eps);
  }

  void place_layer(qwen3_next_layer& L) {
    const device_kind d = ctx_.device;
    layers::place(L.input_norm, d);
    layers::place(L.post_attention_norm, d);
    if (L.kind == layer_kind::kGatedDeltaNet) layers::place(L.gdn, d, weight_type_);
    if (L.kind == layer_kind::kAttention) layers::place(L.attn, d, weight_type_);
    if (L.moe)
      layers::place(L.moe_block, d, weight_type_);
    else
      layers::place(L.mlp, d, weight_type_);
  }
};

}  // namespace

std::unique_ptr<model> make_qwen3_next(const family_args& a) { return std::make_unique<qwen3_next_model>(a); }

}  // namespace hyserve::worker
