#include "qwen3_next.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "gated_attention.h"
#include "gdn_layer.h"
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
class qwen3_next_model final : public model {
 public:
  qwen3_next_model(const model_config& mc, const weight_source& ws, tp_placement tp, collective* comm,
                   const kernels::exec_context& ctx, dtype weight_type, const sparsity_section& sparsity,
                   const decode_graph_options& graphs)
      : mc_(mc), tp_(tp), comm_(comm), ctx_(ctx), weight_type_(weight_type), sparsity_(sparsity) {
    if (mc.attention_bias) throw config_error("Qwen3-Next: attention_bias = true is not supported");
    if (tp.size > 1 && !comm) throw config_error("Qwen3-Next: tp > 1 needs a collective");
    const int r = tp.rank, n = tp.size;
    const int64_t H = mc.hidden_size, V = mc.vocab_size;
    vocab_local_ = tp_split(V, n, "vocab_size");
    embed_ = ws.load_slice("model.embed_tokens.weight", {V, H}, 0, r * vocab_local_, (r + 1) * vocab_local_);
    final_norm_ = load_zero_centered_norm(ws, "model.norm.weight", H);
    const std::string head_name = mc.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    lm_head_ = ws.load_slice(head_name, {V, H}, 0, r * vocab_local_, (r + 1) * vocab_local_);
    kv_heads_local_ = tp_kv_heads(mc.num_attention_heads, mc.num_kv_heads, r, n).count;

    // Each layer is placed on the device (and converted to the weight type) as soon as it is
    // loaded: the host holds one layer's f32 weights at a time, not the whole model's.
    load_progress progress("Qwen3-Next, " + std::to_string(mc.num_layers) + " layers", mc.num_layers);
    place_globals();
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
          L.cache_index = n_recurrent++;
          break;
        case layer_kind::kAttention:
          L.attn = layers::load_gated_attention(ws, p + "self_attn.", mc, tp);
          L.cache_index = n_attn++;
          break;
        case layer_kind::kMamba2:
          throw config_error("Qwen3-Next: layer " + std::to_string(i) +
                             " is a Mamba2 layer; Qwen3-Next has only linear_attention and full_attention layers");
      }
      L.moe = mc.is_moe_layer(i);
      if (L.moe) {
        L.moe_block = layers::load_moe(ws, p + "mlp.", mc, tp);
        L.moe_block.device_routing = layers::dense_routing_pays(mc.num_experts, ctx.device);
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
    step_frame frame;
    frame.label = "Qwen3-Next, " + std::to_string(mc.num_layers) + " layers";
    frame.vocab_size = mc.vocab_size;
    frame.vocab_local = vocab_local_;
    frame.attention_layers = n_attn > 0;
    frame.comm = comm_;
    frame.ctx = ctx_;
    frame.sparsity = &sparsity_;
    std::string blocker = decode_graph_blocker(ctx_, graphs, tp.size);
    const bool host_moe = std::any_of(layers_.begin(), layers_.end(),
                                      [](const qwen3_next_layer& L) { return L.moe && !L.moe_block.device_routing; });
    if (blocker.empty() && host_moe)
      blocker = "MoE with " + std::to_string(mc.num_experts) + " experts routes on the host (device routing: <= 16)";
    driver_ = std::make_unique<step_driver>(frame, graphs, n_attn, n_recurrent, blocker);
  }

  const model_config& config() const override { return mc_; }

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

  int32_t kv_heads_local() const override { return static_cast<int32_t>(kv_heads_local_); }
  const kernels::exec_context& exec() const override { return ctx_; }
  void set_sparsity(const sparsity_section& sparsity) override { sparsity_ = sparsity; }
  const sparsity_section& sparsity() const override { return sparsity_; }

  tensor forward(const forward_batch& batch, const hybrid_metadata& meta, const model_context& ctx,
                 const forward_options& opts) override {
    return driver_->forward(batch, meta, ctx, opts,
                            [&](const layers::step_inputs& in, const kernels::exec_context& ex, bool all_logits,
                                std::vector<tensor>* hidden) { return body(in, ctx, ex, all_logits, hidden); });
  }

 private:
  // Embedding → layers → final norm → this rank's logits, on ex.
  tensor body(const layers::step_inputs& in, const model_context& ctx, const kernels::exec_context& ex,
              bool all_logits, std::vector<tensor>* hidden) {
    tensor h = layers::embed(in.token_ids.as<int32_t>(), in.num_tokens, embed_, tp_.rank * vocab_local_, comm_, ex);
    auto capture = [&](const tensor& t) {
      if (hidden) hidden->push_back(tensor::copy_of(t, device_kind::kCpu));
    };
    capture(h);

    for (qwen3_next_layer& L : layers_) {
      // The mixer's output projection adds into h (block_output).
      tensor x = layers::rmsnorm(h, L.input_norm, mc_.rms_norm_eps, ex);
      switch (L.kind) {
        case layer_kind::kGatedDeltaNet:
          layers::gdn_forward(L.gdn, x, in, ctx.mamba->layer(L.cache_index), comm_, ex,
                              ctx.mamba_steps ? &ctx.mamba_steps->layer(L.cache_index) : nullptr, &h);
          break;
        case layer_kind::kAttention:
          layers::gated_attention_forward(L.attn, x, in, ctx.kv->layer(L.cache_index), comm_, ex, &h);
          break;
        case layer_kind::kMamba2:
          throw error("Qwen3-Next: Mamba2 layer in a Qwen3-Next model");  // rejected at load
      }
      const tensor y_in = layers::rmsnorm(h, L.post_attention_norm, mc_.rms_norm_eps, ex);
      if (L.moe)
        layers::add_inplace(h, layers::moe_forward(L.moe_block, y_in, comm_, ex), ex);
      else
        layers::mlp_forward(L.mlp, y_in, comm_, ex, &h);
      capture(h);
    }

    // Final norm and lm_head only on the rows that need logits.
    const tensor rows =
        all_logits ? std::move(h) : layers::gather_rows(h, in.logit_rows.as<int32_t>(), in.n_logit_rows, ex);
    tensor normed = layers::rmsnorm(rows, final_norm_, mc_.rms_norm_eps, ex);
    if (hidden && all_logits) capture(normed);
    return layers::linear(normed, lm_head_, ex);
  }

  // Weights are loaded on the host and placed on the model's device once.
  void place_globals() {
    const device_kind d = ctx_.device;
    for (tensor* t : {&embed_, &lm_head_}) layers::place_weight(*t, d, weight_type_);
    layers::place(final_norm_, d);
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

  model_config mc_;
  tp_placement tp_;
  collective* comm_;
  kernels::exec_context ctx_;
  dtype weight_type_ = dtype::kF32;  // linear layers, embedding, lm_head
  sparsity_section sparsity_;         // sparse Top-K decode attention
  int64_t vocab_local_ = 0;
  int64_t kv_heads_local_ = 0;
  tensor embed_;       // [vocab_local, hidden]
  tensor final_norm_;  // [hidden], 1 + w
  tensor lm_head_;     // [vocab_local, hidden]
  std::vector<qwen3_next_layer> layers_;
  std::unique_ptr<step_driver> driver_;
};

}  // namespace

std::unique_ptr<model> make_qwen3_next(const model_config& mc, const weight_source& weights, tp_placement tp,
                                       collective* comm, const kernels::exec_context& ctx, dtype weight_type,
                                       const sparsity_section& sparsity, const decode_graph_options& graphs) {
  return std::make_unique<qwen3_next_model>(mc, weights, tp, comm, ctx, weight_type, sparsity, graphs);
}

}  // namespace hyserve::worker
