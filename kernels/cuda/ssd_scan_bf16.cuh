#pragma once
// SSD chunk scan for bf16 io on the tensor cores: mma.sync m16n8k16 bf16 with f32 accumulation,
// operands staged per chunk in shared memory as bf16 and fed by ldmatrix. (The f32-io path,
// ssd_scan_chunked.cuh, keeps fp32 accuracy with 3xTF32.)
//
// Per chunk of Q = 64 tokens, with cum_i = Σ_{s<=i} dt_s·A inside the chunk (double) and S_in
// the state entering it:
//   W     = (C·Bᵀ) ∘ exp(cum_i − cum_j)·dt_j, j <= i     C·Bᵀ on the tensor cores; W stays in
//                                                     registers as the A operand of W·X
//   y     = W·X + exp(cum_i) · C·S_inᵀ + D·x
//   S_loc = (coef ∘ X)ᵀ·B,  coef_j = exp(cum_L − cum_j)·dt_j
//   S_out = exp(cum_L)·S_in + S_loc
// Block = (row b, head h, slice of PS state rows); it walks the row's chunks in order and keeps
// its slice of the state in registers (f32) from the first chunk to the last, so the inter-chunk
// state pass needs no memory round trip and no workspace; the initial state is read once and the
// final state written once (rounded to the state type). Warp w owns token rows [16w, 16w+16) of
// C·Bᵀ, W and y, and state columns [w·N/4, (w+1)·N/4) of the slice. The next chunk's B, C, x
// and dt are loaded into registers while the current one is computed. The operands of the state
// products (coef·x, S_in) are rounded to bf16; accumulation and the carried state are f32.
#include <cuda_bf16.h>

#include <cstdint>

#include "mma_bf16.cuh"
#include "ssd_scan_chunked.cuh"  // kChunk
#include "ssm_common.cuh"

namespace hyserve::kernels::cuda_detail {
namespace ssd_bf16 {

using ssd_chunked::kChunk;
using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;

using mma16::ldsm_x4;
using mma16::ldsm_x4_t;
using mma16::mma_bf16;
using mma16::pack_bf16x2;
using mma16::smem_u32;
using mma16::unpack_bf16x2;

// ldmatrix lane addresses and fragment layouts: mma_bf16.cuh.

// 8 consecutive io elements (16 bytes when vec) as raw bf16 bits.
__device__ __forceinline__ uint4 load8(const bf16* src, bool vec) {
  if (vec) return __ldg(reinterpret_cast<const uint4*>(src));
  uint16_t h[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) h[e] = __bfloat16_as_ushort(src[e]);
  return make_uint4(h[0] | (uint32_t{h[1]} << 16), h[2] | (uint32_t{h[3]} << 16), h[4] | (uint32_t{h[5]} << 16),
                    h[6] | (uint32_t{h[7]} << 16));
}

// 8 consecutive f32 io elements (two 16-byte loads when vec) rounded to bf16 (the operands of a
// bf16 model's scan: ssd_chunk_scan_params::bf16_operands).
__device__ __forceinline__ uint4 load8(const float* src, bool vec) {
  float f[8];
  if (vec) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(src)), b = __ldg(reinterpret_cast<const float4*>(src) + 1);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = src[e];
  }
  return make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]), pack_bf16x2(f[6], f[7]));
}

// y0, y1 to two consecutive io elements (one 4- or 8-byte store when vec).
__device__ __forceinline__ void store2(bf16* dst, float y0, float y1, bool vec) {
  if (vec) {
    *reinterpret_cast<uint32_t*>(dst) = pack_bf16x2(y0, y1);
  } else {
    dst[0] = __float2bfloat16_rn(y0);
    dst[1] = __float2bfloat16_rn(y1);
  }
}
__device__ __forceinline__ void store2(float* dst, float y0, float y1, bool vec) {
  if (vec) {
    *reinterpret_cast<float2*>(dst) = make_float2(y0, y1);
  } else {
    dst[0] = y0;
    dst[1] = y1;
  }
}

