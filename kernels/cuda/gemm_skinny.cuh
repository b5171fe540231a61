#pragma once
// The skinny bf16-weight GEMM kernels of the gemm op (gemm.cu, the only includer): the CUDA-core
// FMA kernel and the tensor-core MMA kernel with their launchers. In gemm.cu's translation unit
// only (internal linkage).
#include <cuda_bf16.h>

#include <cstdint>

#include "common.cuh"
#include "gemm_paths.h"
#include "launch.cuh"
#include "mma_bf16.cuh"

namespace hyserve::kernels::cuda_detail {
namespace {


// Skinny GEMM with a bf16 weight (decode: m ≤ 8 rows of activations, C = α·A·Bᵀ + β·C with B
// [n, k] row-major): memory-bound on B, so each warp streams R rows of B as 16-byte loads,
// 8 / R of them per lane and row in flight, and dots them with the f32 rows of A (read through
// the read-only cache, shared by the block's warps); f32 accumulation, no rounding of A (the CPU
// op's arithmetic). One kernel instead of a rounding pass plus a tensor-core GEMM that a single
// row cannot fill. R (2, 4 or 8 rows of B per warp) grows with m: each A load serves R rows of
// B, so the A bytes a warp reads per B byte are 2m / R (8 at m = 8 with R = 2, which made the
// call bound by L1/L2 rather than by the weight stream); but R = 8 leaves a narrow weight
// (n = 4096) too few blocks to fill the device. skinny_rows_for holds the choice measured on the
// H200 (hyserve-bench-cuda skinny_gemm; bench/results). Row m's arithmetic (its own
// accumulators, the same chunk order — lane l takes chunks l, l + 32, … in order whatever R —
// and the same warp reduction) does not depend on how many rows the call has: a row's result
// is bitwise the same in a 1-row decode and in an 8-row verify.
constexpr int kSkinnyThreads = 256;
constexpr int kSkinnyInFlight = 8;  // 16-byte chunks per lane in flight (over R rows)
constexpr int64_t kSkinnyMaxM = 8;
// The largest R instantiated for m rows (R > 2m gains nothing).
__host__ __device__ constexpr int skinny_rows(int m) { return m <= 2 ? 2 : m <= 4 ? 4 : 8; }

// R for a call (measured, 9B shapes at m = 1..8: MLP gate/up fused, down, lm_head): 2 up to
// m = 3; 4 from m = 4; 8 from m = 7 for the fused gate/up (2 streams per output) and for wide
// weights (n >= 16384: enough blocks at 8 rows per warp).
int skinny_rows_for(int64_t m, int64_t n, bool swiglu) {
  if (m <= 3) return 2;
  if (m >= 7 && (swiglu || n >= 16384)) return 8;
  return 4;
}

// What one skinny launch computes: c[m, row] for rows of b0 (R rows of b0 per warp), or with
// swiglu c[m, row] = silu(x·b0[row]) · (x·b1[row]) (R / 2 outputs per warp, each streaming its
// gate row of b0 and its up row of b1).
struct skinny_args {
  const float* a = nullptr;
  const __nv_bfloat16* b0 = nullptr;
  const __nv_bfloat16* b1 = nullptr;
  float* c = nullptr;
  int64_t n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  float alpha = 1.0f, beta = 0.0f;
  // The activations rounded to bf16 once ([m, k], ld k; the tensor-core kernel's many-row
  // batch_invariant calls): half the bytes every block of weight rows re-reads, the same bits
  // as rounding a's f32 values in the kernel.
  const __nv_bfloat16* a16 = nullptr;
};

template <int M, int R, bool kSwiglu>
__global__ void __launch_bounds__(kSkinnyThreads) skinny_bf16_kernel(const skinny_args p) {
  static_assert(R == 2 || R == 4 || R == 8, "rows of B streamed per warp");
  static_assert(R <= 8 && R <= skinny_rows(M), "instantiated up to skinny_rows(M)");
  constexpr int U = kSkinnyInFlight / R;       // chunks per lane and row in flight
  constexpr int kOutRows = kSwiglu ? R / 2 : R;  // outputs per warp
  const int lane = threadIdx.x & 31;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * (kSkinnyThreads / 32) + threadIdx.x / 32) * kOutRows;
  const bool idle = row0 >= p.n;  // a warp past the last row (it still waits, below)
  const uint4* brow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t out = row0 + (kSwiglu ? r / 2 : r);
    const int64_t row = out < p.n ? out : p.n - 1;  // a duplicate row past the end, not stored
    brow[r] = reinterpret_cast<const uint4*>((kSwiglu && r % 2 == 1 ? p.b1 : p.b0) + row * p.ldb);
  }
  float acc[R][M] = {};
  const int64_t chunks = p.k / 8;
  uint4 w[U][R];
  const auto load_weights = [&](int64_t c0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + 32 * u;
#pragma unroll
      for (int r = 0; r < R; ++r) w[u][r] = c < chunks ? __ldcs(brow[r] + c) : make_uint4(0, 0, 0, 0);
    }
  };
  // Launched with programmatic dependent launch: no earlier kernel writes the weights, so the
  // first chunks of every lane are in flight before pdl_wait(), while the kernel before (the
  // norm or mixer that produces a) finishes; a is read only after it.
  if (!idle) load_weights(lane);
  pdl_begin();
  if (idle) return;
  for (int64_t c0 = lane; c0 < chunks; c0 += 32 * U) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + 32 * u;
      if (c >= chunks) break;
      float wf[R][8];
