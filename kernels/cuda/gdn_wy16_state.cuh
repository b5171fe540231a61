#pragma once
// The state kernel of the GDN chunked prefill's bf16 path (gdn_paths.cuh: gdn_prefill_path::bf16):
// the decomposition of gdn_chunked.cuh, with bf16 tensor-core products (mma.sync m16n8k16, f32
// accumulation) as the flash-linear-attention kernels compute them, and an inter-chunk chain
// with no block-level step.
//
// The intra kernel (gdn_tc_intra.cuh, kHalf) writes per chunk q̂ = scale·q/|q| and k̂ = k/|k| (per
// key head), T = (I + A)⁻¹ and P (per value head) as 16-bit swizzled tiles (swz16), and the token
// factors qs = e^{c}, ks = e^{c_last − c}, β, G = e^{c_last}, xs = β e^{c} (field-major). State
// rows evolve independently, so a block takes kGroups groups of 16 state rows of one value head,
// each served by two warps. Per chunk, transposed (value rows × tokens) so that every product's A
// operand is an earlier product's accumulator, the group's chain warp keeps S_g (16 × K, f32
// accumulators in registers) and computes
//   Y  = S_g·k̂ᵀ                                     (A: S_g rounded to bf16)
//   zᵀ = β ⊙ vᵀ − xs ⊙ Y                            (per token column)
//   uᵀ = zᵀ·Tᵀ                                      (the chunk's new values)
//   S_g ← G·S_g + (ks ⊙ uᵀ)·k̂
// and hands S_g (as it entered the chunk, bf16 A fragments) and uᵀ (bf16) to the group's output
// warp, which computes off the chain
//   oᵀ = qs ⊙ (S_g·q̂ᵀ) + uᵀ·Pᵀ                        (the outputs of the group's rows)
// The chain S → Y → z → u → S stays in one warp's registers, with S kept as σ·s (σ a scalar:
// the chunk decays G multiply σ instead of the 16 × K registers, which are rescaled only when σ
// falls below 2^-40). Handoffs go through shared memory by chunk parity on named barriers
// (FULL: chain → output, EMPTY: output → chain). The output warps also keep the copies going:
// the chunk's tiles q̂ | k̂, T | P and the token factors arrive by three bulk copies, v by 16-byte
// cp.async (plain loads when rows are not 16-byte aligned), all completing on the stage's
// mbarrier, in kStages buffers two chunks ahead; a buffer is refilled once both roles are done
// with its chunk. When the grid takes more than one wave, the value-row slices of a head run as
// one thread block cluster (2 or 4 CTAs, gdn_tc_launch.cuh): the first CTA multicasts the tiles
// to all of them (one L2 read per cluster instead of one per slice) once every CTA has
// signalled the stage empty on its mbarrier.
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

constexpr int kGroups = 2;                // groups of 16 state rows per block
constexpr int kRows = 16 * kGroups;       // value rows per block
constexpr int kChainThreads = 32 * kGroups;
constexpr int kThreads = 2 * kChainThreads;  // warps [0, kGroups): chain; [kGroups, 2·kGroups): output
constexpr int kStages = 3;                // chunk k+2's copies start while chunk k computes
// Named barrier ids: the output warps among themselves; FULL and EMPTY per (group, chunk parity).
constexpr int kBarOut = 1, kBarFull = 2, kBarEmpty = 2 + 2 * kGroups;
constexpr float kRescaleBelow = 0x1p-40f;  // σ threshold of the chain's lazy decay
static_assert(kBarEmpty + 2 * kGroups <= 16, "16 named barriers");
// In: the element type of v (and out).
template <int K, class In = float>
struct tiles {
  // v rows: 16 bytes of padding, conflict-free accumulator-layout reads (f32 or bf16).
  static constexpr int kLdV = kRows + 16 / static_cast<int>(sizeof(In));
  static constexpr int kQK = 2 * kChunk * K;       // q̂ then k̂ (16-bit elements)
  static constexpr int kTP = 2 * kChunk * kChunk;  // T then P
  static constexpr uint32_t kQKBytes = sizeof(bf16) * kQK, kTPBytes = sizeof(bf16) * kTP;
  static constexpr uint32_t kTokBytes = sizeof(float) * kChunk * kTokFields;
  static constexpr uint32_t kVBytes = sizeof(In) * kChunk * kLdV;
  static constexpr uint32_t kStage = kQKBytes + kTPBytes + kTokBytes + kVBytes;
  static_assert(kQKBytes % 16 == 0 && kTPBytes % 16 == 0 && kTokBytes % 16 == 0 && kVBytes % 16 == 0, "bulk copies");
  // Handoff per (chunk parity, group): S_g's A fragments (K/16 k-steps) and uᵀ's (4), 16 bytes
  // per lane each, lane-contiguous.
  // Then σ (16 bytes).
  static constexpr uint32_t kHandS = (K / 16) * 32 * 16, kHandU = 4 * 32 * 16, kHand = kHandS + kHandU + 16;
  // Then the mbarriers: FULL per stage (tiles and v landed), EMPTY per stage (in the cluster's
  // first CTA: every CTA is done with the stage's chunk).
  static constexpr size_t kBytes =
      static_cast<size_t>(kStages) * kStage + 2 * kGroups * kHand + sizeof(uint64_t) * 2 * kStages;
};

