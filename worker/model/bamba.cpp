#include "bamba.h"

#include <string>
#include <vector>

#include "hybrid_model.h"
#include "hyserve/common/error.h"
#include "load_util.h"

namespace hyserve::worker {
namespace {

// Each layer: input norm → Mamba2 or attention → residual; pre-FF norm → SwiGLU MLP → residual.
struct bamba_layer {
  tensor input_norm;
  tensor pre_ff_norm;
  hybrid_model::mixer mixer;  // Mamba2 or attention
  layers::mlp_weights mlp;
};

class bamba_model final : public hybrid_model {
 public:
  bamba_model(const model_config& mc, const weight_source& ws, tp_placement tp, collective* comm,
              const kernels::exec_context& ctx, dtype weight_type, const sparsity_section& sparsity,
              const decode_graph_options& graphs)
      : hybrid_model(mc, tp, comm, ctx, weight_type, sparsity, "Bamba") {
    if (mc.attention_bias) throw config_error("Bamba: attention_bias = true is not supported");
    if (mc.mlp_bias) throw config_error("Bamba: mlp_bias = true is not supported");
    if (mc.mamba_proj_bias) throw config_error("Bamba: mamba_proj_bias = true is not supported");
    const int64_t H = mc.hidden_size;
    load_layers(ws, {"model.embed_tokens.weight", "lm_head.weight", "model.final_layernorm.weight", "model.layers."},
                layers_, [&](bamba_layer& L, int64_t i, const std::string& p, weight_loader& ld, block_loader& blocks) {
                  L.input_norm = ld.load(p + "input_layernorm.weight", {H}, dtype::kF32);
                  L.pre_ff_norm = ld.load(p + "pre_ff_layernorm.weight", {H}, dtype::kF32);
                  L.mlp = blocks.mlp(p + "feed_forward.", mc.intermediate_size);
                  mixer_source src;
                  src.mamba_prefix = p + "mamba.";
                  src.attention_prefix = p + "self_attn.";
                  L.mixer = load_mixer(blocks, i, src,
                                       "is not a Mamba2 or attention layer; Bamba has only Mamba2 and attention layers");
                });
    start(graphs, attention_layers(), state_layers());
  }

 private:
  size_t layer_count() const override { return layers_.size(); }

  void layer_forward(size_t i, tensor& h, const layers::step_inputs& in, const model_context& ctx,
                     const kernels::exec_context& ex) override {
    bamba_layer& L = layers_[i];
    // Each block's output projection adds into h (block_output). The input norm of a Mamba2
    // block and the pre-FF norm are fused into the projection that reads them.
    mixer_forward(L.mixer, h, L.input_norm, in, ctx, ex);
    mlp_block(L.mlp, h, L.pre_ff_norm, ex);
  }

  std::vector<bamba_layer> layers_;
};

}  // namespace

std::unique_ptr<model> make_bamba(const model_config& mc, const weight_source& weights, tp_placement tp,
                                  collective* comm, const kernels::exec_context& ctx, dtype weight_type,
                                  const sparsity_section& sparsity, const decode_graph_options& graphs) {
  return std::make_unique<bamba_model>(mc, weights, tp, comm, ctx, weight_type, sparsity, graphs);
}

}  // namespace hyserve::worker
