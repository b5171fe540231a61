#include "hyserve/worker/model.h"

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "families.h"
#include "hyserve/common/error.h"
#include "weights.h"

namespace hyserve::worker {

namespace {

// The model's context: the device and stream given, the kernel paths of the config.
kernels::exec_context with_config_paths(const service_config& cfg, const kernels::exec_context& given) {
  kernels::exec_context ctx = given;
  ctx.paths = cfg.kernels;
  return ctx;
}

// The model of the family a.mc.arch names; null for an architecture without one.
std::unique_ptr<model> make_family(const family_args& a) {
  switch (a.mc.arch) {
    case model_arch::kBamba: return make_bamba(a);
    case model_arch::kQwen3Next: return make_qwen3_next(a);
    case model_arch::kNemotronH: return make_nemotron_h(a);
    case model_arch::kGraniteMoeHybrid: return make_granite_moe_hybrid(a);
    case model_arch::kFalconH1: return make_falcon_h1(a);
  }
  return nullptr;
}

}  // namespace

std::unique_ptr<model> make_model(const service_config& cfg, const model_config& mc, tp_placement tp,
                                  collective* comm, const kernels::exec_context& given) {
  const kernels::exec_context ctx = with_config_paths(cfg, given);
  mc.validate();
  // model.dtype: the storage of linear-layer weights, embeddings and lm_head (norm and conv
  // weights, A_log, D and dt_bias stay float32). Checked before any weight is read.
  const dtype weight_type = cfg.model.weight_dtype;
  if (weight_type != dtype::kF32 && weight_type != dtype::kBF16)
    throw config_error("model.dtype: " + std::string(dtype_name(weight_type)) +
                       " is not supported by the model (supported: float32, bfloat16)");
  std::unique_ptr<weight_source> weights = cfg.model.synthetic ? make_synthetic_weights(cfg.model.synthetic->seed, cfg.model.synthetic->residual_scale)
                                                               : make_checkpoint_weights(cfg.model.path);
  // Decode batches up to the running-request bound are captured as CUDA graphs.
  decode_graph_options graphs;
  graphs.enabled = cuda_graphs_enabled(cfg);
  graphs.max_batch = std::min(cfg.scheduler.max_running, cfg.cache.max_requests);
  graphs.step_clock = !cfg.scheduler.step_trace.empty();
  if (auto m = make_family({mc, *weights, tp, comm, ctx, weight_type, cfg.sparsity, graphs, cfg.model.gdn_prefill}))
    return m;
  throw config_error("unknown model architecture");
}

std::unique_ptr<model> make_draft_model(const service_config& cfg, const model_config& mc, tp_placement tp,
                                        collective* comm, const kernels::exec_context& given) {
  if (cfg.speculative.algorithm != speculative_algorithm::kDraftModel) return nullptr;
  const kernels::exec_context ctx = with_config_paths(cfg, given);
  const draft_model_spec_section& d = cfg.speculative.draft_model;
  model_config dmc;
  std::unique_ptr<weight_source> weights;
  if (!d.path.empty()) {
    dmc = read_hf_config((std::filesystem::path(d.path) / "config.json").string());
    weights = make_checkpoint_weights(d.path);
  } else {
    if (d.synthetic_num_layers > mc.num_layers)
      throw config_error("speculative.draft_model.synthetic.num_layers: " + std::to_string(d.synthetic_num_layers) +
                         " exceeds the target's " + std::to_string(mc.num_layers) + " layers");
    dmc = mc;
    dmc.num_layers = d.synthetic_num_layers;
    dmc.layer_kinds.resize(static_cast<size_t>(d.synthetic_num_layers));
    std::erase_if(dmc.mlp_only_layers, [&](int64_t l) { return l >= dmc.num_layers; });
    weights = cfg.model.synthetic ? make_synthetic_weights(cfg.model.synthetic->seed, cfg.model.synthetic->residual_scale)
                                  : make_checkpoint_weights(cfg.model.path);
  }
  if (dmc.vocab_size != mc.vocab_size)
    throw config_error("speculative.draft_model: vocab_size " + std::to_string(dmc.vocab_size) +
                       " differs from the target's " + std::to_string(mc.vocab_size));
  dmc.validate();
  const dtype weight_type = cfg.model.weight_dtype;  // checked by make_model
  // The draft runs dense attention and eagerly (default sparsity and graph options).
  if (auto m = make_family({dmc, *weights, tp, comm, ctx, weight_type, {}, {}, cfg.model.gdn_prefill})) return m;
  throw config_error("speculative.draft_model: unknown model architecture");
}

}  // namespace hyserve::worker
