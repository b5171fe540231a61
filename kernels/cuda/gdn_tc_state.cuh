#pragma once
// The state kernel of the GDN chunked prefill (gdn_chunked.cuh: the decomposition, the
// workspace and the plan): one block per (row, value head, value-row slice) walking the row's
// chunks in order.
#include <cstdint>

#include "gdn_chunked.cuh"

namespace hyserve::kernels::cuda_detail {
namespace gdn_tc {

constexpr int kStateWarps = 8;
constexpr int kStateThreads = 32 * kStateWarps;

template <int K>
struct state_tiles {
  static constexpr int kLdQ = K + 8;       // q (A, 8-byte fragment loads)
  static constexpr int kLdK = K + 8;       // k (B k-major in the update; A of X·Sᵀ, 8-byte loads)
  static constexpr int kLdT = kChunk + 4;  // T, R (A)
  static constexpr int kLdY = kSlice + 8;  // v then z in place (B k-major), ks ⊙ u (A read transposed)
  static constexpr int kLdS = K + 8;       // S slice (B read transposed, 8-byte loads)
  // q, k, v and the token factors by chunk parity; T, R, ks ⊙ u and the state once.
  static constexpr int kFloats =
      kChunk * (2 * kLdQ + 2 * kLdK + 2 * kLdT + 3 * kLdY + 2 * kTokFields) + kSlice * kLdS;
  static constexpr size_t kBytes = sizeof(float) * kFloats;
};

// Copies a [C × 4·C4] tile of 16-byte chunks: src(j, c, full) gives the chunk's global address
// and whether it is read (else the chunk is zero-filled). kAsync: cp.async (the caller commits
// and waits); else plain loads, several in flight per thread, and shared stores.
template <bool kAsync, int C4, class Src>
__device__ __forceinline__ void copy_tile(float* dst, int ld, Src src) {
  constexpr int kN = kChunk * C4;
  const int tid = threadIdx.x;
  if constexpr (kAsync) {
    for (int e = tid; e < kN; e += kStateThreads) {
      const int j = e / C4, c = e % C4;
      bool full;
      const float* g = src(j, c, full);
      cp_async16(dst + j * ld + 4 * c, g, full);
    }
  } else {
    constexpr int kU = kN / kStateThreads < 4 ? (kN / kStateThreads > 0 ? kN / kStateThreads : 1) : 4;
    for (int e0 = 0; e0 < kN; e0 += kStateThreads * kU) {
      float4 v[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int e = e0 + u * kStateThreads + tid;
        v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (e < kN) {
          const int j = e / C4, c = e % C4;
          bool full;
          const float* g = src(j, c, full);
          if (full) v[u] = make_float4(g[0], g[1], g[2], g[3]);  // any alignment
        }
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int e = e0 + u * kStateThreads + tid;
        if (e < kN) *reinterpret_cast<float4*>(dst + (e / C4) * ld + 4 * (e % C4)) = v[u];
      }
    }
  }
}

// One block per (row, value head, slice of 32 value rows), 8 warps. With X = xs ⊙ k
// (xs = β e^{c}/|k|), W = T·X, so u = T·(β v) − W·Sᵀ = T·(β v − X·Sᵀ): the state pass needs T
// but not W; and P·u = R·z with R = P·T from the intra kernel. Per chunk:
//   (1) z = β v − xs ⊙ (k·Sᵀ) (in place over v),  o = qs ⊙ (q·Sᵀ)   (one k-loop, shared Sᵀ
//                                                  fragments; the token factors scale the rows)
//   (2) u = T·z and o += R·z → out                (one k-loop, shared z fragments)
//   (3) S ← G·S + (ks ⊙ u)ᵀ·k
// Warp w computes token rows [r0, +16) × slice columns [16·(w / 4), +16) of z, u and o (r0 below),
// and slice rows [16·(w / 4), +16) × key columns [(w % 4)·K/4, +K/4) of the update. q, k and v
// are staged raw; no token factor is applied inside a product.
// The chunk on the critical path (S → z → u → S) never waits for a load that could have
// started earlier: the tiles of chunk k+1 are copied while chunk k is computed (cp.async when
// the inputs allow 16-byte copies), in two groups:
//   QKV (q, k, v, token factors; by chunk parity) — issued at the start of chunk k, so the whole
//                                                   chunk hides it;
//   TR  (T, R; single buffers)                    — issued once (2) of chunk k has read them,
//                                                   awaited before (2) of chunk k+1.
template <bool kSplit, int K, bool kAsync>
__global__ void __launch_bounds__(kStateThreads, 1)
    state_kernel(const gdn_chunk_scan_params p, const workspace ws) {
  using tl = state_tiles<K>;
  constexpr int C = kChunk, BV = kSlice;
  constexpr int kLdQ = tl::kLdQ, kLdK = tl::kLdK, kLdT = tl::kLdT, kLdY = tl::kLdY, kLdS = tl::kLdS;
  constexpr int KW = K / 4;    // state key columns per warp
  constexpr int NTS = KW / 8;  // their n-tiles
  static_assert(KW % 8 == 0, "key columns per warp in whole n-tiles");
  extern __shared__ float4 smem_f4[];
  float* Qb = reinterpret_cast<float*>(smem_f4);  // [2][C][kLdQ] raw q by chunk parity
  float* Kb = Qb + 2 * C * kLdQ;                  // [2][C][kLdK] raw k
  float* Yb = Kb + 2 * C * kLdK;                  // [2][C][kLdY] raw v (slice), then z
  float* toks = Yb + 2 * C * kLdY;                // [2][C][kTokFields]
  float* Ts = toks + 2 * C * kTokFields;          // [C][kLdT]
  float* Rs = Ts + C * kLdT;                      // [C][kLdT]
  float* Uk = Rs + C * kLdT;                      // [C][kLdY] ks ⊙ u
  float* Ss = Uk + C * kLdY;                      // [BV][kLdS]

  pdl_wait();  // launched with PDL: the intra kernel's workspace
  if (*ws.overflow != 0) return;
  const int64_t b = blockIdx.z;
  const int64_t slot = p.state_indices[b];
  if (slot < 0) return;
  const int64_t h = blockIdx.y;
  const int v0 = static_cast<int>(blockIdx.x) * BV;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t HV = p.heads_v;
  const int V = static_cast<int>(p.v_dim);
  const int64_t hk = h / (HV / p.heads_k);
  const int64_t start = p.query_start_loc[b];
  const int len = p.query_start_loc[b + 1] - static_cast<int>(start);
  const bool init = p.has_initial_state != nullptr && p.has_initial_state[b] != 0;
  float* S = p.states + (slot * HV + h) * static_cast<int64_t>(V) * K;
  // Token rows of z, u and o: (2) walks T and R only up to column r0 + 16, so its work grows with
  // r0; warps w and w + 4 share a scheduler (sub-partition w % 4), hence the second four take
  // the row blocks in reverse and every scheduler gets 2 + 8 = 4 + 6 k-steps of (2), not up to 8 + 8.
  const int r0 = 16 * ((warp >> 2) != 0 ? 3 - (warp & 3) : (warp & 3));
  const int c0 = 16 * (warp >> 2);  // slice columns of z, u and o
  const int m0 = 16 * (warp >> 2);  // slice rows of the state update
  const int kb = (warp & 3) * KW;   // key columns of the state update

  // State rows [m0, m0 + 16) × keys [kb, kb + KW) in registers: s[nt][e] at slice row
  // m0 + g + 8·(e / 2), key kb + 8·nt + 2t + e % 2.
  float s[NTS][4];
#pragma unroll
  for (int nt = 0; nt < NTS; ++nt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int vl = m0 + g + 8 * half, key = kb + 8 * nt + 2 * t;
      float2 v = make_float2(0.0f, 0.0f);
      if (init && v0 + vl < V) v = *reinterpret_cast<const float2*>(S + static_cast<int64_t>(v0 + vl) * K + key);
      s[nt][2 * half] = v.x;
      s[nt][2 * half + 1] = v.y;
      *reinterpret_cast<float2*>(&Ss[vl * kLdS + key]) = v;
    }
  }

