// Falcon-H1 (FalconH1ForCausalLM): every layer runs attention and a Mamba2 mixer side by side on
// the same normed input, both outputs added into the residual, then a SwiGLU MLP. The muP
// multipliers (embedding, lm_head, attention in/out and key, SSM in/out and the per-part
// multipliers of in_proj's output z | x | B | C | dt, MLP gate/down) are folded into the
// weights they follow at load.
#include <string>
#include <utility>
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
  // The two mixers' input projections stacked (both read the normed input): Mamba2's in_proj
  // rows z | xBC | dt, then attention's q | k | v: one launch and one weight stream. mamba.in_proj
  // and attn.qkv are empty.
  tensor in_proj;
  // And their output projections side by side (both add into the residual): Mamba2's out_proj
  // columns, then attention's o_proj, over the row mamba y | attention heads: one launch, one
  // tensor-parallel reduction. mamba.out_proj and attn.o are empty.
  tensor out_proj;
  layers::mamba2_weights mamba;
  layers::attention_weights attn;
  layers::mlp_weights mlp;
};

class falcon_h1_model final : public layer_stack<falcon_h1_layer> {
 public:
  explicit falcon_h1_model(const family_args& a) : layer_stack(a, "Falcon-H1") {
    const model_config& mc = a.mc;
    if (mc.attention_bias) throw config_error("Falcon-H1: attention_bias = true is not supported");
    const int64_t H = mc.hidden_size;
    block_loader::attention_scales as;
    as.q = mc.attention_in_multiplier;
    as.k = mc.attention_in_multiplier * mc.key_multiplier;
    as.v = mc.attention_in_multiplier;
    as.o = mc.attention_out_multiplier;
    load_layers(a.weights,
                {"model.embed_tokens.weight", "lm_head.weight", "model.final_layernorm.weight", "model.layers."},
                [&](falcon_h1_layer& L, int64_t i, const std::string& p, weight_loader& ld, block_loader& blocks) {
                  if (mc.layer_kinds[static_cast<size_t>(i)] != layer_kind::kParallelHybrid)
                    throw config_error("Falcon-H1: layer " + std::to_string(i) +
                                       " is not a parallel attention + Mamba2 layer");
                  L.input_norm = ld.load(p + "input_layernorm.weight", {H}, dtype::kF32);
                  L.pre_ff_norm = ld.load(p + "pre_ff_layernorm.weight", {H}, dtype::kF32);
                  L.mamba = blocks.mamba2(p + "mamba.", mc.ssm_multipliers, mc.ssm_in_multiplier,
                                          mc.ssm_out_multiplier);
                  L.attn = blocks.attention(p + "self_attn.", as);
                  std::vector<tensor> parts;
                  parts.push_back(std::move(L.mamba.in_proj));
                  parts.push_back(std::move(L.attn.qkv));
                  L.in_proj = ld.stack_rows(std::move(parts));
                  std::vector<tensor> outs;
                  outs.push_back(std::move(L.mamba.out_proj));
                  outs.push_back(std::move(L.attn.o));
                  L.out_proj = ld.stack_cols(std::move(outs));
                  L.mlp = blocks.mlp(p + "feed_forward.", mc.intermediate_size, false, mc.mlp_gate_multiplier,
                                     mc.mlp_down_multiplier);
                });
    // Layer i holds KV cache layer i and recurrent state layer i.
    const auto n = static_cast<int32_t>(mc.num_layers);
    start(a.graphs, n, n);
  }

 private:
  void forward_layer(falcon_h1_layer& L, size_t i, tensor& h, const layers::step_inputs& in, const model_context& ctx,
                     const kernels::exec_context& ex) override {
    const auto idx = static_cast<int32_t>(i);
    // The input norm feeds only the stacked projection: one rmsnorm_linear op (one kernel at
    // decode on CUDA, the same bits as the norm and the GEMM apart). [T, mamba in_width + q | k | v]
    const tensor proj = layers::norm_linear(h, &L.input_norm, config().rms_norm_eps, L.in_proj, ex);
    layers::profile(ex, "norm+in_proj+qkv",
                    layers::nbytes(L.in_proj) + layers::nbytes(h) + layers::nbytes(L.input_norm) + layers::nbytes(proj));
    parallel_mix_on(L.mamba, L.attn, L.out_proj, proj, h, idx, in, ctx, ex);
    mlp_block(L.mlp, h, L.pre_ff_norm, ex);
  }
};

}  // namespace

std::unique_ptr<model> make_falcon_h1(const family_args& a) { return std::make_unique<falcon_h1_model>(a); }

}  // namespace hyserve::worker
