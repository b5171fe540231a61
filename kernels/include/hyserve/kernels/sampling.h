#pragma once
// Token selection from logits.
#include <cstdint>

namespace hyserve::kernels {

// Greedy: out[r] = argmax_v logits[r, v] (ties to the lowest index).
struct argmax_params {
  const float* __restrict__ logits = nullptr;  // [rows, vocab], row stride stride
  int32_t* __restrict__ out = nullptr;         // [rows]
  int64_t rows = 0, vocab = 0, stride = 0;
};

void run_cpu(const argmax_params& p);

}  // namespace hyserve::kernels