// Block = (row b, head h, slice of PS state rows); it walks the row's chunks in order and keeps
// its slice of the state in registers (f32) from the first chunk to the last: no chain through
// memory and no workspace. Warp w owns token rows [16w, 16w+16) of C·Bᵀ, W and y, and state
// columns [w·N/4, (w+1)·N/4) of the slice. The next chunk's B, C, x and dt are loaded into
// registers while the current one is computed; with a wide state (N > 128, kPrefetchBC false:
// 32 registers a thread each for B and C would not fit beside the state) B and C are loaded
// at the start of their chunk instead, straight into shared memory.

template <int P, int N, int PS>
struct seq_tiles {
  static_assert(kChunk == 16 * kWarps && kChunk == 64, "warp w owns token rows [16w, 16w+16)");
  static_assert(PS % 16 == 0 && P % PS == 0, "state slices of whole m16 tiles");
  static_assert(N % (16 * kWarps) == 0, "each warp owns whole pairs of n-tiles of the state");
  static constexpr int Q = kChunk;
  static constexpr int kLdN = N + 8;   // Cs, Bs, Ss rows
  static constexpr int kLdP = PS + 8;  // Xs, Xc rows
  static constexpr size_t kBf16 = static_cast<size_t>(2 * Q * kLdN + PS * kLdN + 2 * Q * kLdP);
  static constexpr size_t kBytes = sizeof(double) * Q + sizeof(bf16) * kBf16 + sizeof(float) * 3 * Q;
  static constexpr int kMinBlocks = 2;
  static constexpr bool kPrefetchBC = N <= 128;
};

