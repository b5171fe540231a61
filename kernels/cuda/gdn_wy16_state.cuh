#pragma once
// The state kernel of the GDN chunked prefill's bf16 path (gdn_paths.cuh: gdn_prefill_path::bf16):
// the decomposition of gdn_chunked.cuh, with bf16 tensor-core products (mma.sync m16n8k16, f32
// accumulation) as the flash-linear-attention kernels compute them, and an inter-chunk chain
// with no block-level step.
//
// The intra kernel (gdn_tc_intra.cuh, kHalf) writes per chunk q̂ = scale·q/|q| and k̂ = k/|k| (per
// key head), T = (I + A)⁻¹ and P (per value head) as 16-bit swizzled tiles (swz16), and the token
// factors qs = e^{c}, ks = e^{c_last − c}, β, G = e^{c_last}, xs = β e^{c}. State rows evolve
// independently, so warp w of a block keeps state rows [16w, 16w + 16) of the block's slice
// (S_w, 16 × K, f32 accumulators in registers) and computes, per chunk, transposed (value rows ×
// tokens) so that every product's A operand is the previous product's accumulator:
//   Y  = S_w·k̂ᵀ,  Z = S_w·q̂ᵀ                        (A: S_w rounded to bf16)
//   zᵀ = β ⊙ vᵀ − xs ⊙ Y                            (per token column)
//   uᵀ = zᵀ·Tᵀ                                      (the chunk's new values)
//   oᵀ = qs ⊙ Z + uᵀ·Pᵀ                              (the outputs of the warp's rows)
//   S_w ← G·S_w + (ks ⊙ uᵀ)·k̂
// The chain S → Y → z → u → S stays in one warp's registers: no barrier, no shared-memory round
// trip. The block only shares the chunk's tiles: q̂ | k̂, T | P and the token factors arrive by
// three bulk copies on an mbarrier, v by 16-byte cp.async (plain loads when rows are not 16-byte
// aligned), double-buffered so that chunk k+1's copies overlap chunk k.
#include <cuda_bf16.h>

#include <cstdint>

#include "async_copy.cuh"
#include "gdn_chunked.cuh"
#include "mma_bf16.cuh"

namespace hyserve::kernels::cuda_detail {
namespace gdn_wy16 {

using bf16 = __nv_bfloat16;
using gdn_tc::kChunk;
using gdn_tc::kTokFields;
using gdn_tc::swz16;
using gdn_tc::workspace;
using gdn_tc::zero;
using mma16::ldsm_x4;
using mma16::ldsm_x4_t;
using mma16::mma_bf16;
using mma16::pack_bf16x2;

constexpr int kWarps = 2;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16 * kWarps;  // value rows per block
constexpr int kStages = 2;

template <int K>
struct tiles {
  static constexpr int kLdV = kRows + 4;  // v rows (f32): conflict-free accumulator-layout reads
  static constexpr int kQK = 2 * kChunk * K;       // q̂ then k̂ (16-bit elements)
  static constexpr int kTP = 2 * kChunk * kChunk;  // T then P
  static constexpr uint32_t kQKBytes = sizeof(bf16) * kQK, kTPBytes = sizeof(bf16) * kTP;
  static constexpr uint32_t kTokBytes = sizeof(float) * kChunk * kTokFields;
  static constexpr uint32_t kVBytes = sizeof(float) * kChunk * kLdV;
  static constexpr uint32_t kStage = kQKBytes + kTPBytes + kTokBytes + kVBytes;
  static_assert(kQKBytes % 16 == 0 && kTPBytes % 16 == 0 && kTokBytes % 16 == 0 && kVBytes % 16 == 0, "bulk copies");
  static constexpr size_t kBytes = static_cast<size_t>(kStages) * kStage + sizeof(uint64_t) * kStages;
};

// Accumulator fragments of two n-tiles (columns [16k, 16k + 16)) as one bf16 A fragment.
__device__ __forceinline__ void to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack_bf16x2(c0[0], c0[1]);
  a[1] = pack_bf16x2(c0[2], c0[3]);
  a[2] = pack_bf16x2(c1[0], c1[1]);
  a[3] = pack_bf16x2(c1[2], c1[3]);
}

// One block per (row, value head, slice of kRows value rows). kVec: v rows are 16-byte aligned.
template <int K, bool kVec>
__global__ void __launch_bounds__(kThreads, 1) state_kernel(const gdn_chunk_scan_params p, const workspace ws) {
  using tl = tiles<K>;
  constexpr int C = kChunk, KT = K / 8, KS = K / 16, kLdV = tl::kLdV;
  static_assert(K % 16 == 0, "whole k-steps");
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kStages * tl::kStage);

