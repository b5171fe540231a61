#pragma once
// Token embedding lookup, vocab-parallel: this rank holds rows [vocab_start, vocab_end) of the
// table; ids outside that range produce zero rows (the all-reduce over tp fills them in).
#include <cstdint>

namespace hyserve::kernels {

struct embedding_params {
  const int32_t* __restrict__ ids = nullptr;  // [n_tokens]
  const float* __restrict__ table = nullptr;  // [vocab_end - vocab_start, hidden]
  float* __restrict__ out = nullptr;          // [n_tokens, hidden]
  int64_t n_tokens = 0;
  int64_t hidden = 0;
  int64_t vocab_start = 0;
  int64_t vocab_end = 0;
};

void run_cpu(const embedding_params& p);
void run_cuda(const embedding_params& p, void* stream = nullptr);

}  // namespace hyserve::kernels
