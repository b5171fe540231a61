#pragma once
// Gated DeltaNet chunked prefill on the tensor cores (the WY / UT-transform form of the delta
// rule, as the CPU op computes it). Three launches:
//
//   plan    one block: chunk offsets of the rows (ceil(len / 64) chunks per live row, none for
//           padding rows or empty sequences) and the overflow flag (more chunks than reserved);
//   intra   one block per (chunk, value head or pair of value heads sharing a key head), all
//           chunks at once: everything that does not depend on the state entering the chunk;
//   state   one block per (row, value head, slice of 32 value rows) walking the row's chunks in
//           order with its state slice in registers (state rows are independent in the delta
//           rule, so slices need no communication).
//
// Inside a chunk of n tokens (rows >= n are zeros) with c_i = Σ_{s<=i} g_s (double), q̂ = scale·q/|q|,
// k̂ = k/|k| and β = sigmoid(b), the intra kernel computes
//   A  = strictly-lower β_i (k̂_i·k̂_j) e^{c_i − c_j}         (tensor cores: K̂·K̂ᵀ)
//   T  = (I + A)⁻¹                                          (forward substitution, a column per thread)
//   P  = lower-incl. (q̂_i·k̂_j) e^{c_i − c_j}                 (tensor cores: Q̂·K̂ᵀ)
// and per token the factors qs_i = e^{c_i}·scale/|q_i|, ks_j = e^{c_{n−1} − c_j}/|k_j|, β_j,
// xs_j = β_j e^{c_j}/|k_j| and the chunk decay G = e^{c_{n−1}}, and it writes T, R = P·T and
// the token factors to a workspace. With X = xs ⊙ k the CPU op's W = T·X and U = T·(β v), so for
// a state slice S_s [32 × K] the state kernel computes per chunk, on the tensor cores,
//   z   = β v_s − X · S_sᵀ                        ([64 × 32])
//   u   = T · z = U − W·S_sᵀ                      (the chunk's new values)
//   o   = (qs ⊙ q) · S_sᵀ + R · z                 (the chunk's outputs of the slice; R·z = P·u)
//   S_s ← G · S_s + uᵀ · (ks ⊙ k)
// reading q, k and v from the inputs (scaled as their fragments are read) and T, R and the
// token factors from the workspace.
//
// GEMMs run on mma.sync m16n8k8 TF32 with fp32 accumulation, either split 3xTF32
// (a = a_hi + a_lo, a·b ≈ a_lo·b_hi + a_hi·b_lo + a_hi·b_hi: fp32-level accuracy) or plain TF32
// (one product, about 5e-4 relative per product; faster). The intra kernel has 4 warps, warp w
// owning token rows [16w, 16w + 16) of its outputs; the state kernel 8 (see there).
// Shared-memory row strides are ≡ 4 (mod 32) floats where a tile is read as row-major A
// fragments or transposed B fragments, ≡ 8 where it is read as k-major B fragments.
//
// The workspace holds cap = HYSERVE_GDN_MAX_TOKENS / 64 + batch chunks (default 16384 tokens);
// a batch needing more is computed by the recurrent kernel instead, gated on the overflow flag
// on the device (no host synchronisation; graph-capturable).
#include <cstdint>

#include "common.cuh"
#include "hyserve/kernels/gdn.h"

