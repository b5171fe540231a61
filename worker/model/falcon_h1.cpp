// Falcon-H1 (FalconH1ForCausalLM): every layer runs attention and a Mamba2 mixer side by side on
// the same normed input, both outputs added into the residual, then a SwiGLU MLP. The muP
// multipliers (embedding, lm_head, attention in/out and key, SSM in/out and the per-part
// multipliers of in_proj's output z | x | B | C | dt, MLP gate/down) are folded into the
// weights they follow at load.
#include <string>
#include <vector>

#include "families.h"
#include "hybrid_model.h"
#include "hyserve/common/error.h"
#include "load_util.h"

namespace hyserve::worker {
namespace {

struct falcon_h1_layer {
  tensor input_norm;
  tensor pre_ff_norm;
  layers::mamba2_weights mamba;
  layers::attention_weights attn;
  layers::mlp_weights mlp;
};

class falcon_h1_model final : public hybrid_model {
 public:
  falcon_h1_model(const model_config& mc, const weight_source& ws, tp_placement tp, collective* comm,
                  const kernels::exec_context& ctx, dtype weight_type, const sparsity_section& sparsity,
                  const decode_graph_options& graphs)
      : hybrid_model(mc, tp, comm, ctx, weight_type, sparsity, "Falcon-H1") {
    if (mc.attention_bias) throw config_error("Falcon-H1: attention_bias = true is not supported");
    const int64_t H = mc.hidden_size;
    block_loader::attention_scales as;
    as.q = mc.attention_in_multiplier;
    as.k = mc.attention_in_multiplier * mc.key_multiplier;
    as.v = mc.attention_in_multiplier;
    as.o = mc.attention_out_multiplier;
    load_layers(ws, {"model.embed_tokens.weight", "lm_head.weight", "model.final_layernorm.weight", "model.layers."},
                layers_,
                [&](falcon_h1_layer& L, int64_t i, const std::string& p, weight_loader& ld, block_loader& blocks) {
                  if (mc.layer_kinds[static_cast<size_t>(i)] != layer_kind::kParallelHybrid)
                    throw config_error("Falcon-H1: layer " + std::to_string(i) +
                                       " is not a parallel attention + Mamba2 layer");
                  L.input_norm = ld.load(p + "input_layernorm.weight", {H}, dtype::kF32);
                  L.pre_ff_norm = ld.load(p + "pre_ff_layernorm.weight", {H}, dtype::kF32);
                  L.mamba = blocks.mamba2(p + "mamba.", mc.ssm_multipliers, mc.ssm_in_multiplier,
                                          mc.ssm_out_multiplier);
                  L.attn = blocks.attention(p + "self_attn.", as);
                  L.mlp = blocks.mlp(p + "feed_forward.", mc.intermediate_size, false, mc.mlp_gate_multiplier,
                                     mc.mlp_down_multiplier);
                });
    // Layer i holds KV cache layer i and recurrent state layer i.
    const auto n = static_cast<int32_t>(mc.num_layers);
    start(graphs, n, n);
  }

 private:
  size_t layer_count() const override { return layers_.size(); }

  void layer_forward(size_t i, tensor& h, const layers::step_inputs& in, const model_context& ctx,
                     const kernels::exec_context& ex) override {
    falcon_h1_layer& L = layers_[i];
    const tensor x = norm(h, L.input_norm, ex);
    const auto idx = static_cast<int32_t>(i);
    mamba2_on(L.mamba, x, h, idx, in, ctx, ex);
    attention_on(L.attn, x, h, idx, in, ctx, ex);
    mlp_block(L.mlp, h, L.pre_ff_norm, ex);
  }

  std::vector<falcon_h1_layer> layers_;
};

}  // namespace

std::unique_ptr<model> make_falcon_h1(const model_config& mc, const weight_source& weights, tp_placement tp,
                                      collective* comm, const kernels::exec_context& ctx, dtype weight_type,
                                      const sparsity_section& sparsity, const decode_graph_options& graphs) {
  return std::make_unique<falcon_h1_model>(mc, weights, tp, comm, ctx, weight_type, sparsity, graphs);
}

}  // namespace hyserve::worker
