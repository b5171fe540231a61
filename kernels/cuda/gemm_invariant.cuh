#pragma once
// The batch-invariant GEMM kernels beside the skinny ones (determinism: batch_invariant): the
// tiled tensor-core kernel for many activation rows and the fixed-order CUDA-core kernel. In
// gemm.cu's translation unit only (internal linkage); after gemm_skinny.cuh.
#include <cuda_bf16.h>

#include <cstdint>

#include "async_copy.cuh"
#include "common.cuh"
#include "gemm_skinny.cuh"
#include "hyserve/kernels/gemm.h"
#include "mma_bf16.cuh"

namespace hyserve::kernels::cuda_detail {
namespace {


// ---- The tiled row-invariant kernel (determinism: batch_invariant, many activation rows) ----
//
// The batch-invariant skinny kernel's arithmetic (TERMS = 1) for a prefill's many rows, where
// the skinny kernel would re-read the activations for every 16 weight rows: a block owns 128
// weight rows × BM activation rows (BM = 64, 32 for the fused SwiGLU's two weights), 8 warps as
// 4 (weight rows) × 2 (activation rows), each warp 2 MMA row tiles × BM / 16 column tiles; the
// 32-element k blocks of the weights and of the activations (rounded to bf16 once by the
// caller: skinny_args::a16) go through dynamic shared memory by cp.async, kTiledKps k blocks a
// stage and tiled_stages() stages in flight. Measured on an H100 (run 22): with one k block a
// stage, the running totals in registers (167 registers, one block of 8 warps per SM) and one
// barrier per 32 k, the kernel ran at about 70 TFLOPS whether 1 or 3 k blocks were in flight and
// whether the weight came from memory or L2; hence the totals in shared memory (two blocks per
// SM) and two k blocks a barrier.
// The order of the arithmetic is the skinny kernel's, output by output: the k blocks in the order of the
// skinny kernel's W warps (w = 0, 1, …; each w's blocks w, w + W, … ascending), each block's two
// MMAs with the same permutation of k and the same bf16 rounding of the activations, one
// partial sum per w, and the partial sums added in w order (W: the skinny kernel's choice for
// n). So a row's bits are the same whichever kernel ran its call (kTiledMinRows: speed only).
constexpr int kTiledThreads = 256;
constexpr int kTiledBn = 128;  // weight rows per block: 4 warps × 2 row tiles of 16
int64_t g_tiled_min_rows = 0;  // set_invariant_tiled_rows (benchmarks): 0 = kTiledMinRows
constexpr int64_t kTiledMinRows = 256;
constexpr int kTiledKps = 2;       // k blocks of 32 per pipeline stage (one barrier per stage)
constexpr int kTiledXld = 32 + 8;  // bf16 per staged activation row (+16 bytes: fewer bank conflicts)
constexpr int kTiledSums = 32;     // running totals per thread (2 row tiles × CT × S × 4 = 32)

// Pipeline stages: 3, 2 for the fused SwiGLU (two weight tiles a stage), so that two blocks fit
// an SM's shared memory.
template <bool kSwiglu>
__host__ __device__ constexpr int tiled_stages() {
  return kSwiglu ? 2 : 3;
}

// Dynamic shared memory of one block: stages × kTiledKps × (S weight tiles of 128 × 32 bf16,
// BM activation rows of kTiledXld bf16), then the running totals ([kTiledSums][threads] f32).
template <int BM, bool kSwiglu>
__host__ __device__ constexpr size_t tiled_stage_bytes() {
  return size_t{kTiledKps} * sizeof(__nv_bfloat16) * ((kSwiglu ? 2 : 1) * kTiledBn * 32 + BM * kTiledXld);
}
template <int BM, bool kSwiglu>
constexpr size_t tiled_smem_bytes() {
  return size_t{tiled_stages<kSwiglu>()} * tiled_stage_bytes<BM, kSwiglu>() +
         sizeof(float) * kTiledSums * kTiledThreads;
}

// Two blocks per SM (at most 128 registers a thread): the running totals of the partial sums
// live in shared memory, written once per partial sum (every kblocks / W blocks), and a stage
// holds kTiledKps k blocks, so the block waits on a barrier once per 64 k.
template <int BM, bool kSwiglu>
__global__ void __launch_bounds__(kTiledThreads, 2) invariant_tiled_kernel(const skinny_args p, int64_t m, int warps_w) {
  constexpr int S = kSwiglu ? 2 : 1;
  constexpr int CT = BM / 16;  // column tiles (8 activation rows) per warp
  constexpr int kXld = kTiledXld;
  constexpr int kStages = tiled_stages<kSwiglu>();
  static_assert(2 * CT * S * 4 == kTiledSums, "running totals per thread");
  extern __shared__ __align__(16) unsigned char tiled_smem[];
  // Stage st, k block kk of it: weights ws(st, kk)[s][row][32], activations xs(st, kk)[row][kXld].
  auto ws = [&](int st, int kk) {
    return reinterpret_cast<__nv_bfloat16 (*)[kTiledBn][32]>(tiled_smem + st * tiled_stage_bytes<BM, kSwiglu>() +
                                                              kk * S * kTiledBn * 32 * sizeof(__nv_bfloat16));
  };
  auto xs = [&](int st, int kk) {
    return reinterpret_cast<__nv_bfloat16 (*)[kXld]>(tiled_smem + st * tiled_stage_bytes<BM, kSwiglu>() +
                                                      kTiledKps * S * kTiledBn * 32 * sizeof(__nv_bfloat16) +
                                                      kk * BM * kXld * sizeof(__nv_bfloat16));
  };
  float* tot = reinterpret_cast<float*>(tiled_smem + kStages * tiled_stage_bytes<BM, kSwiglu>());  // [32][threads]
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int wn = warp & 3, wm = warp >> 2;
  // blockIdx.y: the weight tile, blockIdx.x: the activation rows. The blocks of one weight tile
  // run together and share its loads through L2; with the rows in y, every BM rows re-read the
  // whole weight from memory (32 times at 2048 rows).
  const int64_t row_base = static_cast<int64_t>(blockIdx.y) * kTiledBn;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * BM;
  const int64_t chunks = p.k / 8, kblocks = ceil_div(chunks, int64_t{4});

  auto load_block = [&](int st, int kk, int64_t kb) {
    __nv_bfloat16 (*w)[kTiledBn][32] = ws(st, kk);
    for (int i = tid; i < S * kTiledBn * 4; i += kTiledThreads) {
      const int s = i / (kTiledBn * 4), r = (i / 4) % kTiledBn, q = i % 4;
      const int64_t row = row_base + r, c = kb * 4 + q;
      const bool live = row < p.n && c < chunks;
      const __nv_bfloat16* src = (s == 1 ? p.b1 : p.b0) + (live ? row * p.ldb + c * 8 : 0);
      cp_async16_zfill(&w[s][r][q * 8], src, live ? 16u : 0u);
    }
    __nv_bfloat16 (*x)[kXld] = xs(st, kk);
    for (int i = tid; i < BM * 4; i += kTiledThreads) {
      const int r = i / 4, q = i % 4;  // q: a chunk of 8 k
      const int64_t row = col0 + r, c = kb * 4 + q;
      const bool live = row < m && c < chunks;
      const __nv_bfloat16* src = p.a16 + (live ? row * p.k + c * 8 : 0);
      cp_async16_zfill(&x[r][q * 8], src, live ? 16u : 0u);
    }
  };
  // The k blocks in the skinny kernel's warp order: w's blocks w, w + W, … ascending, then w + 1's.
  const auto advance = [&](int64_t& kb, int& w) {
    kb += warps_w;
    if (kb >= kblocks) kb = ++w;
  };
  int64_t ld_kb = 0, ld_seq = 0;
  int ld_w = 0;
  // Stage st takes the next kTiledKps blocks of the sequence (none past its end).
  auto load = [&](int st) {
#pragma unroll
    for (int kk = 0; kk < kTiledKps; ++kk) {
      if (ld_seq < kblocks) {
        load_block(st, kk, ld_kb);
        advance(ld_kb, ld_w);
        ++ld_seq;
      }
    }
  };

  float cur[2][CT][S][4] = {};
  int64_t c_kb = 0;
  int c_w = 0;
  const int64_t steps = ceil_div(kblocks, int64_t{kTiledKps});
  // Stages 0 .. kStages - 2 in flight, then one more per step: step's stage has landed once at
  // most kStages - 2 groups are pending, and the stage the step refills is the one every warp
  // finished reading in the step before (the barrier between).
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    load(s);
    cp_async_commit_group();
  }
  for (int64_t step = 0; step < steps; ++step) {
    cp_async_wait_group<kStages - 2>();
    __syncthreads();
    load(static_cast<int>((step + kStages - 1) % kStages));
    cp_async_commit_group();
    const int st = static_cast<int>(step % kStages);
#pragma unroll
    for (int kk = 0; kk < kTiledKps; ++kk) {
      if (step * kTiledKps + kk >= kblocks) break;
      __nv_bfloat16 (*w)[kTiledBn][32] = ws(st, kk);
      __nv_bfloat16 (*x)[kXld] = xs(st, kk);
      uint4 r0[2][S], r1[2][S];
#pragma unroll
      for (int rt = 0; rt < 2; ++rt)
#pragma unroll
        for (int s = 0; s < S; ++s) {
          r0[rt][s] = *reinterpret_cast<const uint4*>(&w[s][wn * 32 + rt * 16 + g][t * 8]);
          r1[rt][s] = *reinterpret_cast<const uint4*>(&w[s][wn * 32 + rt * 16 + g + 8][t * 8]);
        }
#pragma unroll
      for (int ct = 0; ct < CT; ++ct) {
        // k t·8 .. t·8 + 7 of the row as bf16 pairs: the MMA operands the skinny kernel packs.
        const uint4 xv = *reinterpret_cast<const uint4*>(&x[wm * (BM / 2) + ct * 8 + g][t * 8]);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const uint32_t b0 = j == 0 ? xv.x : xv.z, b1 = j == 0 ? xv.y : xv.w;
#pragma unroll
          for (int rt = 0; rt < 2; ++rt)
#pragma unroll
            for (int s = 0; s < S; ++s) {
              const uint4& a0 = r0[rt][s];
              const uint4& a1 = r1[rt][s];
              const uint32_t a[4] = {j == 0 ? a0.x : a0.z, j == 0 ? a1.x : a1.z, j == 0 ? a0.y : a0.w,
                                     j == 0 ? a1.y : a1.w};
              mma16::mma_bf16(cur[rt][ct][s], a, b0, b1);
            }
        }
      }
      // The last k block of partial sum w: add it to the total in w order (the skinny kernel's
      // shared-memory reduction), start the next one.
      int64_t next_kb = c_kb;
      int next_w = c_w;
      advance(next_kb, next_w);
      if (next_w != c_w) {
#pragma unroll
        for (int rt = 0; rt < 2; ++rt)
#pragma unroll
          for (int ct = 0; ct < CT; ++ct)
#pragma unroll
            for (int s = 0; s < S; ++s)
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                float& sum = tot[(((rt * CT + ct) * S + s) * 4 + e) * kTiledThreads + tid];
                sum = c_w == 0 ? cur[rt][ct][s][e] : __fadd_rn(sum, cur[rt][ct][s][e]);
                cur[rt][ct][s][e] = 0.0f;
              }
      }
      c_kb = next_kb;
      c_w = next_w;
    }
  }
  cp_async_wait_group<0>();  // no copy outlives the block (the last groups are empty)
  // Element e of an MMA tile: weight row g (+8 for e >= 2), activation row 2t (+1 for odd e).
