// The routed-experts op on the GPU (moe.h), with no host synchronisation:
//   1. memset of the per-expert counts;
//   2. router: one warp per token: scores (softmax or sigmoid), top-k by repeated warp arg-max
//      (ties to the lower index), renormalisation, the selection sorted by expert index, and the
//      per-expert counts (atomics);
//   3. scan: one block: exclusive prefix sums of the counts (row offsets of each expert in the
//      permuted order) and of the counts' tiles of BM rows (the grouped GEMMs' tile list);
//   4. scatter: each (token, slot) pair takes a row of its expert's segment (slot_pos, and the
//      row's token in row_token); x is copied in the GEMM operand type (xa);
//   5. grouped GEMM 1: act[r] = silu(xa[token(r)] · gate_eᵀ) ⊙ (xa[token(r)] · up_eᵀ);
//   6. grouped GEMM 2: y[r] = act[r] · down_eᵀ (f32);
//   7. combine: out[t] (= or +=) Σ_j w[t, j] · y[slot_pos[t, j]], j in ascending expert order.
// The order of rows inside an expert's segment depends on the atomics, but no result does: a
// GEMM row's value depends only on its own operands, and the combine sums in a fixed order.
//
// The grouped GEMM: a block takes one BM × BN output tile of one expert. The grid's x
// dimension is an upper bound of the tiles over all experts, Σ_e ceil(c_e / BM) ≤ R / BM +
// min(E, R) (R = tokens · top_k rows), known on the host; a block past the device-computed
// total exits, others find their expert by binary search over the tile prefix sums. Operands
// go from global to shared memory by cp.async (16 bytes, zero-filled past the ends) in a
// STAGES-deep pipeline; 4 warps compute with mma.sync m16n8k16 (bf16 in, f32 accumulate).
// W (the weight type) is also the type of the A operand in memory: bf16 operands go straight
// to the tensor cores; f32 operands are split into hi + lo bf16 terms at fragment load
// (hi·hi + hi·lo + lo·hi).
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "../cpu/moe_validate.h"
#include "common.cuh"
#include "hyserve/kernels/moe.h"
#include "stream_alloc.h"

