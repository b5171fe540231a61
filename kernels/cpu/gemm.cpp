#include "hyserve/kernels/activation.h"
#include "hyserve/kernels/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <vector>

#include "dtype_dispatch.h"
#include "dense_validate.h"
#include "validate.h"

namespace hyserve::kernels {

using namespace cpu_detail;

namespace {

// f32 elements of b widened per block: bounded scratch (about 1 MiB), never a whole-matrix copy.
constexpr int64_t kWidenBlockElems = int64_t{1} << 18;

// C = alpha · op(A) · op(B) + beta · C with B stored as bf16: columns of C in blocks of nb,
// each block's slice of B widened to f32 (exact) and handed to sgemm.
void gemm_bf16_b(const gemm_params& p) {
  const auto* b = static_cast<const uint16_t*>(p.b);
  const int64_t nb = std::min(p.n, std::max<int64_t>(kWidenBlockElems / p.k, 16));
  std::vector<float> tile(static_cast<size_t>(nb * p.k));
  for (int64_t n0 = 0; n0 < p.n; n0 += nb) {
    const int64_t cols = std::min(nb, p.n - n0);
    // trans_b: B is [n, k], the block is rows n0..n0+cols (ld k). Otherwise B is [k, n], the
    // block is columns n0..n0+cols of every row (ld cols).
    if (p.trans_b) {
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < cols; ++j) {
        const uint16_t* src = b + (n0 + j) * p.ldb;
        float* dst = tile.data() + j * p.k;
        for (int64_t i = 0; i < p.k; ++i) dst[i] = bf16_to_f32(src[i]);
      }
    } else {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < p.k; ++i) {
        const uint16_t* src = b + i * p.ldb + n0;
        float* dst = tile.data() + i * cols;
        for (int64_t j = 0; j < cols; ++j) dst[j] = bf16_to_f32(src[j]);
      }
    }
    cblas_sgemm(CblasRowMajor, p.trans_a ? CblasTrans : CblasNoTrans, p.trans_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(p.m), static_cast<int>(cols), static_cast<int>(p.k), p.alpha, p.a,
                static_cast<int>(p.lda), tile.data(), static_cast<int>(p.trans_b ? p.k : cols), p.beta, p.c + n0,
                static_cast<int>(p.ldc));
  }
}

}  // namespace

void run_cpu(const gemm_params& p) {
  constexpr const char* op = "gemm";
  check_gemm(p, op);

  dispatch_storage(p.b_dtype, op, "b_dtype", [&](auto tag) {
    if constexpr (decltype(tag)::value == dtype::kF32) {
      cblas_sgemm(CblasRowMajor, p.trans_a ? CblasTrans : CblasNoTrans, p.trans_b ? CblasTrans : CblasNoTrans,
                  static_cast<int>(p.m), static_cast<int>(p.n), static_cast<int>(p.k), p.alpha, p.a,
                  static_cast<int>(p.lda), static_cast<const float*>(p.b), static_cast<int>(p.ldb), p.beta, p.c,
                  static_cast<int>(p.ldc));
    } else {
      gemm_bf16_b(p);
    }
  });
}

void run_cpu(const swiglu_linear_params& p) {
  constexpr const char* op = "swiglu_linear";
  check_swiglu_linear(p, op);
  if (p.m == 0) return;
  std::vector<float> up(static_cast<size_t>(p.m * p.n));
  gemm_params g = swiglu_linear_gate_gemm(p);
  run_cpu(g);
  g.b = p.up_w;
  g.c = up.data();
  g.ldc = p.n;
  run_cpu(g);
  swiglu_params s;
  s.gate = p.out;
  s.up = up.data();
  s.out = p.out;
  s.rows = p.m;
  s.cols = p.n;
  s.gate_stride = s.out_stride = p.out_stride;
  s.up_stride = p.n;
  run_cpu(s);
}

void linear_cpu(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k, bool accumulate) {
  linear_cpu(x, w, dtype::kF32, y, m, n, k, accumulate);
}

void linear_cpu(const float* x, const void* w, dtype w_dtype, float* y, int64_t m, int64_t n, int64_t k,
                bool accumulate) {
  gemm_params p;
  p.a = x;
  p.b = w;
  p.b_dtype = w_dtype;
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