#pragma unroll
  for (int rt = 0; rt < 2; ++rt)
#pragma unroll
    for (int ct = 0; ct < CT; ++ct)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t n_out = row_base + wn * 32 + rt * 16 + g + (e >= 2 ? 8 : 0);
        const int64_t m_out = col0 + wm * (BM / 2) + ct * 8 + 2 * t + (e & 1);
        if (n_out >= p.n || m_out >= m) continue;
        float* out = p.c + m_out * p.ldc + n_out;
        auto total = [&](int s) { return tot[(((rt * CT + ct) * S + s) * 4 + e) * kTiledThreads + tid]; };
        if constexpr (kSwiglu) {
          *out = swiglu_out(total(0), total(1));
        } else {
          const float v = total(0);
          *out = p.beta != 0.0f ? __fmaf_rn(p.alpha, v, __fmul_rn(p.beta, *out)) : __fmul_rn(p.alpha, v);
        }
      }
}

template <bool kSwiglu>
void launch_invariant_tiled(const skinny_args& a, int64_t m, int warps_w, cudaStream_t stream) {
  constexpr int BM = kSwiglu ? 32 : 64;
  const int64_t tiles = ceil_div(a.n, int64_t{kTiledBn}), row_tiles = ceil_div(m, int64_t{BM});
  if (tiles > 65535) fail("gemm", "n", a.n, "exceeds the row-invariant tiled kernel's grid (65535 weight tiles)");
  if (row_tiles > 0x7fffffff) fail("gemm", "m", m, "exceeds the row-invariant tiled kernel's grid");
  const dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(tiles));
  constexpr size_t smem = tiled_smem_bytes<BM, kSwiglu>();
  reserve_dynamic_shared(reinterpret_cast<const void*>(&invariant_tiled_kernel<BM, kSwiglu>), smem);
  invariant_tiled_kernel<BM, kSwiglu><<<grid, kTiledThreads, smem, stream>>>(a, m, warps_w);
}