namespace hyserve::kernels {
namespace cuda_detail {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kMaxTopK = 32;
constexpr int kRouteWarps = 4;
constexpr int kScanThreads = 1024;
constexpr int kGemmThreads = 128;  // 4 warps

// ---- 2. router ----------------------------------------------------------------------------

struct route_args {
  const float* logits = nullptr;
  int64_t logits_stride = 0;
  int64_t tokens = 0;
  int experts = 0, top_k = 0;
  bool softmax = true, norm = true;
  int32_t* ids = nullptr;   // [tokens · top_k]
  float* wts = nullptr;     // [tokens · top_k]
  int32_t* counts = nullptr;  // [experts], zeroed
  int32_t* user_ids = nullptr;
  float* user_wts = nullptr;
};

__global__ void __launch_bounds__(32 * kRouteWarps) moe_route_kernel(const route_args a) {
  extern __shared__ float route_scores[];  // [kRouteWarps][experts]
  __shared__ int sel_id[kRouteWarps][kMaxTopK];
  __shared__ float sel_s[kRouteWarps][kMaxTopK];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp;
  if (t >= a.tokens) return;  // whole warps only; the kernel has no block-wide barrier
  const int E = a.experts;
  float* s = route_scores + static_cast<int64_t>(warp) * E;
  const float* l = a.logits + t * a.logits_stride;
  if (a.softmax) {
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) {
      const float v = l[e];
      s[e] = v;
      mx = fmaxf(mx, v);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) {
      const float v = expf(s[e] - mx);
      s[e] = v;
      sum += v;
    }
    sum = warp_sum(sum);
    for (int e = lane; e < E; e += 32) s[e] = s[e] / sum;
  } else {
    for (int e = lane; e < E; e += 32) s[e] = 1.0f / (1.0f + expf(-l[e]));
  }
  // Scores are >= 0; NaN ranks below every number, -2 marks a taken expert. Each lane reads
  // and writes only its own entries (e ≡ lane mod 32), so no barrier is needed between rounds.
  for (int e = lane; e < E; e += 32)
    if (!(s[e] >= 0.0f)) s[e] = -1.0f;
  for (int j = 0; j < a.top_k; ++j) {
    float best_s = -1.5f;
    int best_e = INT_MAX;
    for (int e = lane; e < E; e += 32) {
      const float v = s[e];
      if (v > best_s) {  // e ascending: a tie keeps the lower index
        best_s = v;
        best_e = e;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float os = __shfl_xor_sync(0xffffffffu, best_s, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (os > best_s || (os == best_s && oe < best_e)) {
        best_s = os;
        best_e = oe;
      }
    }
    if (lane == 0) {
      sel_id[warp][j] = best_e;
      sel_s[warp][j] = best_s;
    }
    if (best_e < E && (best_e & 31) == lane) s[best_e] = -2.0f;
  }
  __syncwarp();
  if (lane != 0) return;
  const int k = a.top_k;
  float top_sum = 0.0f;
  for (int j = 0; j < k; ++j) top_sum += fmaxf(sel_s[warp][j], 0.0f);  // selection order (the CPU op's)
  for (int j = 1; j < k; ++j) {  // by expert index
    const int id = sel_id[warp][j];
    const float sc = sel_s[warp][j];
    int i = j - 1;
    while (i >= 0 && sel_id[warp][i] > id) {
      sel_id[warp][i + 1] = sel_id[warp][i];
      sel_s[warp][i + 1] = sel_s[warp][i];
      --i;
    }
    sel_id[warp][i + 1] = id;
    sel_s[warp][i + 1] = sc;
  }
  for (int j = 0; j < k; ++j) {
    const int e = sel_id[warp][j];
    const float sc = fmaxf(sel_s[warp][j], 0.0f);
    const float w = a.norm ? sc / top_sum : sc;
    const int64_t i = t * k + j;
    a.ids[i] = e;
    a.wts[i] = w;
    if (a.user_ids) a.user_ids[i] = e;
    if (a.user_wts) a.user_wts[i] = w;
    atomicAdd(a.counts + e, 1);
  }
}

// ---- 3. scan ------------------------------------------------------------------------------

// offsets[e] = Σ_{e' < e} counts[e'], tile_offsets[e] = Σ_{e' < e} ceil(counts[e'] / bm), both
// with the total at [experts]; cursor zeroed.
__global__ void __launch_bounds__(kScanThreads) moe_scan_kernel(const int32_t* __restrict__ counts,
                                                                 int32_t* __restrict__ offsets,
                                                                 int32_t* __restrict__ tile_offsets,
                                                                 int32_t* __restrict__ cursor, int experts, int bm) {
  __shared__ int s_rows[kScanThreads];
  __shared__ int s_tiles[kScanThreads];
  const int tid = static_cast<int>(threadIdx.x);
  const int per = (experts + kScanThreads - 1) / kScanThreads;
  const int begin = min(tid * per, experts), end = min(begin + per, experts);
  int rows = 0, tiles = 0;
  for (int e = begin; e < end; ++e) {
    const int c = counts[e];
    rows += c;
    tiles += (c + bm - 1) / bm;
  }
  s_rows[tid] = rows;
  s_tiles[tid] = tiles;
  __syncthreads();
  for (int o = 1; o < kScanThreads; o <<= 1) {  // inclusive Hillis-Steele scan
    const int r = tid >= o ? s_rows[tid - o] : 0;
    const int ti = tid >= o ? s_tiles[tid - o] : 0;
    __syncthreads();
    s_rows[tid] += r;
    s_tiles[tid] += ti;
    __syncthreads();
  }
  int row_off = s_rows[tid] - rows, tile_off = s_tiles[tid] - tiles;
  for (int e = begin; e < end; ++e) {
    const int c = counts[e];
    offsets[e] = row_off;
    tile_offsets[e] = tile_off;
    cursor[e] = 0;
    row_off += c;
    tile_off += (c + bm - 1) / bm;
  }
  if (tid == kScanThreads - 1) {
    offsets[experts] = s_rows[tid];
    tile_offsets[experts] = s_tiles[tid];
  }
}

// ---- 4. scatter (and x in the operand type) ---------------------------------------------------

template <class W>
__global__ void moe_scatter_kernel(const int32_t* __restrict__ ids, int64_t pairs, int top_k,
                                   const int32_t* __restrict__ offsets, int32_t* __restrict__ cursor,
                                   int32_t* __restrict__ slot_pos, int32_t* __restrict__ row_token,
                                   const float* __restrict__ x, int64_t x_stride, W* __restrict__ xa, int64_t tokens,
                                   int64_t hidden) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = i0; i < pairs; i += stride) {
    const int e = ids[i];
    const int pos = offsets[e] + atomicAdd(cursor + e, 1);
    slot_pos[i] = pos;
    row_token[pos] = static_cast<int32_t>(i / top_k);
  }
  const int64_t n = tokens * hidden;
  for (int64_t i = i0; i < n; i += stride) {
    const int64_t t = i / hidden, h = i - t * hidden;
    xa[i] = from_float<W>(x[t * x_stride + h]);
  }
}

// ---- 5, 6. grouped GEMM -------------------------------------------------------------------------

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;  // 0: zero-fill
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two adjacent operand elements (k, k + 1) from shared memory as bf16x2 words, k in the low
// half: bf16 as stored (lo = 0, unused); f32 split into hi (the top 16 bits) + lo (the rest,
// rounded to bf16).
template <class W>
struct frag_word {
  uint32_t hi, lo;
};
template <class W>
__device__ __forceinline__ frag_word<W> load_pair(const W* p) {
  if constexpr (std::is_same_v<W, bf16>) {
    return {*reinterpret_cast<const uint32_t*>(p), 0u};
  } else {
    const float2 v = *reinterpret_cast<const float2*>(p);
    const uint32_t u0 = __float_as_uint(v.x), u1 = __float_as_uint(v.y);
    const uint32_t hi = __byte_perm(u0, u1, 0x7632);
    const float r0 = v.x - __uint_as_float(u0 & 0xffff0000u), r1 = v.y - __uint_as_float(u1 & 0xffff0000u);
    const __nv_bfloat162 lo = __floats2bfloat162_rn(r0, r1);
    return {hi, *reinterpret_cast<const uint32_t*>(&lo)};
  }
}

struct gg_args {
  const void* a = nullptr;        // W [*, lda]: row a_rows[r] (or r) is permuted row r's operand
  int64_t lda = 0;
  const int32_t* a_rows = nullptr;
  const void* b = nullptr;        // W: expert e's [n, k] block at b + e · b_expert (+ b_up for up)
  int64_t b_expert = 0, b_up = 0, ldb = 0;
  void* c = nullptr;              // swiglu: W [rows, ldc]; else f32 [rows, ldc]
  int64_t ldc = 0;
  int64_t n = 0, k = 0;
  const int32_t* offsets = nullptr;       // [experts + 1]
  const int32_t* tile_offsets = nullptr;  // [experts + 1]
  int experts = 0;
};

template <class W, int BM, int BN, int BK, int WM, int WN, int STAGES, bool kSwiglu>
struct gg_config {
  static constexpr int S = kSwiglu ? 2 : 1;                  // weight blocks (gate, up)
  static constexpr int CH = 16 / static_cast<int>(sizeof(W));  // elements per 16-byte chunk
  static constexpr int LDS = BK + CH;                        // row pitch: 16 bytes of padding
  static constexpr int A_ELEMS = BM * LDS, B_ELEMS = BN * LDS;
  static constexpr int STAGE_ELEMS = A_ELEMS + S * B_ELEMS;
  static constexpr size_t kSmemBytes = static_cast<size_t>(STAGES) * STAGE_ELEMS * sizeof(W);
  static constexpr int WTM = BM / WM, WTN = BN / WN;  // warp tile
  static constexpr int MT = WTM / 16, NT = WTN / 8;   // mma tiles per warp
  static_assert(WM * WN == kGemmThreads / 32, "4 warps");
  static_assert(WTM % 16 == 0 && WTN % 8 == 0 && BK % 16 == 0 && BK % CH == 0, "tile shapes");
  static_assert(BM <= kGemmThreads, "one thread per A row for the row table");
};

template <class W, int BM, int BN, int BK, int WM, int WN, int STAGES, bool kSwiglu>
__global__ void __launch_bounds__(kGemmThreads) moe_grouped_gemm_kernel(const gg_args g) {
  using C = gg_config<W, BM, BN, BK, WM, WN, STAGES, kSwiglu>;
  constexpr int S = C::S, CH = C::CH, LDS = C::LDS, MT = C::MT, NT = C::NT;
  extern __shared__ __align__(16) unsigned char gg_smem[];
  W* smem = reinterpret_cast<W*>(gg_smem);
  __shared__ int64_t s_arow[BM];  // element offset of each tile row's A operand; -1 = none

  const int mt = static_cast<int>(blockIdx.x);
  if (mt >= g.tile_offsets[g.experts]) return;  // uniform over the block
  int lo = 0, hi = g.experts - 1;  // the largest e with tile_offsets[e] <= mt
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (g.tile_offsets[mid] <= mt)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int e = lo;
  const int row_begin = g.offsets[e] + (mt - g.tile_offsets[e]) * BM;
  const int row_end = min(row_begin + BM, g.offsets[e + 1]);
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * BN;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < BM) {
    const int r = row_begin + tid;
    s_arow[tid] = r < row_end ? static_cast<int64_t>(g.a_rows ? g.a_rows[r] : r) * g.lda : int64_t{-1};
  }
  __syncthreads();

