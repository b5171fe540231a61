#pragma once
// Gated DeltaNet (Qwen3-Next linear attention). Per value head h, reading key head
// hk = h / (HV / HK) (consecutive value heads share a key head):
//   q̂ = q / sqrt(Σq² + 1e-6) · K^-1/2,  k̂ = k / sqrt(Σk² + 1e-6)     (when qk_l2norm)
//   g    = -exp(A_log[h]) · softplus(a + dt_bias[h])                     (log decay, ≤ 0)
//   beta = sigmoid(b)
//   S ← exp(g) · S;   S ← S + beta · (v − S·k̂) ⊗ k̂;   o = S · q̂
// S is the value × key matrix of the head. State layout per slot: [HV, V, K], K contiguous
// (in the recurrent-state cache: heads = HV, head_dim = V, d_state = K). Transformers keeps the
// transpose, [HV, K, V].
#include <cstdint>

#include "hyserve/common/dtype.h"

namespace hyserve::kernels {

// Fields shared by the chunked prefill and the decode update. q, k and v are usually column
// ranges of one [tokens, conv_dim] buffer (the conv output q | k | v), a and b of the input
// projection.
struct gdn_common_params {
  const float* __restrict__ q = nullptr;                // [tokens, HK, K], row stride q_stride
  const float* __restrict__ k = nullptr;                // [tokens, HK, K], row stride k_stride
  const float* __restrict__ v = nullptr;                // [tokens, HV, V], row stride v_stride
  const float* __restrict__ a = nullptr;                // [tokens, HV] decay input (pre-bias), row stride a_stride
  const float* __restrict__ b = nullptr;                // [tokens, HV] beta logits, row stride b_stride
  const float* __restrict__ A_log = nullptr;            // [HV]
  const float* __restrict__ dt_bias = nullptr;          // [HV]; null = 0
  float* __restrict__ out = nullptr;                    // [tokens, HV, V], row stride out_stride
  float* states = nullptr;                              // [n_slots + 1, HV, V, K]
  const int32_t* __restrict__ state_indices = nullptr;  // [batch]; -1 = padding row (skipped)
  int64_t batch = 0;
  int64_t heads_k = 0, heads_v = 0;  // HK, HV; HV a multiple of HK
  int64_t k_dim = 0, v_dim = 0;      // K, V
  int64_t q_stride = 0, k_stride = 0, v_stride = 0, a_stride = 0, b_stride = 0, out_stride = 0;
  float scale = 0.0f;     // query scale; 0 = K^-1/2
  bool qk_l2norm = true;  // false: q and k are used as given (scale still applies)
};

// Varlen chunked prefill. Sequences are packed by query_start_loc; each starts from its slot's
// state when has_initial_state[b] (else zeros) and writes its final state to the slot. Chunks of
// chunk_size tokens use the WY (UT-transform) form of the delta rule; the result equals the
// per-token recurrence for any sequence length.
//
// Element type of q, k, v and out (io_dtype): f32, through the pointers of gdn_common_params, or
// bf16 (the io of the flash-linear-attention kernels), through q_bf16, k_bf16, v_bf16 and
// out_bf16 instead (same shapes, strides in elements; the f32 pointers are then not read). a, b,
// A_log, dt_bias and the states stay f32, and so does the arithmetic: bf16 inputs are widened,
// outputs rounded to nearest even. On CUDA, bf16 io is taken by the bf16 and recurrent paths
// (gdn_paths.cuh).
// Which CUDA prefill implementation a call asks for (kernels/cuda/gdn_paths.cuh): kDefault
// takes gdn_prefill_default_path(); the others that path (a shape the tensor-core paths do not
// take runs the recurrent kernel). The CPU op has one implementation and ignores it. Models
// choose by their dtype (model.gdn_prefill, worker/model/gdn_layer.h).
enum class gdn_prefill_kernel : uint8_t { kDefault, kRecurrent, kTc, kTf32, kBf16 };

struct gdn_chunk_scan_params : gdn_common_params {
  const int32_t* __restrict__ query_start_loc = nullptr;    // [batch + 1]
  const uint8_t* __restrict__ has_initial_state = nullptr;  // [batch]; null = all false
  int64_t chunk_size = 64;
  dtype io_dtype = dtype::kF32;                   // f32 or bf16
  const uint16_t* __restrict__ q_bf16 = nullptr;  // io_dtype bf16: as q, k, v, out above
  const uint16_t* __restrict__ k_bf16 = nullptr;
  const uint16_t* __restrict__ v_bf16 = nullptr;
  uint16_t* __restrict__ out_bf16 = nullptr;
  gdn_prefill_kernel kernel = gdn_prefill_kernel::kDefault;  // CUDA only
};

void run_cpu(const gdn_chunk_scan_params& p);
void run_cuda(const gdn_chunk_scan_params& p, void* stream = nullptr);

// Single-token decode: row b is token b; the slot's state is updated in place.
struct gdn_state_update_params : gdn_common_params {};

void run_cpu(const gdn_state_update_params& p);
void run_cuda(const gdn_state_update_params& p, void* stream = nullptr);

// Multi-token recurrent update with per-step states (TargetVerify, Draft): row b consumes
// tokens_per_row tokens. states is only read; the state after token t of row b goes to
// step_states[b, first_step[b] + t]; token t starts from its parent's state (retrieve_parent,
// -1 = the row's start) or token t-1's (chain, retrieve_parent null). The row's start is its
// slot's state when first_step[b] == 0, else step_states[b, first_step[b] - 1].
struct gdn_state_update_multi_params : gdn_common_params {
  float* step_states = nullptr;              // [batch, steps, HV, V, K]
  const int32_t* retrieve_parent = nullptr;  // [batch, tokens_per_row]; null = chain
  const int32_t* first_step = nullptr;       // [batch]; null = all 0
  int64_t tokens_per_row = 1;
  int64_t steps = 1;
};

void run_cpu(const gdn_state_update_multi_params& p);
void run_cuda(const gdn_state_update_multi_params& p, void* stream = nullptr);

}  // namespace hyserve::kernels
