// RMSNorm and gated RMSNorm: one block per (row[, group]); programmatic dependent launches
// (launch.cuh). Gated groups of up to 16384 channels (f32, 16-byte aligned) take a register
// kernel (one load round trip, h kept in registers); otherwise two passes over the row: the sum of
// squares (block reduction), then the scaled write. out may alias x: every element is read
// and written by the same thread, and all reads of pass 1 precede the reduction's barriers.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "../cpu/dense_validate.h"
#include "../cpu/dtype_dispatch.h"
#include "../cpu/norm_linear_unfused.h"
#include "common.cuh"
#include "gemm_paths.h"
#include "hyserve/kernels/gemm.h"
#include "hyserve/kernels/norm.h"
#include "hyserve/kernels/paths.h"
#include "launch.cuh"
#include "stream_alloc.h"

namespace hyserve::kernels {
namespace cuda_detail {
namespace {

constexpr int kNormThreads = 256;
constexpr int kMaxGridY = 65535;

template <class T, bool Vec>
__global__ void __launch_bounds__(kNormThreads) rmsnorm_kernel(const rmsnorm_params p) {
  pdl_begin();
  const int64_t r = blockIdx.x / p.groups, g = blockIdx.x % p.groups;
  const T* x = reinterpret_cast<const T*>(p.x) + r * p.x_stride + g * p.cols;
  T* o = reinterpret_cast<T*>(p.out) + r * p.out_stride + g * p.cols;
  const float* weight = p.weight + g * p.weight_stride;
  constexpr int kN = Vec ? pack16<T>::kN : 1;
  const int64_t step = static_cast<int64_t>(blockDim.x) * kN;

  float ss = 0.0f;
  for (int64_t i = threadIdx.x * kN; i < p.cols; i += step) {
    if constexpr (Vec) {
      const pack16<T> v = load_pack(x + i);
#pragma unroll
      for (int j = 0; j < kN; ++j) ss += to_float(v.v[j]) * to_float(v.v[j]);
    } else {
      const float v = to_float(x[i]);
      ss += v * v;
    }
  }
  ss = block_sum(ss);
  const auto inv = static_cast<float>(1.0 / sqrt(static_cast<double>(ss) / static_cast<double>(p.cols) + p.eps));
  for (int64_t i = threadIdx.x * kN; i < p.cols; i += step) {
    if constexpr (Vec) {
      const pack16<T> v = load_pack(x + i);
      float w[kN];
      load_floats<kN>(weight + i, w);
      pack16<T> out;
#pragma unroll
      for (int j = 0; j < kN; ++j) out.v[j] = from_float<T>(to_float(v.v[j]) * inv * w[j]);
      store_pack(o + i, out);
    } else {
      o[i] = from_float<T>(to_float(x[i]) * inv * weight[i]);
    }
  }
}

// Block (group g, rows r = blockIdx.y, blockIdx.y + gridDim.y, ...).
template <class T, bool Vec>
__global__ void __launch_bounds__(kNormThreads) gated_rmsnorm_kernel(const gated_rmsnorm_params p) {
  pdl_begin();
  const int64_t g = blockIdx.x;
  const int64_t gs = p.group_size;
  const int64_t n_groups = p.cols / gs;
  constexpr int kN = Vec ? pack16<T>::kN : 1;
  const int64_t step = static_cast<int64_t>(blockDim.x) * kN;
  const double divisor = static_cast<double>(p.sumsq_in != nullptr && p.group_count > 0 ? p.group_count : gs);

  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const T* x = reinterpret_cast<const T*>(p.x) + r * p.x_stride + g * gs;
    const T* z = reinterpret_cast<const T*>(p.gate) + r * p.gate_stride + g * gs;
    // h = x · silu(z) (x itself with norm_before_gate), recomputed in each pass instead of staged.
    auto h_pack = [&](int64_t i, float (&h)[kN]) {
      if constexpr (Vec) {
        const pack16<T> xv = load_pack(x + i);
        if (p.norm_before_gate) {
#pragma unroll
          for (int j = 0; j < kN; ++j) h[j] = to_float(xv.v[j]);
        } else {
          const pack16<T> zv = load_pack(z + i);
#pragma unroll
          for (int j = 0; j < kN; ++j) h[j] = to_float(xv.v[j]) * silu(to_float(zv.v[j]));
        }
      } else {
        h[0] = p.norm_before_gate ? to_float(x[i]) : to_float(x[i]) * silu(to_float(z[i]));
      }
    };
    // The factor after the norm: silu(z) with norm_before_gate, else 1.
    auto post_pack = [&](int64_t i, float (&s)[kN]) {
      if (!p.norm_before_gate) {
#pragma unroll
        for (int j = 0; j < kN; ++j) s[j] = 1.0f;
      } else if constexpr (Vec) {
        const pack16<T> zv = load_pack(z + i);
#pragma unroll
        for (int j = 0; j < kN; ++j) s[j] = silu(to_float(zv.v[j]));
      } else {
        s[0] = silu(to_float(z[i]));
      }
    };

    float inv = 0.0f;
    if (p.sumsq_in == nullptr) {
      float ss = 0.0f;
      for (int64_t i = threadIdx.x * kN; i < gs; i += step) {
        float h[kN];
        h_pack(i, h);
#pragma unroll
        for (int j = 0; j < kN; ++j) ss += h[j] * h[j];
      }
      ss = block_sum(ss);
      if (p.sumsq_out != nullptr) {  // phase 1: publish Σh², do not normalise
        if (threadIdx.x == 0) p.sumsq_out[r * n_groups + g] = ss;
        continue;
      }
      inv = static_cast<float>(1.0 / sqrt(static_cast<double>(ss) / divisor + p.eps));
    } else {
      inv = static_cast<float>(1.0 / sqrt(static_cast<double>(p.sumsq_in[r * n_groups + g]) / divisor + p.eps));
    }

    T* o = reinterpret_cast<T*>(p.out) + r * p.out_stride + g * gs;
    const float* w = p.weight + g * gs;
    for (int64_t i = threadIdx.x * kN; i < gs; i += step) {
      float h[kN], gf[kN];
      h_pack(i, h);
      post_pack(i, gf);  // 1 without norm_before_gate: the product below is exactly h · inv · w
      if constexpr (Vec) {
        float wv[kN];
        load_floats<kN>(w + i, wv);
        pack16<T> out;
#pragma unroll
        for (int j = 0; j < kN; ++j) out.v[j] = from_float<T>(h[j] * inv * wv[j] * gf[j]);
        store_pack(o + i, out);
      } else {
        o[i] = from_float<T>(h[0] * inv * w[i] * gf[0]);
      }
    }
    // A thread's next row begins with block_sum's barrier, so no thread overtakes a reader.
  }
}

// Gated RMSNorm with the group held in registers: block (group g, rows r = blockIdx.y, ...),
// blockDim.x threads (a multiple of 32, at most 1024), thread t holding packs t + j·blockDim.x
// (j < kPacks) of 4 floats. All of a row's x and gate loads are issued before the first use (a
// Mamba2 decode row of 8192 channels is one round trip of 1024 threads × 2 × 32 bytes), h stays
// in registers between the sum of squares and the scaled write, and the weight is read before
// the programmatic-launch wait (it is a constant). out may alias x: every element is read and
// written by the same thread.
constexpr int kGatedRegMaxThreads = 1024;
constexpr int kGatedRegMaxPacks = 4;

template <int kPacks>
__global__ void __launch_bounds__(kGatedRegMaxThreads) gated_rmsnorm_reg_kernel(const gated_rmsnorm_params p) {
  constexpr int kN = 4;
  const int64_t g = blockIdx.x;
  const int64_t gs = p.group_size;
  const int64_t n_groups = p.cols / gs;
  const int nt = static_cast<int>(blockDim.x);
  const bool normalise = p.sumsq_out == nullptr;
  const bool before_gate = p.norm_before_gate;
  float wv[kPacks][kN];
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    const int64_t i = static_cast<int64_t>(threadIdx.x + j * nt) * kN;
    if (normalise && i < gs) {
      load_floats<kN>(p.weight + g * gs + i, wv[j]);
    } else {
#pragma unroll
      for (int e = 0; e < kN; ++e) wv[j][e] = 0.0f;
    }
  }
  pdl_begin();
  const double divisor = static_cast<double>(p.sumsq_in != nullptr && p.group_count > 0 ? p.group_count : gs);

  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const float* x = p.x + r * p.x_stride + g * gs;
    const float* z = p.gate + r * p.gate_stride + g * gs;
    float4 xv[kPacks], zv[kPacks];
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int64_t i = static_cast<int64_t>(threadIdx.x + j * nt) * kN;
      if (i < gs) {
        xv[j] = *reinterpret_cast<const float4*>(x + i);
        // Before the gate, phase 1 (Σx²) needs no gate.
        zv[j] = before_gate && !normalise ? make_float4(0.0f, 0.0f, 0.0f, 0.0f)
                                          : *reinterpret_cast<const float4*>(z + i);
      } else {
        xv[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        zv[j] = xv[j];
      }
    }
    float h[kPacks][kN];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const float xs[kN] = {xv[j].x, xv[j].y, xv[j].z, xv[j].w};
      const float zs[kN] = {zv[j].x, zv[j].y, zv[j].z, zv[j].w};
#pragma unroll
      for (int e = 0; e < kN; ++e) {
        h[j][e] = before_gate ? xs[e] : xs[e] * silu(zs[e]);  // 0 past the group: x = 0
        ss += h[j][e] * h[j][e];
      }
    }
    float inv = 0.0f;
    if (p.sumsq_in == nullptr) {
      ss = block_sum(ss);
      if (!normalise) {  // phase 1: publish Σh², do not normalise
        if (threadIdx.x == 0) p.sumsq_out[r * n_groups + g] = ss;
        continue;
      }
      inv = static_cast<float>(1.0 / sqrt(static_cast<double>(ss) / divisor + p.eps));
    } else {
      inv = static_cast<float>(1.0 / sqrt(static_cast<double>(p.sumsq_in[r * n_groups + g]) / divisor + p.eps));
    }
    float* o = p.out + r * p.out_stride + g * gs;
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int64_t i = static_cast<int64_t>(threadIdx.x + j * nt) * kN;
      if (i < gs) {
        if (before_gate)
          *reinterpret_cast<float4*>(o + i) =
              make_float4(h[j][0] * inv * wv[j][0] * silu(zv[j].x), h[j][1] * inv * wv[j][1] * silu(zv[j].y),
                          h[j][2] * inv * wv[j][2] * silu(zv[j].z), h[j][3] * inv * wv[j][3] * silu(zv[j].w));
        else
          *reinterpret_cast<float4*>(o + i) =
              make_float4(h[j][0] * inv * wv[j][0], h[j][1] * inv * wv[j][1], h[j][2] * inv * wv[j][2],
                          h[j][3] * inv * wv[j][3]);
      }
    }
    // With sumsq_in there is no barrier between rows; none is needed: a thread only ever
    // touches its own elements, and block_sum's scratch is unused.
  }
}