  const W* A = static_cast<const W*>(g.a);
  const W* B = static_cast<const W*>(g.b) + static_cast<int64_t>(e) * g.b_expert;
  const int64_t KT = (g.k + BK - 1) / BK;
  constexpr int KC = BK / CH;  // chunks per tile row

  auto load_stage = [&](int stage, int64_t kt) {
    W* sa = smem + stage * C::STAGE_ELEMS;
    W* sb = sa + C::A_ELEMS;
    const int64_t k0 = kt * BK;
    for (int c = tid; c < BM * KC; c += kGemmThreads) {
      const int row = c / KC, kc = c % KC;
      const int64_t kk = k0 + kc * CH;
      const int64_t src = s_arow[row];
      const bool valid = src >= 0 && kk < g.k;
      cp_async16(sa + row * LDS + kc * CH, valid ? A + src + kk : A, valid);
    }
    for (int c = tid; c < S * BN * KC; c += kGemmThreads) {
      const int s = c / (BN * KC), rem = c % (BN * KC);
      const int row = rem / KC, kc = rem % KC;
      const int64_t kk = k0 + kc * CH, n = n0 + row;
      const bool valid = n < g.n && kk < g.k;
      cp_async16(sb + s * C::B_ELEMS + row * LDS + kc * CH, valid ? B + (s ? g.b_up : 0) + n * g.ldb + kk : B, valid);
    }
  };