// Accumulator fragments of two n-tiles (columns [16k, 16k + 16)) as one bf16 A fragment.
__device__ __forceinline__ void to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack_bf16x2(c0[0], c0[1]);
  a[1] = pack_bf16x2(c0[2], c0[3]);
  a[2] = pack_bf16x2(c1[0], c1[1]);
  a[3] = pack_bf16x2(c1[2], c1[3]);
}

// acc[8][4] (16 rows × the chunk's 64 tokens) += a (a 16 × 16 A fragment) · the tile at the
// ldmatrix address addr, stored [token][k] with rows of kRowBytes (B of two token n-tiles per
// ldmatrix; token block np at addr + np·16·kRowBytes), for token blocks np >= np0.
template <int kRowBytes>
__device__ __forceinline__ void mma_tokens(float (&acc)[8][4], const uint32_t (&a)[4], uint32_t addr, int np0 = 0) {
#pragma unroll
  for (int np = np0; np < 4; ++np) {
    uint32_t b[4];
    ldsm_x4(b, addr + np * 16 * kRowBytes);
    mma_bf16(acc[2 * np], a, b[0], b[1]);
    mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
  }
}

// One block per (row, value head, slice of kRows value rows). kVec: v rows are 16-byte aligned.
// v and out of element type In (f32 or bf16) with p's strides.
template <int K, bool kVec, class In = float>
__global__ void __launch_bounds__(kThreads, 1) state_kernel(const gdn_chunk_scan_params p, const In* __restrict__ vin,
                                                            In* __restrict__ outp, const workspace ws) {
  using tl = tiles<K, In>;
  constexpr int C = kChunk, KT = K / 8, KS = K / 16, kLdV = tl::kLdV;
  static_assert(K % 16 == 0, "whole k-steps");
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* hand = smem + kStages * tl::kStage;
  uint64_t* bars = reinterpret_cast<uint64_t*>(hand + 2 * kGroups * tl::kHand);  // FULL
  uint64_t* empty = bars + kStages;                                              // EMPTY

  pdl_wait();  // launched with PDL: the intra kernel's tiles
  if (*ws.overflow != 0) return;
  const int64_t b = blockIdx.z;
  const int64_t slot = p.state_indices[b];
  if (slot < 0) return;
  const int64_t h = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const bool chain = warp < kGroups;
  const int grp = chain ? warp : warp - kGroups;
  const int64_t HV = p.heads_v, HK = p.heads_k;
  const int V = static_cast<int>(p.v_dim);
  const int v0 = static_cast<int>(blockIdx.x) * kRows;
  const int w0 = 16 * grp;  // the group's state rows in the slice
  const int64_t hk = h / (HV / HK);
  const int64_t start = p.query_start_loc[b];
  const int len = p.query_start_loc[b + 1] - static_cast<int>(start);
  const bool init = p.has_initial_state != nullptr && p.has_initial_state[b] != 0;
  float* S = p.states + (slot * HV + h) * static_cast<int64_t>(V) * K;
  const int n_chunks = (len + C - 1) / C;
  const int gc0 = ws.chunk_off[b];
  const uint32_t nc = cluster_size(), rank = cluster_rank();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      mbar_init(&bars[st], 1 + kChainThreads);  // issuer + v copiers
      mbar_init(&empty[st], static_cast<int>(nc));
    }
    fence_mbar_init();
  }
  __syncthreads();
  if (nc > 1) cluster_sync();  // every CTA's barriers initialised before any multicast

  const uint32_t smem0 = smem_addr(smem);
  auto hand_s = [&](int par) { return reinterpret_cast<uint4*>(hand + (par * kGroups + grp) * tl::kHand); };
  auto hand_u = [&](int par) {
    return reinterpret_cast<uint4*>(hand + (par * kGroups + grp) * tl::kHand + tl::kHandS);
  };
  // Per-lane byte offsets of the ldmatrix rows inside a stage (swz16): the unit XOR depends on
  // the lane and on one compile-time index, so each is computed once here.
  const int l7 = lane & 7, lb = (lane >> 3) & 1, lh = lane >> 4;
  constexpr int kMaskK = (K / 8 < 8 ? K / 8 : 8) - 1;
  uint32_t offKn[KS], offTP[4];  // q̂ or k̂ plain (by k-step); T and P (by k-step)
