#include "hyserve/kernels/gemm.h"

#include <cblas.h>

#include "validate.h"

namespace hyserve::kernels {

using namespace cpu_detail;

void run_cpu(const gemm_params& p) {
  constexpr const char* op = "gemm";
  require_ptr(p.a, op, "a");
  require_ptr(p.b, op, "b");
  require_ptr(p.c, op, "c");
  require_positive(p.m, op, "m");
  require_positive(p.n, op, "n");
  require_positive(p.k, op, "k");
  // Row-major: the stored row of op(A) has k columns, of A^T (trans_a) m columns.
  require_stride(p.lda, p.trans_a ? p.m : p.k, op, "lda");
  require_stride(p.ldb, p.trans_b ? p.k : p.n, op, "ldb");
  require_stride(p.ldc, p.n, op, "ldc");
  // cblas takes int sizes; larger problems would silently wrap.
  constexpr int64_t kMaxBlas = 0x7fffffff;
  if (p.m > kMaxBlas) fail(op, "m", p.m, "exceeds the BLAS int range");
  if (p.n > kMaxBlas) fail(op, "n", p.n, "exceeds the BLAS int range");
  if (p.k > kMaxBlas) fail(op, "k", p.k, "exceeds the BLAS int range");
  if (p.lda > kMaxBlas) fail(op, "lda", p.lda, "exceeds the BLAS int range");
  if (p.ldb > kMaxBlas) fail(op, "ldb", p.ldb, "exceeds the BLAS int range");
  if (p.ldc > kMaxBlas) fail(op, "ldc", p.ldc, "exceeds the BLAS int range");

  cblas_sgemm(CblasRowMajor, p.trans_a ? CblasTrans : CblasNoTrans, p.trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(p.m), static_cast<int>(p.n), static_cast<int>(p.k), p.alpha, p.a,
              static_cast<int>(p.lda), p.b, static_cast<int>(p.ldb), p.beta, p.c, static_cast<int>(p.ldc));
}

void linear_cpu(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k, bool accumulate) {
  gemm_params p;
  p.a = x;
  p.b = w;
  p.c = y;
  p.m = m;
  p.n = n;
  p.k = k;
  p.lda = k;
  p.ldb = k;
  p.ldc = n;
  p.trans_b = true;
  p.beta = accumulate ? 1.0f : 0.0f;
  run_cpu(p);
}

}  // namespace hyserve::kernels
