#pragma once
// The hybrid families, one file each: Bamba (bamba.cpp), Qwen3-Next (qwen3_next.cpp),
// Nemotron-H (nemotron_h.cpp), Granite-4.0-H (granite_moe_hybrid.cpp) and Falcon-H1
// (falcon_h1.cpp). Each builds its model from the same family_args.
#include <memory>

#include "hyserve/common/config.h"
#include "hyserve/worker/model.h"
#include "step_driver.h"
#include "weights.h"

namespace hyserve::worker {

// What every family's model is built from (make_model and make_draft_model fill it).
struct family_args {
  const model_config& mc;
  const weight_source& weights;
  tp_placement tp;
  collective* comm;
  const kernels::exec_context& ctx;
  // model.dtype (f32 or bf16): storage of the linear layers, embedding and lm_head.
  dtype weight_type = dtype::kF32;
  // Sparse Top-K decode attention (docs/ARCHITECTURE.md, Sparse Top-K attention; off by default).
  sparsity_section sparsity = {};
  // Decode as CUDA graphs (step_driver.h; off by default).
  decode_graph_options graphs = {};
  // model.gdn_prefill (Qwen3-Next only): the GDN chunked-prefill kernel; auto follows weight_type.
  gdn_prefill_choice gdn_prefill = gdn_prefill_choice::kAuto;
};

// Bamba (BambaForCausalLM): Mamba2 and attention decoder layers, each followed by a SwiGLU MLP.
std::unique_ptr<model> make_bamba(const family_args& a);
// Qwen3-Next (Qwen3NextForCausalLM): Gated DeltaNet and gated attention decoder layers, each
// followed by a sparse MoE block (or a dense SwiGLU MLP), with zero-centred RMSNorms.
std::unique_ptr<model> make_qwen3_next(const family_args& a);
std::unique_ptr<model> make_nemotron_h(const family_args& a);
std::unique_ptr<model> make_granite_moe_hybrid(const family_args& a);
std::unique_ptr<model> make_falcon_h1(const family_args& a);

}  // namespace hyserve::worker