#pragma unroll
  for (int i = 0; i < KS; ++i) offKn[i] = 2 * ((l7 + 8 * lh) * K + (((2 * i + lb) ^ (l7 & kMaskK)) << 3));
#pragma unroll
  for (int i = 0; i < 4; ++i) offTP[i] = 2 * ((l7 + 8 * lh) * C + (((2 * i + lb) ^ l7) << 3));

  if (!chain) {
    // ---- output warp: oᵀ = qs ⊙ (S_g·q̂ᵀ) + uᵀ·Pᵀ → out, one chunk behind the chain at most.
    // v: output thread i copies 16-byte unit vc of rows vj0 + kVRows·r of each chunk.
    constexpr int kE = 16 / static_cast<int>(sizeof(In));  // elements per 16-byte unit
    constexpr int kVUnits = kRows / kE, kVRows = kChainThreads / kVUnits, kVPasses = C / kVRows;
    static_assert(kChainThreads % kVUnits == 0 && C % kVRows == 0, "whole v passes");
    const int ot = threadIdx.x - kChainThreads;
    const int vj0 = ot / kVUnits, vc = kE * (ot % kVUnits);
    const bool vcol = v0 + vc < V;
    const In* vsrc = vin + (start + vj0) * p.v_stride + h * V + v0 + vc;
    // Chunk kc into stage st; refill: the stage held chunk kc − kStages, which this CTA is done with.
    auto issue = [&](int kc, int st, bool refill) {
      unsigned char* base = smem + st * tl::kStage;
      const int64_t gc = gc0 + kc;
      if (ot == 0) {
        mbar_arrive_expect_tx(&bars[st], tl::kQKBytes + tl::kTPBytes + tl::kTokBytes);
        if (nc > 1 && refill) mbar_arrive_cluster(&empty[st], 0);
        if (rank == 0) {
          if (nc > 1 && refill) mbar_wait_cluster(&empty[st], static_cast<uint32_t>(kc / kStages - 1) & 1u);
          fence_proxy_async();
          const void* src[3] = {ws.qk16 + (gc * HK + hk) * tl::kQK, ws.tp16 + (gc * HV + h) * tl::kTP,
                                ws.tok + (gc * HV + h) * C * kTokFields};
          const uint32_t bytes[3] = {tl::kQKBytes, tl::kTPBytes, tl::kTokBytes};
          unsigned char* dst = base;
#pragma unroll
          for (int i = 0; i < 3; ++i) {
            if (nc > 1) bulk_copy_multicast(dst, src[i], bytes[i], &bars[st], static_cast<uint16_t>((1u << nc) - 1));
            else bulk_copy(dst, src[i], bytes[i], &bars[st]);
            dst += bytes[i];
          }
        }
      }
      In* vs = reinterpret_cast<In*>(base + tl::kQKBytes + tl::kTPBytes + tl::kTokBytes) + vj0 * kLdV + vc;
      const int n = min(C, len - kc * C);
      const In* src = vsrc + static_cast<int64_t>(kc) * C * p.v_stride;
#pragma unroll
      for (int r = 0; r < kVPasses; ++r) {
        const bool full = vcol && vj0 + kVRows * r < n;
        if constexpr (kVec) {
          gdn_tc::cp_async16(vs + kVRows * r * kLdV, full ? src + kVRows * r * p.v_stride : vin, full);
        } else {
#pragma unroll
          for (int e = 0; e < kE; ++e)
            vs[kVRows * r * kLdV + e] = full && v0 + vc + e < V ? src[kVRows * r * p.v_stride + e] : from_float<In>(0.0f);
        }
      }
      if constexpr (kVec) cp_async_mbar_arrive(&bars[st]);  // v lands on the stage's barrier too
      else mbar_arrive(&bars[st]);
    };
    In* const out_lane = outp + (start + 2 * t) * p.out_stride + h * V + v0 + w0 + g;
    const bool rows_full = v0 + w0 + 16 <= V;
#pragma unroll
    for (int c = 0; c < kStages; ++c)
      if (c < n_chunks) issue(c, c, false);
    int st = 0;
    uint32_t parity = 0;
#pragma unroll 1
    for (int kc = 0; kc < n_chunks; ++kc) {
      const int par = kc & 1;
      named_sync(kBarFull + 2 * grp + par, 64);
      if (kc >= 1 && kc + 2 < n_chunks) {
        // Both chains have handed off chunk kc (so are done with kc − 1) and both output warps
        // are past kc − 1: its buffers take chunk kc + 2.
        named_sync(kBarOut, kChainThreads);
        issue(kc + 2, st == 0 ? kStages - 1 : st - 1, true);
      }
      mbar_wait(&bars[st], parity);  // the tiles are visible to this warp too
      const uint32_t sQ = smem0 + st * tl::kStage, sP = sQ + tl::kQKBytes + C * C * 2;
      const float* tk = reinterpret_cast<const float*>(smem + st * tl::kStage + tl::kQKBytes + tl::kTPBytes);
      const uint4* hs = hand_s(par);
      const uint4* hu = hand_u(par);
      const float sigma = *reinterpret_cast<const float*>(hu + 4 * 32);
      float zq[8][4];
      zero(zq);
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        const uint4 w = hs[ks * 32 + lane];
        const uint32_t sa[4] = {w.x, w.y, w.z, w.w};
        mma_tokens<K * 2>(zq, sa, sQ + offKn[ks]);
      }
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const float2 qs = *reinterpret_cast<const float2*>(tk + 8 * nt + 2 * t);
        const float q0 = qs.x * sigma, q1 = qs.y * sigma;
#pragma unroll
        for (int e = 0; e < 4; ++e) zq[nt][e] *= (e & 1) ? q1 : q0;
      }
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        const uint4 w = hu[ks * 32 + lane];
        const uint32_t ua[4] = {w.x, w.y, w.z, w.w};
        mma_tokens<C * 2>(zq, ua, sP + offTP[ks], ks);
      }
      named_arrive(kBarEmpty + 2 * grp + par, 64);  // handoff buffers and this chunk's tiles read
      // zq[nt][e] is token 8·nt + 2t + (e & 1), row w0 + g + 8·(e >> 1) of the slice.
      const int n = min(C, len - kc * C);
      In* const o = out_lane + static_cast<int64_t>(kc) * C * p.out_stride;
      const int64_t os = p.out_stride;
      if (n == C && rows_full) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[(8 * nt + (e & 1)) * os + 8 * (e >> 1)] = from_float<In>(zq[nt][e]);
        }
      } else {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int j = 8 * nt + 2 * t + (e & 1), row = v0 + w0 + g + 8 * (e >> 1);
            if (j < n && row < V) o[(8 * nt + (e & 1)) * os + 8 * (e >> 1)] = from_float<In>(zq[nt][e]);
          }
        }
      }
      if (++st == kStages) {
        st = 0;
        parity ^= 1u;
      }
    }
  } else {
    // ---- chain warps (threads [0, kChainThreads)) ----
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

    uint32_t offKt[KS];  // k̂ transposed (by n-pair)
#pragma unroll
    for (int i = 0; i < KS; ++i) offKt[i] = 2 * ((lane & 15) * K + (((2 * i + lh) ^ (l7 & kMaskK)) << 3));

    float sigma = 1.0f;  // S_g = σ·s
    int st = 0;
    uint32_t parity = 0;
#pragma unroll 1
    for (int kc = 0; kc < n_chunks; ++kc) {
      const int par = kc & 1;
      mbar_wait(&bars[st], parity);  // tiles and v
      if (kc >= 2) named_sync(kBarEmpty + 2 * grp + par, 64);  // the output warp is done with kc − 2's handoff

      const unsigned char* base = smem + st * tl::kStage;
      const uint32_t sK = smem0 + st * tl::kStage + C * K * 2, sT = smem0 + st * tl::kStage + tl::kQKBytes;
      const float* tk = reinterpret_cast<const float*>(base + tl::kQKBytes + tl::kTPBytes);  // [field][C]
      const In* vs = reinterpret_cast<const In*>(base + tl::kQKBytes + tl::kTPBytes + tl::kTokBytes);

      // Y = S_g·k̂ᵀ (8 token n-tiles; B stored [token][key]); S_g's fragments to the handoff.
      uint4* hs = hand_s(par);
      float y[8][4];
      zero(y);
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        uint32_t sa[4];
        to_a(sa, s[2 * ks], s[2 * ks + 1]);
        hs[ks * 32 + lane] = make_uint4(sa[0], sa[1], sa[2], sa[3]);
        mma_tokens<K * 2>(y, sa, sK + offKn[ks]);
      }

      // zᵀ = β ⊙ vᵀ − xs ⊙ Y (in place over Y), as A fragments over the tokens.
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int j = 8 * nt + 2 * t;
        const float2 be = *reinterpret_cast<const float2*>(tk + 2 * C + j);
        float2 xs = *reinterpret_cast<const float2*>(tk + 4 * C + j);
        xs.x *= sigma;
        xs.y *= sigma;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float vr = to_float(vs[(j + (e & 1)) * kLdV + w0 + g + 8 * (e >> 1)]);
          y[nt][e] = ((e & 1) ? be.y : be.x) * vr - ((e & 1) ? xs.y : xs.x) * y[nt][e];
        }
      }
      uint32_t za[4][4];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) to_a(za[kk], y[2 * kk], y[2 * kk + 1]);

      // uᵀ = zᵀ·Tᵀ: B[j][i] = T[i][j] (T stored [i][j]); T is lower triangular, so k-step ks
      // serves token blocks np >= ks only.
      float u[8][4];
      zero(u);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) mma_tokens<C * 2>(u, za[ks], sT + offTP[ks], ks);
      uint4* hu = hand_u(par);
      if (lane == 0) *reinterpret_cast<float*>(hu + 4 * 32) = sigma;
      // The decay: σ ← σ·G, or (below the threshold) s ← σG·s and σ ← 1; the update is divided by σ.
      const float sg = sigma * tk[3 * C];
      if (sg < kRescaleBelow) {
#pragma unroll
        for (int nt = 0; nt < KT; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[nt][e] *= sg;
        }
        sigma = 1.0f;
      } else {
        sigma = sg;
      }
      const float inv_sigma = 1.0f / sigma;
      uint32_t uk[4][4];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        uint32_t ua[4];
        to_a(ua, u[2 * kk], u[2 * kk + 1]);
        hu[kk * 32 + lane] = make_uint4(ua[0], ua[1], ua[2], ua[3]);
        float w[2][4];
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const float2 ks2 = *reinterpret_cast<const float2*>(tk + 1 * C + 16 * kk + 8 * q + 2 * t);
          const float k0 = ks2.x * inv_sigma, k1 = ks2.y * inv_sigma;
