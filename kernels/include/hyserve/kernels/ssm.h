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
};

void run_cpu(const ssd_chunk_scan_params& p);
void run_cuda(const ssd_chunk_scan_params& p, void* stream = nullptr);

// Single-token decode: row b is token b; state updated in place in its slot.
struct selective_state_update_params : ssm_common_params {};

void run_cpu(const selective_state_update_params& p);
void run_cuda(const selective_state_update_params& p, void* stream = nullptr);

}  // namespace hyserve::kernels