#pragma unroll
      for (int r = 0; r < R; ++r) bf16x8_to_float(w[u][r], wf[r]);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const float4* ap = reinterpret_cast<const float4*>(p.a + m * p.lda + c * 8);
        const float4 x0 = __ldg(ap), x1 = __ldg(ap + 1);
        const float x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r][m] = fmaf(x[e], wf[r][e], acc[r][m]);
      }
    }
    if (c0 + 32 * U < chunks) load_weights(c0 + 32 * U);
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);
  if (lane != 0) return;
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int o = 0; o < kOutRows; ++o) {
      if (row0 + o >= p.n) break;
      float* out = p.c + m * p.ldc + row0 + o;
      if constexpr (kSwiglu) {
        const float g = acc[2 * o][m];
        *out = g / (1.0f + expf(-g)) * acc[2 * o + 1][m];  // the swiglu op's formula
      } else {
        // Explicit roundings: left to the compiler, α·acc + β·c may contract into either fma,
        // differently per M instantiation (a row's result would then depend on the call's m).
        *out = p.beta != 0.0f ? __fmaf_rn(p.alpha, acc[o][m], __fmul_rn(p.beta, *out)) : __fmul_rn(p.alpha, acc[o][m]);
      }
    }
  }
}

// ---- The tensor-core skinny path (m <= 8 rows of f32 A, bf16 B [n, k]) ----
//
// C[:, rows]ᵀ = B[rows, :] · Aᵀ as mma.sync m16n8k16 (bf16 in, f32 accumulate): the 16 rows of
// the MMA's A operand are 16 rows of the weight, its 8 columns of the B operand the (up to 8)
// rows of activations (columns >= m read zeros). The activations are not rounded: each f32 x
// is split exactly into three bf16 terms (x = hi + mid + lo: truncations to the top 16 bits of
// what is left, 3 × 8 significant bits = f32's 24), and the weight fragment is multiplied by
// each (products of bf16 are exact in f32). A block of WARPS warps owns 16·TILES weight
// rows; warp w takes the 32-element k blocks w, w + WARPS, …; their partial sums are added
// in warp order through shared memory. A fixed permutation of k inside each 32-element block
// lets every lane load its fragments as 16-byte chunks: lane (g = lane / 4, t = lane % 4) reads
// chunk t of the block (8 consecutive k) of weight rows g and g + 8 and of activation row g, and
// MMA j (0, 1) of the block takes elements 4j .. 4j + 3 of each lane's chunk as its k positions
// 2t, 2t + 1, 2t + 8, 2t + 9. An output's arithmetic depends only on n, k and its own column
// (the MMA's columns are independent; the k split and the warp order do not depend on m), so a
// row's result is bitwise the same in a 1-row decode and an 8-row verify. TILES (1 or 2, by n
// only) changes only how many row tiles share a block's activation loads, not any result.
constexpr int kMmaUnroll = 4;  // k blocks per warp in flight

