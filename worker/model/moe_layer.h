#pragma once
// Sparse mixture of experts (Qwen3-Next, Granite-4.0-H): a router picks the top-k experts of each
// token (softmax scores; weights renormalised to sum 1 when norm_topk_prob), each expert is a
// SwiGLU MLP, and a shared SwiGLU expert is added, scaled by sigmoid(shared_gate · x) when the
// family gates it (Qwen3-Next) or as is (Granite-4.0-H).
// The routed experts run as one op (kernels/moe.h: route, permute by expert, grouped GEMMs,
// weighted combine) with no host synchronisation on any device, so MoE decode is captured in the
// decode CUDA graphs. Expert weights are stacked: gate_up [E, 2·I_local, H] (each expert's gate
// rows, then its up rows) and down [E, H, I_local], in the model's weight type.
// Tensor parallelism splits the intermediate dimension of every expert (routed and shared); the
// router and the shared gate are replicated, so all ranks route alike and one all-reduce sums the
// row-parallel partial outputs.
#include <cstdint>
#include <string>
#include <vector>

#include "hyserve/common/model_config.h"
#include "hyserve/common/tensor.h"
#include "hyserve/kernels/moe.h"
#include "hyserve/worker/collective.h"
#include "hyserve/worker/model.h"
#include "layers.h"
#include "weight_loader.h"
#include "weights.h"

namespace hyserve::worker::layers {

struct moe_weights {
  tensor router;   // [num_experts, hidden]
  tensor gate_up;  // [num_experts, 2·inter_local, hidden]: gate rows [0, inter_local), up rows after
  tensor down;     // [num_experts, hidden, inter_local]
  int64_t num_experts = 0, inter_local = 0;
  mlp_weights shared;  // [shared_inter_local, hidden] …; empty gate = no shared expert
  tensor shared_gate;  // [1, hidden]; empty = shared expert ungated
  int64_t top_k = 1;
  bool norm_topk_prob = true;
  kernels::moe_scoring scoring = kernels::moe_scoring::kSoftmax;
};

// Stacked expert weights built one expert at a time on `device` in `type`: set(e, gate, up,
// down) copies expert e's [inter_local, hidden] gate and up and [hidden, inter_local] down
// (tensors of `type` on `device`) into place.
class expert_stack {
 public:
  expert_stack(int64_t experts, int64_t inter_local, int64_t hidden, dtype type, device_kind device);
  void set(int64_t e, const tensor& gate, const tensor& up, const tensor& down);
  // Moves the stacks into w (gate_up, down, num_experts, inter_local).
  void finish(moe_weights& w);

 private:
  int64_t experts_, inter_, hidden_;
  tensor gate_up_, down_;
};

// Rank tp.rank's shard of the Hugging Face Qwen3NextSparseMoeBlock under `prefix` (".../mlp."),
// experts stored one by one (experts.{e}.gate_proj/up_proj/down_proj), loaded straight into the
// stacks in weight_type on the loader's device.
moe_weights load_moe(weight_loader& ld, const weight_source& ws, const std::string& prefix, const model_config& mc,
                     tp_placement tp, dtype weight_type);

// Router, experts, shared expert and shared gate in weight_type (model.dtype).
void place(moe_weights& w, device_kind device, dtype weight_type = dtype::kF32);

// The block on x = rmsnorm(h; norm, eps): h [T, hidden] → [T, hidden], reduced over tp. The
// norm runs in the router's op (rmsnorm_linear with normed_out: no kernel of its own). residual:
// *residual += that instead (residual may be &h), and an empty tensor returned; with one rank
// the experts' combine and the shared expert add straight into it (no output tensor, no add
// kernel).
tensor moe_forward(const moe_weights& w, const tensor& h, const tensor& norm, float eps, collective* comm,
                   const exec_context& ctx, tensor* residual = nullptr);

}  // namespace hyserve::worker::layers
