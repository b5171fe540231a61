// Bamba (BambaForCausalLM): Mamba2 and attention decoder layers, each followed by a SwiGLU MLP.
#include <string>
#include <vector>

#include "families.h"
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

class bamba_model final : public layer_stack<bamba_layer> {
 public:
  explicit bamba_model(const family_args& a) : layer_stack(a, "Bamba") {
    const model_config& mc = a.mc;
    if (mc.attention_bias) throw config_error("Bamba: attention_bias = true is not supported");
    if (mc.mlp_bias) throw config_error("Bamba: mlp_bias = true is not supported");
    if (mc.mamba_proj_bias) throw config_error("Bamba: mamba_proj_bias = true is not supported");
    const int64_t H = mc.hidden_size;
    load_layers(a.weights,
                {"model.embed_tokens.weight", "lm_head.weight", "model.final_layernorm.weight", "model.layers."},
                [&](bamba_layer& L, int64_t i, const std::string& p, weight_loader& ld, block_loader& blocks) {
                  L.input_norm = ld.load(p + "input_layernorm.weight", {H}, dtype::kF32);
                  L.pre_ff_norm = ld.load(p + "pre_ff_layernorm.weight", {H}, dtype::kF32);
                  L.mlp = blocks.mlp(p + "feed_forward.", mc.intermediate_size);
                  mixer_source src;
                  src.mamba_prefix = p + "mamba.";
                  src.attention_prefix = p + "self_attn.";
                  L.mixer = load_mixer(blocks, i, src,
                                       "is not a Mamba2 or attention layer; Bamba has only Mamba2 and attention layers");
                });
    start(a.graphs, attention_layers(), state_layers());
  }

 private:
  void forward_layer(bamba_layer& L, size_t, tensor& h, const layers::step_inputs& in, const model_context& ctx,
                     const kernels::exec_context& ex) override {
    // Each block's output projection adds into h (block_output). The input norm of a Mamba2
    // block and the pre-FF norm are fused into the projection that reads them.
    mixer_forward(L.mixer, h, L.input_norm, in, ctx, ex);
    mlp_block(L.mlp, h, L.pre_ff_norm, ex);
  }
};

}  // namespace

std::unique_ptr<model> make_bamba(const family_args& a) { return std::make_unique<bamba_model>(a); }

}  // namespace hyserve::worker