template <class T>
void launch_rmsnorm(const rmsnorm_params& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.rows * p.groups));
  if (vector_ok({p.x, p.out, p.weight}, {p.cols, p.x_stride, p.out_stride, p.weight_stride}, pack16<T>::kN))
    launch_pdl(rmsnorm_kernel<T, true>, grid, dim3(kNormThreads), 0, stream, p);
  else
    launch_pdl(rmsnorm_kernel<T, false>, grid, dim3(kNormThreads), 0, stream, p);
}

template <class T>
void launch_gated_rmsnorm(const gated_rmsnorm_params& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.cols / p.group_size), static_cast<unsigned>(std::min<int64_t>(p.rows, kMaxGridY)));
  const bool vec = vector_ok({p.x, p.gate, p.out, p.weight}, {p.group_size, p.x_stride, p.gate_stride, p.out_stride},
                             pack16<T>::kN);
  if constexpr (std::is_same_v<T, float>) {
    // Groups of up to kGatedRegMaxThreads · kGatedRegMaxPacks · 4 channels: the register kernel.
    const int64_t packs = p.group_size / 4;
    if (vec && packs <= int64_t{kGatedRegMaxThreads} * kGatedRegMaxPacks) {
      const int64_t per_thread = ceil_div(packs, int64_t{kGatedRegMaxThreads});
      const int k_packs = per_thread <= 1 ? 1 : per_thread <= 2 ? 2 : 4;
      const auto threads = static_cast<unsigned>(ceil_div(ceil_div(packs, int64_t{k_packs}), int64_t{32}) * 32);
      switch (k_packs) {
        case 1: launch_pdl(gated_rmsnorm_reg_kernel<1>, grid, dim3(threads), 0, stream, p); break;
        case 2: launch_pdl(gated_rmsnorm_reg_kernel<2>, grid, dim3(threads), 0, stream, p); break;
        default: launch_pdl(gated_rmsnorm_reg_kernel<4>, grid, dim3(threads), 0, stream, p); break;
      }
      return;
    }
  }
  if (vec)
    launch_pdl(gated_rmsnorm_kernel<T, true>, grid, dim3(kNormThreads), 0, stream, p);
  else
    launch_pdl(gated_rmsnorm_kernel<T, false>, grid, dim3(kNormThreads), 0, stream, p);
}

