#pragma once
// Token embedding lookup, vocab-parallel: this rank holds rows [vocab_start, vocab_end) of the
// table; ids outside that range produce zero rows (the all-reduce over tp fills them in).
// The table is table_dtype (f32 or bf16); the output is always f32 (bf16 rows are widened
// exactly).
#include <cstdint>

#include "hyserve/common/dtype.h"

namespace hyserve::kernels {

struct embedding_params {
  const int32_t* __restrict__ ids = nullptr;  // [n_tokens]
  const void* __restrict__ table = nullptr;   // table_dtype [vocab_end - vocab_start, hidden]
  float* __restrict__ out = nullptr;          // [n_tokens, hidden]
  int64_t n_tokens = 0;
  int64_t hidden = 0;
  int64_t vocab_start = 0;
  int64_t vocab_end = 0;
  dtype table_dtype = dtype::kF32;  // f32 or bf16
};

void run_cpu(const embedding_params& p);
void run_cuda(const embedding_params& p, void* stream = nullptr);

}  // namespace hyserve::kernels