  const int lane = tid & 31, warp = tid >> 5;
  const int wm = warp / WN, wn = warp % WN;
  const int gq = lane >> 2, tq = lane & 3;
  float acc[S][MT][NT][4] = {};

#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (st < KT) load_stage(st, st);
    cp_async_commit();
  }
  for (int64_t kt = 0; kt < KT; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int64_t nk = kt + STAGES - 1;
    if (nk < KT) load_stage(static_cast<int>(nk % STAGES), nk);
    cp_async_commit();
    const W* sa = smem + static_cast<int>(kt % STAGES) * C::STAGE_ELEMS;
    const W* sb = sa + C::A_ELEMS;
#pragma unroll
    for (int kb = 0; kb < BK; kb += 16) {
      frag_word<W> af[MT][4];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        const W* p = sa + (wm * C::WTM + mi * 16 + gq) * LDS + kb + 2 * tq;
        af[mi][0] = load_pair<W>(p);
        af[mi][1] = load_pair<W>(p + 8 * LDS);
        af[mi][2] = load_pair<W>(p + 8);
        af[mi][3] = load_pair<W>(p + 8 * LDS + 8);
      }
#pragma unroll
      for (int s = 0; s < S; ++s)
#pragma unroll
        for (int ni = 0; ni < NT; ++ni) {
          const W* p = sb + s * C::B_ELEMS + (wn * C::WTN + ni * 8 + gq) * LDS + kb + 2 * tq;
          const frag_word<W> b0 = load_pair<W>(p), b1 = load_pair<W>(p + 8);
#pragma unroll
          for (int mi = 0; mi < MT; ++mi) {
            const uint32_t ah[4] = {af[mi][0].hi, af[mi][1].hi, af[mi][2].hi, af[mi][3].hi};
            if constexpr (!std::is_same_v<W, bf16>) {
              const uint32_t al[4] = {af[mi][0].lo, af[mi][1].lo, af[mi][2].lo, af[mi][3].lo};
              mma16816(acc[s][mi][ni], al, b0.hi, b1.hi);  // small terms first
              mma16816(acc[s][mi][ni], ah, b0.lo, b1.lo);
            }
            mma16816(acc[s][mi][ni], ah, b0.hi, b1.hi);
          }
        }
    }
  }

  // Epilogue: C fragment c0, c1 at (row g, cols 2t, 2t + 1), c2, c3 at row g + 8.
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row_begin + wm * C::WTM + mi * 16 + gq + 8 * h;
      if (r >= row_end) continue;
