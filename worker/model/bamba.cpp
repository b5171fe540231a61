#include "bamba.h"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "hyserve/common/error.h"
#include "layers.h"
#include "load_util.h"
#include "step_driver.h"
#include "weight_loader.h"

namespace hyserve::worker {
namespace {

using range = std::pair<int64_t, int64_t>;

std::string layer_prefix(int64_t i) { return "model.layers." + std::to_string(i) + "."; }

// Splits n into tp equal parts; a dimension that does not divide is a startup error naming it.
int64_t split(int64_t n, int tp, const char* what) {
  if (n % tp != 0)
    throw config_error(std::string("tensor parallelism: ") + what + " = " + std::to_string(n) +
                       " is not divisible by tp = " + std::to_string(tp));
  return n / tp;
}

struct bamba_layer {
  layer_kind kind = layer_kind::kMamba2;
  tensor input_norm;
  tensor pre_ff_norm;
  layers::mamba2_weights mamba;
  layers::attention_weights attn;
  layers::mlp_weights mlp;
  int32_t cache_index = 0;  // index among layers of the same kind (KV or SSM state)
};

class bamba_model final : public model {
 public:
  bamba_model(const model_config& mc, const weight_source& ws, tp_placement tp, collective* comm,
              const kernels::exec_context& ctx, dtype weight_type, const sparsity_section& sparsity,
              const decode_graph_options& graphs)
      : mc_(mc), tp_(tp), comm_(comm), ctx_(ctx), weight_type_(weight_type), sparsity_(sparsity) {
    if (mc.attention_bias) throw config_error("Bamba: attention_bias = true is not supported");
    if (mc.mlp_bias) throw config_error("Bamba: mlp_bias = true is not supported");
    if (mc.mamba_proj_bias) throw config_error("Bamba: mamba_proj_bias = true is not supported");
    if (tp.size > 1 && !comm) throw config_error("Bamba: tp > 1 needs a collective");
    const int r = tp.rank, n = tp.size;
    const int64_t H = mc.hidden_size, V = mc.vocab_size;
    vocab_local_ = split(V, n, "vocab_size");
    // Every tensor goes straight to the model's device in its storage type (weight_loader.h): on
    // CUDA generated or streamed there, else through the host one tensor at a time.
    load_progress progress("Bamba, " + std::to_string(mc.num_layers) + " layers", mc.num_layers);
    weight_loader ld(ws, ctx);
    embed_ = ld.load_slice("model.embed_tokens.weight", {V, H}, 0, r * vocab_local_, (r + 1) * vocab_local_,
                           weight_type_);
    final_norm_ = ld.load("model.final_layernorm.weight", {H}, dtype::kF32);
    const std::string head_name = mc.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    lm_head_ = ld.load_slice(head_name, {V, H}, 0, r * vocab_local_, (r + 1) * vocab_local_, weight_type_);
    place_globals();
    int32_t n_attn = 0, n_mamba = 0;
    layers_.resize(static_cast<size_t>(mc.num_layers));
    for (int64_t i = 0; i < mc.num_layers; ++i) {
      bamba_layer& L = layers_[static_cast<size_t>(i)];
      const std::string p = layer_prefix(i);
      L.kind = mc.layer_kinds[static_cast<size_t>(i)];
      L.input_norm = ld.load(p + "input_layernorm.weight", {H}, dtype::kF32);
      L.pre_ff_norm = ld.load(p + "pre_ff_layernorm.weight", {H}, dtype::kF32);
      load_mlp(ld, p + "feed_forward.", L.mlp);
      switch (L.kind) {
        case layer_kind::kMamba2:
          load_mamba(ld, p + "mamba.", L.mamba);
          L.cache_index = n_mamba++;
          break;
        case layer_kind::kAttention:
          load_attention(ld, p + "self_attn.", L.attn);
          L.cache_index = n_attn++;
          break;
        case layer_kind::kGatedDeltaNet:
          throw config_error("Bamba: layer " + std::to_string(i) +
                             " is a Gated DeltaNet layer; Bamba has only Mamba2 and attention layers");
      }
      place_layer(L);
      progress.layer_done(i + 1, ld.bytes());
    }
    step_frame frame;
    frame.label = "Bamba, " + std::to_string(mc.num_layers) + " layers";
    frame.vocab_size = mc.vocab_size;
    frame.vocab_local = vocab_local_;
    frame.attention_layers = n_attn > 0;
    frame.comm = comm_;
    frame.ctx = ctx_;
    frame.sparsity = &sparsity_;
    driver_ = std::make_unique<step_driver>(frame, graphs, n_attn, n_mamba, decode_graph_blocker(ctx_, graphs, tp.size));
  }

