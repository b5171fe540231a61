#pragma once
// The intra-chunk kernel of the GDN chunked prefill (gdn_chunked.cuh: the decomposition, the
// workspace and the plan).
#include <cstdint>

#include "gdn_chunked.cuh"

namespace hyserve::kernels::cuda_detail {
namespace gdn_tc {

// kG value heads (1 or 2) sharing one key head per block: q, k, their norms and the raw Gram
// products are computed once for both; masks, decays, β and T per value head.
template <int K, int kG>
struct intra_tiles {
  static constexpr int kLdQ = K + 8;  // Q̂ (A of Q̂·K̂ᵀ, 8-byte fragment loads)
  static constexpr int kLdK = K + 8;  // K̂ (A of K̂·K̂ᵀ, B transposed, 8-byte fragment loads)
  static constexpr int kLdA = kChunk + 4;  // A and P (A fragments; rows 16-byte aligned for the T solve)
  static_assert(kLdA % 4 == 0, "float4 rows");
  static constexpr int kLdT = kChunk + 8;  // T (k-major B fragments)
  // Q̂ and K̂ are dead once the Gram products are in registers: P and T of the block's heads
  // (for R = P·T) reuse their space.
  static constexpr int kQK = kChunk * (kLdQ + kLdK), kPT = kG * kChunk * (kLdA + kLdT);
  static constexpr int kFloats = (kQK > kPT ? kQK : kPT) + kG * kChunk * kLdA + (2 + 3 * kG) * kChunk;
  static constexpr size_t kBytes = sizeof(double) * kG * kChunk + sizeof(float) * kFloats;
};

// Row b of global chunk gc: the last b with chunk_off[b] <= gc.
__device__ __forceinline__ int64_t find_row(const int* chunk_off, int64_t batch, int gc) {
  int lo = 0, hi = static_cast<int>(batch);
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (chunk_off[mid] <= gc) lo = mid;
    else hi = mid;
  }
  return lo;
}

// Block (chunk gc, value heads kG·blockIdx.y + [0, kG)). kVec: q and k rows are 16-byte aligned
// (staged with cp.async), else read element by element.
template <bool kSplit, int K, int kG, bool kVec>
__global__ void __launch_bounds__(kThreads) intra_kernel(const gdn_chunk_scan_params p, const workspace ws,
                                                         float scale) {
  using tl = intra_tiles<K, kG>;
  constexpr int C = kChunk, kLdQ = tl::kLdQ, kLdK = tl::kLdK, kLdA = tl::kLdA;
  static_assert(kG * C <= kThreads, "a thread per (head, token) and per (head, column of T)");
  extern __shared__ double smem_d[];
  double* cum = smem_d;                               // [kG][C] inclusive Σ g (rows >= n: flat)
  float* Qs = reinterpret_cast<float*>(cum + kG * C);  // [C][kLdQ]
  float* Ks = Qs + C * kLdQ;                          // [C][kLdK]
  float* Pm = Qs;                                     // [kG][C][kLdA] P, after the Gram products
  float* Tm = Pm + kG * C * kLdA;                     // [kG][C][tl::kLdT] T
  float* As = Qs + (tl::kQK > tl::kPT ? tl::kQK : tl::kPT);  // [kG][C][kLdA]
  float* qf = As + kG * C * kLdA;                     // [C] scale / |q|
  float* kf = qf + C;                                 // [C] 1 / |k|
  float* beta = kf + C;                               // [kG][C]
  float* gl = beta + kG * C;                          // [kG][C] log decay
  float* ecum = gl + kG * C;                          // [kG][C] e^{c}

  const int gc = static_cast<int>(blockIdx.x);
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * kG;
  if (*ws.overflow != 0 || gc >= ws.chunk_off[p.batch]) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int64_t b = find_row(ws.chunk_off, p.batch, gc);
  const int kc = gc - ws.chunk_off[b];
  const int64_t t0 = p.query_start_loc[b] + static_cast<int64_t>(kc) * C;
  const int n = min(C, p.query_start_loc[b + 1] - static_cast<int>(t0));
  const int64_t HV = p.heads_v;
  const int64_t hk = h0 / (HV / p.heads_k);

  if constexpr (kVec) {
    for (int e = tid; e < C * (K / 4); e += kThreads) {
      const int j = e / (K / 4), c = 4 * (e % (K / 4));
      const bool full = j < n;
      cp_async16(&Qs[j * kLdQ + c], full ? p.q + (t0 + j) * p.q_stride + hk * K + c : p.q, full);
      cp_async16(&Ks[j * kLdK + c], full ? p.k + (t0 + j) * p.k_stride + hk * K + c : p.k, full);
    }
    cp_async_commit();
  } else {
    stage<C, K>(
        [&](int j, int c) {
          return j < n ? make_float2(p.q[(t0 + j) * p.q_stride + hk * K + c], p.k[(t0 + j) * p.k_stride + hk * K + c])
                       : make_float2(0.0f, 0.0f);
        },
        [&](int j, int c, float2 v) {
          Qs[j * kLdQ + c] = v.x;
          Ks[j * kLdK + c] = v.y;
        });
  }
  if (tid < kG * C) {
    const int hh = tid / C, j = tid % C;
    const int64_t h = h0 + hh;
    float gv = 0.0f, bv = 0.0f;
    if (j < n) {
      const float bias = p.dt_bias != nullptr ? p.dt_bias[h] : 0.0f;
      gv = -expf(p.A_log[h]) * softplus(p.a[(t0 + j) * p.a_stride + h] + bias);
      bv = 1.0f / (1.0f + expf(-p.b[(t0 + j) * p.b_stride + h]));
    }
    gl[tid] = gv;
    beta[tid] = bv;
  }
  if constexpr (kVec) cp_async_wait0();
  __syncthreads();

  // Norms: warp w, rows [16w, 16w + 16).
  for (int r = 16 * warp; r < 16 * warp + 16; ++r) {
    float sq = 0.0f, sk = 0.0f;
    for (int c = lane; c < K; c += 32) {
      const float qv = Qs[r * kLdQ + c], kv = Ks[r * kLdK + c];
      sq += qv * qv;
      sk += kv * kv;
    }
    sq = warp_sum(sq);
    sk = warp_sum(sk);
    if (lane == 0) {
      qf[r] = p.qk_l2norm ? scale / sqrtf(sq + kL2Eps) : scale;
      kf[r] = p.qk_l2norm ? 1.0f / sqrtf(sk + kL2Eps) : 1.0f;
    }
  }
  if (warp < kG) {  // warp hh: inclusive scan of head hh's log decay in double, two tokens per lane
    const float* glh = gl + warp * C;
    const double a0 = glh[2 * lane], a1 = glh[2 * lane + 1];
    double run = a0 + a1;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double v = __shfl_up_sync(0xffffffffu, run, o);
      if (lane >= o) run += v;
    }
    cum[warp * C + 2 * lane + 1] = run;
    cum[warp * C + 2 * lane] = run - a1;
  }
  __syncthreads();
  if (tid < kG * C) ecum[tid] = static_cast<float>(exp(cum[tid]));
  __syncthreads();