// ---- rmsnorm_linear: the decode linear layer with its input norm (norm.h) ----
//
// Block = 256 threads (kNormThreads: the norm's reduction is the rmsnorm kernel's). With a
// norm, the block first normalises the m rows into shared memory exactly as rmsnorm_kernel<float,
// true> does (same partial sums per thread, same block_sum, same scaling), so the staged rows
// are bitwise the rmsnorm op's output. Then each warp takes tasks: two weight rows (or the gate
// and up rows of one output, swiglu), streamed as 16-byte loads, kLinUnroll per lane in flight,
// dotted with the rows of x in the skinny gemm kernel's order (chunk c = lane + 32·j, fmaf over
// the 8 elements, xor-shuffle reduction), so each output equals the skinny kernel's bit for
// bit. The grid is sized for kLinBlocksPerSm blocks per SM (kernels.norm_linear_blocks_per_sm)
// with an equal number of tasks per warp; each block stages the norm once for all its tasks.
// The weights are constants, so each warp's first loads are issued before the programmatic-launch
// wait (overlapping the previous kernel's tail and the staging), and a warp's next task's first
// loads before the current task's reduction.
constexpr int kLinWarps = kNormThreads / 32;
// 16-byte chunks per lane per weight row in flight: 8 for one or two rows of x (8 KB per warp in
// flight; about 100 registers), 4 for more (keeps two blocks per SM). The unroll only groups the
// loads: the per-row order of the fmaf chain is the same for every value.
template <int M>
inline constexpr int kLinUnroll = M <= 2 ? 8 : 4;
// kernels.norm_linear_wide: one row of x, no norm, k <= 32 · kLinWideUnroll · 8 (4096) and one
// wave at one block an SM: a warp's whole task (two rows of up to 8 KB) is loaded before the
// programmatic-launch wait, in one step (about 170 registers). The same fmaf order per row.
constexpr int kLinWideUnroll = 16;
constexpr int kLinRows = 2;
// kernels.norm_linear_rows: 4 weight rows a task without swiglu (each chunk of x loaded once for
// four rows instead of two: half the activation loads per weight byte at 2-4 rows of x), the
// unroll halved so that a warp has as many bytes in flight. Each row's fmaf order is the same.
template <int M, int R>
inline constexpr int kLinUnrollRows = kLinUnroll<M> * kLinRows / R;
constexpr int64_t kLinMaxM = kNormLinearFusedMaxRows;
constexpr int64_t kLinMaxShared = 46 * 1024;  // dynamic; under the 48 KB default with block_sum's scratch