#pragma unroll
      for (int ni = 0; ni < NT; ++ni) {
        const int64_t col = n0 + wn * C::WTN + ni * 8 + 2 * tq;
        if (col >= g.n) continue;  // n is even: col + 1 < n too
        if constexpr (kSwiglu) {
          const float g0 = acc[0][mi][ni][2 * h], g1 = acc[0][mi][ni][2 * h + 1];
          const float v0 = g0 / (1.0f + expf(-g0)) * acc[1][mi][ni][2 * h];  // the swiglu op's formula
          const float v1 = g1 / (1.0f + expf(-g1)) * acc[1][mi][ni][2 * h + 1];
          W* out = static_cast<W*>(g.c) + static_cast<int64_t>(r) * g.ldc + col;
          if constexpr (std::is_same_v<W, bf16>) {
            *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(v0, v1);
          } else {
            *reinterpret_cast<float2*>(out) = make_float2(v0, v1);
          }
        } else {
          float* out = static_cast<float*>(g.c) + static_cast<int64_t>(r) * g.ldc + col;
          *reinterpret_cast<float2*>(out) = make_float2(acc[0][mi][ni][2 * h], acc[0][mi][ni][2 * h + 1]);
        }
      }
    }
}

// Upper bound of Σ_e ceil(c_e / bm) over any routing of `rows` rows to `experts` experts.
int64_t max_tiles(int64_t rows, int64_t experts, int bm) { return rows / bm + std::min(experts, rows); }