  if (tid < kG * C) {
    // Token factors: qs = e^{c}·scale/|q|, ks = e^{c_last − c}/|k|, β, G = e^{c_last},
    // xs = β·e^{c}/|k| (rows >= n: zeros but G).
    const int hh = tid / C, j = tid % C;
    const double* ch = cum + hh * C;
    const double c_last = ch[C - 1];
    const bool live = j < n;
    const int64_t it = static_cast<int64_t>(gc) * HV + h0 + hh;
    float4* dst = reinterpret_cast<float4*>(ws.tok + (it * C + j) * kTokFields);
    dst[0] = make_float4(live ? qf[j] * ecum[tid] : 0.0f, live ? static_cast<float>(exp(c_last - ch[j])) * kf[j] : 0.0f,
                         beta[tid], static_cast<float>(exp(c_last)));
    dst[1] = make_float4(live ? beta[tid] * ecum[tid] * kf[j] : 0.0f, 0.0f, 0.0f, 0.0f);
  }

  const int r0 = 16 * warp;
  // A and P rows [r0, r0 + 16) of each head: columns j < r0 + 16 from the tensor cores (shared
  // by the heads), zeros beyond. The products are of the raw q and k rows; the norms scale them
  // in the epilogue (q̂_i·k̂_j = qf_i kf_j (q_i·k_j)), so no pass rescales the staged tiles.
  {
    float kk[C / 8][4], qk[C / 8][4];
    zero(kk);
    zero(qk);
    const int nt_end = 2 * (warp + 1);  // n-tiles past the diagonal block stay zero
    warp_gemm2_kc<kSplit, C / 8>(
        kk, qk, K, [&](int r, int k) { return *reinterpret_cast<const float2*>(&Ks[(r0 + r) * kLdK + k]); },
        [&](int r, int k) { return *reinterpret_cast<const float2*>(&Qs[(r0 + r) * kLdQ + k]); },
        [&](int k, int j) { return *reinterpret_cast<const float2*>(&Ks[j * kLdK + k]); }, nt_end);
    __syncthreads();  // Q̂ and K̂ read by every warp: their space takes P and T
#pragma unroll
    for (int hh = 0; hh < kG; ++hh) {
      const double* ch = cum + hh * C;
      const float* bh = beta + hh * C;
      float* Ah = As + hh * C * kLdA;
      float* Ph = Pm + hh * C * kLdA;
#pragma unroll
      for (int nt = 0; nt < C / 8; ++nt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = r0 + g + 8 * half;
          const int j = 8 * nt + 2 * t;
          float2 av = make_float2(0.0f, 0.0f), pv = make_float2(0.0f, 0.0f);
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int jj = j + e;
            if (jj <= i) {
              const float d = expf(static_cast<float>(ch[i] - ch[jj])) * kf[jj];
              const float pe = qk[nt][2 * half + e] * qf[i] * d;
              const float ae = jj < i ? bh[i] * kf[i] * kk[nt][2 * half + e] * d : 0.0f;
              if (e == 0) {
                pv.x = pe;
                av.x = ae;
              } else {
                pv.y = pe;
                av.y = ae;
              }
            }
          }
          *reinterpret_cast<float2*>(&Ah[i * kLdA + j]) = av;
          *reinterpret_cast<float2*>(&Ph[i * kLdA + j]) = pv;
        }
      }
    }
  }
  __syncthreads();  // A and P complete

  if (tid < kG * C) {
    // T = (I + A)⁻¹ of head tid / C, column m = tid % C: x_i = δ_im − Σ_{j<i} A_ij x_j (four
    // partial sums, so that the dependent chain is a quarter as long), written row by row.
    const int hh = tid / C, m = tid % C;
    const float* Ah = As + hh * C * kLdA;
    float* Th = Tm + hh * C * tl::kLdT;
    float* Tg = ws.T + (static_cast<int64_t>(gc) * HV + h0 + hh) * C * C;
    float x[C];
#pragma unroll
    for (int i = 0; i < C; ++i) {
      float s4[4] = {i == m ? 1.0f : 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < i; j += 4) {  // A's row i in 16-byte loads (rows are 16-byte aligned)
        const float4 a = lds128(&Ah[i * kLdA + j]);
        const float a4[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (j + e < i) s4[e] -= a4[e] * x[j + e];
      }
      x[i] = (s4[0] + s4[1]) + (s4[2] + s4[3]);
      Tg[i * C + m] = x[i];
      Th[i * tl::kLdT + m] = x[i];
    }
  }
  __syncthreads();  // T complete

  // R = P·T (rows [r0, r0 + 16) of each head; both factors lower triangular, so R is too and
  // only columns j < r0 + 16 are products; zeros beyond).
#pragma unroll 1
  for (int hh = 0; hh < kG; ++hh) {
    const float* Ph = Pm + hh * C * kLdA;
    const float* Th = Tm + hh * C * tl::kLdT;
    float* Rg = ws.R + (static_cast<int64_t>(gc) * HV + h0 + hh) * C * C;
    float r[C / 8][4];
    zero(r);
    const int nt_end = 2 * (warp + 1);
    warp_gemm<kSplit, C / 8>(
        r, r0 + 16, [&](int rr, int k) { return Ph[(r0 + rr) * kLdA + k]; },
        [&](int k, int j) { return Th[k * tl::kLdT + j]; }, nt_end);
#pragma unroll
    for (int nt = 0; nt < C / 8; ++nt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = r0 + g + 8 * half, j = 8 * nt + 2 * t;
        *reinterpret_cast<float2*>(&Rg[i * C + j]) =
            nt < nt_end ? make_float2(r[nt][2 * half], r[nt][2 * half + 1]) : make_float2(0.0f, 0.0f);
      }
    }
  }
}

}  // namespace gdn_tc
}  // namespace hyserve::kernels::cuda_detail
