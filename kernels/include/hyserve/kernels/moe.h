#pragma once
// Routed experts of a sparse mixture-of-experts block in one op: route, run the top-k SwiGLU
// experts of every token, combine; then, optionally, the block's shared expert. The router's
// linear layer (logits = x · routerᵀ) stays outside (the caller's linear op).
//
// For token t (logits l = router_logits[t, :], E experts):
//   score_e = softmax(l)_e (kSoftmax) or sigmoid(l_e) (kSigmoid);
//   S = the top_k experts by score, ties to the lower expert index;
//   w_e = score_e / Σ_{S} score (norm_topk_prob; the sum taken in selection order) or score_e;
//   out[t, :] (= or +=, accumulate) Σ_{e ∈ S, ascending e} w_e · down_e · (silu(gate_e · x) ⊙ up_e · x)
// with x = x[t, :] and expert e's weights gate_e = gate_up[e, 0:inter, :], up_e =
// gate_up[e, inter:2·inter, :] ([inter, hidden] each, row-major) and down_e = down[e] [hidden,
// inter]. The terms are added in ascending expert order into out (starting from 0, or from out
// when accumulate), as a loop over experts in index order adds them.
//
// Weights are w_dtype (f32 or bf16, both tensors); x, the logits and out are f32.
// CPU op (kernels/cpu/moe.cpp): the reference. Groups the tokens of each expert and runs the
// gemm and swiglu ops on them (f32 activations, bf16 weights widened), experts in index order.
// CUDA op (kernels/cuda/moe.cu): no host synchronisation (capturable in a CUDA graph): a fused
// router kernel (scores, top-k, renormalisation, per-expert counts), a prefix sum of the counts
// on the device, a scatter that permutes the (token, slot) pairs by expert, two grouped GEMMs
// over all active experts (gate/up with the SwiGLU in the epilogue, then down) on the tensor
// cores (mma.sync bf16, f32 accumulation), and the weighted combine fused into the un-permute.
// With bf16 weights, x and the SwiGLU activations are rounded to bf16 (the GEMM operands);
// with f32 weights each f32 operand is split into two bf16 terms (hi + lo, three products:
// about 1e-5 relative, near the CPU op's f32). Its grid depends only on tokens, top_k, experts
// and the sizes (never on the routing), so a replay with other routing is valid.
//
// Optional outputs topk_ids / topk_weights [tokens, top_k] (row stride top_k): each token's
// selected experts in ascending index order with their weights (tests; null = not written).
//
// Tensor parallelism: every expert's intermediate dimension is split (inter is the local
// slice); the caller all-reduces out. Expert parallelism would split the expert dimension:
// the layout [experts, …] keeps each expert's weights contiguous for that.
#include <cstdint>

#include "hyserve/common/dtype.h"

namespace hyserve::kernels {

enum class moe_scoring : uint8_t { kSoftmax, kSigmoid };

struct moe_experts_params {
  const float* __restrict__ x = nullptr;              // [tokens, hidden], row stride x_stride
  const float* __restrict__ router_logits = nullptr;  // [tokens, experts], row stride logits_stride
  const void* __restrict__ gate_up = nullptr;         // w_dtype [experts, 2·inter, hidden]
  const void* __restrict__ down = nullptr;            // w_dtype [experts, hidden, inter]
  float* out = nullptr;                               // [tokens, hidden], row stride out_stride
  int32_t* topk_ids = nullptr;                        // optional [tokens, top_k]
  float* topk_weights = nullptr;                      // optional [tokens, top_k]
  int64_t tokens = 0, hidden = 0, inter = 0, experts = 0, top_k = 1;
  int64_t x_stride = 0, logits_stride = 0, out_stride = 0;
  moe_scoring scoring = moe_scoring::kSoftmax;
  bool norm_topk_prob = true;
  bool accumulate = false;  // out += the experts' sum (else out =)
  dtype w_dtype = dtype::kF32;
  // Optional shared expert, added after the routed experts (shared_inter 0: none):
  //   a = silu(x · shared_gateᵀ) ⊙ (x · shared_upᵀ)            f32 [tokens, shared_inter]
  //   out += a · shared_downᵀ                                   (shared_gate_w null)
  //   out += sigmoid(x · shared_gate_wᵀ) · (a · shared_downᵀ)   (one gate value a token)
  // computed as the swiglu_linear, gemm (beta 1 into out, or beta 0) and row_add ops compute
  // them, in that order: bit for bit what a layer running those ops after this op gets. Weights
  // in w_dtype: shared_gate, shared_up [shared_inter, hidden], shared_down [hidden,
  // shared_inter], shared_gate_w [1, hidden], all row-major.
  const void* shared_gate = nullptr;
  const void* shared_up = nullptr;
  const void* shared_down = nullptr;
  const void* shared_gate_w = nullptr;
  int64_t shared_inter = 0;
};

void run_cpu(const moe_experts_params& p);
void run_cuda(const moe_experts_params& p, void* stream = nullptr);

// Routing alone, as both ops compute it (the CPU reference): for token t, the selected experts
// in ascending index order and their weights, written to ids / weights [top_k].
void moe_route_token(const float* logits, int64_t experts, int64_t top_k, moe_scoring scoring, bool norm_topk_prob,
                     int32_t* ids, float* weights);

}  // namespace hyserve::kernels