#pragma unroll
          for (int e = 0; e < 4; ++e) w[q][e] = u[2 * kk + q][e] * ((e & 1) ? k1 : k0);
        }
        to_a(uk[kk], w[0], w[1]);
      }
      named_arrive(kBarFull + 2 * grp + par, 64);  // S_g and uᵀ of chunk kc to the output warp

      // s ← s + (ks/σ ⊙ uᵀ)·k̂: B[j][key] = k̂[j][key] (stored [token][key], read transposed).
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

      if (++st == kStages) {
        st = 0;
        parity ^= 1u;
      }
    }
    for (int kc = n_chunks >= 2 ? n_chunks - 2 : 0; kc < n_chunks; ++kc)
      named_sync(kBarEmpty + 2 * grp + (kc & 1), 64);  // the last handoffs

#pragma unroll
    for (int nt = 0; nt < KT; ++nt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = v0 + w0 + g + 8 * half;
        if (row < V)
          *reinterpret_cast<float2*>(S + static_cast<int64_t>(row) * K + 8 * nt + 2 * t) =
              make_float2(sigma * s[nt][2 * half], sigma * s[nt][2 * half + 1]);
      }
    }
  }
  if (nc > 1) cluster_sync();  // no CTA leaves while the cluster's copies may target it
}

}  // namespace gdn_wy16
}  // namespace hyserve::kernels::cuda_detail