constexpr int kLinMaxGateGroups = 128;  // rows · groups of a gated norm staged by the fused kernel

// The fused kernel's gated norm of its m rows into xs [m, k] (every thread of the block calls
// it): h = x · silu(gate) (x with norm_before_gate) staged, each (row, group)'s Σh² by a warp,
// then xs = h · inv · w (· silu(gate) with norm_before_gate), the gated_rmsnorm op's formula.
__device__ __forceinline__ void stage_gated_norm(const rmsnorm_linear_params& p, int m_rows, float* xs) {
  __shared__ float inv_s[kLinMaxGateGroups];
  constexpr int kN = 4;
  const int64_t k = p.k, gs = p.norm_group > 0 ? p.norm_group : k, groups = k / gs;
  const int64_t step = static_cast<int64_t>(blockDim.x) * kN;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int m = 0; m < m_rows; ++m) {
    const float* x = p.x + m * p.x_stride;
    const float* z = p.gate + m * p.gate_stride;
    for (int64_t i = threadIdx.x * kN; i < k; i += step) {
      const float4 xv = *reinterpret_cast<const float4*>(x + i);
      float4 h = xv;
      if (!p.norm_before_gate) {
        const float4 zv = *reinterpret_cast<const float4*>(z + i);
        h = make_float4(xv.x * silu(zv.x), xv.y * silu(zv.y), xv.z * silu(zv.z), xv.w * silu(zv.w));
      }
      *reinterpret_cast<float4*>(xs + m * k + i) = h;
    }
  }
  __syncthreads();
  for (int64_t mg = warp; mg < m_rows * groups; mg += warps) {
    const float* h = xs + (mg / groups) * k + (mg % groups) * gs;
    float ss = 0.0f;
    for (int64_t i = lane; i < gs; i += 32) ss += h[i] * h[i];
    ss = warp_sum(ss);
    if (lane == 0) inv_s[mg] = static_cast<float>(1.0 / sqrt(static_cast<double>(ss) / static_cast<double>(gs) + p.eps));
  }
  __syncthreads();
  for (int m = 0; m < m_rows; ++m) {
    const float* z = p.gate + m * p.gate_stride;
    for (int64_t i = threadIdx.x * kN; i < k; i += step) {
      const float inv = inv_s[m * groups + i / gs];  // gs % 4 == 0: the 4 channels share a group
      float4 h = *reinterpret_cast<const float4*>(xs + m * k + i);
      const float4 w = *reinterpret_cast<const float4*>(p.norm_weight + i);
      float4 post = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
      if (p.norm_before_gate) {
        const float4 zv = *reinterpret_cast<const float4*>(z + i);
        post = make_float4(silu(zv.x), silu(zv.y), silu(zv.z), silu(zv.w));
      }
      h = make_float4(h.x * inv * w.x * post.x, h.y * inv * w.y * post.y, h.z * inv * w.z * post.z,
                      h.w * inv * w.w * post.w);
      *reinterpret_cast<float4*>(xs + m * k + i) = h;
      if (p.normed_out != nullptr && blockIdx.x == 0) *reinterpret_cast<float4*>(p.normed_out + m * k + i) = h;
    }
  }
}

