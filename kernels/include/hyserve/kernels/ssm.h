#pragma once
// Mamba2 selective state space (SSD) ops. Per head h (group g = h / (heads / n_groups)):
//   dt  = clamp(softplus(dt_raw + dt_bias[h]), dt_min, dt_max)
//   A   = -exp(A_log[h])
//   S_t = exp(dt·A) · S_{t-1} + dt · x_t ⊗ B_t          S: [head_dim, d_state]
//   y_t = S_t · C_t + D[h] · x_t
// State layout per slot: [heads, head_dim, d_state].
#include <cstdint>

namespace hyserve::kernels {

// Fields shared by the prefill scan and the decode update.
struct ssm_common_params {
  const float* __restrict__ x = nullptr;       // [tokens, heads, head_dim], row stride x_stride
  const float* __restrict__ dt = nullptr;      // [tokens, heads] raw (pre-bias), row stride dt_stride
  const float* __restrict__ dt_bias = nullptr; // [heads]; null = 0
  const float* __restrict__ A_log = nullptr;   // [heads]
  const float* __restrict__ B = nullptr;       // [tokens, n_groups, d_state], row stride bc_stride
  const float* __restrict__ C = nullptr;       // [tokens, n_groups, d_state], row stride bc_stride
  const float* __restrict__ D = nullptr;       // [heads]; null = no skip term
  float* __restrict__ y = nullptr;             // [tokens, heads, head_dim], row stride y_stride
  float* ssm_states = nullptr;                 // [n_slots + 1, heads, head_dim, d_state]
  const int32_t* __restrict__ state_indices = nullptr;  // [batch]; -1 = padding row (skipped)
  int64_t batch = 0;
  int64_t heads = 0, head_dim = 0, d_state = 0, n_groups = 1;
  int64_t x_stride = 0, dt_stride = 0, bc_stride = 0, y_stride = 0;
  float dt_min = 0.0f;
  float dt_max = 3.4e38f;
  bool dt_softplus = true;
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
