#pragma once
// Paged decode attention over a bf16 cache on the tensor cores: the contract, grid, slicing,
// partials and warp merge of attention_decode.cuh's decode_kernel (decode queries and the short
// query runs of verify steps), with the arithmetic on mma.sync m16n8k16 (bf16 operands, f32
// accumulation) instead of CUDA-core FMAs on widened elements. Why: with G query heads per kv
// head every cache element costs G FMAs for the scores and G for P·V plus its widening and the
// per-key softmax; over a bf16 cache (2 bytes per element) that is more instructions per byte
// than the SM issues at copy bandwidth (measured: ~50% of copy). Here a warp issues on the order
// of 200 instructions (counted from the code, not profiled) per 16 keys (8 KB of K and V at D = 128).
//
// Warp w of the block takes the tiles of 16 keys s0 = kb + 16·(w + 4i) of the slice [kb, ke);
// per tile, with g = lane / 4 and t = lane % 4 (the PTX fragment coordinates):
//   scores  Sᵀ[head × key] = Q[head × D] · Kᵀ[D × key]: A = q (rows = the G heads, zero-padded
//           to 16), B = K (n = 8 keys per n-tile, two n-tiles). Lane (g, t) reads key g (and
//           8 + g) at dims [D/4·t, D/4·(t+1)) as 16-byte loads; k-step ks takes its words 2ks and
//           2ks + 1 (dims D/4·t + 4ks + {0,1} and {2,3}) as the fragment's k slots {2t, 2t+1} and
//           {2t+8, 2t+9}; q's fragments use the same dims. The accumulator leaves lane (g, t)
//           with head g's scores of keys {2t, 2t+1} (n-tile 0) and {8+2t, 9+2t} (n-tile 1).
//   softmax online per tile: the head's tile max by two shuffles inside the quad, one rescale
//           of the running sum and accumulator per tile; scores are in log2 units (q carries
//           scale·log2 e) so p = exp2(s − m).
//   P·V     Oᵀ[dim × head] = Vᵀ[dim × key] · Pᵀ[key × head]: B = p, which is exactly the
//           scores' accumulator layout (k slots {2t, 2t+1} and {2t+8, 2t+9} = keys, n = head g);
//           A = Vᵀ: lane (g, t) reads keys {2t, 2t+1, 2t+8, 2t+9} at dims [64c + 8g, +8) (16-byte
//           loads, c < D/64) and pairs the two keys' halves of each dim into one register
//           (byte permutes). M-tile (c, i) has rows g ↔ dim 64c + 8g + i, g + 8 ↔ dim 64c + 8g + 4 + i;
//           its accumulator gives lane (g, t) those dims × heads {2t, 2t+1}.
// q and p are split into two bf16 terms (x = hi + lo, |x − hi − lo| <= 2^-17 |x|) and each
// product is two MMAs, so with the cache's bf16 values exact operands the results carry f32-level
// errors (the same tolerance as the CUDA-core kernel against the CPU op).
#include <cstdint>

#include "attention_decode.cuh"
#include "common.cuh"
#include "mma_bf16.cuh"