  const model_config& config() const override { return mc_; }

  mamba_state_shape mamba_shape() const override {
    mamba_state_shape s;
    s.heads = static_cast<int32_t>(mc_.mamba_n_heads / tp_.size);
    s.head_dim = static_cast<int32_t>(mc_.mamba_d_head);
    s.d_state = static_cast<int32_t>(mc_.mamba_d_state);
    s.conv_width = static_cast<int32_t>(mc_.mamba_d_conv);
    s.conv_dim = static_cast<int32_t>(s.heads * s.head_dim + 2 * groups_local() * mc_.mamba_d_state);
    return s;
  }

  int32_t kv_heads_local() const override { return static_cast<int32_t>(kv_heads_local_value()); }
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
  // Embedding → layers → final norm → this rank's logits, on ex (no host synchronisation).
  tensor body(const layers::step_inputs& in, const model_context& ctx, const kernels::exec_context& ex,
              bool all_logits, std::vector<tensor>* hidden) {
    tensor h = layers::embed(in.token_ids.as<int32_t>(), in.num_tokens, embed_, tp_.rank * vocab_local_, comm_, ex);
    layers::profile(ex, "embed", 2 * layers::nbytes(h));
    auto capture = [&](const tensor& t) {
      if (hidden) hidden->push_back(tensor::copy_of(t, device_kind::kCpu));
    };
    capture(h);

    for (bamba_layer& L : layers_) {
      // Each block's output projection adds into h (block_output). The input norm of a Mamba2
      // block and the pre-FF norm are fused into the projection that reads them.
      switch (L.kind) {
        case layer_kind::kMamba2:
          layers::mamba2_forward(L.mamba, h, in, ctx.mamba->layer(L.cache_index), comm_, ex,
                                 ctx.mamba_steps ? &ctx.mamba_steps->layer(L.cache_index) : nullptr, &h,
                                 &L.input_norm, mc_.rms_norm_eps);
          break;
        case layer_kind::kAttention: {
          const tensor x = layers::rmsnorm(h, L.input_norm, mc_.rms_norm_eps, ex);
          layers::profile(ex, "norm.input", 2 * layers::nbytes(h) + layers::nbytes(L.input_norm));
          layers::attention_forward(L.attn, x, in, ctx.kv->layer(L.cache_index), comm_, ex, &h);
          break;
        }
        case layer_kind::kGatedDeltaNet:
          throw error("Bamba: Gated DeltaNet layer in a Bamba model");  // rejected at load
      }
      layers::mlp_forward(L.mlp, h, comm_, ex, &h, &L.pre_ff_norm, mc_.rms_norm_eps);
      capture(h);
    }

    // Final norm and lm_head only on the rows that need logits.
    const tensor rows =
        all_logits ? std::move(h) : layers::gather_rows(h, in.logit_rows.as<int32_t>(), in.n_logit_rows, ex);
    layers::profile(ex, "final.gather", 2 * layers::nbytes(rows));
    tensor logits;
    if (hidden && all_logits) {
      tensor normed = layers::rmsnorm(rows, final_norm_, mc_.rms_norm_eps, ex);
      capture(normed);
      logits = layers::linear(normed, lm_head_, ex);
    } else {
      logits = layers::norm_linear(rows, &final_norm_, mc_.rms_norm_eps, lm_head_, ex);  // final norm fused
    }
    layers::profile(ex, "lm_head", layers::nbytes(lm_head_) + 2 * layers::nbytes(rows) + layers::nbytes(logits));
    return logits;
  }