// The fused kernels' norm of their M rows of x into xs [M, k] (every thread of the block calls
// it; 256 threads): exactly rmsnorm_kernel<float, true>'s partial sums, block_sum and scaling (or
// stage_gated_norm's), so the staged rows are bitwise the norm op's output; block 0 also writes
// them to normed_out. Ends with a barrier.
template <int M>
__device__ __forceinline__ void stage_norm(const rmsnorm_linear_params& p, float* xs) {
  const int64_t k = p.k;
  if (p.gate != nullptr) {
    stage_gated_norm(p, M, xs);
  } else {
    constexpr int kN = 4;
    const int64_t step = static_cast<int64_t>(blockDim.x) * kN;
#pragma unroll 1
    for (int m = 0; m < M; ++m) {
      const float* x = p.x + m * p.x_stride;
      float ss = 0.0f;
      for (int64_t i = threadIdx.x * kN; i < k; i += step) {
        const pack16<float> v = load_pack(x + i);
#pragma unroll
        for (int j = 0; j < kN; ++j) ss += to_float(v.v[j]) * to_float(v.v[j]);
      }
      ss = block_sum(ss);
      const auto inv = static_cast<float>(1.0 / sqrt(static_cast<double>(ss) / static_cast<double>(k) + p.eps));
      for (int64_t i = threadIdx.x * kN; i < k; i += step) {
        const pack16<float> v = load_pack(x + i);
        float w[kN];
        load_floats<kN>(p.norm_weight + i, w);
        pack16<float> out;
#pragma unroll
        for (int j = 0; j < kN; ++j) out.v[j] = from_float<float>(to_float(v.v[j]) * inv * w[j]);
        store_pack(xs + m * k + i, out);
        if (p.normed_out != nullptr && blockIdx.x == 0) store_pack(p.normed_out + m * k + i, out);
      }
    }
  }
  __syncthreads();
}

// The 8 activations at a (16-byte aligned): kStaged, the block's normed rows in shared memory;
// else x in global memory (read-only loads).
template <bool kStaged>
__device__ __forceinline__ void load_x8(const float* a, float (&x)[8]) {
  const float4* ap = reinterpret_cast<const float4*>(a);
  const float4 x0 = kStaged ? ap[0] : __ldg(ap), x1 = kStaged ? ap[1] : __ldg(ap + 1);
  x[0] = x0.x, x[1] = x0.y, x[2] = x0.z, x[3] = x0.w, x[4] = x1.x, x[5] = x1.y, x[6] = x1.z, x[7] = x1.w;
}

