#pragma once
// Dense matrix multiply, row-major: C[m,n] = alpha * op(A)[m,k] · op(B)[k,n] + beta * C.
// A linear layer y = x · Wᵀ with W [out, in] is gemm with trans_b = true.
#include <cstdint>

namespace hyserve::kernels {

struct gemm_params {
  const float* __restrict__ a = nullptr;  // [m, k] (or [k, m] when trans_a), row stride lda
  const float* __restrict__ b = nullptr;  // [k, n] (or [n, k] when trans_b), row stride ldb
  float* __restrict__ c = nullptr;        // [m, n], row stride ldc
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  float beta = 0.0f;
};

void run_cpu(const gemm_params& p);
void run_cuda(const gemm_params& p, void* stream = nullptr);

// y[m, n] = x[m, k] · w[n, k]ᵀ (+ y when accumulate). All contiguous.
void linear_cpu(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k, bool accumulate = false);

}  // namespace hyserve::kernels
