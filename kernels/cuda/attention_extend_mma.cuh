#pragma once
// Paged causal extend attention over a bf16 cache on the tensor cores: the rows of more than one
// query (prefill chunks, and verify rows the decode kernel does not take; any GQA group), in
// place of paged_attention_kernel's CUDA-core loop (one key per lane, f32 FMAs on widened
// elements). Flash-attention order (online softmax over key tiles) with mma.sync
// m16n8k16 (bf16 operands, f32 accumulation):
//   - a block takes tiles of kRows = 64 query rows of one (row, kv head): query rows are (token,
//     group head) pairs, token-major as in paged_attention_kernel; warp w owns rows 16w .. 16w + 15;
//   - the row's keys go through shared memory keys_for<D> (64; 32 at head_dim 256, Qwen3-Next's,
//     so that two stages and the split q fit) at a time (16-byte cp.async copies gathered through
//     the page table, zero-filled past the keys the tile needs), two stages;
//   - scores S = Q·Kᵀ (A = q, staged split in shared memory, and B = K, both by ldmatrix), in log2
//     units (q carries scale·log2 e), masked
//     causally (key position <= the query's) and past the row's length; the online softmax keeps
//     each row's running max and sum; O += P·V (A = p straight from the scores' accumulators,
//     B = V by ldmatrix.trans).
// q and p are split into two bf16 terms (x = hi + lo) and each product is two MMAs, smallest
// first, so with the cache's bf16 values exact the results carry f32-level errors (the CUDA-core
// kernel's tolerance against the CPU op), as in attention_decode_mma.cuh. A bfloat16 model's
// attention (paged_attention_params::bf16_products, kSplit false) rounds q and p to one bf16
// term each, as flash attention does: half the MMAs, and no shared memory for q's low terms.
// A query row's arithmetic depends only on its own q, its position and the row's keys: the key
// tiles start at key 0 whatever the query tile, and a tile past the row's causal end (the tile
// serves later queries) leaves its sums exactly unchanged (p = 0, rescale by exp2(0) = 1). So a
// token's output does not depend on the chunk or the batch it comes in (determinism:
// batch_invariant).
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "async_copy.cuh"
#include "common.cuh"
#include "hyserve/kernels/attention.h"
#include "mma_bf16.cuh"

