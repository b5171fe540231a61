#pragma once
// The frame every hybrid architecture shares: the model interface, the vocab-parallel embedding,
// final norm and lm_head, the forward skeleton (embedding → layers → final norm → this rank's
// logits, run through the step driver), and loaders for the blocks the families have in common
// (Mamba2 mixer, attention, SwiGLU / relu² MLP) with Bamba's tensor-parallel sharding. A family
// is then the description of its layer stack (loading and one layer's forward) plus what is
// truly its own.
#include <memory>
#include <string>
#include <vector>

#include "families.h"
#include "hyserve/worker/model.h"
#include "layers.h"
#include "load_util.h"
#include "step_driver.h"
#include "weight_loader.h"
#include "weights.h"

namespace hyserve::worker {

// Per-row scales folded into a weight at load (muP multipliers): one entry scales the whole
// tensor; otherwise one entry per row of the loaded shard. Empty = 1.
using row_scales = std::vector<float>;

// Loads the shared blocks of layer prefixes for rank tp.rank of tp.size, in the weight type.
class block_loader {
 public:
  block_loader(weight_loader& ld, const model_config& mc, tp_placement tp, dtype weight_type)
      : ld_(ld), mc_(mc), tp_(tp), wt_(weight_type) {}

  // Mamba2 mixer (in_proj z | x | B | C | dt, conv1d, dt_bias, A_log, D, norm, out_proj): heads
  // split over tp, B/C groups split when n_groups % tp == 0, else one group per rank (replicated
  // when n_groups == 1; each of tp / n_groups ranks holding a copy when n_groups divides tp).
  // in_scale: scales of in_proj's output z | x | B | C | dt (5 entries; empty = 1) times
  // in_multiplier; out_scale scales out_proj.
  layers::mamba2_weights mamba2(const std::string& prefix, const std::vector<float>& in_scale = {},
                                float in_multiplier = 1.0f, float out_scale = 1.0f);
  // Attention q/k/v/o: query heads split, KV heads split or replicated. Scales fold input and
  // output multipliers into the projections.
  struct attention_scales {
    float q = 1.0f, k = 1.0f, v = 1.0f, o = 1.0f;
  };
  layers::attention_weights attention(const std::string& prefix, const attention_scales& s);
  layers::attention_weights attention(const std::string& prefix) { return attention(prefix, attention_scales{}); }
  // SwiGLU MLP gate/up/down of `inter` channels (split over tp); relu²: up/down only.
  layers::mlp_weights mlp(const std::string& prefix, int64_t inter, bool relu2 = false, float gate_scale = 1.0f,
                          float down_scale = 1.0f);

  int64_t groups_local() const;

 private:
  weight_loader& ld_;
  const model_config& mc_;
  tp_placement tp_;
  dtype wt_;
};

class hybrid_model : public model {
 public:
  // A layer's Mamba2 or attention mixer, with its cache index among the layers of its kind.
  struct mixer {
    layer_kind kind = layer_kind::kMamba2;
    layers::mamba2_weights mamba;
    layers::attention_weights attn;
    int32_t cache_index = 0;
  };
  // Where a family keeps its mixers and the multipliers it folds into them.
  struct mixer_source {
    std::string mamba_prefix, attention_prefix;
    std::vector<float> mamba_in_scale;  // block_loader::mamba2
    float mamba_in_multiplier = 1.0f, mamba_out_scale = 1.0f;
    block_loader::attention_scales attention;
  };
  const model_config& config() const override { return mc_; }
  // The Mamba2 state of this rank (heads split, groups split or replicated).
  mamba_state_shape mamba_shape() const override;
  int32_t kv_heads_local() const override;
  const kernels::exec_context& exec() const override { return ctx_; }
  void set_sparsity(const sparsity_section& sparsity) override { sparsity_ = sparsity; }
  const sparsity_section& sparsity() const override { return sparsity_; }
  tensor forward(const forward_batch& batch, const hybrid_metadata& meta, const model_context& ctx,
                 const forward_options& opts) override;

 protected:
  // label: the model in log lines ("Bamba"); the layer count is appended.
  hybrid_model(const family_args& a, const std::string& label);

  // The embedding table and lm_head (vocab-parallel, scaled by mc.embedding_multiplier and
  // mc.logits_multiplier; the lm_head is the embedding when tied) and the final norm.
  void load_globals(weight_loader& ld, const std::string& embed_name, const std::string& head_name);
  void set_final_norm(tensor norm);
  // Starts the step driver once the layers are loaded; blocker: an architecture's own reason
  // why decode cannot use CUDA graphs (empty: none).
  void start(const decode_graph_options& graphs, int32_t attention_layers, int32_t state_layers,
             const std::string& blocker = "");

  // Where a checkpoint keeps the embedding, lm_head and final norm, and the prefix of layer i
  // ("model.layers." for "model.layers.<i>.").
  struct checkpoint_names {
    std::string embed, lm_head, final_norm, layers;
  };
  // Layer `layer`'s mixer (its kind from mc.layer_kinds); the layer claims the next KV or state
  // cache layer (counted for start). Any other kind is a start-up error: "<label>: layer i "
  // followed by `otherwise`.
  mixer load_mixer(block_loader& blocks, int64_t layer, const mixer_source& src, const std::string& otherwise);
  // h += the mixer: a Mamba2 mixer with input_norm fused into its in_proj, attention on
  // rmsnorm(h; input_norm).
  void mixer_forward(mixer& m, tensor& h, const tensor& input_norm, const layers::step_inputs& in,
                     const model_context& ctx, const kernels::exec_context& ex);
  // The cache layers claimed by load_mixer so far.
  int32_t attention_layers() const { return n_attention_; }
  int32_t state_layers() const { return n_state_; }