  const int n_chunks = (len + C - 1) / C;
  const int gc0 = ws.chunk_off[b];
  auto chunk_tokens = [&](int kc) { return min(C, len - kc * C); };
  auto issue_qkv = [&](int kc) {
    const int64_t it = static_cast<int64_t>(gc0 + kc) * HV + h;
    const int64_t t0 = start + static_cast<int64_t>(kc) * C;
    const int n = chunk_tokens(kc);
    const int par = kc & 1;
    const float* tokg = ws.tok + it * C * kTokFields;
    copy_tile<kAsync, kTokFields / 4>(toks + par * C * kTokFields, kTokFields, [&](int j, int c, bool& full) {
      full = true;
      return tokg + j * kTokFields + 4 * c;
    });
    copy_tile<kAsync, K / 4>(Qb + par * C * kLdQ, kLdQ, [&](int j, int c, bool& full) {
      full = j < n;
      return full ? p.q + (t0 + j) * p.q_stride + hk * K + 4 * c : p.q;
    });
    copy_tile<kAsync, K / 4>(Kb + par * C * kLdK, kLdK, [&](int j, int c, bool& full) {
      full = j < n;
      return full ? p.k + (t0 + j) * p.k_stride + hk * K + 4 * c : p.k;
    });
    copy_tile<kAsync, BV / 4>(Yb + par * C * kLdY, kLdY, [&](int j, int c, bool& full) {
      full = j < n && v0 + 4 * c < V;
      return full ? p.v + (t0 + j) * p.v_stride + h * V + v0 + 4 * c : p.v;
    });
  };
  auto issue_tr = [&](int kc) {
    const int64_t it = static_cast<int64_t>(gc0 + kc) * HV + h;
    const float* Tg = ws.T + it * C * C;
    const float* Rg = ws.R + it * C * C;
    copy_tile<kAsync, C / 4>(Ts, kLdT, [&](int j, int c, bool& full) {
      full = true;
      return Tg + j * C + 4 * c;
    });
    copy_tile<kAsync, C / 4>(Rs, kLdT, [&](int j, int c, bool& full) {
      full = true;
      return Rg + j * C + 4 * c;
    });
  };