  // Weights are loaded in place (weight_loader); these only make sure of it.
  void place_globals() {
    const device_kind d = ctx_.device;
    for (tensor* t : {&embed_, &lm_head_}) layers::place_weight(*t, d, weight_type_);
    layers::place(final_norm_, d);
  }
  void place_layer(bamba_layer& L) {
    const device_kind d = ctx_.device;
    layers::place(L.input_norm, d);
    layers::place(L.pre_ff_norm, d);
    layers::place(L.mlp, d, weight_type_);
    if (L.kind == layer_kind::kMamba2) layers::place(L.mamba, d, weight_type_);
    if (L.kind == layer_kind::kAttention) layers::place(L.attn, d, weight_type_);
  }

  int64_t groups_local() const {
    // B/C groups split when n_groups % tp == 0, replicated when n_groups == 1.
    if (mc_.mamba_n_groups % tp_.size == 0) return mc_.mamba_n_groups / tp_.size;
    return 1;
  }

  int64_t kv_heads_local_value() const {
    return mc_.num_kv_heads >= tp_.size ? mc_.num_kv_heads / tp_.size : 1;
  }

  void load_mlp(weight_loader& ld, const std::string& p, layers::mlp_weights& w) {
    const int64_t H = mc_.hidden_size, I = mc_.intermediate_size;
    const int64_t il = split(I, tp_.size, "intermediate_size");
    const int64_t b = tp_.rank * il, e = b + il;
    w.gate = ld.load_slice(p + "gate_proj.weight", {I, H}, 0, b, e, weight_type_);
    w.up = ld.load_slice(p + "up_proj.weight", {I, H}, 0, b, e, weight_type_);
    w.down = ld.load_slice(p + "down_proj.weight", {H, I}, 1, b, e, weight_type_);
  }

  void load_attention(weight_loader& ld, const std::string& p, layers::attention_weights& w) {
    const int64_t H = mc_.hidden_size, nh = mc_.num_attention_heads, kvh = mc_.num_kv_heads, hd = mc_.head_dim;
    const int r = tp_.rank, n = tp_.size;
    const int64_t qh = split(nh, n, "num_attention_heads");
    int64_t kv_first = 0, kvl = 0;
    if (kvh % n == 0) {
      kvl = kvh / n;
      kv_first = r * kvl;
    } else if (n % kvh == 0) {  // replicate: each rank keeps the one KV head its query heads use
      kvl = 1;
      kv_first = (r * qh) / (nh / kvh);
    } else {
      throw config_error("tensor parallelism: num_key_value_heads = " + std::to_string(kvh) +
                         " neither divides nor is divisible by tp = " + std::to_string(n));
    }
    const dtype t = weight_type_;
    w.q = ld.load_slice(p + "q_proj.weight", {nh * hd, H}, 0, r * qh * hd, (r + 1) * qh * hd, t);
    w.k = ld.load_slice(p + "k_proj.weight", {kvh * hd, H}, 0, kv_first * hd, (kv_first + kvl) * hd, t);
    w.v = ld.load_slice(p + "v_proj.weight", {kvh * hd, H}, 0, kv_first * hd, (kv_first + kvl) * hd, t);
    w.o = ld.load_slice(p + "o_proj.weight", {H, nh * hd}, 1, r * qh * hd, (r + 1) * qh * hd, t);
    w.q_heads = qh;
    w.kv_heads = kvl;
    w.head_dim = hd;
    w.rotary_dim = mc_.rotary_dim();
    w.rope_theta = mc_.rope_theta;
  }