// TI: the io type, bf16, or f32 rounded to bf16 as loaded (bf16_operands) with y stored in f32.
template <class TI, class TS, int P, int N, int PS>
__global__ void __launch_bounds__(kThreads, (seq_tiles<P, N, PS>::kMinBlocks))
    ssd_bf16_seq_kernel(const ssd_chunk_scan_params p, bool vec) {
  using tl = seq_tiles<P, N, PS>;
  constexpr int Q = tl::Q, kLdN = tl::kLdN, kLdP = tl::kLdP;
  constexpr int kSplit = P / PS;
  constexpr int MT = PS / 16;         // state m-tiles (16 rows) of the slice
  constexpr int NW = N / kWarps;      // state columns per warp
  constexpr int NT = NW / 8;          // state n-tiles per warp
  constexpr int kBC = Q * N / 8 / kThreads, kX = Q * PS / 8 / kThreads;
  static_assert(kBC * kThreads * 8 == Q * N && kX * kThreads * 8 == Q * PS, "whole load batches");
  extern __shared__ double smem_d[];
  double* cum = smem_d;                                  // [Q]
  bf16* Cs = reinterpret_cast<bf16*>(cum + Q);           // [Q][kLdN]
  bf16* Bs = Cs + Q * kLdN;                              // [Q][kLdN]
  bf16* Ss = Bs + Q * kLdN;                              // [PS][kLdN] S_in of the slice
  bf16* Xs = Ss + PS * kLdN;                             // [Q][kLdP] x of the slice
  bf16* Xc = Xs + Q * kLdP;                              // [Q][kLdP] coef_j · x_j
  float* dtv = reinterpret_cast<float*>(Xc + Q * kLdP);  // [Q]
  float* coef = dtv + Q;                                 // [Q]
  float* ecum = coef + Q;                                // [Q]

  const int64_t h = blockIdx.x / kSplit;
  const int p0 = static_cast<int>(blockIdx.x % kSplit) * PS;
  const int64_t b = blockIdx.y;
  const int64_t slot = p.state_indices[b];
  if (slot < 0) return;  // padding row: output rows and state untouched
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int r0 = 16 * warp;
  const int64_t H = p.heads;
  const int64_t start = p.query_start_loc[b];
  const int64_t len = p.query_start_loc[b + 1] - start;
  const bool init = p.has_initial_state != nullptr && p.has_initial_state[b] != 0;
  const int64_t grp = h / (p.heads / p.n_groups);
  const double A = -exp(static_cast<double>(p.A_log[h]));
  const float d_skip = p.D != nullptr ? p.D[h] : 0.0f;
  const TI* xg = static_cast<const TI*>(p.x);
  const TI* dtg = static_cast<const TI*>(p.dt);
  const TI* Bg = static_cast<const TI*>(p.B);
  const TI* Cg = static_cast<const TI*>(p.C);
  TI* yg = static_cast<TI*>(p.y);
  TS* state = static_cast<TS*>(p.ssm_states) + (slot * H + h) * static_cast<int64_t>(P) * N;

  // This warp's state tile: rows p0 + 16·mt + g (+8), columns warp·NW + 8·nt + 2t (+1).
  float s[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int pr = p0 + 16 * mt + g + 8 * half, nc = warp * NW + 8 * nt + 2 * t;
        const float2 v = init ? load_state2(state + static_cast<int64_t>(pr) * N + nc) : make_float2(0.0f, 0.0f);
        s[mt][nt][2 * half] = v.x;
        s[mt][nt][2 * half + 1] = v.y;
      }
    }
  }

  constexpr bool kPrefetchBC = tl::kPrefetchBC;
  uint4 bv[kPrefetchBC ? kBC : 1], cv[kPrefetchBC ? kBC : 1], xv[kX];
  float dtr = 0.0f;
  auto prefetch = [&](int64_t c0) {
    const int64_t rest = len - c0;
    const int L = rest >= Q ? Q : static_cast<int>(rest);
    const int64_t t0 = start + c0;
    if constexpr (kPrefetchBC) {
#pragma unroll
      for (int u = 0; u < kBC; ++u) {
        const int e = u * kThreads + tid, j = e / (N / 8), c = e % (N / 8);
        bv[u] = cv[u] = make_uint4(0, 0, 0, 0);
        if (j < L) {
          const int64_t off = (t0 + j) * p.bc_stride + grp * N + 8 * c;
          bv[u] = load8(Bg + off, vec);
          cv[u] = load8(Cg + off, vec);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kX; ++u) {
      const int e = u * kThreads + tid, j = e / (PS / 8), c = e % (PS / 8);
      xv[u] = make_uint4(0, 0, 0, 0);
      if (j < L) xv[u] = load8(xg + (t0 + j) * p.x_stride + h * P + p0 + 8 * c, vec);
    }
    dtr = tid < L ? to_float(dtg[(t0 + tid) * p.dt_stride + h]) : 0.0f;
  };

  if (len > 0) prefetch(0);
  for (int64_t c0 = 0; c0 < len; c0 += Q) {
    const int64_t rest = len - c0;
    const int L = rest >= Q ? Q : static_cast<int>(rest);
    const int64_t t0 = start + c0;
    const bool carry = init || c0 > 0;

    // The previous chunk ended with a barrier: the tiles are free.
#pragma unroll
    for (int u = 0; u < kBC; ++u) {
      const int e = u * kThreads + tid, j = e / (N / 8), c = e % (N / 8);
      if constexpr (kPrefetchBC) {
        *reinterpret_cast<uint4*>(Bs + j * kLdN + 8 * c) = bv[u];
        *reinterpret_cast<uint4*>(Cs + j * kLdN + 8 * c) = cv[u];
      } else {
        uint4 bw = make_uint4(0, 0, 0, 0), cw = make_uint4(0, 0, 0, 0);
        if (j < L) {
          const int64_t off = (t0 + j) * p.bc_stride + grp * N + 8 * c;
          bw = load8(Bg + off, vec);
          cw = load8(Cg + off, vec);
        }
        *reinterpret_cast<uint4*>(Bs + j * kLdN + 8 * c) = bw;
        *reinterpret_cast<uint4*>(Cs + j * kLdN + 8 * c) = cw;
      }
    }
#pragma unroll
    for (int u = 0; u < kX; ++u) {
      const int e = u * kThreads + tid, j = e / (PS / 8), c = e % (PS / 8);
      *reinterpret_cast<uint4*>(Xs + j * kLdP + 8 * c) = xv[u];
    }
    if (tid < Q) dtv[tid] = tid < L ? step_size(p, dtr, h) : 0.0f;
    if (c0 + Q < len) prefetch(c0 + Q);  // in flight while this chunk is computed
    __syncthreads();
    const double cum_end = ssd_chunked::chunk_decay(dtv, A, tid, lane, warp, cum, ecum, coef);
#pragma unroll
    for (int u = 0; u < kX; ++u) {
      const int e = u * kThreads + tid, j = e / (PS / 8), c = e % (PS / 8);
      float f[8];
      pack_traits<bf16>::unpack(*reinterpret_cast<const uint4*>(Xs + j * kLdP + 8 * c), f);
      const float cj = coef[j];
#pragma unroll
      for (int k = 0; k < 8; ++k) f[k] *= cj;
      *reinterpret_cast<uint4*>(Xc + j * kLdP + 8 * c) = pack_traits<bf16>::pack(f);
    }
    __syncthreads();

    // C·Bᵀ rows [r0, r0+16), then W as A fragments.
    uint32_t wa[Q / 16][4];
    {
      float cb[Q / 8][4];
#pragma unroll
      for (int n = 0; n < Q / 8; ++n) cb[n][0] = cb[n][1] = cb[n][2] = cb[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < N / 16; ++kk) {
        uint32_t a[4];
        ldsm_x4(a, Cs + (r0 + (lane & 15)) * kLdN + kk * 16 + 8 * (lane >> 4));
#pragma unroll
        for (int np = 0; np < Q / 16; ++np) {
          if (np <= warp) {
            uint32_t bq[4];
            ldsm_x4(bq, Bs + (np * 16 + (lane & 7) + 8 * (lane >> 4)) * kLdN + kk * 16 + 8 * ((lane >> 3) & 1));
            mma_bf16(cb[2 * np], a, bq[0], bq[1]);
            mma_bf16(cb[2 * np + 1], a, bq[2], bq[3]);
          }
        }
      }
      const int i_lo = r0 + g, i_hi = r0 + g + 8;
      const double ci_lo = cum[i_lo], ci_hi = cum[i_hi];
#pragma unroll
      for (int kk = 0; kk < Q / 16; ++kk) {
        wa[kk][0] = wa[kk][1] = wa[kk][2] = wa[kk][3] = 0u;
        if (kk <= warp) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int n = 2 * kk + half;
            const int j0 = 8 * n + 2 * t, j1 = j0 + 1;
            const double cj0 = cum[j0], cj1 = cum[j1];
            const float d0 = dtv[j0], d1 = dtv[j1];
            const float w00 = j0 <= i_lo ? cb[n][0] * expf(static_cast<float>(ci_lo - cj0)) * d0 : 0.0f;
            const float w01 = j1 <= i_lo ? cb[n][1] * expf(static_cast<float>(ci_lo - cj1)) * d1 : 0.0f;
            const float w10 = j0 <= i_hi ? cb[n][2] * expf(static_cast<float>(ci_hi - cj0)) * d0 : 0.0f;
            const float w11 = j1 <= i_hi ? cb[n][3] * expf(static_cast<float>(ci_hi - cj1)) * d1 : 0.0f;
            wa[kk][2 * half] = pack_bf16x2(w00, w01);
            wa[kk][2 * half + 1] = pack_bf16x2(w10, w11);
          }
        }
      }
    }

    // y rows [r0, r0+16), slice columns = W · X.
    float acc[PS / 8][4];
#pragma unroll
    for (int n = 0; n < PS / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < Q / 16; ++kk) {
      if (kk <= warp) {
#pragma unroll
        for (int np = 0; np < PS / 16; ++np) {
          uint32_t bq[4];
          ldsm_x4_t(bq, Xs + (kk * 16 + (lane & 15)) * kLdP + np * 16 + 8 * (lane >> 4));
          mma_bf16(acc[2 * np], wa[kk], bq[0], bq[1]);
          mma_bf16(acc[2 * np + 1], wa[kk], bq[2], bq[3]);
        }
      }
    }

    // S_loc of this warp's tile: A(p, j) = Xc[j][p], B(j, n) = Bs[j][n].
    {
      float sl[MT][NT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) sl[mt][nt][0] = sl[mt][nt][1] = sl[mt][nt][2] = sl[mt][nt][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < Q / 16; ++kk) {
        if (kk * 16 < L) {
          uint32_t a[MT][4];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
            ldsm_x4_t(a[mt], Xc + (kk * 16 + (lane & 7) + 8 * (lane >> 4)) * kLdP + 16 * mt + 8 * ((lane >> 3) & 1));
#pragma unroll
          for (int ntp = 0; ntp < NT / 2; ++ntp) {
            uint32_t bq[4];
            ldsm_x4_t(bq, Bs + (kk * 16 + (lane & 15)) * kLdN + warp * NW + 16 * ntp + 8 * (lane >> 4));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              mma_bf16(sl[mt][2 * ntp], a[mt], bq[0], bq[1]);
              mma_bf16(sl[mt][2 * ntp + 1], a[mt], bq[2], bq[3]);
            }
          }
        }
      }
      // S_in (bf16) to shared memory for C·S_inᵀ; the carried state becomes S_out.
      const float total = static_cast<float>(exp(cum_end));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int pr = 16 * mt + g + 8 * half, nc = warp * NW + 8 * nt + 2 * t;
            float& s0 = s[mt][nt][2 * half];
            float& s1 = s[mt][nt][2 * half + 1];
            if (carry) *reinterpret_cast<uint32_t*>(Ss + pr * kLdN + nc) = pack_bf16x2(s0, s1);
            s0 = total * s0 + sl[mt][nt][2 * half];
            s1 = total * s1 + sl[mt][nt][2 * half + 1];
          }
        }
      }
    }
    __syncthreads();  // Ss complete

    if (carry) {  // y rows += exp(cum_i) · C_i·S_inᵀ (slice columns)
      float a2[PS / 8][4];
#pragma unroll
      for (int n = 0; n < PS / 8; ++n) a2[n][0] = a2[n][1] = a2[n][2] = a2[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < N / 16; ++kk) {
        uint32_t a[4];
        ldsm_x4(a, Cs + (r0 + (lane & 15)) * kLdN + kk * 16 + 8 * (lane >> 4));
#pragma unroll
        for (int np = 0; np < PS / 16; ++np) {
          uint32_t bq[4];
          ldsm_x4(bq, Ss + (np * 16 + (lane & 7) + 8 * (lane >> 4)) * kLdN + kk * 16 + 8 * ((lane >> 3) & 1));
          mma_bf16(a2[2 * np], a, bq[0], bq[1]);
          mma_bf16(a2[2 * np + 1], a, bq[2], bq[3]);
        }
      }
      const float e_lo = ecum[r0 + g], e_hi = ecum[r0 + g + 8];
#pragma unroll
      for (int n = 0; n < PS / 8; ++n) {
        acc[n][0] += e_lo * a2[n][0];
        acc[n][1] += e_lo * a2[n][1];
        acc[n][2] += e_hi * a2[n][2];
        acc[n][3] += e_hi * a2[n][3];
      }
    }
#pragma unroll
    for (int n = 0; n < PS / 8; ++n) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = r0 + g + 8 * half, pc = 8 * n + 2 * t;
        if (i < L) {
          const float2 xf = unpack_bf16x2(*reinterpret_cast<const uint32_t*>(Xs + i * kLdP + pc));
          const float y0 = acc[n][2 * half] + d_skip * xf.x, y1 = acc[n][2 * half + 1] + d_skip * xf.y;
          store2(yg + (t0 + i) * p.y_stride + h * P + p0 + pc, y0, y1, vec);
        }
      }
    }
    __syncthreads();  // tiles free before the next chunk is staged
  }

  // Final state of the row (a row without tokens keeps its initial state, or zeros).
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int pr = p0 + 16 * mt + g + 8 * half, nc = warp * NW + 8 * nt + 2 * t;
        store_state2(state + static_cast<int64_t>(pr) * N + nc, make_float2(s[mt][nt][2 * half], s[mt][nt][2 * half + 1]));
      }
    }
  }
}

}  // namespace ssd_bf16
}  // namespace hyserve::kernels::cuda_detail