// A product's store without swiglu: the skinny kernel's epilogue (gemm.cu), explicit roundings
// included (alpha 1, beta: the residual); relu2: the relu2 op's formula on the stored product.
__device__ __forceinline__ void linear_epilogue(const rmsnorm_linear_params& p, float* out, float acc) {
  const float alpha = 1.0f;
  const float v = p.beta != 0.0f ? __fmaf_rn(alpha, acc, __fmul_rn(p.beta, *out)) : __fmul_rn(alpha, acc);
  if (p.relu2) {
    const float pos = v > 0.0f ? v : 0.0f;
    *out = __fmul_rn(pos, pos);
  } else {
    *out = v;
  }
}

// Warp w of block b takes tasks t, t + gridDim.x · kLinWarps, … from t = b · kLinWarps + w, or
// with `spread` from t = w · gridDim.x + b: then every block of the grid gets an equal share
// (within one task) however few tasks there are, so a grid of the resident blocks loads every SM
// alike. Each task's arithmetic is the same either way.
template <int M, bool kSwiglu, bool kNorm, int U = kLinUnroll<M>, int kRows = kLinRows>
__global__ void __launch_bounds__(kNormThreads) rmsnorm_linear_kernel(const rmsnorm_linear_params p, int64_t tasks,
                                                                       bool spread) {
  static_assert(!kSwiglu || kRows == 2, "swiglu: a task is one output, its gate and up rows");
  extern __shared__ float4 lin_shared[];
  float* xs = reinterpret_cast<float*>(lin_shared);  // [M, k] normed rows (kNorm)
  constexpr int kOutRows = kSwiglu ? 1 : kRows;
  const int lane = threadIdx.x & 31;
  const int64_t n_warps = static_cast<int64_t>(gridDim.x) * kLinWarps;
  const auto* w0 = static_cast<const __nv_bfloat16*>(p.w);
  const auto* w1 = static_cast<const __nv_bfloat16*>(p.up_w);
  const int64_t k = p.k;
  const int64_t chunks = k / 8;

  // The weight rows of a task, and one step of U chunks per row from chunk c0.
  const uint4* brow[kRows];
  uint4 wv[U][kRows];
  auto task_rows = [&](int64_t t) {
    const int64_t row0 = t * kOutRows;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if constexpr (kSwiglu) {
        brow[r] = reinterpret_cast<const uint4*>((r == 0 ? w0 : w1) + row0 * p.w_stride);
      } else {
        const int64_t row = row0 + r < p.n ? row0 + r : p.n - 1;  // a duplicate row past the end, not stored
        brow[r] = reinterpret_cast<const uint4*>(w0 + row * p.w_stride);
      }
    }
  };
  auto load_step = [&](int64_t c0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + 32 * u;
#pragma unroll
      for (int r = 0; r < kRows; ++r) wv[u][r] = c < chunks ? __ldcs(brow[r] + c) : make_uint4(0, 0, 0, 0);
    }
  };

  // The weights are constants: the first task's first step is loaded before the wait, so that
  // it overlaps the end of the previous kernel (and the norm's staging below).
  const int64_t warp = threadIdx.x / 32;
  int64_t t = spread ? warp * gridDim.x + blockIdx.x : static_cast<int64_t>(blockIdx.x) * kLinWarps + warp;
  if (t < tasks) {
    task_rows(t);
    load_step(lane);
  }
  pdl_begin();  // x (and out, with beta) come from earlier kernels
  if constexpr (kNorm) stage_norm<M>(p, xs);
  const float* a = kNorm ? xs : p.x;
  const int64_t lda = kNorm ? k : p.x_stride;

  for (; t < tasks; t += n_warps) {
    const int64_t row0 = t * kOutRows;
    float acc[kRows][M] = {};
    for (int64_t c0 = lane; c0 < chunks; c0 += 32 * U) {
      if (c0 != lane) load_step(c0);  // the task's first step is already loaded
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t c = c0 + 32 * u;
        if (c >= chunks) break;
        float wf[kRows][8];
#pragma unroll
        for (int r = 0; r < kRows; ++r) bf16x8_to_float(wv[u][r], wf[r]);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float x[8];
          load_x8<kNorm>(a + m * lda + c * 8, x);
#pragma unroll
          for (int r = 0; r < kRows; ++r)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[r][m] = fmaf(x[e], wf[r][e], acc[r][m]);
        }
      }
    }
    // The next task's first step goes out before this one's reduction and stores.
    if (t + n_warps < tasks) {
      task_rows(t + n_warps);
      load_step(lane);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);
    if (lane != 0) continue;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if constexpr (kSwiglu) {
        p.out[m * p.out_stride + row0] = silu(acc[0][m]) * acc[1][m];  // the swiglu op's formula
      } else {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          if (row0 + r >= p.n) break;
          linear_epilogue(p, p.out + m * p.out_stride + row0 + r, acc[r][m]);
        }
      }
    }
  }
}

