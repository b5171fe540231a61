#pragma once
// RMSNorm and gated RMSNorm.
#include <cstdint>

#include "hyserve/common/dtype.h"

namespace hyserve::kernels {

// out[r, :] = x[r, :] * rsqrt(mean(x[r, :]²) + eps) * weight. out may alias x.
// groups > 1: each row holds `groups` vectors of cols channels side by side (vector g of row r
// at r · stride + g · cols, in x and in out), each normalised on its own with the weight
// weight + g · weight_stride (weight_stride 0: one weight for all): per-head norms (the queries'
// and keys' of Qwen3-Next) on the rows of a stacked projection, in one op.
struct rmsnorm_params {
  const float* x = nullptr;                    // [rows, groups · cols], row stride x_stride
  const float* __restrict__ weight = nullptr;  // [cols], or [groups, weight_stride]
  float* out = nullptr;                        // [rows, groups · cols], row stride out_stride
  int64_t rows = 0, cols = 0;
  int64_t x_stride = 0, out_stride = 0;
  float eps = 1e-6f;
  int64_t groups = 1;
  int64_t weight_stride = 0;  // 0, or >= cols
};

void run_cpu(const rmsnorm_params& p);
void run_cuda(const rmsnorm_params& p, void* stream = nullptr);

// Gated RMSNorm (Mamba2):
//   norm_before_gate = false:  h = x · silu(gate); out = h * rsqrt(mean_over_group(h²) + eps) * weight
//   norm_before_gate = true:   h = x;              out = h * rsqrt(mean_over_group(h²) + eps) * weight
//                                                        * silu(gate)
// where the mean runs over contiguous groups of group_size channels (group_size = cols for a
// single group; Mamba2 uses intermediate_size / n_groups).
//
// Tensor parallelism with one group split over ranks: call once with sumsq_out set (writes the
// per-row, per-group Σh² and returns without normalising), all-reduce it, then call again with
// sumsq_in set and group_count = the global channel count of a group. Both calls take the same
// norm_before_gate.
//
// The CUDA op launches with programmatic dependent launch; for groups it holds in registers it
// reads weight before waiting for the kernel launched just before it (which must not write it).
struct gated_rmsnorm_params {
  const float* x = nullptr;                    // [rows, cols], row stride x_stride
  const float* __restrict__ gate = nullptr;    // [rows, cols], row stride gate_stride
  const float* __restrict__ weight = nullptr;  // [cols]
  float* out = nullptr;                        // [rows, cols], row stride out_stride; may alias x
  int64_t rows = 0, cols = 0;
  int64_t x_stride = 0, gate_stride = 0, out_stride = 0;
  int64_t group_size = 0;            // channels per normalisation group (local); divides cols
  float eps = 1e-6f;
  float* sumsq_out = nullptr;        // null: normal mode. else [rows, cols/group_size]: phase 1
  const float* sumsq_in = nullptr;   // null: computed locally. else [rows, cols/group_size]
  int64_t group_count = 0;           // divisor of the mean when sumsq_in is set (0 = group_size)
  bool norm_before_gate = false;     // true: normalise x, then multiply by silu(gate) (Falcon-H1)
};

void run_cpu(const gated_rmsnorm_params& p);
void run_cuda(const gated_rmsnorm_params& p, void* stream = nullptr);

// A decode linear layer with its input RMSNorm (a block's input norm and first projection):
//   xn = rmsnorm(x) (the rmsnorm op with norm_weight, eps), or x itself when norm_weight is null
//   out = xn · wᵀ + beta · out              (up_w null; beta 0 or 1: the residual epilogue)
//   out = silu(xn · wᵀ) ⊙ (xn · up_wᵀ)      (up_w set: w is the gate; the swiglu_linear op)
//   out = relu2(xn · wᵀ)                    (relu2: the relu2 op on the product; up_w null, beta 0)
// x, out f32; w and up_w [n, k] row-major in w_dtype (f32 or bf16). The CPU op is the rmsnorm
// op into a scratch row block, then the gemm (or swiglu_linear) op. The CUDA op runs one kernel
// for decode (bf16 weights, m ≤ 4, 16-byte aligned, k a multiple of 8; with a norm, the m normed
// rows must fit in 46 KB of shared memory): each block recomputes the rows' sums of squares with
// the rmsnorm kernel's arithmetic, stages the normed rows in shared memory and streams its share
// of the weight rows against them with the skinny gemm kernel's arithmetic, so every row equals
// the unfused CUDA ops' bit for bit; it launches with programmatic dependent launch and reads
// its first weight rows before waiting for the kernel launched just before it (weights are
// constants: that kernel must not write w or up_w). Otherwise it runs the unfused ops.
// normed_out (with a norm): xn is also written there, the rmsnorm op's output bit for bit (the
// fused kernel's first block stores its staged rows), for other consumers of the normed rows:
// the norm then costs no kernel of its own.
// gate (with a norm): the norm is the gated_rmsnorm op instead, on x with this gate (row stride
// gate_stride), in groups of norm_group channels (0: k), norm_before_gate as that op's: a mixer's
// output norm (Mamba2, Gated DeltaNet) fused into its out_proj. The fused kernel stages
// x · silu(gate) (or x), sums each group's squares by warps, then scales: the gated norm op's
// formula, its sums added in another order (not its bits).
// kernels.norm_linear: false (exec_context::paths) disables the fused kernel;
// kernels.norm_linear_gate (false by default) enables it for a gated norm.
// The most rows (m) the CUDA op's fused kernel takes.
inline constexpr int64_t kNormLinearFusedMaxRows = 4;

struct rmsnorm_linear_params {
  const float* x = nullptr;                         // [m, k], row stride x_stride
  const float* __restrict__ norm_weight = nullptr;  // [k]; null: no norm
  float eps = 1e-6f;
  const void* __restrict__ w = nullptr;             // w_dtype [n, k], row stride w_stride
  const void* __restrict__ up_w = nullptr;          // optional: w_dtype [n, k], row stride w_stride
  dtype w_dtype = dtype::kF32;
  float* __restrict__ out = nullptr;                // [m, n], row stride out_stride; not aliasing x
  int64_t m = 0, n = 0, k = 0;
  int64_t x_stride = 0, w_stride = 0, out_stride = 0;
  float beta = 0.0f;                                // 0 or 1 (up_w null only)
  bool relu2 = false;                               // squared ReLU of the product (up_w null, beta 0)
  float* normed_out = nullptr;                      // optional [m, k] (row stride k): xn itself (norm_weight set)
  const float* __restrict__ gate = nullptr;         // optional [m, k], row stride gate_stride (norm_weight set)
  int64_t gate_stride = 0;
  int64_t norm_group = 0;                           // channels per gated-norm group; 0: k
  bool norm_before_gate = false;
};

void run_cpu(const rmsnorm_linear_params& p);
void run_cuda(const rmsnorm_linear_params& p, void* stream = nullptr);

}  // namespace hyserve::kernels