template <class W, int BM, int BN, int BK, int WM, int WN, int STAGES, bool kSwiglu>
void launch_grouped(const gg_args& g, int64_t rows, cudaStream_t stream) {
  using C = gg_config<W, BM, BN, BK, WM, WN, STAGES, kSwiglu>;
  auto kernel = moe_grouped_gemm_kernel<W, BM, BN, BK, WM, WN, STAGES, kSwiglu>;
  if (C::kSmemBytes > 48 * 1024) reserve_dynamic_shared(reinterpret_cast<const void*>(kernel), C::kSmemBytes);
  const dim3 grid(static_cast<unsigned>(max_tiles(rows, g.experts, BM)), static_cast<unsigned>(ceil_div(g.n, BN)));
  kernel<<<grid, kGemmThreads, C::kSmemBytes, stream>>>(g);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

// Tile shapes: few rows per expert (decode, small batches): 16-row tiles, narrow (more blocks
// streaming the weights) and deep in k; many rows: 64 × 64 tiles.
constexpr int kSmallBM = 16, kLargeBM = 64;
bool small_tiles(int64_t rows, int64_t experts) { return rows < 16 * experts; }

template <class W, bool kSwiglu>
void launch_gemm(const gg_args& g, int64_t rows, bool small, cudaStream_t stream) {
  if (small)
    launch_grouped<W, kSmallBM, 32, 64, 1, 4, 4, kSwiglu>(g, rows, stream);
  else
    launch_grouped<W, kLargeBM, 64, 32, 2, 2, 4, kSwiglu>(g, rows, stream);
}

// ---- 7. combine ---------------------------------------------------------------------------

__global__ void moe_combine_kernel(const float* __restrict__ y, int64_t hidden, const int32_t* __restrict__ slot_pos,
                                   const float* __restrict__ wts, int top_k, float* __restrict__ out,
                                   int64_t out_stride, bool accumulate) {
  const int64_t t = blockIdx.x;
  const int64_t h4n = hidden / 4;
  for (int64_t h4 = threadIdx.x; h4 < h4n; h4 += blockDim.x) {
    float4* o = reinterpret_cast<float4*>(out + t * out_stride) + h4;
    float4 acc = accumulate ? *o : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int j = 0; j < top_k; ++j) {
      const int64_t i = t * top_k + j;
      const float w = wts[i];
      const float4 v = reinterpret_cast<const float4*>(y + static_cast<int64_t>(slot_pos[i]) * hidden)[h4];
      acc.x += w * v.x;
      acc.y += w * v.y;
      acc.z += w * v.z;
      acc.w += w * v.w;
    }
    *o = acc;
  }
}

size_t round_up(size_t b) { return (b + 255) & ~size_t{255}; }