// MMAs: mma16::mma_bf16 (mma_bf16.cuh), m16n8k16, bf16 in, f32 accumulate.

// Two f32 as three bf16x2 terms (hi, mid, lo), element e0 in the low halves; exact (barring
// subnormal remainders): each term is the top 16 bits of what the terms before it leave.
__device__ __forceinline__ void split3_bf16x2(float e0, float e1, uint32_t (&t)[3]) {
  uint32_t u0 = __float_as_uint(e0), u1 = __float_as_uint(e1);
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    t[i] = __byte_perm(u0, u1, 0x7632);
    const float h0 = __uint_as_float(u0 & 0xffff0000u), h1 = __uint_as_float(u1 & 0xffff0000u);
    u0 = __float_as_uint(__uint_as_float(u0) - h0);
    u1 = __float_as_uint(__uint_as_float(u1) - h1);
  }
}

// silu(g)·u, the swiglu op's formula, compiled once for every tensor-core kernel: inlined, its
// addition could contract into an FMA with expf's last product differently per instantiation,
// and a row's bits would follow the kernel (and so the call's m).
__device__ __noinline__ float swiglu_out(float g, float u) { return g / (1.0f + expf(-g)) * u; }

//
// TERMS: 3 multiplies the weights by f32 activations split exactly as above (kernels.skinny:
// mma, m <= 8); 1 rounds the activations to bf16 (mma16::pack_bf16x2) and makes one MMA per 16 k (determinism:
// batch_invariant, every m: the activations as cuBLAS takes them, a third of the MMAs).
// Any m (batch_invariant): groups of 8 activation rows are the MMA's columns, CG groups per
// block (they share the block's weight loads: each weight fragment is multiplied by every
// group's activations), blockIdx.x the block's first group. A group's arithmetic is the one
// above, so row r of an m-row call has the bits of the same row in a 1-row call for every m.
// kX16: the activations come pre-rounded (skinny_args::a16): each lane's 8 k values are one
// 16-byte load whose bf16 pairs are the packed MMA operands, bit for bit those of TERMS = 1.
template <int WARPS, int TILES, int CG, int TERMS, bool kSwiglu, bool kX16 = false>
__global__ void __launch_bounds__(32 * WARPS, TILES == 1 && CG == 1 ? 1024 / (32 * WARPS) : 0)
    skinny_mma_kernel(const skinny_args p, int64_t m) {
  static_assert(TERMS == 1 || TERMS == 3, "activation terms");
  static_assert(!kX16 || TERMS == 1, "pre-rounded activations are one term");
  constexpr int S = kSwiglu ? 2 : 1;  // weight streams per output row (gate, up)
  __shared__ float part[WARPS][TILES][S][32][4];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int g = lane >> 2, t = lane & 3;
  // blockIdx.y: the weight tile; blockIdx.x: the groups of activation rows. The blocks of one
  // weight tile are launched one after another, so they stream it at the same time and every
  // block after the first reads it from L2 (with the tile in x, each further 32 rows re-read the
  // whole weight from memory once the earlier rows' blocks had pushed it out of L2).
  const int64_t row_base = static_cast<int64_t>(blockIdx.y) * 16 * TILES;
  const uint4* wrow[TILES][S][2];
#pragma unroll
  for (int ti = 0; ti < TILES; ++ti)
#pragma unroll
    for (int s = 0; s < S; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t out = row_base + 16 * ti + g + 8 * h;
        const int64_t row = out < p.n ? out : p.n - 1;  // a duplicate row past the end, not stored
        wrow[ti][s][h] = reinterpret_cast<const uint4*>((s == 1 ? p.b1 : p.b0) + row * p.ldb);
      }
  // The block's activation rows: group cg holds rows col0 + 8·cg .. + 7; lane (g, t) reads row
  // col0 + 8·cg + g (rows past m read zeros).
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * 8 * CG;
  bool x_live[CG];
  const float4* xrow[CG];
  const uint4* xrow16[CG];
#pragma unroll
  for (int cg = 0; cg < CG; ++cg) {
    const int64_t r = col0 + 8 * cg + g;
    x_live[cg] = r < m;
    if constexpr (kX16) xrow16[cg] = reinterpret_cast<const uint4*>(p.a16 + (x_live[cg] ? r : 0) * p.k);
    else xrow[cg] = reinterpret_cast<const float4*>(p.a + (x_live[cg] ? r : 0) * p.lda);
  }
  float acc[CG][TILES][S][4] = {};
  const int64_t chunks = p.k / 8, kblocks = ceil_div(chunks, int64_t{4});
  // Launched with programmatic dependent launch: the weights' first blocks are fetched into L2
  // before pdl_wait() (no earlier kernel writes them; a prefetch holds no registers), while the
  // kernel before finishes; the activations are read only after it.
#pragma unroll
  for (int u = 0; u < kMmaUnroll; ++u) {
    const int64_t c = (warp + u * WARPS) * 4 + t;
    if (c < chunks) {
#pragma unroll
      for (int ti = 0; ti < TILES; ++ti)
#pragma unroll
        for (int s = 0; s < S; ++s)
#pragma unroll
          for (int h = 0; h < 2; ++h) prefetch_l2(wrow[ti][s][h] + c);
    }
  }
  pdl_begin();
  for (int64_t kb0 = warp; kb0 < kblocks; kb0 += WARPS * kMmaUnroll) {
    uint4 w[kMmaUnroll][TILES][S][2];
    float4 x[kMmaUnroll][2];  // group 0's activations (the others' are loaded where used)
    uint4 x16[kMmaUnroll];    // the same, pre-rounded (kX16)
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      const int64_t c = (kb0 + u * WARPS) * 4 + t;
      const bool live = c < chunks;
#pragma unroll
      for (int ti = 0; ti < TILES; ++ti)
#pragma unroll
        for (int s = 0; s < S; ++s)
#pragma unroll
          for (int h = 0; h < 2; ++h) w[u][ti][s][h] = live ? __ldcs(wrow[ti][s][h] + c) : make_uint4(0, 0, 0, 0);
      if constexpr (kX16) {
        x16[u] = live && x_live[0] ? __ldg(xrow16[0] + c) : make_uint4(0, 0, 0, 0);
      } else {
        x[u][0] = live && x_live[0] ? __ldg(xrow[0] + 2 * c) : make_float4(0, 0, 0, 0);
        x[u][1] = live && x_live[0] ? __ldg(xrow[0] + 2 * c + 1) : make_float4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      const int64_t c = (kb0 + u * WARPS) * 4 + t;
      const bool live = c < chunks;
#pragma unroll
      for (int cg = 0; cg < CG; ++cg) {
        float4 xc[2];
        uint4 xc16;
        if constexpr (kX16) {
          xc16 = cg == 0 ? x16[u] : live && x_live[cg] ? __ldg(xrow16[cg] + c) : make_uint4(0, 0, 0, 0);
        } else if (cg == 0) {
          xc[0] = x[u][0];
          xc[1] = x[u][1];
        } else {
          xc[0] = live && x_live[cg] ? __ldg(xrow[cg] + 2 * c) : make_float4(0, 0, 0, 0);
          xc[1] = live && x_live[cg] ? __ldg(xrow[cg] + 2 * c + 1) : make_float4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          uint32_t b0[3], b1[3];
          if constexpr (kX16) {
            b0[0] = j == 0 ? xc16.x : xc16.z;
            b1[0] = j == 0 ? xc16.y : xc16.w;
          } else if constexpr (TERMS == 3) {
            split3_bf16x2(xc[j].x, xc[j].y, b0);
            split3_bf16x2(xc[j].z, xc[j].w, b1);
          } else {
            b0[0] = mma16::pack_bf16x2(xc[j].x, xc[j].y);
            b1[0] = mma16::pack_bf16x2(xc[j].z, xc[j].w);
          }
#pragma unroll
          for (int ti = 0; ti < TILES; ++ti)
#pragma unroll
            for (int s = 0; s < S; ++s) {
              const uint4& r0 = w[u][ti][s][0];
              const uint4& r1 = w[u][ti][s][1];
              const uint32_t a[4] = {j == 0 ? r0.x : r0.z, j == 0 ? r1.x : r1.z, j == 0 ? r0.y : r0.w,
                                     j == 0 ? r1.y : r1.w};
#pragma unroll
              for (int i = TERMS - 1; i >= 0; --i) mma16::mma_bf16(acc[cg][ti][s], a, b0[i], b1[i]);  // smallest term first
            }
        }
      }
    }
  }
#pragma unroll
  for (int cg = 0; cg < CG; ++cg) {
    if (cg > 0) __syncthreads();  // the previous group's sums are read
#pragma unroll
    for (int ti = 0; ti < TILES; ++ti)
#pragma unroll
      for (int s = 0; s < S; ++s)
#pragma unroll
        for (int r = 0; r < 4; ++r) part[warp][ti][s][lane][r] = acc[cg][ti][s][r];
    __syncthreads();
    // One output (tile, row, column) per thread: the warps' partial sums in warp order.
    for (int o = static_cast<int>(threadIdx.x); o < TILES * 16 * 8; o += 32 * WARPS) {
      const int ti = o / 128, row = (o / 8) % 16, col = o % 8;
      const int src_lane = (row % 8) * 4 + col / 2, src_reg = (row / 8) * 2 + col % 2;
      const int64_t out_row = row_base + 16 * ti + row;
      const int64_t out_col = col0 + 8 * cg + col;
      if (out_col >= m || out_row >= p.n) continue;
      float v[S];
#pragma unroll
      for (int s = 0; s < S; ++s) {
        v[s] = part[0][ti][s][src_lane][src_reg];
#pragma unroll
        for (int w2 = 1; w2 < WARPS; ++w2) v[s] += part[w2][ti][s][src_lane][src_reg];
      }
      float* out = p.c + out_col * p.ldc + out_row;
      if constexpr (kSwiglu) {
        *out = swiglu_out(v[0], v[1]);
      } else {
        *out = p.beta != 0.0f ? __fmaf_rn(p.alpha, v[0], __fmul_rn(p.beta, *out)) : __fmul_rn(p.alpha, v[0]);
      }
    }
  }
}

