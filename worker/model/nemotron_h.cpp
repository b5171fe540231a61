// Nemotron-H (NemotronHForCausalLM): a stack of single-block layers, each `h += mixer(norm(h))`
// with the mixer a Mamba2 mixer ("M"), attention without positional embedding ("*") or a relu²
// MLP ("-"); weights under backbone.*.
#include <string>
#include <vector>

#include "families.h"
#include "hybrid_model.h"
#include "hyserve/common/error.h"
#include "hyserve/kernels/activation.h"
#include "hyserve/kernels/run.h"
#include "load_util.h"

namespace hyserve::worker {
namespace {

struct nemotron_h_layer {
  bool is_mlp = false;
  tensor norm;
  hybrid_model::mixer mixer;  // Mamba2 or attention (not is_mlp)
  layers::mlp_weights mlp;    // up / down only (relu²)
};

class nemotron_h_model final : public layer_stack<nemotron_h_layer> {
 public:
  explicit nemotron_h_model(const family_args& a) : layer_stack(a, "Nemotron-H") {
    const model_config& mc = a.mc;
    if (mc.mlp_act != mlp_activation::kRelu2) throw config_error("Nemotron-H: mlp_hidden_act must be relu2");
    if (a.ctx.device == device_kind::kCuda && mc.num_layers_of(layer_kind::kMlp) > 0 &&
        !kernels::has_cuda<kernels::relu2_params>())
      throw config_error("Nemotron-H: the relu2 MLP activation has no CUDA kernel in this build (device: cpu only)");
    const int64_t H = mc.hidden_size;
    load_layers(a.weights, {"backbone.embeddings.weight", "lm_head.weight", "backbone.norm_f.weight", "backbone.layers."},
                [&](nemotron_h_layer& L, int64_t i, const std::string& p, weight_loader& ld, block_loader& blocks) {
                  L.norm = ld.load(p + "norm.weight", {H}, dtype::kF32);
                  L.is_mlp = mc.layer_kinds[static_cast<size_t>(i)] == layer_kind::kMlp;
                  if (L.is_mlp) {
                    L.mlp = blocks.mlp(p + "mixer.", mc.intermediate_size, /*relu2=*/true);
                  } else {
                    mixer_source src;
                    src.mamba_prefix = src.attention_prefix = p + "mixer.";
                    L.mixer = load_mixer(blocks, i, src, "is not a Mamba2, attention or MLP layer (supported: M, *, -)");
                  }
                });
    start(a.graphs, attention_layers(), state_layers());
  }

 private:
  void forward_layer(nemotron_h_layer& L, size_t, tensor& h, const layers::step_inputs& in, const model_context& ctx,
                     const kernels::exec_context& ex) override {
    if (L.is_mlp) {
      mlp_block(L.mlp, h, L.norm, ex);
    } else {
      mixer_forward(L.mixer, h, L.norm, in, ctx, ex);
    }
  }
};

}  // namespace

std::unique_ptr<model> make_nemotron_h(const family_args& a) { return std::make_unique<nemotron_h_model>(a); }

}  // namespace hyserve::worker