  if (*ws.overflow != 0) return;
  const int64_t b = blockIdx.z;
  const int64_t slot = p.state_indices[b];
  if (slot < 0) return;
  const int64_t h = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t HV = p.heads_v, HK = p.heads_k;
  const int V = static_cast<int>(p.v_dim);
  const int v0 = static_cast<int>(blockIdx.x) * kRows;
  const int w0 = 16 * warp;  // the warp's state rows in the slice
  const int64_t hk = h / (HV / HK);
  const int64_t start = p.query_start_loc[b];
  const int len = p.query_start_loc[b + 1] - static_cast<int>(start);
  const bool init = p.has_initial_state != nullptr && p.has_initial_state[b] != 0;
  float* S = p.states + (slot * HV + h) * static_cast<int64_t>(V) * K;

  // s[nt][e]: state row v0 + w0 + g + 8·(e / 2), key 8·nt + 2t + e % 2.
  float s[KT][4];
#pragma unroll
  for (int nt = 0; nt < KT; ++nt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = v0 + w0 + g + 8 * half;
      float2 v = make_float2(0.0f, 0.0f);
      if (init && row < V) v = *reinterpret_cast<const float2*>(S + static_cast<int64_t>(row) * K + 8 * nt + 2 * t);
      s[nt][2 * half] = v.x;
      s[nt][2 * half + 1] = v.y;
    }
  }

  const int n_chunks = (len + C - 1) / C;
  const int gc0 = ws.chunk_off[b];
  if (threadIdx.x == 0) {
#pragma unroll
    for (int st = 0; st < kStages; ++st) mbar_init(&bars[st], 1);
    fence_mbar_init();
  }
  __syncthreads();

  // v: thread i copies 16-byte unit vc of rows vj0 + 8·r (r < kVPasses) of each chunk.
  constexpr int kVUnits = kRows / 4, kVRows = kThreads / kVUnits, kVPasses = C / kVRows;
  static_assert(kThreads % kVUnits == 0 && C % kVRows == 0, "whole v passes");
  const int vj0 = threadIdx.x / kVUnits, vc = 4 * (threadIdx.x % kVUnits);
  const bool vcol = v0 + vc < V;
  const float* vsrc = p.v + (start + vj0) * p.v_stride + h * V + v0 + vc;
  const uint32_t smem0 = smem_addr(smem);
  auto issue = [&](int kc, int st) {
    unsigned char* base = smem + st * tl::kStage;
    const int64_t gc = gc0 + kc;
    if (threadIdx.x == 0) {
      fence_proxy_async();
      mbar_arrive_expect_tx(&bars[st], tl::kQKBytes + tl::kTPBytes + tl::kTokBytes);
      bulk_copy(base, ws.qk16 + (gc * HK + hk) * tl::kQK, tl::kQKBytes, &bars[st]);
      bulk_copy(base + tl::kQKBytes, ws.tp16 + (gc * HV + h) * tl::kTP, tl::kTPBytes, &bars[st]);
      bulk_copy(base + tl::kQKBytes + tl::kTPBytes, ws.tok + (gc * HV + h) * C * kTokFields, tl::kTokBytes, &bars[st]);
    }
    float* vs = reinterpret_cast<float*>(base + tl::kQKBytes + tl::kTPBytes + tl::kTokBytes) + vj0 * kLdV + vc;
    const int n = min(C, len - kc * C);
    const float* src = vsrc + static_cast<int64_t>(kc) * C * p.v_stride;
#pragma unroll
    for (int r = 0; r < kVPasses; ++r) {
      const bool full = vcol && vj0 + kVRows * r < n;
      if constexpr (kVec) {
        gdn_tc::cp_async16(vs + kVRows * r * kLdV, full ? src + kVRows * r * p.v_stride : p.v, full);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          vs[kVRows * r * kLdV + e] = full && v0 + vc + e < V ? src[kVRows * r * p.v_stride + e] : 0.0f;
      }
    }
    if constexpr (kVec) gdn_tc::cp_async_commit();
  };

  // Per-lane byte offsets of the ldmatrix rows inside a stage (swz16): the unit XOR depends on
  // the lane and on one compile-time index, so each is computed once here.
  const int l7 = lane & 7, lb = (lane >> 3) & 1, lh = lane >> 4;
  constexpr int kMaskK = (K / 8 < 8 ? K / 8 : 8) - 1;
  uint32_t offKn[KS], offKt[KS], offTP[4];  // k̂ plain (by k-step), k̂ transposed (by n-pair), T and P