// Groups of 8 activation rows per block: 1 up to 8 rows (the decode kernel, bounded to 64
// registers per thread), 2 up to 16, else 4 (more groups per weight load, fewer re-reads of
// the weight by the blocks of other groups), with the activations pre-rounded (a16, set by the
// caller above 16 rows). Speed only: every choice gives the same bits.
constexpr int kMaxRowGroups = 4;
int skinny_row_groups(int64_t m) { return m <= 8 ? 1 : m <= 16 ? 2 : kMaxRowGroups; }

// exact (kernels.skinny: mma, m <= 8): f32 activations in three terms; else (batch_invariant)
// bf16-rounded activations, any m.
template <int WARPS, int TILES, bool kSwiglu>
void launch_skinny_mma_w(const skinny_args& a, int64_t m, bool exact, cudaStream_t stream) {
  const int64_t tiles = ceil_div(a.n, int64_t{16} * TILES);
  if (tiles > 65535) fail("gemm", "n", a.n, "exceeds the tensor-core skinny kernel's grid (65535 weight tiles)");
  if (exact) {
    launch_pdl(skinny_mma_kernel<WARPS, TILES, 1, 3, kSwiglu>, dim3(1, static_cast<unsigned>(tiles)), dim3(32 * WARPS), 0, stream, a, m);
    return;
  }
  const int cg = skinny_row_groups(m);
  const int64_t groups = ceil_div(m, int64_t{8} * cg);
  if (groups > 0x7fffffff) fail("gemm", "m", m, "exceeds the row-invariant kernel's grid");
  const dim3 grid(static_cast<unsigned>(groups), static_cast<unsigned>(tiles));
  if (a.a16 == nullptr && cg == kMaxRowGroups) fail("gemm", "m", m, "needs the pre-rounded activations (internal)");
  if (cg == 1) launch_pdl(skinny_mma_kernel<WARPS, TILES, 1, 1, kSwiglu>, grid, dim3(32 * WARPS), 0, stream, a, m);
  else if (cg == 2) launch_pdl(skinny_mma_kernel<WARPS, TILES, 2, 1, kSwiglu>, grid, dim3(32 * WARPS), 0, stream, a, m);
  else launch_pdl(skinny_mma_kernel<WARPS, TILES, kMaxRowGroups, 1, kSwiglu, true>, grid, dim3(32 * WARPS), 0, stream, a, m);
}

