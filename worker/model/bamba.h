#pragma once
// Bamba (BambaForCausalLM): Mamba2 and attention decoder layers, each followed by a SwiGLU MLP.
#include <memory>

#include "hyserve/worker/model.h"
#include "step_driver.h"
#include "weights.h"

namespace hyserve::worker {

// weight_type (model.dtype, f32 or bf16): storage of the linear layers, embedding and lm_head.
// sparsity: sparse Top-K decode attention (docs/ARCHITECTURE.md, Sparse Top-K attention; off by default). graphs: decode as CUDA
// graphs (step_driver.h; off by default).
std::unique_ptr<model> make_bamba(const model_config& mc, const weight_source& weights, tp_placement tp,
                                  collective* comm, const kernels::exec_context& ctx, dtype weight_type = dtype::kF32,
                                  const sparsity_section& sparsity = {}, const decode_graph_options& graphs = {});

}  // namespace hyserve::worker