  // in_proj and out_proj in the weight type; conv, dt_bias, A_log, D and the norm in f32.
  void load_mamba(weight_loader& ld, const std::string& p, layers::mamba2_weights& w) {
    const int64_t H = mc_.hidden_size, nh = mc_.mamba_n_heads, hd = mc_.mamba_d_head, N = mc_.mamba_d_state;
    const int64_t G = mc_.mamba_n_groups, K = mc_.mamba_d_conv;
    const int r = tp_.rank, n = tp_.size;
    const int64_t di = nh * hd, conv = di + 2 * G * N, in_dim = di + conv + nh;
    const int64_t hl = split(nh, n, "mamba_n_heads");
    const int64_t dil = hl * hd;
    if (G % n != 0 && G != 1)
      throw config_error("tensor parallelism: mamba_n_groups = " + std::to_string(G) +
                         " must be 1 or divisible by tp = " + std::to_string(n));
    const int64_t gl = groups_local();
    const int64_t g0 = (G == 1) ? 0 : r * gl;  // first local group
    // Channel ranges of this shard inside xBC = [x (di) | B (G·N) | C (G·N)].
    const std::vector<range> xbc = {{r * dil, (r + 1) * dil},
                                    {di + g0 * N, di + (g0 + gl) * N},
                                    {di + G * N + g0 * N, di + G * N + (g0 + gl) * N}};
    std::vector<range> in_rows = {{r * dil, (r + 1) * dil}};  // z
    for (const range& c : xbc) in_rows.push_back({di + c.first, di + c.second});
    in_rows.push_back({di + conv + r * hl, di + conv + (r + 1) * hl});  // dt
    const dtype f32 = dtype::kF32;
    w.in_proj = ld.load_row_ranges(p + "in_proj.weight", {in_dim, H}, in_rows, weight_type_);
    w.conv_w = ld.load_row_ranges(p + "conv1d.weight", {conv, 1, K}, xbc, f32);
    w.conv_w.reshape({w.conv_w.shape()[0], K});
    if (mc_.mamba_conv_bias) w.conv_b = ld.load_row_ranges(p + "conv1d.bias", {conv}, xbc, f32);
    w.dt_bias = ld.load_slice(p + "dt_bias", {nh}, 0, r * hl, (r + 1) * hl, f32);
    w.A_log = ld.load_slice(p + "A_log", {nh}, 0, r * hl, (r + 1) * hl, f32);
    w.D = ld.load_slice(p + "D", {nh}, 0, r * hl, (r + 1) * hl, f32);
    w.norm = ld.load_slice(p + "norm.weight", {di}, 0, r * dil, (r + 1) * dil, f32);
    w.out_proj = ld.load_slice(p + "out_proj.weight", {H, di}, 1, r * dil, (r + 1) * dil, weight_type_);
    w.heads = hl;
    w.head_dim = hd;
    w.d_state = N;
    w.groups = gl;
    w.conv_width = K;
    w.chunk_size = mc_.mamba_chunk_size;
    // Gated norm groups follow the SSM groups: di / G channels each.
    w.norm_group_global = di / G;
    w.norm_group_size = std::min(w.norm_group_global, dil);
    w.dt_min = mc_.time_step_min;
    w.dt_max = mc_.time_step_max;
    w.eps = mc_.rms_norm_eps;
  }

  model_config mc_;
  tp_placement tp_;
  collective* comm_;
  kernels::exec_context ctx_;
  dtype weight_type_ = dtype::kF32;  // linear layers, embedding, lm_head
  sparsity_section sparsity_;         // sparse Top-K decode attention
  int64_t vocab_local_ = 0;
  tensor embed_;       // [vocab_local, hidden]
  tensor final_norm_;  // [hidden]
  tensor lm_head_;     // [vocab_local, hidden]
  std::vector<bamba_layer> layers_;
  std::unique_ptr<step_driver> driver_;
};

}  // namespace

std::unique_ptr<model> make_bamba(const model_config& mc, const weight_source& weights, tp_placement tp,
                                  collective* comm, const kernels::exec_context& ctx, dtype weight_type,
                                  const sparsity_section& sparsity, const decode_graph_options& graphs) {
  return std::make_unique<bamba_model>(mc, weights, tp, comm, ctx, weight_type, sparsity, graphs);
}

}  // namespace hyserve::worker