namespace hyserve::kernels::cuda_detail {
namespace gdn_tc {

constexpr int kChunk = 64;
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kSlice = 32;  // value rows per state block
constexpr float kL2Eps = 1e-6f;
constexpr int kTokFields = 8;  // per token: qs, ks, beta, G (every row), xs, 3 unused

// ---- TF32 mma.sync -------------------------------------------------------------------------

// The TF32 operand(s) of x. The tensor core reads the top 19 bits of a .tf32 register and
// ignores the low 13. Split (3xTF32): hi = x with the low 13 bits cleared, lo = x − hi (exact in
// fp32), read truncated: |error| <= 2^-10·|lo| <= 2^-20·|x|. Plain: x + half a TF32 unit in the
// last place, read truncated = x rounded to nearest (ties away). One or two integer/fp32
// operations per element where cvt.rna.tf32.f32 takes more.
template <bool kSplit>
__device__ __forceinline__ void tf32_parts(float x, uint32_t& hi, uint32_t& lo) {
  if constexpr (kSplit) {
    hi = __float_as_uint(x) & 0xffffe000u;
    lo = __float_as_uint(x - __uint_as_float(hi));
  } else {
    hi = __float_as_uint(x) + 0x1000u;
    lo = 0u;
  }
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One warp: acc[16 × 8·NT] += A[16 × k_end] · B[k_end × 8·NT] (k_end a multiple of 8).
// a_at(r, k), r in [0, 16), and b_at(k, n), n in [0, 8·NT), give fp32 elements. Fragments (PTX
// m16n8k8 .tf32), g = lane / 4, t = lane % 4:
//   A: (g, k+t) (g+8, k+t) (g, k+t+4) (g+8, k+t+4);  B: (k+t, 8·tile + g) (k+t+4, 8·tile + g);
//   acc[tile][e]: row g + 8·(e / 2), column 8·tile + 2t + e % 2.
// n-tiles n >= nt_end are skipped (left untouched).
template <bool kSplit, int NT, class FA, class FB>
__device__ __forceinline__ void warp_gemm(float (&acc)[NT][4], int k_end, FA a_at, FB b_at, int nt_end = NT) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll 2
  for (int k = 0; k < k_end; k += 8) {
    const float a[4] = {a_at(g, k + t), a_at(g + 8, k + t), a_at(g, k + t + 4), a_at(g + 8, k + t + 4)};
    uint32_t ahi[4], alo[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      tf32_parts<kSplit>(a[i], ahi[i], alo[i]);
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      if (n >= nt_end) continue;
      const float b0 = b_at(k + t, 8 * n + g), b1 = b_at(k + t + 4, 8 * n + g);
      uint32_t b0h, b0l, b1h, b1l;
      tf32_parts<kSplit>(b0, b0h, b0l);
      tf32_parts<kSplit>(b1, b1h, b1l);
      if constexpr (kSplit) {
        mma_tf32(acc[n], alo, b0h, b1h);  // small terms first
        mma_tf32(acc[n], ahi, b0l, b1l);
      }
      mma_tf32(acc[n], ahi, b0h, b1h);
    }
  }
}

// Two products sharing B, acc1 += A1 · B and acc2 += A2 · B (B read and split once), for
// operands contiguous along k (A rows and Bᵀ rows in shared memory): the k-slots
// t and t+4 of a fragment take the adjacent elements 2t and 2t+1 of each 8-wide k step (the
// same permutation for A and B leaves the product unchanged), so each fragment pair is one
// 8-byte load. a1_at2(r, k), a2_at2(r, k) and b_at2(k, n) return the float2 at (r or n, k..k+1),
// k even. Conflict-free for row strides ≡ 8 (mod 32) floats.
template <bool kSplit, int NT, class FA1, class FA2, class FB>
__device__ __forceinline__ void warp_gemm2_kc(float (&acc1)[NT][4], float (&acc2)[NT][4], int k_end, FA1 a1_at2,
                                              FA2 a2_at2, FB b_at2, int nt_end = NT) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll 2
  for (int k = 0; k < k_end; k += 8) {
    const float2 p0 = a1_at2(g, k + 2 * t), p1 = a1_at2(g + 8, k + 2 * t);
    const float2 q0 = a2_at2(g, k + 2 * t), q1 = a2_at2(g + 8, k + 2 * t);
    const float a1[4] = {p0.x, p1.x, p0.y, p1.y};
    const float a2[4] = {q0.x, q1.x, q0.y, q1.y};
    uint32_t a1hi[4], a1lo[4], a2hi[4], a2lo[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      tf32_parts<kSplit>(a1[i], a1hi[i], a1lo[i]);
      tf32_parts<kSplit>(a2[i], a2hi[i], a2lo[i]);
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      if (n >= nt_end) continue;
      const float2 bb = b_at2(k + 2 * t, 8 * n + g);
      uint32_t b0h, b0l, b1h, b1l;
      tf32_parts<kSplit>(bb.x, b0h, b0l);
      tf32_parts<kSplit>(bb.y, b1h, b1l);
      if constexpr (kSplit) {
        mma_tf32(acc1[n], a1lo, b0h, b1h);
        mma_tf32(acc1[n], a1hi, b0l, b1l);
        mma_tf32(acc2[n], a2lo, b0h, b1h);
        mma_tf32(acc2[n], a2hi, b0l, b1l);
      }
      mma_tf32(acc1[n], a1hi, b0h, b1h);
      mma_tf32(acc2[n], a2hi, b0h, b1h);
    }
  }
}

template <int NT>
__device__ __forceinline__ void zero(float (&acc)[NT][4]) {
#pragma unroll
  for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

__device__ __forceinline__ float softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

struct float4x2 {
  float4 a, b;
};
__device__ __forceinline__ float4x2 make_float4x2(float4 a, float4 b) { return {a, b}; }

// 16-byte asynchronous copies to shared memory (full = false: the 16 bytes are zero-filled,
// nothing is read).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool full) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(full ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait0() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// ---- workspace and plan ----------------------------------------------------------------------

struct workspace {
  int* chunk_off = nullptr;  // [batch + 1] first global chunk of each row
  int* overflow = nullptr;   // [1] 1: more chunks than cap (the recurrent kernel runs instead)
  float* R = nullptr;        // [cap, HV, 64, 64] P·T
  float* T = nullptr;        // [cap, HV, 64, 64]
  float* tok = nullptr;      // [cap, HV, 64, kTokFields]
  int cap = 0;
};

__device__ __forceinline__ int row_chunks(const gdn_chunk_scan_params& p, int64_t b) {
  if (p.state_indices[b] < 0) return 0;
  const int len = p.query_start_loc[b + 1] - p.query_start_loc[b];
  return (len + kChunk - 1) / kChunk;
}

static __global__ void __launch_bounds__(1024) plan_kernel(const gdn_chunk_scan_params p, workspace ws) {
  __shared__ int warp_tot[32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t per = ceil_div(p.batch, 1024);
  const int64_t b0 = tid * per, b1 = min(p.batch, b0 + per);
  int sum = 0;
  for (int64_t b = b0; b < b1; ++b) sum += row_chunks(p, b);
  int incl = sum;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) warp_tot[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int w = warp_tot[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += v;
    }
    warp_tot[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  int run = incl - sum + (warp > 0 ? warp_tot[warp - 1] : 0);  // exclusive prefix of this thread
  for (int64_t b = b0; b < b1; ++b) {
    ws.chunk_off[b] = run;
    run += row_chunks(p, b);
  }
  if (tid == 1023) {  // the last thread's running sum is the total (threads past the batch add 0)
    ws.chunk_off[p.batch] = run;
    *ws.overflow = run > ws.cap ? 1 : 0;
  }
}

// Stages a [ROWS × COLS] tile: kU loads in flight per thread before the stores.
template <int ROWS, int COLS, class Load, class Store>
__device__ __forceinline__ void stage(Load load, Store store) {
  constexpr int kN = ROWS * COLS, kU = kN / kThreads < 8 ? kN / kThreads : 8;
  static_assert(kU > 0 && kN % (kThreads * kU) == 0, "whole batches");
  const int tid = threadIdx.x;
  for (int e0 = 0; e0 < kN; e0 += kThreads * kU) {
    decltype(load(0, 0)) v[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int e = e0 + u * kThreads + tid;
      v[u] = load(e / COLS, e % COLS);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int e = e0 + u * kThreads + tid;
      store(e / COLS, e % COLS, v[u]);
    }
  }
}

// ---- intra-chunk kernel ----------------------------------------------------------------------

// kG value heads (1 or 2) sharing one key head per block: q, k, their norms and the raw Gram
// products are computed once for both; masks, decays, β and T per value head.
template <int K, int kG>
struct intra_tiles {
  static constexpr int kLdQ = K + 8;  // Q̂ (A of Q̂·K̂ᵀ, 8-byte fragment loads)
  static constexpr int kLdK = K + 8;  // K̂ (A of K̂·K̂ᵀ, B transposed, 8-byte fragment loads)
  static constexpr int kLdA = kChunk + 4;  // A and P (A fragments)
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
  for (int e = tid; e < C * K; e += kThreads) {
    const int j = e / K, c = e % K;
    Qs[j * kLdQ + c] *= qf[j];
    Ks[j * kLdK + c] *= kf[j];
  }
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
  // by the heads), zeros beyond.
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
              const float d = expf(static_cast<float>(ch[i] - ch[jj]));
              const float pe = qk[nt][2 * half + e] * d;
              const float ae = jj < i ? bh[i] * kk[nt][2 * half + e] * d : 0.0f;
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
      for (int j = 0; j < i; ++j) s4[j & 3] -= Ah[i * kLdA + j] * x[j];
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

// ---- state kernel ----------------------------------------------------------------------------

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

// Two products sharing B: acc1 += A1·B and acc2 += A2·B over k < k_end (fragments as in
// warp_gemm; B read and split once).
template <bool kSplit, int NT, class FA1, class FA2, class FB>
__device__ __forceinline__ void warp_gemm2(float (&acc1)[NT][4], float (&acc2)[NT][4], int k_end, FA1 a1_at,
                                           FA2 a2_at, FB b_at) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll 2
  for (int k = 0; k < k_end; k += 8) {
    const float a1[4] = {a1_at(g, k + t), a1_at(g + 8, k + t), a1_at(g, k + t + 4), a1_at(g + 8, k + t + 4)};
    const float a2[4] = {a2_at(g, k + t), a2_at(g + 8, k + t), a2_at(g, k + t + 4), a2_at(g + 8, k + t + 4)};
    uint32_t a1hi[4], a1lo[4], a2hi[4], a2lo[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      tf32_parts<kSplit>(a1[i], a1hi[i], a1lo[i]);
      tf32_parts<kSplit>(a2[i], a2hi[i], a2lo[i]);
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const float b0 = b_at(k + t, 8 * n + g), b1 = b_at(k + t + 4, 8 * n + g);
      uint32_t b0h, b0l, b1h, b1l;
      tf32_parts<kSplit>(b0, b0h, b0l);
      tf32_parts<kSplit>(b1, b1h, b1l);
      if constexpr (kSplit) {
        mma_tf32(acc1[n], a1lo, b0h, b1h);
        mma_tf32(acc1[n], a1hi, b0l, b1l);
        mma_tf32(acc2[n], a2lo, b0h, b1h);
        mma_tf32(acc2[n], a2hi, b0l, b1l);
      }
      mma_tf32(acc1[n], a1hi, b0h, b1h);
      mma_tf32(acc2[n], a2hi, b0h, b1h);
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
// Warp w computes token rows [16·(w % 4), +16) × slice columns [16·(w / 4), +16) of z, u and o,
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
  const int r0 = 16 * (warp & 3);   // token rows of z, u and o
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