bool rmsnorm_linear_fused(const rmsnorm_linear_params& p) {
  const bool enabled = current_paths().norm_linear;
  // The fused kernel reproduces the FMA skinny path's arithmetic; with the MMA path the norm
  // and the GEMM run apart (the decode and verify linear layers must agree bit for bit).
  if (!enabled || p.w_dtype != dtype::kBF16 || p.m < 1 || p.m > kLinMaxM || skinny_uses_mma()) return false;
  if (p.norm_weight != nullptr && (p.m * p.k * 4 > kLinMaxShared || !aligned16(p.norm_weight))) return false;
  if (p.normed_out != nullptr && !aligned16(p.normed_out)) return false;
  if (p.gate != nullptr) {
    if (!current_paths().norm_linear_gate) return false;
    const int64_t gs = p.norm_group > 0 ? p.norm_group : p.k;
    if (gs % 4 != 0 || p.m * (p.k / gs) > kLinMaxGateGroups || p.gate_stride % 4 != 0 || !aligned16(p.gate)) return false;
  }
  return p.k % 8 == 0 && p.w_stride % 8 == 0 && p.x_stride % 4 == 0 && aligned16(p.x) && aligned16(p.w) &&
         (p.up_w == nullptr || aligned16(p.up_w));
}

// The fused kernel's grid: its tasks, blocks, and whether the tasks are spread over the blocks
// (kernels.norm_linear_spread: then `blocks` is set per variant, from its occupancy).
struct lin_grid {
  int64_t tasks = 0;
  unsigned blocks = 0;
  int64_t per_sm = 2;  // blocks an SM at most (kernels.norm_linear_blocks_per_sm)
  bool spread = false;
};

// One launch of a variant of the fused kernel. Spread: min(tasks, the blocks resident at once,
// at most per_sm an SM) blocks, every SM with as many; the tasks spread over them.
template <int M, bool kSwiglu, bool kNorm, int U, int R>
void launch_rmsnorm_linear_kernel(const rmsnorm_linear_params& p, lin_grid g, size_t smem, cudaStream_t stream) {
  auto kernel = rmsnorm_linear_kernel<M, kSwiglu, kNorm, U, R>;
  if (g.spread) {
    const int64_t per_sm =
        std::min<int64_t>(g.per_sm, resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), kNormThreads, smem));
    g.blocks = static_cast<unsigned>(std::min(g.tasks, per_sm * sm_count()));
  }
  launch_pdl(kernel, dim3(g.blocks), dim3(kNormThreads), smem, stream, p, g.tasks, g.spread);
}

// One launch of the fused kernel's variant: the norm's staged rows as dynamic shared memory.
template <int M, bool kSwiglu, int U, int R>
void launch_rmsnorm_linear_variant(const rmsnorm_linear_params& p, const lin_grid& g, cudaStream_t stream) {
  if (p.norm_weight != nullptr)
    launch_rmsnorm_linear_kernel<M, kSwiglu, true, U, R>(p, g, static_cast<size_t>(M * p.k) * sizeof(float), stream);
  else
    launch_rmsnorm_linear_kernel<M, kSwiglu, false, U, R>(p, g, 0, stream);
}

template <int M, bool kSwiglu>
void launch_rmsnorm_linear_m(const rmsnorm_linear_params& p, const lin_grid& g, int rows, cudaStream_t stream) {
  if constexpr (!kSwiglu) {
    if (rows == 4) return launch_rmsnorm_linear_variant<M, false, kLinUnrollRows<M, 4>, 4>(p, g, stream);
    if (M == 1 && p.norm_weight == nullptr && current_paths().norm_linear_wide && p.k / 8 <= 32 * kLinWideUnroll &&
        g.blocks <= static_cast<unsigned>(sm_count())) {
      lin_grid wide = g;
      wide.spread = false;  // its own grid: one wave at one block an SM
      return launch_rmsnorm_linear_kernel<1, false, false, kLinWideUnroll, kLinRows>(p, wide, 0, stream);
    }
  }
  launch_rmsnorm_linear_variant<M, kSwiglu, kLinUnroll<M>, kLinRows>(p, g, stream);
}