template <class W>
void run_moe(const moe_experts_params& p, cudaStream_t stream) {
  const int64_t T = p.tokens, H = p.hidden, I = p.inter, E = p.experts, k = p.top_k, R = T * k;
  const bool small = small_tiles(R, E);
  const int bm = small ? kSmallBM : kLargeBM;
  // Scratch, one allocation.
  size_t off = 0;
  auto carve = [&](size_t bytes) {
    const size_t at = off;
    off += round_up(bytes);
    return at;
  };
  const size_t o_counts = carve(E * 4), o_cursor = carve(E * 4), o_offsets = carve((E + 1) * 4),
               o_tiles = carve((E + 1) * 4), o_ids = carve(R * 4), o_wts = carve(R * 4), o_pos = carve(R * 4),
               o_rowtok = carve(R * 4), o_xa = carve(static_cast<size_t>(T * H) * sizeof(W)),
               o_act = carve(static_cast<size_t>(R * I) * sizeof(W)), o_y = carve(static_cast<size_t>(R * H) * 4);
  char* base = nullptr;
  CUDA_CHECK(scratch_alloc(reinterpret_cast<void**>(&base), off, stream));
  auto* counts = reinterpret_cast<int32_t*>(base + o_counts);
  auto* cursor = reinterpret_cast<int32_t*>(base + o_cursor);
  auto* offsets = reinterpret_cast<int32_t*>(base + o_offsets);
  auto* tiles = reinterpret_cast<int32_t*>(base + o_tiles);
  auto* ids = reinterpret_cast<int32_t*>(base + o_ids);
  auto* wts = reinterpret_cast<float*>(base + o_wts);
  auto* slot_pos = reinterpret_cast<int32_t*>(base + o_pos);
  auto* row_token = reinterpret_cast<int32_t*>(base + o_rowtok);
  auto* xa = reinterpret_cast<W*>(base + o_xa);
  auto* act = reinterpret_cast<W*>(base + o_act);
  auto* y = reinterpret_cast<float*>(base + o_y);

  CUDA_CHECK(cudaMemsetAsync(counts, 0, static_cast<size_t>(E) * 4, stream));

  route_args ra;
  ra.logits = p.router_logits;
  ra.logits_stride = p.logits_stride;
  ra.tokens = T;
  ra.experts = static_cast<int>(E);
  ra.top_k = static_cast<int>(k);
  ra.softmax = p.scoring == moe_scoring::kSoftmax;
  ra.norm = p.norm_topk_prob;
  ra.ids = ids;
  ra.wts = wts;
  ra.counts = counts;
  ra.user_ids = p.topk_ids;
  ra.user_wts = p.topk_weights;
  const size_t route_smem = static_cast<size_t>(kRouteWarps) * E * sizeof(float);
  if (route_smem > 48 * 1024) reserve_dynamic_shared(reinterpret_cast<const void*>(moe_route_kernel), route_smem);
  moe_route_kernel<<<static_cast<unsigned>(ceil_div(T, kRouteWarps)), 32 * kRouteWarps, route_smem, stream>>>(ra);
  HYSERVE_CUDA_CHECK_LAUNCH();

  moe_scan_kernel<<<1, kScanThreads, 0, stream>>>(counts, offsets, tiles, cursor, static_cast<int>(E), bm);
  HYSERVE_CUDA_CHECK_LAUNCH();

  const int64_t scatter_work = std::max(R, T * H);
  const auto scatter_blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(scatter_work, 256), 8 * sm_count()));
  moe_scatter_kernel<W><<<scatter_blocks, 256, 0, stream>>>(ids, R, static_cast<int>(k), offsets, cursor, slot_pos,
                                                            row_token, p.x, p.x_stride, xa, T, H);
  HYSERVE_CUDA_CHECK_LAUNCH();

  gg_args g1;
  g1.a = xa;
  g1.lda = H;
  g1.a_rows = row_token;
  g1.b = p.gate_up;
  g1.b_expert = 2 * I * H;
  g1.b_up = I * H;
  g1.ldb = H;
  g1.c = act;
  g1.ldc = I;
  g1.n = I;
  g1.k = H;
  g1.offsets = offsets;
  g1.tile_offsets = tiles;
  g1.experts = static_cast<int>(E);
  launch_gemm<W, true>(g1, R, small, stream);

  gg_args g2 = g1;
  g2.a = act;
  g2.lda = I;
  g2.a_rows = nullptr;
  g2.b = p.down;
  g2.b_expert = H * I;
  g2.b_up = 0;
  g2.ldb = I;
  g2.c = y;
  g2.ldc = H;
  g2.n = H;
  g2.k = I;
  launch_gemm<W, false>(g2, R, small, stream);

  const int combine_threads = static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, ceil_div(H / 4, 32) * 32)));
  moe_combine_kernel<<<static_cast<unsigned>(T), combine_threads, 0, stream>>>(y, H, slot_pos, wts, static_cast<int>(k),
                                                                             p.out, p.out_stride, p.accumulate);
  HYSERVE_CUDA_CHECK_LAUNCH();
  CUDA_CHECK(scratch_free(base, stream));
}

}  // namespace
}  // namespace cuda_detail

using namespace cuda_detail;

void run_cuda(const moe_experts_params& p, void* stream) {
  constexpr const char* op = "moe_experts";
  cpu_detail::check_moe_experts_fields(p, op);
  if (p.top_k > kMaxTopK) fail(op, "top_k", p.top_k, "exceeds the CUDA router's 32");
  if (p.experts > 8192) fail(op, "experts", p.experts, "exceeds the CUDA router's 8192");
  if (p.hidden % 8 != 0) fail(op, "hidden", p.hidden, "must be a multiple of 8 on CUDA");
  if (p.inter % 8 != 0) fail(op, "inter", p.inter, "must be a multiple of 8 on CUDA");
  if (p.tokens == 0) return;
  if (p.tokens * p.top_k > INT32_MAX / 2) fail(op, "tokens", p.tokens, "times top_k exceeds the CUDA op's row range");
  if (p.tokens > INT32_MAX) fail(op, "tokens", p.tokens, "exceeds the CUDA grid");
  require_aligned16(p.gate_up, op, "gate_up");
  require_aligned16(p.down, op, "down");
  require_aligned16(p.out, op, "out");
  if (p.out_stride % 4 != 0) fail(op, "out_stride", p.out_stride, "must be a multiple of 4 on CUDA");
  if (p.w_dtype == dtype::kBF16)
    run_moe<bf16>(p, as_stream(stream));
  else
    run_moe<float>(p, as_stream(stream));
}

}  // namespace hyserve::kernels