  // cp.async groups in commit order: QKV(0), TR(0), then per chunk k: QKV(k+1) at its start,
  // TR(k+1) after its (2) (empty groups past the last chunk keep the count uniform). Waiting
  // until at most one group is pending thus completes QKV(k) at the top of chunk k and TR(k)
  // before its (2).
  if (n_chunks > 0) {
    issue_qkv(0);
    if constexpr (kAsync) cp_async_commit();
    issue_tr(0);
    if constexpr (kAsync) cp_async_commit();
  }
  for (int kc = 0; kc < n_chunks; ++kc) {
    const int64_t t0 = start + static_cast<int64_t>(kc) * C;
    const int n = chunk_tokens(kc);
    const int par = kc & 1;
    const float* tk = toks + par * C * kTokFields;  // qs, ks, beta, G, xs per token row
    const float* Qs = Qb + par * C * kLdQ;
    const float* Ks = Kb + par * C * kLdK;
    float* Zs = Yb + par * C * kLdY;
    if constexpr (kAsync) cp_async_wait1();  // QKV(kc)
    __syncthreads();
    if (kc + 1 < n_chunks) issue_qkv(kc + 1);  // into the buffers chunk kc − 1 has finished with
    if constexpr (kAsync) cp_async_commit();

    // (1) z = β v − xs ⊙ (k·Sᵀ) and o = qs ⊙ (q·Sᵀ): rows [r0, r0 + 16), slice columns
    // [c0, c0 + 16); z overwrites v element by element (each lane reads what it writes).
    float z[2][4], o[2][4];
    zero(z);
    zero(o);
    warp_gemm2_kc<kSplit, 2>(
        z, o, K, [&](int r, int k) { return *reinterpret_cast<const float2*>(&Ks[(r0 + r) * kLdK + k]); },
        [&](int r, int k) { return *reinterpret_cast<const float2*>(&Qs[(r0 + r) * kLdQ + k]); },
        [&](int k, int c) { return *reinterpret_cast<const float2*>(&Ss[(c0 + c) * kLdS + k]); });
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = r0 + g + 8 * half;
      const float xs = tk[i * kTokFields + 4], qs = tk[i * kTokFields], bi = tk[i * kTokFields + 2];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int c = c0 + 8 * nt + 2 * t;
        o[nt][2 * half] *= qs;
        o[nt][2 * half + 1] *= qs;
        const float2 v = *reinterpret_cast<const float2*>(&Zs[i * kLdY + c]);
        *reinterpret_cast<float2*>(&Zs[i * kLdY + c]) =
            make_float2(bi * v.x - xs * z[nt][2 * half], bi * v.y - xs * z[nt][2 * half + 1]);
      }
    }
    if constexpr (kAsync) cp_async_wait1();  // TR(kc) (QKV(kc + 1) may be in flight)
    __syncthreads();                          // z complete, T and R landed