// Blocks of the one-group kernel resident on the whole device at once (read once per
// instantiation). It alone sizes the k split (warps per block) for every m.
template <int WARPS, int TILES, bool kSwiglu>
int64_t skinny_mma_slots() {
  static const int64_t slots = [] {
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, skinny_mma_kernel<WARPS, TILES, 1, 3, kSwiglu>,
                                                             32 * WARPS, 0));
    return int64_t{per_sm} * sm_count();
  }();
  return slots;
}

// Warps per block (the k split): the most of 16, 8, 4 with which every row tile's block is
// resident at once, so no partial last wave idles most of the device (a 4096-row weight: 256
// tiles, 16 warps; the fused 14336-row gate/up: 896 tiles, 4 warps); with more tiles than
// that, 8. By n (and the device) only: the k split fixes the summation order, which must not
// depend on m.
template <int TILES, bool kSwiglu>
int skinny_mma_warps(int64_t n) {
  const int64_t tiles = ceil_div(n, int64_t{16} * TILES);
  if (tiles <= skinny_mma_slots<16, TILES, kSwiglu>()) return 16;
  if (tiles <= skinny_mma_slots<8, TILES, kSwiglu>()) return 8;
  if (tiles <= skinny_mma_slots<4, TILES, kSwiglu>()) return 4;
  return 8;
}