  // One layer's forward: updates the hidden state h [T, hidden] in place.
  virtual void layer_forward(size_t layer, tensor& h, const layers::step_inputs& in, const model_context& ctx,
                             const kernels::exec_context& ex) = 0;
  virtual size_t layer_count() const = 0;

  // Blocks as the families run them, each adding its output into h (tp-reduced).
  // h += mamba2(rmsnorm(h; norm)) (the input norm fused into in_proj; norm null: x = h as is).
  void mamba2_block(layers::mamba2_weights& w, tensor& h, const tensor* norm, int32_t cache_index,
                    const layers::step_inputs& in, const model_context& ctx, const kernels::exec_context& ex);
  // h += attention(rmsnorm(h; input_norm)) (the input norm fused into the q | k | v projection).
  void attention_on(layers::attention_weights& w, tensor& h, const tensor& input_norm, int32_t cache_index,
                    const layers::step_inputs& in, const model_context& ctx, const kernels::exec_context& ex);
  // h += [mamba2 y | attention heads] · out_projᵀ: a Mamba2 mixer and attention side by side
  // after their stacked input projection (proj: z | xBC | dt, then q | k | v), with one output
  // projection over both outputs (out_proj: out_proj's columns, then o_proj's). The layer's
  // recurrent state and KV cache are both at cache_index.
  void parallel_mix_on(layers::mamba2_weights& mw, layers::attention_weights& aw, const tensor& out_proj,
                       const tensor& proj, tensor& h, int32_t cache_index, const layers::step_inputs& in,
                       const model_context& ctx, const kernels::exec_context& ex);
  // h += mlp(rmsnorm(h; norm)) (norm fused into the first projection).
  void mlp_block(layers::mlp_weights& w, tensor& h, const tensor& norm, const kernels::exec_context& ex);
  tensor norm(const tensor& h, const tensor& weight, const kernels::exec_context& ex) const;

  int64_t groups_local() const;
  const std::string& label() const { return label_; }

  model_config mc_;
  tp_placement tp_;
  collective* comm_;
  kernels::exec_context ctx_;
  dtype weight_type_ = dtype::kF32;  // linear layers, embedding, lm_head
  sparsity_section sparsity_;         // sparse Top-K decode attention

 private:
  tensor body(const layers::step_inputs& in, const model_context& ctx, const kernels::exec_context& ex,
              bool all_logits, std::vector<tensor>* hidden);

  std::string label_;
  int32_t n_attention_ = 0, n_state_ = 0;  // cache layers claimed by load_mixer
  int64_t vocab_local_ = 0;
  tensor embed_;       // [vocab_local, hidden]
  tensor final_norm_;  // [hidden]
  tensor lm_head_;     // [vocab_local, hidden]
  std::unique_ptr<step_driver> driver_;
};

// A family whose layers are all of one struct Layer: the stack, its load, and layer i's forward
// through forward_layer.
template <class Layer>
class layer_stack : public hybrid_model {
 protected:
  using hybrid_model::hybrid_model;

  // The load of a stack of block_loader layers: the globals and the final norm [hidden] in f32,
  // then load_layer(layer i, i, its prefix, ld, blocks) for each layer, with the load progress
  // on stderr. Every tensor goes straight to the model's device in its storage type
  // (weight_loader.h): on CUDA generated or streamed there, else through the host one tensor at
  // a time.
  template <class LoadLayer>
  void load_layers(const weight_source& ws, const checkpoint_names& names, LoadLayer&& load_layer) {
    load_progress progress(label(), mc_.num_layers);
    weight_loader ld(ws, ctx_);
    block_loader blocks(ld, mc_, tp_, weight_type_);
    load_globals(ld, names.embed, names.lm_head);
    set_final_norm(ld.load(names.final_norm, {mc_.hidden_size}, dtype::kF32));
    layers_.resize(static_cast<size_t>(mc_.num_layers));
    for (int64_t i = 0; i < mc_.num_layers; ++i) {
      load_layer(layers_[static_cast<size_t>(i)], i, names.layers + std::to_string(i) + ".", ld, blocks);
      progress.layer_done(i + 1, ld.bytes());
    }
  }

  // One layer's forward: updates the hidden state h [T, hidden] in place.
  virtual void forward_layer(Layer& L, size_t i, tensor& h, const layers::step_inputs& in, const model_context& ctx,
                             const kernels::exec_context& ex) = 0;

  std::vector<Layer> layers_;

 private:
  size_t layer_count() const final { return layers_.size(); }
  void layer_forward(size_t i, tensor& h, const layers::step_inputs& in, const model_context& ctx,
                     const kernels::exec_context& ex) final {
    forward_layer(layers_[i], i, h, in, ctx, ex);
  }
};

}  // namespace hyserve::worker
