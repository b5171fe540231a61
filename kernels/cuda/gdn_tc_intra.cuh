#pragma once
// The intra-chunk kernel of the GDN chunked prefill (gdn_chunked.cuh: the decomposition, the
// workspace and the plan).
#include <cstdint>
#include <type_traits>

#include "gdn_chunked.cuh"

namespace hyserve::kernels::cuda_detail {
namespace gdn_tc {

// kG value heads (1 or 2) sharing one key head per block: q, k, their norms and the raw Gram
// products are computed once for both; masks, decays, β and T per value head. q and k are staged
// as their element type In (f32, or bf16 for the bf16 path's bf16 io), except that the bf16 path
// (kHalf) stages 16-byte aligned f32 rows (kVec) as q̂ and k̂ in bf16: normalised in registers on
// the way in (the norms of the f32 values), so rounded once, as its tiles are anyway. Rows padded
// by 32 bytes.
template <bool kHalf, bool kVec, class In>
inline constexpr bool kNormInStaging = kHalf && kVec && std::is_same_v<In, float>;

template <int K, int kG, bool kHalf = false, class In = float, bool kVec = false>
struct intra_tiles {
  using St = std::conditional_t<kNormInStaging<kHalf, kVec, In>, __nv_bfloat16, In>;
  static constexpr int kPad = 32 / static_cast<int>(sizeof(St));
  static constexpr int kLdQ = K + kPad;  // Q̂ (A of Q̂·K̂ᵀ, 8-byte fragment loads)
  static constexpr int kLdK = K + kPad;  // K̂ (A of K̂·K̂ᵀ, B transposed, 8-byte fragment loads)
  static constexpr int kLdA = kChunk + 4;  // A and P (A fragments; rows 16-byte aligned for the T solve)
  static_assert(kLdA % 4 == 0, "float4 rows");
  static constexpr int kLdT = kChunk + 8;  // T (k-major B fragments)
  // Q̂ and K̂ are dead once the Gram products are in registers: P and T of the block's heads
  // (for R = P·T) reuse their space; the bf16 path stores P from registers and keeps only T.
  static constexpr int kQK = kChunk * (kLdQ + kLdK) * static_cast<int>(sizeof(St)) / 4;  // floats
  static constexpr int kPT = kG * kChunk * ((kHalf ? 0 : kLdA) + kLdT);
  // As holds A; before it, the bf16 path's q̂ and k̂ bf16 tiles for its Gram products.
  static constexpr int kAs = kG * kChunk * kLdA, kHalfTiles = kHalf ? kChunk * K : 0;  // floats
  static constexpr int kFloats =
      (kQK > kPT ? kQK : kPT) + (kAs > kHalfTiles ? kAs : kHalfTiles) + (2 + 4 * kG) * kChunk;
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

// Writes a [64 × L] f32 shared tile (row stride ld), each row scaled by row_scale(r), as a
// 16-bit swizzled tile (swz16) to dst (and dst2 unless null): 16-byte stores, the block's threads
// striding over units.
// 8 consecutive elements of a shared tile (16-byte aligned) as floats.
__device__ __forceinline__ void load8(const float* src, float (&x)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(src);
  const float4 b = *reinterpret_cast<const float4*>(src + 4);
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}
__device__ __forceinline__ void load8(const __nv_bfloat16* src, float (&x)[8]) {
  const pack16<__nv_bfloat16> u = load_pack(src);
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = __bfloat162float(u.v[i]);
}

// Writes a [64 × L] shared tile (f32 or bf16, row stride ld), each row scaled by row_scale(r),
// as a 16-bit swizzled tile (swz16) to dst (and dst2 unless null): 16-byte stores, the block's
// threads striding over units.
template <int L, class Src, class RowScale>
__device__ __forceinline__ void store_tile16(__nv_bfloat16* dst, const Src* src, int ld, RowScale row_scale,
                                             __nv_bfloat16* dst2 = nullptr) {
  for (int e = threadIdx.x; e < kChunk * (L / 8); e += kThreads) {
    const int r = e / (L / 8), c = 8 * (e % (L / 8));
    const float f = row_scale(r);
    float x[8];
    load8(&src[r * ld + c], x);
    const uint4 u = make_uint4(mma16::pack_bf16x2(x[0] * f, x[1] * f), mma16::pack_bf16x2(x[2] * f, x[3] * f),
                               mma16::pack_bf16x2(x[4] * f, x[5] * f), mma16::pack_bf16x2(x[6] * f, x[7] * f));
    *reinterpret_cast<uint4*>(dst + swz16<L>(r, c)) = u;
    if (dst2 != nullptr) *reinterpret_cast<uint4*>(dst2 + swz16<L>(r, c)) = u;
  }
}

// Block (chunk gc, value heads kG·blockIdx.y + [0, kG)). kVec: q and k rows are 16-byte aligned
// (staged with cp.async), else read element by element. kHalf: the bf16 path's outputs (q̂, k̂,
// T and P as 16-bit tiles, token factors without the norms; no R) instead of T and R in f32.
// q and k (of element type In: f32, or bf16 with kHalf) with p's strides.
template <bool kSplit, int K, int kG, bool kVec, bool kHalf = false, class In = float>
__global__ void __launch_bounds__(kThreads) intra_kernel(const gdn_chunk_scan_params p, const In* __restrict__ qin,
                                                         const In* __restrict__ kin, const workspace ws, float scale) {
  static_assert(kHalf || std::is_same_v<In, float>, "the f32-accurate paths stage f32");
  using tl = intra_tiles<K, kG, kHalf, In, kVec>;
  using St = typename tl::St;
  constexpr bool kPreNorm = kNormInStaging<kHalf, kVec, In>;  // Qs, Ks hold q̂, k̂ (bf16)
  constexpr int C = kChunk, kLdQ = tl::kLdQ, kLdK = tl::kLdK, kLdA = tl::kLdA;
  static_assert(kG * C <= kThreads, "a thread per (head, token) and per (head, column of T)");
  extern __shared__ double smem_d[];
  double* cum = smem_d;                               // [kG][C] inclusive Σ g (rows >= n: flat)
  St* Qs = reinterpret_cast<St*>(cum + kG * C);       // [C][kLdQ]
  St* Ks = Qs + C * kLdQ;                             // [C][kLdK]
  float* Pm = reinterpret_cast<float*>(Qs);           // [kG][C][kLdA] P, after the Gram products (not kHalf)
  float* Tm = Pm + (kHalf ? 0 : kG * C * kLdA);       // [kG][C][tl::kLdT] T
  float* As = Pm + (tl::kQK > tl::kPT ? tl::kQK : tl::kPT);  // [kG][C][kLdA]
  float* qf = As + (tl::kAs > tl::kHalfTiles ? tl::kAs : tl::kHalfTiles);  // [C] scale / |q|
  float* kf = qf + C;                                 // [C] 1 / |k|
  float* beta = kf + C;                               // [kG][C]
  float* gl = beta + kG * C;                          // [kG][C] log decay
  float* ecum = gl + kG * C;                          // [kG][C] e^{c}
  float* cum2 = ecum + kG * C;                        // [kG][C] c·log2(e) in f32 (kHalf)

  const int gc = static_cast<int>(blockIdx.x);
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * kG;
  pdl_begin();  // launched with PDL: the plan's chunk offsets
  if (*ws.overflow != 0 || gc >= ws.chunk_off[p.batch]) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int64_t b = find_row(ws.chunk_off, p.batch, gc);
  const int kc = gc - ws.chunk_off[b];
  const int64_t t0 = p.query_start_loc[b] + static_cast<int64_t>(kc) * C;
  const int n = min(C, p.query_start_loc[b + 1] - static_cast<int>(t0));
  const int64_t HV = p.heads_v;
  const int64_t hk = h0 / (HV / p.heads_k);

  if constexpr (kPreNorm) {
    // f32 rows staged as q̂ and k̂ in bf16: thread tid takes 8 columns c (two 16-byte loads, one
    // 16-byte store) of rows tid / kU + kR·r, kB rows' loads in flight; the kU threads of a row
    // (consecutive lanes) sum its squares by xor shuffles.
    constexpr int kU = K / 8, kR = kThreads / kU, kPasses = C / kR, kB = kPasses < 4 ? kPasses : 4;
    static_assert(kThreads % kU == 0 && C % kR == 0 && kPasses % kB == 0, "whole passes");
    const int j0 = tid / kU, c = 8 * (tid % kU);
#pragma unroll
    for (int r0 = 0; r0 < kPasses; r0 += kB) {
      float4 qv[kB][2], kv[kB][2];
#pragma unroll
      for (int r = 0; r < kB; ++r) {
        const int j = j0 + kR * (r0 + r);
        const bool full = j < n;
        const float4* qs = reinterpret_cast<const float4*>(qin + (t0 + j) * p.q_stride + hk * K + c);
        const float4* ks = reinterpret_cast<const float4*>(kin + (t0 + j) * p.k_stride + hk * K + c);
        const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        qv[r][0] = full ? qs[0] : zero4;
        qv[r][1] = full ? qs[1] : zero4;
        kv[r][0] = full ? ks[0] : zero4;
        kv[r][1] = full ? ks[1] : zero4;
      }
#pragma unroll
      for (int r = 0; r < kB; ++r) {
        const int j = j0 + kR * (r0 + r);
        float sq = 0.0f, sk = 0.0f;
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const float4 a = qv[r][u], b = kv[r][u];
          sq = fmaf(a.x, a.x, fmaf(a.y, a.y, fmaf(a.z, a.z, fmaf(a.w, a.w, sq))));
          sk = fmaf(b.x, b.x, fmaf(b.y, b.y, fmaf(b.z, b.z, fmaf(b.w, b.w, sk))));
        }
#pragma unroll
        for (int o = kU / 2; o > 0; o >>= 1) {
          sq += __shfl_xor_sync(0xffffffffu, sq, o);
          sk += __shfl_xor_sync(0xffffffffu, sk, o);
        }
        const float fq = p.qk_l2norm ? scale / sqrtf(sq + kL2Eps) : scale;
        const float fk = p.qk_l2norm ? 1.0f / sqrtf(sk + kL2Eps) : 1.0f;
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          qv[r][u] = make_float4(qv[r][u].x * fq, qv[r][u].y * fq, qv[r][u].z * fq, qv[r][u].w * fq);
          kv[r][u] = make_float4(kv[r][u].x * fk, kv[r][u].y * fk, kv[r][u].z * fk, kv[r][u].w * fk);
        }
        *reinterpret_cast<uint4*>(&Qs[j * kLdQ + c]) =
            make_uint4(mma16::pack_bf16x2(qv[r][0].x, qv[r][0].y), mma16::pack_bf16x2(qv[r][0].z, qv[r][0].w),
                       mma16::pack_bf16x2(qv[r][1].x, qv[r][1].y), mma16::pack_bf16x2(qv[r][1].z, qv[r][1].w));
        *reinterpret_cast<uint4*>(&Ks[j * kLdK + c]) =
            make_uint4(mma16::pack_bf16x2(kv[r][0].x, kv[r][0].y), mma16::pack_bf16x2(kv[r][0].z, kv[r][0].w),
                       mma16::pack_bf16x2(kv[r][1].x, kv[r][1].y), mma16::pack_bf16x2(kv[r][1].z, kv[r][1].w));
      }
    }
  } else if constexpr (kVec) {
    // Thread tid copies 16-byte unit tid % kU of rows tid / kU + kR·r.
    constexpr int kE = 16 / static_cast<int>(sizeof(In)), kU = K / kE, kR = kThreads / kU;
    static_assert(kThreads % kU == 0 && C % kR == 0, "whole passes");
    const int j0 = tid / kU, c = kE * (tid % kU);
    const In* qsrc = qin + (t0 + j0) * p.q_stride + hk * K + c;
    const In* ksrc = kin + (t0 + j0) * p.k_stride + hk * K + c;
    const int64_t qstep = kR * p.q_stride, kstep = kR * p.k_stride;
#pragma unroll
    for (int r = 0; r < C / kR; ++r) {
      const int j = j0 + kR * r;
      const bool full = j < n;
      cp_async16(&Qs[j * kLdQ + c], full ? qsrc : qin, full);
      cp_async16(&Ks[j * kLdK + c], full ? ksrc : kin, full);
      qsrc += qstep;
      ksrc += kstep;
    }
    cp_async_commit();
  } else {
    stage<C, K>(
        [&](int j, int c) {
          return j < n ? make_float2(to_float(qin[(t0 + j) * p.q_stride + hk * K + c]),
                                     to_float(kin[(t0 + j) * p.k_stride + hk * K + c]))
                       : make_float2(0.0f, 0.0f);
        },
        [&](int j, int c, float2 v) {
          Qs[j * kLdQ + c] = from_float<St>(v.x);  // (exact unless f32 is staged as bf16)
          Ks[j * kLdK + c] = from_float<St>(v.y);
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
  if constexpr (kVec && !kPreNorm) cp_async_wait0();
  __syncthreads();

  // Norms: two threads per row r = tid / 2, each summing alternate 16-byte units of q and k
  // (conflict-free: rows are padded by 32 bytes, so four consecutive rows' units fall in distinct
  // bank groups).
  static_assert(2 * C == kThreads && kLdK == kLdQ, "two threads per row");
  if constexpr (!kPreNorm) {
    const int r = tid >> 1, hv = tid & 1;
    float sq = 0.0f, sk = 0.0f;
    if constexpr (std::is_same_v<St, float>) {
#pragma unroll
      for (int i = 0; i < K / 8; ++i) {
        const float4 a = lds128(&Qs[r * kLdQ + 4 * (2 * i + hv)]);
        const float4 c = lds128(&Ks[r * kLdK + 4 * (2 * i + hv)]);
        sq = fmaf(a.x, a.x, fmaf(a.y, a.y, fmaf(a.z, a.z, fmaf(a.w, a.w, sq))));
        sk = fmaf(c.x, c.x, fmaf(c.y, c.y, fmaf(c.z, c.z, fmaf(c.w, c.w, sk))));
      }
    } else {
#pragma unroll
      for (int i = 0; i < K / 16; ++i) {
        float a[8], c[8];
        load8(&Qs[r * kLdQ + 8 * (2 * i + hv)], a);
        load8(&Ks[r * kLdK + 8 * (2 * i + hv)], c);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          sq = fmaf(a[e], a[e], sq);
          sk = fmaf(c[e], c[e], sk);
        }
      }
    }
    sq += __shfl_xor_sync(0xffffffffu, sq, 1);
    sk += __shfl_xor_sync(0xffffffffu, sk, 1);
    if (hv == 0) {
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
  if (tid < kG * C) {
    ecum[tid] = static_cast<float>(exp(cum[tid]));
    cum2[tid] = static_cast<float>(cum[tid] * 1.4426950408889634);
  }
  __syncthreads();
  if constexpr (kHalf) {
    // q̂ = scale·q/|q| and k̂ = k/|k| as 16-bit tiles, once per key head (by its first value head's
    // block); rows >= n are zeros (staged so).
    // The same tiles in shared memory (before A's space) for the Gram products on bf16.
    __nv_bfloat16* H = reinterpret_cast<__nv_bfloat16*>(As);
    const bool lead = h0 % (HV / p.heads_k) == 0;
    __nv_bfloat16* dst = ws.qk16 + (static_cast<int64_t>(gc) * p.heads_k + hk) * 2 * C * K;
    store_tile16<K>(H, Qs, kLdQ, [&](int r) { return kPreNorm ? 1.0f : qf[r]; }, lead ? dst : nullptr);
    store_tile16<K>(H + C * K, Ks, kLdK, [&](int r) { return kPreNorm ? 1.0f : kf[r]; }, lead ? dst + C * K : nullptr);
    __syncthreads();
  }

  if (tid < kG * C) {
    // Token factors: qs = e^{c}·scale/|q|, ks = e^{c_last − c}/|k|, β, G = e^{c_last},
    // xs = β·e^{c}/|k| (rows >= n: zeros but G).
    const int hh = tid / C, j = tid % C;
    const double* ch = cum + hh * C;
    const double c_last = ch[C - 1];
    const bool live = j < n;
    const int64_t it = static_cast<int64_t>(gc) * HV + h0 + hh;
    if constexpr (kHalf) {
      // q̂ and k̂ are stored normalised, so the factors leave out scale/|q| and 1/|k|; stored
      // field-major ([field][C]) for the bf16 state kernel's paired loads.
      float* dst = ws.tok + it * C * kTokFields + j;
      dst[0 * C] = live ? ecum[tid] : 0.0f;
      dst[1 * C] = live ? static_cast<float>(exp(c_last - ch[j])) : 0.0f;
      dst[2 * C] = beta[tid];
      dst[3 * C] = static_cast<float>(exp(c_last));
      dst[4 * C] = live ? beta[tid] * ecum[tid] : 0.0f;
    } else {
      float4* dst = reinterpret_cast<float4*>(ws.tok + (it * C + j) * kTokFields);
      dst[0] = make_float4(live ? qf[j] * ecum[tid] : 0.0f,
                           live ? static_cast<float>(exp(c_last - ch[j])) * kf[j] : 0.0f, beta[tid],
                           static_cast<float>(exp(c_last)));
      dst[1] = make_float4(live ? beta[tid] * ecum[tid] * kf[j] : 0.0f, 0.0f, 0.0f, 0.0f);
    }
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
    if constexpr (kHalf) {
      // k̂·k̂ᵀ and q̂·k̂ᵀ on bf16 from the swizzled tiles (mma_bf16.cuh for the ldmatrix rows).
      const uint32_t hq = mma16::smem_u32(As), hkk = hq + 2 * C * K;
      const int l7 = lane & 7;
      constexpr int kMask = (K / 8 < 8 ? K / 8 : 8) - 1;
#pragma unroll
      for (int ks = 0; ks < K / 16; ++ks) {
        const int ra = r0 + (lane & 15), ua = 2 * ks + (lane >> 4);
        const uint32_t offa = 2 * (ra * K + ((ua ^ (ra & kMask)) << 3));
        uint32_t ak[4], aq[4];
        mma16::ldsm_x4(ak, hkk + offa);
        mma16::ldsm_x4(aq, hq + offa);
#pragma unroll
        for (int np = 0; np < C / 16; ++np) {
          if (np > warp) continue;
          const int rb = 16 * np + l7 + 8 * (lane >> 4), ub = 2 * ks + ((lane >> 3) & 1);
          uint32_t bk[4];
          mma16::ldsm_x4(bk, hkk + 2 * (rb * K + ((ub ^ (rb & kMask)) << 3)));
          mma16::mma_bf16(kk[2 * np], ak, bk[0], bk[1]);
          mma16::mma_bf16(kk[2 * np + 1], ak, bk[2], bk[3]);
          mma16::mma_bf16(qk[2 * np], aq, bk[0], bk[1]);
          mma16::mma_bf16(qk[2 * np + 1], aq, bk[2], bk[3]);
        }
      }
    } else {
      warp_gemm2_kc<kSplit, C / 8>(
          kk, qk, K, [&](int r, int k) { return *reinterpret_cast<const float2*>(&Ks[(r0 + r) * kLdK + k]); },
          [&](int r, int k) { return *reinterpret_cast<const float2*>(&Qs[(r0 + r) * kLdQ + k]); },
          [&](int k, int j) { return *reinterpret_cast<const float2*>(&Ks[j * kLdK + k]); }, nt_end);
    }
    __syncthreads();  // Q̂ and K̂ read by every warp: their space takes P and T
#pragma unroll
    for (int hh = 0; hh < kG; ++hh) {
      const double* ch = cum + hh * C;
      const float* bh = beta + hh * C;
      float* Ah = As + hh * C * kLdA;
      float* Ph = Pm + hh * C * kLdA;
      // The bf16 path writes P as its 16-bit tile straight from the registers (pairs of columns:
      // 4-byte stores into the swizzled rows).
      __nv_bfloat16* P16 = ws.tp16 + ((static_cast<int64_t>(gc) * HV + h0 + hh) * 2 + 1) * C * C;
      // Row factors of the lane's two rows (the bf16 path's products are of q̂ and k̂ already).
      float rq[2], ra[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = r0 + g + 8 * half;
        rq[half] = kHalf ? 1.0f : qf[i];
        ra[half] = kHalf ? bh[i] : bh[i] * kf[i];
      }
#pragma unroll
      for (int nt = 0; nt < C / 8; ++nt) {
        const int j = 8 * nt + 2 * t;
        if (nt >= nt_end) {  // right of the diagonal block (warp-uniform): zeros
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int i = r0 + g + 8 * half;
            *reinterpret_cast<float2*>(&Ah[i * kLdA + j]) = make_float2(0.0f, 0.0f);
            if constexpr (kHalf) *reinterpret_cast<uint32_t*>(P16 + swz16<C>(i, j)) = 0u;
            else *reinterpret_cast<float2*>(&Ph[i * kLdA + j]) = make_float2(0.0f, 0.0f);
          }
          continue;
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = r0 + g + 8 * half;
          float pe[2], ae[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int jj = j + e;
            // The decay e^{c_i − c_j} (j <= i; the difference is clamped for the masked j > i):
            // in double for the fp32-level paths; the bf16 path takes the f32 difference of
            // c·log2(e) (about 1e-7·|c| relative, far inside bf16's 4e-3).
            float d;
            if constexpr (kHalf) d = exp2f(fminf(cum2[hh * C + i] - cum2[hh * C + jj], 0.0f));
            else d = expf(static_cast<float>(fmin(ch[i] - ch[jj], 0.0))) * kf[jj];
            pe[e] = jj <= i ? qk[nt][2 * half + e] * rq[half] * d : 0.0f;
            ae[e] = jj < i ? kk[nt][2 * half + e] * ra[half] * d : 0.0f;
          }
          *reinterpret_cast<float2*>(&Ah[i * kLdA + j]) = make_float2(ae[0], ae[1]);
          if constexpr (kHalf) *reinterpret_cast<uint32_t*>(P16 + swz16<C>(i, j)) = mma16::pack_bf16x2(pe[0], pe[1]);
          else *reinterpret_cast<float2*>(&Ph[i * kLdA + j]) = make_float2(pe[0], pe[1]);
        }
      }
    }
  }
  __syncthreads();  // A and P complete

  // T = (I + A)⁻¹ by 16 × 16 blocks (A strictly, T unit lower triangular). The diagonal blocks
  // T_dd = (I + A_dd)⁻¹ by forward substitution, a thread per (head, block, column); then block
  // rows i = 1..3 in turn, one warp per (head, block column j < i):
  //   M_ij = Σ_{k=j}^{i-1} A_ik·T_kj,   T_ij = −T_ii·M_ij
  // on the tensor cores, M_ij staged where T_ij goes: 3xTF32 (fp32-level products), or plain
  // TF32 for the bf16 path (whose T is then rounded to bf16).
  if (tid < kG * C) {
    const int hh = tid / C, d = (tid % C) / 16, m = tid % 16;
    const float* Ad = As + hh * C * kLdA + 16 * d * kLdA + 16 * d;
    float* Td = Tm + hh * C * tl::kLdT + 16 * d * tl::kLdT;
    float x[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      float s2[2] = {i == m ? 1.0f : 0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < i; ++j) s2[j & 1] -= Ad[i * kLdA + j] * x[j];
      x[i] = s2[0] + s2[1];
      Td[i * tl::kLdT + 16 * d + m] = x[i];
#pragma unroll 1
      for (int e = d + 1; e < 4; ++e) Td[i * tl::kLdT + 16 * e + m] = 0.0f;  // right of the diagonal
    }
  }
  __syncthreads();  // diagonal blocks
#pragma unroll 1
  for (int i = 1; i < 4; ++i) {
#pragma unroll 1
    for (int item = warp; item < kG * i; item += kWarps) {
      const int hh = item / i, j = item % i;
      const float* Ah = As + hh * C * kLdA;
      float* Th = Tm + hh * C * tl::kLdT;
      float acc[2][4];
      zero(acc);
      warp_gemm<!kHalf, 2>(
          acc, 16 * (i - j), [&](int r, int k) { return Ah[(16 * i + r) * kLdA + 16 * j + k]; },
          [&](int k, int n) { return Th[(16 * j + k) * tl::kLdT + 16 * j + n]; });
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          Th[(16 * i + g + 8 * (e >> 1)) * tl::kLdT + 16 * j + 8 * nt + 2 * t + (e & 1)] = acc[nt][e];
      }
      __syncwarp();
      zero(acc);
      warp_gemm<!kHalf, 2>(
          acc, 16, [&](int r, int k) { return Th[(16 * i + r) * tl::kLdT + 16 * i + k]; },
          [&](int k, int n) { return Th[(16 * i + k) * tl::kLdT + 16 * j + n]; });
      __syncwarp();
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          Th[(16 * i + g + 8 * (e >> 1)) * tl::kLdT + 16 * j + 8 * nt + 2 * t + (e & 1)] = -acc[nt][e];
      }
    }
    __syncthreads();  // block row i
  }
  if constexpr (!kHalf) {
    for (int e = tid; e < kG * C * (C / 4); e += kThreads) {
      const int hh = e / (C * (C / 4)), i = (e / (C / 4)) % C, c = 4 * (e % (C / 4));
      *reinterpret_cast<float4*>(ws.T + ((static_cast<int64_t>(gc) * HV + h0 + hh) * C + i) * C + c) =
          *reinterpret_cast<const float4*>(&Tm[(hh * C + i) * tl::kLdT + c]);
    }
  }
  __syncthreads();  // T complete
  if constexpr (kHalf) {
    static_assert(tl::kLdT % 4 == 0, "float4 rows");
#pragma unroll 1
    for (int hh = 0; hh < kG; ++hh)
      store_tile16<C>(ws.tp16 + (static_cast<int64_t>(gc) * HV + h0 + hh) * 2 * C * C, Tm + hh * C * tl::kLdT,
                      tl::kLdT, [](int) { return 1.0f; });
  } else {  // (the bf16 path applies P to u itself: no R = P·T)
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
}

}  // namespace gdn_tc
}  // namespace hyserve::kernels::cuda_detail
