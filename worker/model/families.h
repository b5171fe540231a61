#pragma once
// The hybrid families built on hybrid_model.h, one file each: Nemotron-H (nemotron_h.cpp),
// Granite-4.0-H (granite_moe_hybrid.cpp) and Falcon-H1 (falcon_h1.cpp). Arguments as make_bamba.
#include <memory>

#include "hyserve/worker/model.h"
#include "step_driver.h"
#include "weights.h"

namespace hyserve::worker {

std::unique_ptr<model> make_nemotron_h(const model_config& mc, const weight_source& weights, tp_placement tp,
                                       collective* comm, const kernels::exec_context& ctx,
                                       dtype weight_type = dtype::kF32, const sparsity_section& sparsity = {},
                                       const decode_graph_options& graphs = {});

std::unique_ptr<model> make_granite_moe_hybrid(const model_config& mc, const weight_source& weights, tp_placement tp,
                                               collective* comm, const kernels::exec_context& ctx,
                                               dtype weight_type = dtype::kF32, const sparsity_section& sparsity = {},
                                               const decode_graph_options& graphs = {});

std::unique_ptr<model> make_falcon_h1(const model_config& mc, const weight_source& weights, tp_placement tp,
                                      collective* comm, const kernels::exec_context& ctx,
                                      dtype weight_type = dtype::kF32, const sparsity_section& sparsity = {},
                                      const decode_graph_options& graphs = {});

}  // namespace hyserve::worker