template <bool kSwiglu>
void launch_rmsnorm_linear(const rmsnorm_linear_params& p, cudaStream_t stream) {
  const int32_t asked = current_paths().norm_linear_blocks_per_sm;  // validated with the config: 0 or 1..8
  lin_grid g;
  g.per_sm = asked >= 1 && asked <= 8 ? asked : 2;
  g.spread = current_paths().norm_linear_spread;
  const int rows = !kSwiglu && current_paths().norm_linear_rows == 4 ? 4 : kLinRows;  // weight rows a task
  g.tasks = kSwiglu ? p.n : ceil_div(p.n, int64_t{rows});
  // Equal tasks per warp over at most per_sm blocks per SM; without a norm there is no staging
  // to amortise, so one task per warp (the skinny kernel's grid). (Spread: set per variant.)
  const int64_t max_warps = int64_t{sm_count()} * g.per_sm * kLinWarps;
  const int64_t per_warp = p.norm_weight != nullptr ? ceil_div(g.tasks, max_warps) : 1;
  g.blocks = static_cast<unsigned>(ceil_div(g.tasks, per_warp * kLinWarps));
  switch (p.m) {
    case 1: launch_rmsnorm_linear_m<1, kSwiglu>(p, g, rows, stream); break;
    case 2: launch_rmsnorm_linear_m<2, kSwiglu>(p, g, rows, stream); break;
    case 3: launch_rmsnorm_linear_m<3, kSwiglu>(p, g, rows, stream); break;
    default: launch_rmsnorm_linear_m<4, kSwiglu>(p, g, rows, stream); break;
  }
}

#define HYSERVE_INSTANTIATE(T)                                                \
  template void launch_rmsnorm<T>(const rmsnorm_params&, cudaStream_t); \
  template void launch_gated_rmsnorm<T>(const gated_rmsnorm_params&, cudaStream_t);
HYSERVE_CUDA_FOR_EACH_TYPE(HYSERVE_INSTANTIATE)
#undef HYSERVE_INSTANTIATE

}  // namespace
}  // namespace cuda_detail

using namespace cuda_detail;

void run_cuda(const rmsnorm_params& p, void* stream) {
  constexpr const char* op = "rmsnorm";
  cpu_detail::check_rmsnorm(p, op);
  if (p.rows * p.groups > 0x7fffffff) fail(op, "rows", p.rows, "times groups exceeds the CUDA grid");
  launch_rmsnorm<float>(p, as_stream(stream));
}

void run_cuda(const rmsnorm_linear_params& p, void* stream) {
  cpu_detail::check_rmsnorm_linear(p);
  if (p.m == 0) return;
  const cudaStream_t s = as_stream(stream);
  if (rmsnorm_linear_fused(p)) {
    if (p.up_w != nullptr) launch_rmsnorm_linear<true>(p, s);
    else launch_rmsnorm_linear<false>(p, s);
    return;
  }
  // Unfused: the rmsnorm op into a scratch block, then the gemm or swiglu_linear op.
  float* xn = nullptr;
  if (p.norm_weight != nullptr && p.normed_out == nullptr)
    CUDA_CHECK(scratch_alloc(reinterpret_cast<void**>(&xn), static_cast<size_t>(p.m * p.k) * sizeof(float), s));
  cpu_detail::run_rmsnorm_linear_unfused(p, xn, [&](const auto& q) { run_cuda(q, stream); });
  if (xn != nullptr) CUDA_CHECK(scratch_free(xn, s));
}

void run_cuda(const gated_rmsnorm_params& p, void* stream) {
  constexpr const char* op = "gated_rmsnorm";
  cpu_detail::check_gated_rmsnorm(p, op);
  if (p.cols / p.group_size > 0x7fffffff) fail(op, "group_size", p.group_size, "gives more groups than the CUDA grid");
  launch_gated_rmsnorm<float>(p, as_stream(stream));
}

}  // namespace hyserve::kernels
