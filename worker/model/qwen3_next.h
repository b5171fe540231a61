#pragma once
// Qwen3-Next (Qwen3NextForCausalLM): Gated DeltaNet and gated attention decoder layers, each
// followed by a sparse MoE block (or a dense SwiGLU MLP), with zero-centred RMSNorms.
#include <memory>

#include "hyserve/common/config.h"
#include "hyserve/worker/model.h"
#include "step_driver.h"
#include "weights.h"

namespace hyserve::worker {

// weight_type (model.dtype, f32 or bf16): storage of the linear layers, embedding and lm_head.
// gdn_prefill (model.gdn_prefill): the GDN chunked-prefill kernel; auto follows weight_type.
std::unique_ptr<model> make_qwen3_next(const model_config& mc, const weight_source& weights, tp_placement tp,
                                       collective* comm, const kernels::exec_context& ctx,
                                       dtype weight_type = dtype::kF32, const sparsity_section& sparsity = {},
                                       const decode_graph_options& graphs = {},
                                       gdn_prefill_choice gdn_prefill = gdn_prefill_choice::kAuto);

}  // namespace hyserve::worker
