#pragma once
// Dense matrix multiply, row-major: C[m,n] = alpha * op(A)[m,k] · op(B)[k,n] + beta * C.
// A linear layer y = x · Wᵀ with W [out, in] is gemm with trans_b = true.
//
// Element types: a and c are f32; b (the weight of a linear layer) is b_dtype, f32 or bf16
// (anything else is rejected naming the field). Accumulation is f32. With a bf16 b the CPU op
// widens b block by block (no f32 copy of the whole matrix); the CUDA op, for m ≤ 8 with
// trans_b (a decode linear layer, 16-byte aligned, k a multiple of 8), streams b through a
// skinny kernel with f32 a (the CPU op's arithmetic); otherwise it rounds a to bf16 in a
// scratch buffer and runs a bf16 × bf16 → f32 tensor-core GEMM with f32 accumulation, so its
// result differs from the CPU op by the rounding of a (tests compare with bf16-exact a).
#include <cstdint>

#include "hyserve/common/dtype.h"

namespace hyserve::kernels {

struct gemm_params {
  const float* __restrict__ a = nullptr;  // [m, k] (or [k, m] when trans_a), row stride lda
  const void* __restrict__ b = nullptr;   // b_dtype [k, n] (or [n, k] when trans_b), row stride ldb
  float* __restrict__ c = nullptr;        // [m, n], row stride ldc
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  float beta = 0.0f;
  dtype b_dtype = dtype::kF32;  // element type of b: f32 or bf16
};

void run_cpu(const gemm_params& p);
void run_cuda(const gemm_params& p, void* stream = nullptr);

// The first half of a SwiGLU MLP in one op: out[i, j] = silu(g) · u with g = x[i, :] · gate_w[j, :]
// and u = x[i, :] · up_w[j, :] (silu(g) = g / (1 + e^-g), as the swiglu op). x, out f32; the two
// weights [n, k] row-major in w_dtype (f32 or bf16). The CPU op is two gemm ops and the swiglu
// op. The CUDA op fuses everything into the skinny bf16 kernel when the gemm op would take it
// for each weight (m ≤ 8, or any m under determinism: batch_invariant; bf16, aligned); otherwise
// it runs the two gemm ops and the swiglu op.
struct swiglu_linear_params {
  const float* __restrict__ x = nullptr;       // [m, k], row stride x_stride
  const void* __restrict__ gate_w = nullptr;   // w_dtype [n, k], row stride w_stride
  const void* __restrict__ up_w = nullptr;     // w_dtype [n, k], row stride w_stride
  float* __restrict__ out = nullptr;           // [m, n], row stride out_stride
  int64_t m = 0, n = 0, k = 0;
  int64_t x_stride = 0, w_stride = 0, out_stride = 0;
  dtype w_dtype = dtype::kF32;
};

void run_cpu(const swiglu_linear_params& p);
void run_cuda(const swiglu_linear_params& p, void* stream = nullptr);

// The gate projection of p as a gemm: out = x · gate_wᵀ (the backends' unfused path; the up
// projection is the same with b = up_w and its own output).
inline gemm_params swiglu_linear_gate_gemm(const swiglu_linear_params& p) {
  gemm_params g;
  g.a = p.x;
  g.b = p.gate_w;
  g.b_dtype = p.w_dtype;
  g.c = p.out;
  g.m = p.m;
  g.n = p.n;
  g.k = p.k;
  g.lda = p.x_stride;
  g.ldb = p.w_stride;
  g.ldc = p.out_stride;
  g.trans_b = true;
  return g;
}

// y[m, n] = x[m, k] · w[n, k]ᵀ (+ y when accumulate). All contiguous.
void linear_cpu(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k, bool accumulate = false);
// The same with w in w_dtype (f32 or bf16).
void linear_cpu(const float* x, const void* w, dtype w_dtype, float* y, int64_t m, int64_t n, int64_t k,
                bool accumulate = false);

}  // namespace hyserve::kernels
