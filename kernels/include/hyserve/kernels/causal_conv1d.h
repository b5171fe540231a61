#pragma once
// Depthwise causal conv1d with a per-sequence rolling window (Mamba2 / GDN).
//   out[t, c] = act(bias[c] + Σ_{j<K} w[c, j] · in[t - (K-1) + j, c])
// where inputs before the sequence start come from the slot's saved window (or zeros when the
// row has no initial state). Window layout per slot: [dim, K-1], oldest first.
#include <cstdint>

namespace hyserve::kernels {

// Varlen prefill over packed sequences.
struct conv1d_varlen_params {
  const float* __restrict__ x = nullptr;       // [total_tokens, dim], row stride x_stride
  const float* __restrict__ weight = nullptr;  // [dim, K]
  const float* __restrict__ bias = nullptr;    // [dim]; null = no bias
  float* __restrict__ out = nullptr;           // [total_tokens, dim], row stride out_stride
  const int32_t* __restrict__ query_start_loc = nullptr;  // [batch + 1]
  const int32_t* __restrict__ state_indices = nullptr;    // [batch]; -1 = padding row (skipped)
  const uint8_t* __restrict__ has_initial_state = nullptr;  // [batch]; null = all false
  float* conv_states = nullptr;  // [n_slots + 1, dim, K-1]; last K-1 inputs written back
  int64_t batch = 0;
  int64_t dim = 0;
  int64_t width = 0;  // K
  int64_t x_stride = 0, out_stride = 0;
  bool silu = true;
};

void run_cpu(const conv1d_varlen_params& p);
void run_cuda(const conv1d_varlen_params& p, void* stream = nullptr);

// Single-token decode update: shifts the window by one and writes the new input. The CUDA op
// launches with programmatic dependent launch and reads conv_states, state_indices, weight and
// bias before waiting for the kernel launched just before it on the stream, which therefore
// must not write them (in a Mamba2 decode step that kernel is the in_proj GEMM).
struct conv1d_update_params {
  const float* __restrict__ x = nullptr;       // [batch, dim], row stride x_stride
  const float* __restrict__ weight = nullptr;  // [dim, K]
  const float* __restrict__ bias = nullptr;    // [dim]; null = no bias
  float* __restrict__ out = nullptr;           // [batch, dim], row stride out_stride
  const int32_t* __restrict__ state_indices = nullptr;  // [batch]; -1 = padding row (skipped)
  float* conv_states = nullptr;                // [n_slots + 1, dim, K-1]
  int64_t batch = 0;
  int64_t dim = 0;
  int64_t width = 0;
  int64_t x_stride = 0, out_stride = 0;
  bool silu = true;
};

void run_cpu(const conv1d_update_params& p);
void run_cuda(const conv1d_update_params& p, void* stream = nullptr);

// Multi-token update with per-step windows (TargetVerify, Draft): row b consumes tokens_per_row
// tokens (rows of x: b·T + t). conv_states is only read; the window after token t of row b is
// written to step_windows[b, first_step[b] + t]. Token t continues the window after its parent
// (retrieve_parent[b, t]; -1 = the row's start window), or after token t-1 when retrieve_parent
// is null. The start window is the slot's when first_step[b] == 0, else
// step_windows[b, first_step[b] - 1].
struct conv1d_update_multi_params {
  const float* __restrict__ x = nullptr;       // [batch · tokens_per_row, dim], row stride x_stride
  const float* __restrict__ weight = nullptr;  // [dim, K]
  const float* __restrict__ bias = nullptr;    // [dim]; null = no bias
  float* __restrict__ out = nullptr;           // [batch · tokens_per_row, dim], row stride out_stride
  const int32_t* __restrict__ state_indices = nullptr;  // [batch]; -1 = padding row (skipped)
  const float* conv_states = nullptr;          // [n_slots + 1, dim, K-1]; read only
  float* step_windows = nullptr;               // [batch, steps, dim, K-1]
  const int32_t* retrieve_parent = nullptr;    // [batch, tokens_per_row]; null = chain
  const int32_t* first_step = nullptr;         // [batch]; null = all 0
  int64_t batch = 0;
  int64_t dim = 0;
  int64_t width = 0;
  int64_t tokens_per_row = 1;
  int64_t steps = 1;
  int64_t x_stride = 0, out_stride = 0;
  bool silu = true;
};

void run_cpu(const conv1d_update_multi_params& p);
void run_cuda(const conv1d_update_multi_params& p, void* stream = nullptr);

}  // namespace hyserve::kernels
