#pragma once
// Mamba2 selective state space (SSD) ops. Per head h (group g = h / (heads / n_groups)):
//   dt  = clamp(softplus(dt_raw + dt_bias[h]), dt_min, dt_max)
//   A   = -exp(A_log[h])
//   S_t = exp(dt·A) · S_{t-1} + dt · x_t ⊗ B_t          S: [head_dim, d_state]
//   y_t = S_t · C_t + D[h] · x_t
// State layout per slot: [heads, head_dim, d_state].
//
// Element types: x, dt, B, C and y are io_dtype; ssm_states is state_dtype; dt_bias, A_log
// and D are always f32. f32 and bf16 are supported for both, in every combination; compute is
// f32 and bf16 results are rounded to nearest even. Other types are rejected.
#include <cstdint>

#include "hyserve/common/dtype.h"

namespace hyserve::kernels {

// Fields shared by the prefill scan and the decode update.
struct ssm_common_params {
  const void* __restrict__ x = nullptr;        // io_dtype [tokens, heads, head_dim], row stride x_stride
  const void* __restrict__ dt = nullptr;       // io_dtype [tokens, heads] raw (pre-bias), row stride dt_stride
  const float* __restrict__ dt_bias = nullptr; // [heads]; null = 0
  const float* __restrict__ A_log = nullptr;   // [heads]
  const void* __restrict__ B = nullptr;        // io_dtype [tokens, n_groups, d_state], row stride bc_stride
  const void* __restrict__ C = nullptr;        // io_dtype [tokens, n_groups, d_state], row stride bc_stride
  const float* __restrict__ D = nullptr;       // [heads]; null = no skip term
  void* __restrict__ y = nullptr;              // io_dtype [tokens, heads, head_dim], row stride y_stride
  void* ssm_states = nullptr;                  // state_dtype [n_slots + 1, heads, head_dim, d_state]
  const int32_t* __restrict__ state_indices = nullptr;  // [batch]; -1 = padding row (skipped)
  int64_t batch = 0;
  int64_t heads = 0, head_dim = 0, d_state = 0, n_groups = 1;
  int64_t x_stride = 0, dt_stride = 0, bc_stride = 0, y_stride = 0;
  float dt_min = 0.0f;
  float dt_max = 3.4e38f;
  bool dt_softplus = true;
  dtype io_dtype = dtype::kF32;     // element type of x, dt, B, C, y (strides are in elements)
  dtype state_dtype = dtype::kF32;  // element type of ssm_states
};

// Varlen chunked scan for prefill. Sequences are packed by query_start_loc; each starts from the
// slot's state when has_initial_state[b] (else zeros) and writes its final state to the slot.
struct ssd_chunk_scan_params : ssm_common_params {
  const int32_t* __restrict__ query_start_loc = nullptr;    // [batch + 1]
  const uint8_t* __restrict__ has_initial_state = nullptr;  // [batch]; null = all false
  int64_t chunk_size = 256;
  // A bf16 model's scan (f32 io): the CUDA op may round x, B and C to bf16 for the tensor cores
  // (the sequential bf16 kernel, f32 accumulation and state, y in f32), the model's own accuracy
  // class, instead of the CUDA-core kernel (Falcon-H1's head_dim 128, d_state 256) or, with
  // kernels.ssd_seq_bf16, the 3xTF32 kernel (head_dim 64, d_state 128). The CPU op computes in
  // f32 either way.
  bool bf16_operands = false;
};

void run_cpu(const ssd_chunk_scan_params& p);
void run_cuda(const ssd_chunk_scan_params& p, void* stream = nullptr);

// Single-token decode: row b is token b; state updated in place in its slot. The CUDA op
// launches with programmatic dependent launch and reads ssm_states and state_indices before
// waiting for the kernel launched just before it on the stream, which therefore must not write
// them (in a Mamba2 decode step that kernel is the conv update).
struct selective_state_update_params : ssm_common_params {};

void run_cpu(const selective_state_update_params& p);
void run_cuda(const selective_state_update_params& p, void* stream = nullptr);

// Multi-token update with per-step states (TargetVerify, Draft). Row b consumes tokens_per_row
// tokens (tokens b·T .. b·T + T-1, T = tokens_per_row). The persistent state in ssm_states is
// only read: the state after token t of row b is written to step_states[b, first_step[b] + t].
// Token t starts from the state after its parent node (retrieve_parent[b, t]; -1 = the row's
// start state), or after token t-1 when retrieve_parent is null (a chain). The row's start state
// is its slot's state when first_step[b] == 0, else step_states[b, first_step[b] - 1] (a Draft
// step continues the previous draft step of the same row). Parents precede their children.
// Element types as in ssm_common_params: io_dtype for x, dt, B, C, y; state_dtype for both
// ssm_states and step_states. Every step's state is rounded to state_dtype when stored and the
// next token starts from the stored value, exactly as a sequence of single-token decode steps
// does; y is computed from the f32 state before rounding (as the decode op does).
struct selective_state_update_multi_params : ssm_common_params {
  void* step_states = nullptr;               // state_dtype [batch, steps, heads, head_dim, d_state]
  const int32_t* retrieve_parent = nullptr;  // [batch, tokens_per_row]; null = chain
  const int32_t* first_step = nullptr;       // [batch]; null = all 0
  int64_t tokens_per_row = 1;
  int64_t steps = 1;  // step columns per row; first_step[b] + tokens_per_row <= steps
};

void run_cpu(const selective_state_update_multi_params& p);
void run_cuda(const selective_state_update_multi_params& p, void* stream = nullptr);

// Fused commit of accepted speculative steps: for every commit i and every recurrent layer l,
//   ssm_states[l][slots[i]]  = ssm_steps[l][rows[i], steps_taken[i]]
//   conv_states[l][slots[i]] = conv_steps[l][rows[i], steps_taken[i]]
// in one launch. The per-layer pointer arrays are host arrays (n_layers entries) of pointers on
// the op's device; slots, rows and steps_taken live on the op's device. A slot < 0 is skipped.
// SSM states and their steps are state_dtype (f32 or bf16, copied bit for bit); conv windows
// are f32.
struct state_commit_params {
  int64_t n_layers = 0;
  void* const* ssm_states = nullptr;         // [n_layers] → state_dtype [n_slots + 1, state_elems]
  const void* const* ssm_steps = nullptr;    // [n_layers] → state_dtype [rows, steps, state_elems]
  float* const* conv_states = nullptr;       // [n_layers] → [n_slots + 1, conv_elems]; null = none
  const float* const* conv_steps = nullptr;  // [n_layers] → [rows, steps, conv_elems]
  int64_t state_elems = 0, conv_elems = 0, steps = 0;
  const int32_t* slots = nullptr;        // [n_commits]
  const int32_t* rows = nullptr;         // [n_commits]
  const int32_t* steps_taken = nullptr;  // [n_commits] step column to keep
  int64_t n_commits = 0;
  dtype state_dtype = dtype::kF32;  // element type of ssm_states and ssm_steps
};

void run_cpu(const state_commit_params& p);
void run_cuda(const state_commit_params& p, void* stream = nullptr);

}  // namespace hyserve::kernels