template <int TILES, bool kSwiglu>
void launch_skinny_mma_t(const skinny_args& a, int64_t m, bool exact, cudaStream_t stream) {
  switch (skinny_mma_warps<TILES, kSwiglu>(a.n)) {
    case 16: return launch_skinny_mma_w<16, TILES, kSwiglu>(a, m, exact, stream);
    case 4: return launch_skinny_mma_w<4, TILES, kSwiglu>(a, m, exact, stream);
    default: return launch_skinny_mma_w<8, TILES, kSwiglu>(a, m, exact, stream);
  }
}

// Row tiles per block: 2 for wide plain weights (half the activation reads per weight byte),
// else 1. One-tile blocks are bounded to 64 registers per thread (1024 threads per SM), so
// that small blocks can all be resident.
int g_skinny_rows = 0;  // set_skinny_rows (benchmarks): 0 = skinny_rows_for
skinny_path g_skinny_path = skinny_path::kDefault;  // set_skinny_path

template <int M, int R, bool kSwiglu>
void launch_skinny_mr(const skinny_args& a, cudaStream_t stream) {
  const int64_t out_rows = kSwiglu ? R / 2 : R;
  const int64_t warps = ceil_div(a.n, out_rows);
  const auto blocks = static_cast<unsigned>(ceil_div(warps, int64_t{kSkinnyThreads / 32}));
  launch_pdl(skinny_bf16_kernel<M, R, kSwiglu>, dim3(blocks), dim3(kSkinnyThreads), 0, stream, a);
}

// R = skinny_rows_for(M, n), or the one set_skinny_rows forces (at most skinny_rows(M)).
template <int M, bool kSwiglu>
void launch_skinny_m(const skinny_args& a, cudaStream_t stream) {
  const int r = g_skinny_rows != 0 ? g_skinny_rows : skinny_rows_for(M, a.n, kSwiglu);
  if constexpr (skinny_rows(M) >= 8) {
    if (r >= 8) return launch_skinny_mr<M, 8, kSwiglu>(a, stream);
  }
  if constexpr (skinny_rows(M) >= 4) {
    if (r >= 4) return launch_skinny_mr<M, 4, kSwiglu>(a, stream);
  }
  launch_skinny_mr<M, 2, kSwiglu>(a, stream);
}

}  // namespace
}  // namespace hyserve::kernels::cuda_detail
