#pragma once
// Partial rotary position embedding, rotate-half (GPT-NeoX / Llama) convention, applied in
// place to the first rotary_dim dims of every head of q and k:
//   inv_freq[i] = theta^(-2i / rotary_dim), i < rotary_dim/2
//   x1 = x[:rd/2], x2 = x[rd/2:rd]; x1' = x1·cos − x2·sin; x2' = x2·cos + x1·sin
#include <cstdint>

namespace hyserve::kernels {

struct rope_params {
  float* q = nullptr;                            // [n_tokens, n_q_heads, head_dim], row stride q_stride
  float* k = nullptr;                            // [n_tokens, n_kv_heads, head_dim], row stride k_stride
  const int32_t* __restrict__ positions = nullptr;  // [n_tokens]
  int64_t n_tokens = 0;
  int64_t n_q_heads = 0, n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;  // even, ≤ head_dim
  int64_t q_stride = 0, k_stride = 0;
  float theta = 10000.0f;
};

void run_cpu(const rope_params& p);
void run_cuda(const rope_params& p, void* stream = nullptr);

}  // namespace hyserve::kernels