    // (2) u = T·z, o += R·z (both lower triangular: columns j < r0 + 16) → out, ks ⊙ u.
    float u[2][4];
    zero(u);
    warp_gemm2<kSplit, 2>(
        u, o, r0 + 16, [&](int r, int k) { return Ts[(r0 + r) * kLdT + k]; },
        [&](int r, int k) { return Rs[(r0 + r) * kLdT + k]; }, [&](int k, int c) { return Zs[k * kLdY + c0 + c]; });
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = r0 + g + 8 * half;
      const float ks = tk[i * kTokFields + 1];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int c = c0 + 8 * nt + 2 * t;
        *reinterpret_cast<float2*>(&Uk[i * kLdY + c]) = make_float2(ks * u[nt][2 * half], ks * u[nt][2 * half + 1]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = r0 + g + 8 * (e >> 1);
        const int vv = v0 + c0 + 8 * nt + 2 * t + (e & 1);
        if (i < n && vv < V) p.out[(t0 + i) * p.out_stride + h * V + vv] = o[nt][e];
      }
    }
    __syncthreads();  // ks ⊙ u complete; T, R and z read for this chunk

    if (kc + 1 < n_chunks) issue_tr(kc + 1);
    if constexpr (kAsync) cp_async_commit();

    // (3) S ← G·S + (ks ⊙ u)ᵀ·k: slice rows [m0, m0 + 16), keys [kb, kb + KW).
    const float G = tk[3];
#pragma unroll
    for (int nt = 0; nt < NTS; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] *= G;
    }
    const int k_end = (n + 7) & ~7;  // rows >= n of u and k are zeros
    warp_gemm<kSplit, NTS>(
        s, k_end, [&](int r, int k) { return Uk[k * kLdY + m0 + r]; },
        [&](int k, int c) { return Ks[k * kLdK + kb + c]; });
#pragma unroll
    for (int nt = 0; nt < NTS; ++nt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int vl = m0 + g + 8 * half, key = kb + 8 * nt + 2 * t;
        *reinterpret_cast<float2*>(&Ss[vl * kLdS + key]) = make_float2(s[nt][2 * half], s[nt][2 * half + 1]);
      }
    }
    __syncthreads();  // ks ⊙ u, this chunk's k and token factors free; Ss holds the new state
  }
  if constexpr (kAsync) cp_async_wait0();

#pragma unroll
  for (int nt = 0; nt < NTS; ++nt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int vl = m0 + g + 8 * half, key = kb + 8 * nt + 2 * t;
      if (v0 + vl < V)
        *reinterpret_cast<float2*>(S + static_cast<int64_t>(v0 + vl) * K + key) =
            make_float2(s[nt][2 * half], s[nt][2 * half + 1]);
    }
  }
}

}  // namespace gdn_tc
}  // namespace hyserve::kernels::cuda_detail
