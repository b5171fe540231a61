#pragma once
// Bamba (BambaForCausalLM): Mamba2 and attention decoder layers, each followed by a SwiGLU MLP.
#include <memory>

#include "hyserve/worker/model.h"
#include "weights.h"

namespace hyserve::worker {

// weight_type (model.dtype, f32 or bf16): storage of the linear layers, embedding and lm_head.
std::unique_ptr<model> make_bamba(const model_config& mc, const weight_source& weights, tp_placement tp,
                                  collective* comm, const kernels::exec_context& ctx, dtype weight_type = dtype::kF32);

}  // namespace hyserve::worker