namespace hyserve::kernels::cuda_detail {
namespace attn_decode_mma {

using attn_decode::kThreads;
using attn_decode::kWarps;
constexpr int kTile = 16;  // keys per warp step

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

using mma16::split_bf16x2;

// Word i of a 16-byte load.
__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Dim x (0..7) of two keys' 8-dim chunks as one bf16x2 word: key a's element low, key b's high.
__device__ __forceinline__ uint32_t pair_dim(const uint4& a, const uint4& b, int x) {
  return __byte_perm(word(a, x >> 1), word(b, x >> 1), (x & 1) != 0 ? 0x7632 : 0x5410);
}

// kCluster: launched in clusters of n_slices blocks along x (attn_decode::merge_cluster); causal
// calls only.
// early (kernels.attn_decode_early_loads; causal calls, head_dim <= 128): the block locates its keys and loads its
// warps' first tiles of K and V before the programmatic-launch wait, all but the keys of this
// step's tokens (positions >= seq_len − q_len), which it loads after the wait with q. Safe where
// the kernel before this one waits for its own predecessor before it lets this one launch (every
// decode-step kernel does: pdl_begin): then all that is older than that kernel — the row
// metadata, the pages and the earlier steps' keys — is complete and visible, and only what that
// kernel writes (the step's K, V and rotated q: the rope and kv_write kernel) is not.
template <int D, int G, bool kTree, bool kCluster = false>
__global__ void __launch_bounds__(kThreads) decode_kernel_mma(const paged_attention_params p, int n_slices, int qmax,
                                                              const attn_decode::partials part,
                                                              const attn_decode::tree_keys tree, bool early = false) {
  // Not for a tree call (its paths may come from the kernel just before), nor at head_dim 256
  // (a tile held across the q set-up spills some 700 bytes a thread there).
  early = early && !kTree && D <= 128;
  if (!early) pdl_begin();
  static_assert(D == 64 || D == 128 || D == 256, "head_dim 64, 128 or 256");
  static_assert(G >= 1 && G <= 8, "at most 8 heads per kv head (one n-tile)");
  constexpr int KS = D / 16;  // k-steps of the scores
  constexpr int KU = D / 32;  // 16-byte loads per key of K per lane (D/4 dims)
  constexpr int VC = D / 64;  // 8-dim chunks per key of V per lane
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kLn2 = 0.6931471805599453f;
  attn_decode::block_keys r;
  static_assert(!(kTree && kCluster), "the cluster merge serves causal calls");
  // A cluster's blocks share their query: all of them leave here or none (empty slices stay).
  // (early: a block with nothing to do leaves before its wait; it reads and writes nothing more.)
  if (!attn_decode::locate_block<kTree, kCluster>(p, n_slices, qmax, tree, r)) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;

  const int32_t* pages = p.page_table + r.b * p.page_table_stride;
  const int64_t ps = p.page_size;
  const bool page_tiles = ps % kTile == 0;  // a tile (s0 a multiple of 16) lies inside one page
  const auto* kc = static_cast<const __nv_bfloat16*>(p.k_cache);
  const auto* vc = static_cast<const __nv_bfloat16*>(p.v_cache);
  const int vkey[4] = {2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9};
  // Lane (g, t)'s rows of the tile at s0: K of keys g and 8 + g (kr), V of keys vkey (vr). `which`:
  // kAll every valid key (others zero); kOld the keys before `fresh` (the others zero); kFresh
  // only the keys from `fresh` on (the others kept).
  enum { kAll, kOld, kFresh };
  const int64_t fresh =
      early ? p.seq_lens[r.b] - (p.query_start_loc[r.b + 1] - p.query_start_loc[r.b]) : int64_t{0};
  uint4 kr[2][KU], vr[4][VC];
  auto load_tile = [&](int64_t s0, int which) {
    // A tile of consecutive positions inside one page (a tree call's path keys are not).
    const bool tile_in_page = page_tiles && (!kTree || s0 + kTile <= r.prefix);
    const int64_t tile_loc = tile_in_page ? static_cast<int64_t>(pages[s0 / ps]) * ps + s0 % ps : 0;
    // Cache row (token location × kv heads + kv head) of tile key jj (valid keys only: the page
    // table past the row's length may hold -1).
    auto row_of = [&](int jj) {
      const int64_t s = attn_decode::key_position<kTree>(r, s0 + jj);
      const int64_t loc = tile_in_page ? tile_loc + jj : static_cast<int64_t>(pages[s / ps]) * ps + s % ps;
      return (loc * p.kv_heads + r.kvh) * D;
    };
    auto take = [&](int jj) {  // load key jj now; else (kAll, kOld) zero it, (kFresh) keep it
      const int64_t s = s0 + jj;
      return s < r.ke && (which == kAll || (which == kOld) == (s < fresh));
    };
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int jj = 8 * nt + g;
      if (take(jj)) {
        const uint4* src = reinterpret_cast<const uint4*>(kc + row_of(jj) + (D / 4) * t);
#pragma unroll
        for (int u = 0; u < KU; ++u) kr[nt][u] = __ldcs(src + u);
      } else if (which != kFresh) {
#pragma unroll
        for (int u = 0; u < KU; ++u) kr[nt][u] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
#pragma unroll
    for (int k4 = 0; k4 < 4; ++k4) {
      if (take(vkey[k4])) {
        const uint4* src = reinterpret_cast<const uint4*>(vc + row_of(vkey[k4]) + 8 * g);
#pragma unroll
        for (int c = 0; c < VC; ++c) vr[k4][c] = __ldcs(src + 8 * c);  // dims 64c + 8g: 8 uint4 apart
      } else if (which != kFresh) {
#pragma unroll
        for (int c = 0; c < VC; ++c) vr[k4][c] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  };
  const int64_t first = r.kb + kTile * warp;  // this warp's first tile
  if (early) {
    if (first < r.ke) load_tile(first, kOld);
    pdl_begin();  // q and this step's keys come from the kernel before
  }

  // q of head g at dims D/4·t + 4ks + {0,1} (a0) and {2,3} (a2); rows g + 8 (a1, a3) and heads
  // g >= G are zero. Head_dim 256 (kernels.attn_decode_mma_hd256): the fragments in shared
  // memory ([ks][hi0, hi1, lo0, lo1][lane], written by warp 0; the same for every warp), so that
  // the tile's K and V rows (128 registers a lane) and the accumulator (64) fit the registers.
  // The fragments' 8 KB share the warps' merge buffer where it is as large (s_acc: written after
  // the last tile, behind a barrier; G >= 2).
  constexpr bool kQShared = D > 128;
  constexpr int KQ = kQShared ? 1 : KS;
  constexpr bool kQAlias = kQShared && kWarps * G * D >= KS * 4 * 32;
  uint32_t qh[KQ][2], ql[KQ][2];
  __shared__ float2 s_ml[kWarps][G];
  __shared__ float s_acc[kWarps][G][D];
  __shared__ uint32_t s_q_own[kQShared && !kQAlias ? KS : 1][4][32];
  auto* s_q = kQAlias ? reinterpret_cast<uint32_t(*)[4][32]>(&s_acc[0][0][0]) : s_q_own;
  {
    const float qs = p.scale * kLog2e;
    const float* qrow = p.q + r.q_start * p.q_stride + (r.kvh * G + g) * D + (D / 4) * t;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      if (kQShared && warp != 0) break;
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (g < G) {
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = qrow[4 * ks + e] * qs;
      }
      uint32_t h0, l0, h1, l1;
      split_bf16x2(v[0], v[1], h0, l0);
      split_bf16x2(v[2], v[3], h1, l1);
      if constexpr (kQShared) {
        s_q[ks][0][lane] = h0;
        s_q[ks][1][lane] = h1;
        s_q[ks][2][lane] = l0;
        s_q[ks][3][lane] = l1;
      } else {
        qh[ks][0] = h0;
        qh[ks][1] = h1;
        ql[ks][0] = l0;
        ql[ks][1] = l1;
      }
    }
    if constexpr (kQShared) __syncthreads();
  }
  // k-step ks's fragments: a0 | a2 of the big terms (hi) or the small ones (lo).
  const auto q_frag = [&](int ks, bool hi, int i) -> uint32_t {
    if constexpr (kQShared) return s_q[ks][(hi ? 0 : 2) + i][lane];
    else return hi ? qh[ks][i] : ql[ks][i];
  };

  float acc[4 * VC][4];  // m-tile 4c + i: (dims 64c + 8g + i, 64c + 8g + 4 + i) × heads (2t, 2t + 1)
#pragma unroll
  for (int mt = 0; mt < 4 * VC; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;
  float m = -INFINITY, l = 0.0f;  // head g: running max (log2 units; the same in the quad), this lane's Σ p

  for (int64_t s0 = first; s0 < r.ke; s0 += kTile * kWarps) {
    load_tile(s0, early && s0 == first ? kFresh : kAll);  // early: the first tile's older keys are in

    // Scores of head g: sc[nt][e] for key 8nt + 2t + e (e < 2; e >= 2 are rows g + 8, unused).
    float sc[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        const uint32_t b0 = word(kr[nt][ks >> 1], 2 * (ks & 1)), b1 = word(kr[nt][ks >> 1], 2 * (ks & 1) + 1);
        mma_bf16(sc[nt], q_frag(ks, false, 0), 0u, q_frag(ks, false, 1), 0u, b0, b1);  // small terms first
        mma_bf16(sc[nt], q_frag(ks, true, 0), 0u, q_frag(ks, true, 1), 0u, b0, b1);
      }
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (s0 + 8 * nt + 2 * t + e >= r.ke) sc[nt][e] = -INFINITY;
    }
    float mt = fmaxf(fmaxf(sc[0][0], sc[0][1]), fmaxf(sc[1][0], sc[1][1]));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
    const float m_new = fmaxf(m, mt);  // finite: the tile has a valid key
    const float corr = exp2f(m - m_new);  // m = -inf first: 0 (acc and l are 0 anyway)
    float pr[2][2];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) pr[nt][e] = exp2f(sc[nt][e] - m_new);
    l = l * corr + ((pr[0][0] + pr[0][1]) + (pr[1][0] + pr[1][1]));
    m = m_new;
    uint32_t ph0, pl0, ph1, pl1;
    split_bf16x2(pr[0][0], pr[0][1], ph0, pl0);  // keys 2t, 2t + 1
    split_bf16x2(pr[1][0], pr[1][1], ph1, pl1);  // keys 2t + 8, 2t + 9

    // The accumulator's heads 2t and 2t + 1 take the rescale of the lanes holding those heads.
    const float ca = __shfl_sync(0xffffffffu, corr, 8 * t), cb = __shfl_sync(0xffffffffu, corr, 8 * t + 4);
#pragma unroll
    for (int c = 0; c < VC; ++c) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float(&a)[4] = acc[4 * c + i];
        a[0] *= ca;
        a[1] *= cb;
        a[2] *= ca;
        a[3] *= cb;
        const uint32_t a0 = pair_dim(vr[0][c], vr[1][c], i), a1 = pair_dim(vr[0][c], vr[1][c], 4 + i);
        const uint32_t a2 = pair_dim(vr[2][c], vr[3][c], i), a3 = pair_dim(vr[2][c], vr[3][c], 4 + i);
        mma_bf16(a, a0, a1, a2, a3, pl0, pl1);
        mma_bf16(a, a0, a1, a2, a3, ph0, ph1);
      }
    }
  }

  // Head g's sum over the quad; (m, l) in natural-log units for the shared merge.
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if constexpr (kQAlias) __syncthreads();  // every warp's last read of q's fragments in s_acc
  if (g < G && t == 0) s_ml[warp][g] = make_float2(m == -INFINITY ? -INFINITY : m * kLn2, l);
#pragma unroll
  for (int c = 0; c < VC; ++c) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = 2 * t + (e & 1), d = 64 * c + 8 * g + i + 4 * (e >> 1);
        if (h < G) s_acc[warp][h][d] = acc[4 * c + i][e];
      }
    }
  }
  __syncthreads();
  if constexpr (kCluster)
    attn_decode::merge_cluster<D, G>(p, s_ml, s_acc, r);
  else
    attn_decode::merge_warps_and_store<D, G>(p, s_ml, s_acc, n_slices, part, r.slice, r.kvh, r.bq, r.q_start);
}

}  // namespace attn_decode_mma
}  // namespace hyserve::kernels::cuda_detail