namespace hyserve::kernels::cuda_detail {
namespace attn_extend_mma {

constexpr int kThreads = 128;  // 4 warps
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 16 * kWarps;  // query rows a tile
constexpr int kStages = 2;
// Keys a shared-memory tile: 64, or 32 at head_dim 256 (203 KB of tiles with 64).
template <int D>
constexpr int keys_for = D > 128 ? 32 : 64;

template <int D, bool kSplit>
struct smem_t {
  static constexpr int kLd = D + 8;  // bf16 a row: 16 bytes of padding, ldmatrix rows on distinct banks
  __nv_bfloat16 k[kStages][keys_for<D>][kLd];
  __nv_bfloat16 v[kStages][keys_for<D>][kLd];
  __nv_bfloat16 qh[kRows][kLd];  // the tile's q (scaled), split: hi and lo terms (kSplit; else hi only)
  __nv_bfloat16 ql[kSplit ? kRows : 1][kLd];
};

// The query rows [r0, r0 + kRows) of row b (kv head kvh) against the keys [0, len) causally.
template <int D, bool kSplit>
__device__ void run_tile(const paged_attention_params& p, smem_t<D, kSplit>& sm, int64_t b, int64_t kvh, int64_t q_start,
                         int len, int q_len, int group, int r0) {
  constexpr int kKeys = keys_for<D>;
  constexpr int KS = D / 16;          // k-steps of the scores
  constexpr int NT = kKeys / 8;       // key n-tiles of the scores
  constexpr int DT = D / 8;           // dim n-tiles of the output
  constexpr int kChunks = D / 8;      // 16-byte chunks a key
  constexpr float kLog2e = 1.4426950408889634f;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int M = q_len * group;
  // This thread's two query rows (h = 0: row g of the warp's 16, h = 1: row g + 8).
  int qpos[2];  // key positions in 32 bits (a row's length is an int32 seq_lens entry)
  bool live[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = r0 + 16 * warp + g + 8 * h;
    live[h] = row < M;
    qpos[h] = live[h] ? len - q_len + row / group : -1;  // -1: every key masked
  }

  // The tile's q rows (zeros past M), scaled to log2 units and split, into shared memory; each
  // warp reads its A fragments by ldmatrix per k-step (registers stay for the accumulators).
  {
    const float qs = p.scale * kLog2e;
    for (int e = tid; e < kRows * (D / 2); e += kThreads) {
      const int r = e / (D / 2), d = 2 * (e % (D / 2)), row = r0 + r;
      float v0 = 0.0f, v1 = 0.0f;
      if (row < M) {
        const float* q = p.q + (q_start + row / group) * p.q_stride + (kvh * group + row % group) * D + d;
        v0 = q[0] * qs;
        v1 = q[1] * qs;
      }
      if constexpr (kSplit) {
        uint32_t hi, lo;
        mma16::split_bf16x2(v0, v1, hi, lo);
        *reinterpret_cast<uint32_t*>(&sm.qh[r][d]) = hi;
        *reinterpret_cast<uint32_t*>(&sm.ql[r][d]) = lo;
      } else {
        *reinterpret_cast<__nv_bfloat162*>(&sm.qh[r][d]) = __floats2bfloat162_rn(v0, v1);
      }
    }
  }
  __syncthreads();

  // Keys the tile needs: up to its last query's position.
  const int last_row = min(M, r0 + kRows) - 1;
  const int key_end = min(len, len - q_len + last_row / group + 1);
  const int n_tiles = static_cast<int>((key_end + kKeys - 1) / kKeys);
  const int32_t* pages = p.page_table + b * p.page_table_stride;
  // The page of key s: a shift for a power-of-two page size (32-bit arithmetic either way: a
  // 64-bit division per copied chunk cost more issue slots than the tile's MMAs).
  const int ps = static_cast<int>(p.page_size);
  const int ps_shift = (ps & (ps - 1)) == 0 ? __ffs(ps) - 1 : -1;
  const auto* kc = static_cast<const __nv_bfloat16*>(p.k_cache);
  const auto* vc = static_cast<const __nv_bfloat16*>(p.v_cache);
  auto issue = [&](int tile) {
    const int st = tile % kStages;
    const int k0 = tile * kKeys;
    for (int e = tid; e < kKeys * kChunks; e += kThreads) {
      const int key = e / kChunks, ch = e % kChunks;
      const int s = k0 + key;
      const bool in = s < key_end;  // the page table past the row's keys may hold -1
      const int pg = ps_shift >= 0 ? s >> ps_shift : s / ps;
      const int64_t off = in ? ((static_cast<int64_t>(pages[pg]) * ps + (s - pg * ps)) * p.kv_heads + kvh) * D + ch * 8 : 0;
      cp_async16_zfill(&sm.k[st][key][ch * 8], kc + off, in ? 16u : 0u);
      cp_async16_zfill(&sm.v[st][key][ch * 8], vc + off, in ? 16u : 0u);
    }
    cp_async_commit_group();
  };

  float o[DT][4];
#pragma unroll
  for (int n = 0; n < DT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this lane's part of the row sum

  if (n_tiles > 0) issue(0);
  for (int tile = 0; tile < n_tiles; ++tile) {
    if (tile + 1 < n_tiles) {
      issue(tile + 1);  // its stage was released by the barrier ending the iteration before
      cp_async_wait_group<1>();
    } else {
      cp_async_wait_group<0>();
    }
    __syncthreads();
    const int st = tile % kStages;
    const int k0 = tile * kKeys;

    // Scores: s[j][e] is row g (e < 2) or g + 8 (e >= 2) against key k0 + 8j + 2t + (e & 1).
    float s[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      // A: this warp's 16 rows at dims 16ks .. 16ks + 15 (row-major [row][dim]).
      uint32_t qh[4], ql[4];
      mma16::ldsm_x4(qh, &sm.qh[16 * warp + (lane & 15)][16 * ks + 8 * (lane >> 4)]);
      if constexpr (kSplit) mma16::ldsm_x4(ql, &sm.ql[16 * warp + (lane & 15)][16 * ks + 8 * (lane >> 4)]);
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        // B for key n-tiles 2np, 2np + 1 (K stored [key][dim]): {kb0, kb1}, {kb2, kb3}.
        uint32_t kb[4];
        mma16::ldsm_x4(kb, &sm.k[st][16 * np + (lane & 7) + 8 * (lane >> 4)][16 * ks + 8 * ((lane >> 3) & 1)]);
        if constexpr (kSplit) {
          mma16::mma_bf16(s[2 * np], ql, kb[0], kb[1]);  // small terms first
          mma16::mma_bf16(s[2 * np + 1], ql, kb[2], kb[3]);
        }
        mma16::mma_bf16(s[2 * np], qh, kb[0], kb[1]);
        mma16::mma_bf16(s[2 * np + 1], qh, kb[2], kb[3]);
      }
    }
    // Mask, the rows' tile maxima (over the quad: the four lanes of a row), online softmax.
    float mt[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        const int key = k0 + 8 * j + 2 * t + (e & 1);
        if (key >= key_end || key > qpos[h]) s[j][e] = -INFINITY;
        mt[h] = fmaxf(mt[h], s[j][e]);
      }
    float corr[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mt[h] = fmaxf(mt[h], __shfl_xor_sync(0xffffffffu, mt[h], 1));
      mt[h] = fmaxf(mt[h], __shfl_xor_sync(0xffffffffu, mt[h], 2));
      const float m_new = fmaxf(m[h], mt[h]);
      // A row with nothing unmasked yet keeps p = 0 and its sums (no exp2(-inf - -inf)).
      corr[h] = m_new == -INFINITY ? 1.0f : exp2f(m[h] - m_new);
      m[h] = m_new;
    }
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        s[j][e] = m[h] == -INFINITY ? 0.0f : exp2f(s[j][e] - m[h]);
        rs[h] += s[j][e];
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) l[h] = l[h] * corr[h] + rs[h];
#pragma unroll
    for (int n = 0; n < DT; ++n) {
      o[n][0] *= corr[0];
      o[n][1] *= corr[0];
      o[n][2] *= corr[1];
      o[n][3] *= corr[1];
    }

    // O += P·V: k-step kj takes keys 16kj .. 16kj + 15, whose A fragment is the scores' n-tiles
    // 2kj (a0, a1) and 2kj + 1 (a2, a3); B for dim n-tiles 2dp, 2dp + 1 (V stored [key][dim],
    // transposed by ldmatrix).
#pragma unroll
    for (int kj = 0; kj < NT / 2; ++kj) {
      uint32_t ph[4], pl[4];
      if constexpr (kSplit) {
        mma16::split_bf16x2(s[2 * kj][0], s[2 * kj][1], ph[0], pl[0]);
        mma16::split_bf16x2(s[2 * kj][2], s[2 * kj][3], ph[1], pl[1]);
        mma16::split_bf16x2(s[2 * kj + 1][0], s[2 * kj + 1][1], ph[2], pl[2]);
        mma16::split_bf16x2(s[2 * kj + 1][2], s[2 * kj + 1][3], ph[3], pl[3]);
      } else {
        ph[0] = mma16::pack_bf16x2(s[2 * kj][0], s[2 * kj][1]);
        ph[1] = mma16::pack_bf16x2(s[2 * kj][2], s[2 * kj][3]);
        ph[2] = mma16::pack_bf16x2(s[2 * kj + 1][0], s[2 * kj + 1][1]);
        ph[3] = mma16::pack_bf16x2(s[2 * kj + 1][2], s[2 * kj + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t vb[4];
        mma16::ldsm_x4_t(vb, &sm.v[st][16 * kj + (lane & 15)][16 * dp + 8 * (lane >> 4)]);
        if constexpr (kSplit) {
          mma16::mma_bf16(o[2 * dp], pl, vb[0], vb[1]);  // small terms first
          mma16::mma_bf16(o[2 * dp + 1], pl, vb[2], vb[3]);
        }
        mma16::mma_bf16(o[2 * dp], ph, vb[0], vb[1]);
        mma16::mma_bf16(o[2 * dp + 1], ph, vb[2], vb[3]);
      }
    }
    __syncthreads();  // the stage is refilled by the next iteration's issue
  }

  // The rows' sums over the quad, then out (o[n][e]: row g or g + 8, dims 8n + 2t, +1).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!live[h]) continue;
    const int row = r0 + 16 * warp + g + 8 * h;
    float* out = p.out + (q_start + row / group) * p.out_stride + (kvh * group + row % group) * D;
    const float inv = 1.0f / l[h];
#pragma unroll
    for (int n = 0; n < DT; ++n) {
      out[8 * n + 2 * t] = o[n][2 * h] * inv;
      out[8 * n + 2 * t + 1] = o[n][2 * h + 1] * inv;
    }
  }
}

// Grid (slices, kv heads, batch rows): slice s takes the query tiles s, s + n_slices, … of its
// (row, kv head). Rows of at most skip_upto queries (at least 1) belong to another kernel.
template <int D, bool kSplit>
__global__ void __launch_bounds__(kThreads, 2) extend_kernel(const paged_attention_params p, int n_slices, int skip_upto) {
  static_assert(D == 64 || D == 128 || D == 256, "head_dim 64, 128 or 256");
  extern __shared__ __align__(16) unsigned char ext_smem[];
  auto& sm = *reinterpret_cast<smem_t<D, kSplit>*>(ext_smem);
  const int64_t b = blockIdx.z, kvh = blockIdx.y;
  const int64_t q_start = p.query_start_loc[b];
  const int q_len = p.query_start_loc[b + 1] - static_cast<int>(q_start);
  if (q_len <= 0 || q_len <= skip_upto) return;
  const int len = p.seq_lens[b];
  if (len < q_len) return;  // invalid row (the CPU op rejects it on the host)
  const int group = static_cast<int>(p.q_heads / p.kv_heads);
  const int M = q_len * group;
  for (int r0 = static_cast<int>(blockIdx.x) * kRows; r0 < M; r0 += n_slices * kRows)
    run_tile<D, kSplit>(p, sm, b, kvh, q_start, len, q_len, group, r0);
}

}  // namespace attn_extend_mma
}  // namespace hyserve::kernels::cuda_detail