#pragma unroll
  for (int i = 0; i < KS; ++i) {
    offKn[i] = 2 * ((l7 + 8 * lh) * K + (((2 * i + lb) ^ (l7 & kMaskK)) << 3));
    offKt[i] = 2 * ((lane & 15) * K + (((2 * i + lh) ^ (l7 & kMaskK)) << 3));
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) offTP[i] = 2 * ((l7 + 8 * lh) * C + (((2 * i + lb) ^ l7) << 3));
  float* const out_lane = p.out + (start + 2 * t) * p.out_stride + h * V + v0 + w0 + g;
  const bool rows_full = v0 + w0 + 16 <= V;

  if (n_chunks > 0) issue(0, 0);
#pragma unroll 1
  for (int kc = 0; kc < n_chunks; ++kc) {
    const int st = kc & 1;
    if constexpr (kVec) gdn_tc::cp_async_wait0();
    mbar_wait(&bars[st], (kc >> 1) & 1);
    __syncthreads();  // v visible to both warps; both are done with chunk kc − 1's buffers
    if (kc + 1 < n_chunks) issue(kc + 1, st ^ 1);

    const unsigned char* base = smem + st * tl::kStage;
    const uint32_t sQ = smem0 + st * tl::kStage, sK = sQ + C * K * 2, sT = sQ + tl::kQKBytes, sP = sT + C * C * 2;
    const float* tk = reinterpret_cast<const float*>(base + tl::kQKBytes + tl::kTPBytes);  // [field][C]
    const float* vs = reinterpret_cast<const float*>(base + tl::kQKBytes + tl::kTPBytes + tl::kTokBytes);
    const int n = min(C, len - kc * C);

    // Y = S_w·k̂ᵀ and Z = S_w·q̂ᵀ (8 token n-tiles; B stored [token][key]).
    float y[8][4], zq[8][4];
    zero(y);
    zero(zq);
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      uint32_t sa[4];
      to_a(sa, s[2 * ks], s[2 * ks + 1]);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t bk[4], bq[4];
        ldsm_x4(bk, sK + offKn[ks] + np * 16 * K * 2);
        ldsm_x4(bq, sQ + offKn[ks] + np * 16 * K * 2);
        mma_bf16(y[2 * np], sa, bk[0], bk[1]);
        mma_bf16(y[2 * np + 1], sa, bk[2], bk[3]);
        mma_bf16(zq[2 * np], sa, bq[0], bq[1]);
        mma_bf16(zq[2 * np + 1], sa, bq[2], bq[3]);
      }
    }

    // zᵀ = β ⊙ vᵀ − xs ⊙ Y (in place over Y), as A fragments over the tokens.
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const int j = 8 * nt + 2 * t;
      const float2 be = *reinterpret_cast<const float2*>(tk + 2 * C + j);
      const float2 xs = *reinterpret_cast<const float2*>(tk + 4 * C + j);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float* vr = vs + (j + (e & 1)) * kLdV + w0 + g + 8 * (e >> 1);
        y[nt][e] = ((e & 1) ? be.y : be.x) * *vr - ((e & 1) ? xs.y : xs.x) * y[nt][e];
      }
    }
    uint32_t za[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) to_a(za[kk], y[2 * kk], y[2 * kk + 1]);

    // uᵀ = zᵀ·Tᵀ: B[j][i] = T[i][j] (T stored [i][j]); T is lower triangular, so token block np
    // of u takes k-steps 0..np only.
    float u[8][4];
    zero(u);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
