#pragma once
// Sparse mixture of experts (Qwen3-Next): a softmax router picks the top-k experts of each token
// (weights renormalised to sum 1 when norm_topk_prob), each expert is a SwiGLU MLP, and a shared
// SwiGLU expert is added scaled by sigmoid(shared_gate · x).
// Tensor parallelism splits the intermediate dimension of every expert (routed and shared); the
// router and the shared gate are replicated, so all ranks route alike and one all-reduce sums the
// row-parallel partial outputs.
#include <cstdint>
#include <string>
#include <vector>

#include "hyserve/common/model_config.h"
#include "hyserve/common/tensor.h"
#include "hyserve/worker/collective.h"
#include "hyserve/worker/model.h"
#include "layers.h"
#include "weights.h"

namespace hyserve::worker::layers {

struct moe_weights {
  tensor router;                // [num_experts, hidden]
  std::vector<mlp_weights> experts;  // [num_experts], each [moe_inter_local, hidden] / [hidden, moe_inter_local]
  mlp_weights shared;                // [shared_inter_local, hidden] …; empty gate = no shared expert
  tensor shared_gate;           // [1, hidden]; empty = shared expert ungated
  int64_t top_k = 1;
  bool norm_topk_prob = true;
  // Route on the device (kernels moe_route) and run every expert over every token, weighted 0
  // where not routed: no host synchronisation (CUDA-graph decode), at num_experts / top_k times
  // the expert work. Chosen at load for small expert counts (dense_routing_pays).
  bool device_routing = false;
};

// Whether device routing pays for `experts` experts on `device` (CUDA and at most 16 experts:
// beyond that running every expert over every token costs more than the host round trip).
bool dense_routing_pays(int64_t experts, device_kind device);

// Rank tp.rank's shard of the Hugging Face Qwen3NextSparseMoeBlock under `prefix` (".../mlp."),
// experts stored one by one (experts.{e}.gate_proj/up_proj/down_proj).
moe_weights load_moe(const weight_source& ws, const std::string& prefix, const model_config& mc, tp_placement tp);

// Router, experts and shared gate in weight_type (model.dtype).
void place(moe_weights& w, device_kind device, dtype weight_type = dtype::kF32);

// x [T, hidden] → [T, hidden], reduced over tp. Host routing (default): over the router logits
// ([T, num_experts], copied back); experts run on ctx.device over gathered rows. Device routing:
// see moe_weights::device_routing.
tensor moe_forward(const moe_weights& w, const tensor& x, collective* comm, const exec_context& ctx);

}  // namespace hyserve::worker::layers
