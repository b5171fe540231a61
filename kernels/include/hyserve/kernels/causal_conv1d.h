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

// Single-token decode update: shifts the window by one and writes the new input.
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

}  // namespace hyserve::kernels