#pragma unroll
      for (int ks = 0; ks <= np; ++ks) {
        uint32_t bt[4];
        ldsm_x4(bt, sT + offTP[ks] + np * 16 * C * 2);
        mma_bf16(u[2 * np], za[ks], bt[0], bt[1]);
        mma_bf16(u[2 * np + 1], za[ks], bt[2], bt[3]);
      }
    }
    uint32_t ua[4][4], uk[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      to_a(ua[kk], u[2 * kk], u[2 * kk + 1]);
      float w[2][4];
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const float2 ks2 = *reinterpret_cast<const float2*>(tk + 1 * C + 16 * kk + 8 * q + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) w[q][e] = u[2 * kk + q][e] * ((e & 1) ? ks2.y : ks2.x);
      }
      to_a(uk[kk], w[0], w[1]);
    }

    // S_w ← G·S_w + (ks ⊙ uᵀ)·k̂: B[j][key] = k̂[j][key] (stored [token][key], read transposed).
    const float G = tk[3 * C];
#pragma unroll
    for (int nt = 0; nt < KT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] *= G;
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int np = 0; np < KT / 2; ++np) {
        uint32_t bk[4];
        ldsm_x4_t(bk, sK + offKt[np] + kk * 16 * K * 2);
        mma_bf16(s[2 * np], uk[kk], bk[0], bk[1]);
        mma_bf16(s[2 * np + 1], uk[kk], bk[2], bk[3]);
      }
    }

    // oᵀ = qs ⊙ Z + uᵀ·Pᵀ (P lower triangular, stored [i][j]) → out.
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const float2 qs = *reinterpret_cast<const float2*>(tk + 8 * nt + 2 * t);
#pragma unroll
      for (int e = 0; e < 4; ++e) zq[nt][e] *= (e & 1) ? qs.y : qs.x;
    }
#pragma unroll
    for (int np = 0; np < 4; ++np) {
#pragma unroll
      for (int ks = 0; ks <= np; ++ks) {
        uint32_t bp[4];
        ldsm_x4(bp, sP + offTP[ks] + np * 16 * C * 2);
        mma_bf16(zq[2 * np], ua[ks], bp[0], bp[1]);
        mma_bf16(zq[2 * np + 1], ua[ks], bp[2], bp[3]);
      }
    }
    // zq[nt][e] is token 8·nt + 2t + (e & 1), row w0 + g + 8·(e >> 1) of the slice.
    float* const o = out_lane + static_cast<int64_t>(kc) * C * p.out_stride;
    const int64_t os = p.out_stride;
    if (n == C && rows_full) {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[(8 * nt + (e & 1)) * os + 8 * (e >> 1)] = zq[nt][e];
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = 8 * nt + 2 * t + (e & 1), row = v0 + w0 + g + 8 * (e >> 1);
          if (j < n && row < V) o[(8 * nt + (e & 1)) * os + 8 * (e >> 1)] = zq[nt][e];
        }
      }
    }
  }

#pragma unroll
  for (int nt = 0; nt < KT; ++nt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = v0 + w0 + g + 8 * half;
      if (row < V)
        *reinterpret_cast<float2*>(S + static_cast<int64_t>(row) * K + 8 * nt + 2 * t) =
            make_float2(s[nt][2 * half], s[nt][2 * half + 1]);
    }
  }
}

}  // namespace gdn_wy16
}  // namespace hyserve::kernels::cuda_detail