// ---- The row-invariant CUDA-core GEMM (determinism: batch_invariant) ----
//
// f32 weights, and bf16 weights in layouts the tensor-core skinny kernel does not read (trans_a,
// unaligned rows): C = α·op(A)·op(B) + β·C on 64 × 64 output tiles, 256 threads with 4 × 4
// outputs each, op(A) and op(B) staged through shared memory 16 k at a time (zeros past m, n
// and k). Every output is one fmaf chain over k = 0, 1, … in order (the zeros past k leave it
// unchanged), then scaled with explicit roundings: its bits depend on its row of op(A) and
// column of op(B) alone, whatever m and wherever the row sits in the call. Not the fast path
// for f32 (cuBLAS is, with determinism: fast); it exists so that an f32 model's tokens do not
// depend on its batch either.
constexpr int kInvTile = 64, kInvK = 16, kInvThreads = 256;

__device__ __forceinline__ float load_f(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_f(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }

template <class TB>
__global__ void __launch_bounds__(kInvThreads) invariant_gemm_kernel(const gemm_params p) {
  __shared__ float as[kInvK][kInvTile + 1];
  __shared__ float bs[kInvK][kInvTile + 1];
  const TB* b = static_cast<const TB*>(p.b);
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kInvTile, n0 = static_cast<int64_t>(blockIdx.x) * kInvTile;
  const int tx = static_cast<int>(threadIdx.x) % 16, ty = static_cast<int>(threadIdx.x) / 16;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < p.k; k0 += kInvK) {
    for (int e = static_cast<int>(threadIdx.x); e < kInvTile * kInvK; e += kInvThreads) {
      // Consecutive threads along the stored rows (coalesced): k for A [m, k], m for A [k, m].
      const int r = p.trans_a ? e % kInvTile : e / kInvK, kk = p.trans_a ? e / kInvTile : e % kInvK;
      const int64_t gi = m0 + r, gk = k0 + kk;
      as[kk][r] = gi < p.m && gk < p.k ? (p.trans_a ? p.a[gk * p.lda + gi] : p.a[gi * p.lda + gk]) : 0.0f;
      // op(B)[k, n]: B [n, k] when trans_b (consecutive threads along k), else B [k, n].
      const int c = p.trans_b ? e / kInvK : e % kInvTile, kb = p.trans_b ? e % kInvK : e / kInvTile;
      const int64_t gn = n0 + c, gkb = k0 + kb;
      bs[kb][c] = gn < p.n && gkb < p.k ? load_f(b, p.trans_b ? gn * p.ldb + gkb : gkb * p.ldb + gn) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kInvK; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = as[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = bs[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = m0 + ty + 16 * i;
    if (row >= p.m) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t col = n0 + tx + 16 * j;
      if (col >= p.n) continue;
      float* out = p.c + row * p.ldc + col;
      *out = p.beta != 0.0f ? __fmaf_rn(p.alpha, acc[i][j], __fmul_rn(p.beta, *out)) : __fmul_rn(p.alpha, acc[i][j]);
    }
  }
}

template <class TB>
void invariant_gemm(const gemm_params& p, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return;
  const int64_t gy = ceil_div(p.m, int64_t{kInvTile}), gx = ceil_div(p.n, int64_t{kInvTile});
  if (gy > 65535) fail("gemm", "m", p.m, "exceeds the row-invariant CUDA-core kernel's grid (65535 tiles of 64 rows)");
  if (gx > 0x7fffffff) fail("gemm", "n", p.n, "exceeds the row-invariant CUDA-core kernel's grid");
  invariant_gemm_kernel<TB><<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), kInvThreads, 0, stream>>>(p);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace
}  // namespace hyserve::kernels::cuda_detail
