#pragma once
// SSD chunk scan on the tensor cores (Mamba2 "state space duality"), one kernel.
//
// Work item = (chunk, head); chunks are kChunk tokens of one sequence (each sequence is
// chunked on its own, its last chunk partial; a live row with no tokens is one empty chunk so
// that its state is still zeroed or kept as the CPU op does). With, inside the chunk,
// cum_i = Σ_{s<=i} dt_s·A (double, as the CPU op) and S_in the state entering the chunk:
//   (a) cum, dt                                       fp32/double, per token
//   (b) S_loc = Σ_j exp(cum_L − cum_j)·dt_j · x_j ⊗ B_j       GEMM [P × Q]·[Q × N]
//   (c) S_out = exp(cum_L)·S_in + S_loc                       the only sequential step
//   (d) y_i   = Σ_{j<=i} (C_i·B_j)·exp(cum_i − cum_j)·dt_j · x_j     GEMMs [Q × N]·[N × Q], [Q × Q]·[Q × P]
//             + exp(cum_i) · C_i·S_inᵀ                              GEMM  [Q × N]·[N × P]
//             + D·x_i
// The GEMMs run on mma.sync m16n8k8 TF32 with the 3xTF32 split (a = a_hi + a_lo, each
// rounded to TF32; a·b ≈ a_lo·b_hi + a_hi·b_lo + a_hi·b_hi, fp32 accumulation), which keeps
// fp32-level accuracy (plain TF32 would be ~5e-4 relative, over the test's 1e-4).
//
// State passing without a workspace: the carry lives in the sequence's own state slot. Items
// are claimed in (chunk-major, head-minor) order through an atomic ticket, so the item a block
// waits for (the previous chunk of its sequence and head) was claimed earlier by a running
// block: no deadlock whatever the grid size. Chunk k of (sequence b, head h) waits until
// flags[b·heads + h] == k, reads S_in from the slot (chunk 0: the initial state or zeros),
// writes S_out there and publishes k + 1. Everything but (c) — loads, (b), the intra-chunk
// part of (d) — is done before the wait, and the inter-chunk part of (d) after the publish,
// so the chain between chunks is one 32 KB read-modify-write through L2.
//
// Layout: 4 warps; warp w owns rows [16w, 16w + 16) of every GEMM output it computes
// (Q = 64 token rows of y and of C·Bᵀ; P = 64 state rows of S_loc). Shared-memory row strides
// are padded so that fragment loads are (mostly) free of bank conflicts: see tiles<P, N>.
#include <cstdint>
#include <type_traits>

#include "ssm_common.cuh"

namespace hyserve::kernels::cuda_detail {
namespace ssd_chunked {

constexpr int kChunk = 64;  // Q: tokens per chunk (internal; the result does not depend on it)
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;

// ---- 3xTF32 mma.sync -----------------------------------------------------------------------

__device__ __forceinline__ uint32_t to_tf32(float f) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(f));
  return r;
}

__device__ __forceinline__ void split_tf32(float v, uint32_t& hi, uint32_t& lo) {
  hi = to_tf32(v);
  lo = to_tf32(v - __uint_as_float(hi));
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One warp: acc[16 × 8·NT] += A[16 × K] · B[K × 8·NT] over k in [0, k_end) (k_end a multiple
// of 8), n-tiles n < nt_end only (the rest untouched). a_at(r, k) and b_at(k, n) give fp32
// elements. Fragment ownership (PTX m16n8k8 .tf32), g = lane / 4, t = lane % 4:
//   A: (g, k+t) (g+8, k+t) (g, k+t+4) (g+8, k+t+4);  B: (k+t, n) (k+t+4, n) with n = 8·tile + g;
//   acc[tile]: (g, 8·tile + 2t) (g, 8·tile + 2t + 1) (g+8, 8·tile + 2t) (g+8, 8·tile + 2t + 1).
template <int NT, class FA, class FB>
__device__ __forceinline__ void warp_gemm_3xtf32(float (&acc)[NT][4], int k_end, int nt_end, FA a_at, FB b_at) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll 2
  for (int k = 0; k < k_end; k += 8) {
    uint32_t ahi[4], alo[4];
    split_tf32(a_at(g, k + t), ahi[0], alo[0]);
    split_tf32(a_at(g + 8, k + t), ahi[1], alo[1]);
    split_tf32(a_at(g, k + t + 4), ahi[2], alo[2]);
    split_tf32(a_at(g + 8, k + t + 4), ahi[3], alo[3]);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      if (n < nt_end) {
        uint32_t b0h, b0l, b1h, b1l;
        split_tf32(b_at(k + t, 8 * n + g), b0h, b0l);
        split_tf32(b_at(k + t + 4, 8 * n + g), b1h, b1l);
        mma_tf32(acc[n], alo, b0h, b1h);  // small terms first
        mma_tf32(acc[n], ahi, b0l, b1l);
        mma_tf32(acc[n], ahi, b0h, b1h);
      }
    }
  }
}

// ---- cross-block flags -----------------------------------------------------------------------

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_release(int* p, int v) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// ---- workspace and plan ------------------------------------------------------------------------

struct workspace {
  int* chunk_offsets = nullptr;  // [batch + 1] first global chunk of each row (padding rows: 0 chunks)
  int* flags = nullptr;          // [batch, heads, flags_per_head] chunks of (row, head[, slice]) published
  int* ticket = nullptr;         // [1] next work item
  float* chain = nullptr;        // [batch, heads, P, N] f32 carry between chunks when the state type
                                 // is not f32 (null: the carry lives in the f32 slot itself)
};

// The carry between chunks: chunk 0 reads the slot (its state type), later chunks the f32 chain;
// the last chunk writes the slot, earlier ones the chain. With f32 states the chain is the slot.
template <class TS>
struct state_chain {
  TS* slot;
  float* chain;
  __device__ __forceinline__ state_chain(const ssm_common_params& p, const workspace& ws, int64_t b, int64_t slot_idx,
                                         int64_t h, int64_t PN) {
    slot = static_cast<TS*>(p.ssm_states) + (slot_idx * p.heads + h) * PN;
    if constexpr (std::is_same_v<TS, float>) chain = slot;
    else chain = ws.chain + (b * p.heads + h) * PN;
  }
  __device__ __forceinline__ float2 load(bool first, int64_t off) const {
    return first ? load_state2(slot + off) : load_state2(chain + off);
  }
  __device__ __forceinline__ void store(bool last, int64_t off, float2 v) const {
    if (last) store_state2(slot + off, v);
    else store_state2(chain + off, v);
  }
};

// chunk_offsets by one block: chunks(b) = 0 for padding rows, max(1, ceil(len / Q)) otherwise.
__global__ void __launch_bounds__(1024) plan_kernel(const ssd_chunk_scan_params p, workspace ws) {
  __shared__ int warp_tot[32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t per = ceil_div(p.batch, 1024);
  const int64_t b0 = tid * per, b1 = min(p.batch, b0 + per);
  int sum = 0;
  for (int64_t b = b0; b < b1; ++b) {
    if (p.state_indices[b] < 0) continue;
    const int len = p.query_start_loc[b + 1] - p.query_start_loc[b];
    sum += max(1, (len + kChunk - 1) / kChunk);
  }
  int run = block_exclusive_prefix(sum, lane, warp, warp_tot);  // exclusive prefix of this thread
  for (int64_t b = b0; b < b1; ++b) {
    ws.chunk_offsets[b] = run;
    if (p.state_indices[b] < 0) continue;
    const int len = p.query_start_loc[b + 1] - p.query_start_loc[b];
    run += max(1, (len + kChunk - 1) / kChunk);
  }
  if (b1 == p.batch && b0 < b1) ws.chunk_offsets[p.batch] = run;
  if (tid == 0 && p.batch == 0) ws.chunk_offsets[0] = 0;
}

// ---- main kernel -------------------------------------------------------------------------------

template <int P, int N>
struct tiles {
  static_assert(P == 16 * kWarps, "warp w owns state rows [16w, 16w+16)");
  static_assert(kChunk == 16 * kWarps, "warp w owns token rows [16w, 16w+16)");
  static_assert(N % 8 == 0 && N >= 8, "d_state in whole n-tiles");
  static_assert(kChunk == 64, "the cumsum scan takes two tokens per lane of one warp");
  static constexpr int Q = kChunk;
  // Row strides (floats). Readers: k-major B fragments want stride ≡ 8 (mod 32), row-major A
  // fragments (and Bᵀ read as B) want ≡ 4.
  static constexpr int kLdB = N + 8;   // Bs[j][n]: B of S_loc (k-major); also Bᵀ of C·Bᵀ (2-way conflict)
  static constexpr int kLdC = N + 4;   // Cs[i][n]: A of C·Bᵀ and of C·S_inᵀ
  static constexpr int kLdX = P + 8;   // Xs[j][p]: A of S_loc (read transposed) and B of W·X
  static constexpr int kLdW = Q + 4;   // Ws[i][j]: A of W·X
  static constexpr int kLdS = N + 4;   // Ss[p][n]: S_in, B of C·S_inᵀ (read transposed); overlays Bs
  static_assert(P * kLdS <= Q * kLdB, "S_in fits over the B tile");
  static constexpr int kFloats = Q * kLdB + Q * kLdC + Q * kLdX + Q * kLdW + 4 * Q;
  static constexpr size_t kBytes = sizeof(double) * Q + sizeof(float) * kFloats + 16 * sizeof(int);
};

// A chunk's decay terms from its step sizes dtv [Q] (rows >= L: 0), shared by the f32 and bf16
// chunked scans: warp 0 scans dt·A in double, two tokens per lane, into cum (inclusive; run - a1
// can differ from the serial sum by an ulp of double: far below fp32); then ecum[i] = exp(cum_i)
// and coef[i] = exp(cum_end - cum_i)·dt_i. Returns cum_end = cum[Q - 1] (rows >= L add nothing).
// Every thread of the block calls it (it synchronises the block).
__device__ __forceinline__ double chunk_decay(const float* dtv, double A, int tid, int lane, int warp, double* cum,
                                              float* ecum, float* coef) {
  constexpr int Q = kChunk;
  static_assert(Q == 64, "the cumsum scan takes two tokens per lane of one warp");
  if (warp == 0) {  // inclusive scan of dt·A in double, two tokens per lane
    const double a0 = static_cast<double>(dtv[2 * lane]) * A;
    const double a1 = static_cast<double>(dtv[2 * lane + 1]) * A;
    double run = a0 + a1;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double v = __shfl_up_sync(0xffffffffu, run, o);
      if (lane >= o) run += v;
    }
    cum[2 * lane + 1] = run;
    cum[2 * lane] = run - a1;
  }
  __syncthreads();
  const double cum_end = cum[Q - 1];
  if (tid < Q) {
    ecum[tid] = static_cast<float>(exp(cum[tid]));
    coef[tid] = static_cast<float>(exp(cum_end - cum[tid])) * dtv[tid];
  }
  __syncthreads();
  return cum_end;
}

template <class T, class TS, int P, int N>
__global__ void __launch_bounds__(kThreads, 2) ssd_chunked_kernel(const ssd_chunk_scan_params p, workspace ws) {
  using tl = tiles<P, N>;
  constexpr int Q = tl::Q;
  constexpr int kLdB = tl::kLdB, kLdC = tl::kLdC, kLdX = tl::kLdX, kLdW = tl::kLdW, kLdS = tl::kLdS;
  extern __shared__ double smem_d[];
  double* cum = smem_d;                                   // [Q] inclusive Σ dt·A (rows >= L: cum_L)
  float* Bs = reinterpret_cast<float*>(cum + Q);          // [Q][kLdB], later Ss [P][kLdS]
  float* Cs = Bs + Q * kLdB;                              // [Q][kLdC]
  float* Xs = Cs + Q * kLdC;                              // [Q][kLdX]
  float* Ws = Xs + Q * kLdX;                              // [Q][kLdW] (C_i·B_j)·exp(cum_i − cum_j)·dt_j, j <= i
  float* dtv = Ws + Q * kLdW;                             // [Q] step sizes (rows >= L: 0)
  float* coef = dtv + Q;                                  // [Q] exp(cum_L − cum_j)·dt_j
  float* ecum = coef + Q;                                 // [Q] exp(cum_i)
  int* item_sh = reinterpret_cast<int*>(ecum + Q);        // [1] claimed item
  float* Ss = Bs;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int64_t H = p.heads;
  const int64_t heads_per_group = p.heads / p.n_groups;
  const T* xg = reinterpret_cast<const T*>(p.x);
  const T* dtg = reinterpret_cast<const T*>(p.dt);
  const T* Bg = reinterpret_cast<const T*>(p.B);
  const T* Cg = reinterpret_cast<const T*>(p.C);
  T* yg = reinterpret_cast<T*>(p.y);

  const int64_t n_items = static_cast<int64_t>(ws.chunk_offsets[p.batch]) * H;
  for (;;) {
    if (tid == 0) *item_sh = atomicAdd(ws.ticket, 1);
    __syncthreads();
    const int64_t item = *item_sh;
    if (item >= n_items) break;
    const int gc = static_cast<int>(item / H);
    const int64_t h = item % H;
    // Row b: the last b with chunk_offsets[b] <= gc (rows with no chunks share their offset).
    int lo = 0, hi = static_cast<int>(p.batch);  // answer in [lo, hi)
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (ws.chunk_offsets[mid] <= gc) lo = mid; else hi = mid;
    }
    const int64_t b = lo;
    const int kc = gc - ws.chunk_offsets[b];  // chunk index inside the row
    const int64_t start = p.query_start_loc[b];
    const int64_t len = p.query_start_loc[b + 1] - start;
    const int64_t t0 = start + static_cast<int64_t>(kc) * Q;
    const int64_t rest = len - static_cast<int64_t>(kc) * Q;
    const int L = rest <= 0 ? 0 : rest >= Q ? Q : static_cast<int>(rest);
    const int64_t slot = p.state_indices[b];
    const bool init = p.has_initial_state != nullptr && p.has_initial_state[b] != 0;
    const bool carry = init || kc > 0;  // false: S_in is zero (the slot is not read)
    const int64_t grp = h / heads_per_group;
    const double A = -exp(static_cast<double>(p.A_log[h]));
    const float d_skip = p.D != nullptr ? p.D[h] : 0.0f;

    // Stage the chunk; rows >= L are zeros (dt = 0 keeps cum flat, x = B = C = 0). Loads are
    // batched kUnroll deep into registers before the shared stores, so that a thread has that
    // many L2/DRAM requests in flight instead of one.
    constexpr int kUnroll = 8;
    static_assert((Q * N) % (kThreads * kUnroll) == 0 && (Q * P) % (kThreads * kUnroll) == 0, "whole batches");
    for (int e0 = 0; e0 < Q * N; e0 += kThreads * kUnroll) {
      float bv[kUnroll], cv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int e = e0 + u * kThreads + tid, j = e / N, n = e % N;
        bv[u] = cv[u] = 0.0f;
        if (j < L) {
          const int64_t off = (t0 + j) * p.bc_stride + grp * N + n;
          bv[u] = to_float(Bg[off]);
          cv[u] = to_float(Cg[off]);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int e = e0 + u * kThreads + tid, j = e / N, n = e % N;
        Bs[j * kLdB + n] = bv[u];
        Cs[j * kLdC + n] = cv[u];
      }
    }
    for (int e0 = 0; e0 < Q * P; e0 += kThreads * kUnroll) {
      float xv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int e = e0 + u * kThreads + tid, j = e / P, pp = e % P;
        xv[u] = j < L ? to_float(xg[(t0 + j) * p.x_stride + h * P + pp]) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int e = e0 + u * kThreads + tid, j = e / P, pp = e % P;
        Xs[j * kLdX + pp] = xv[u];
      }
    }
    if (tid < Q) dtv[tid] = tid < L ? step_size(p, to_float(dtg[(t0 + tid) * p.dt_stride + h]), h) : 0.0f;
    __syncthreads();
    const double cum_end = chunk_decay(dtv, A, tid, lane, warp, cum, ecum, coef);  // = cum_{L-1}

    const int r0 = 16 * warp;  // this warp's rows

    // (d, intra) W rows [r0, r0+16), columns j < r0 + 16: C·Bᵀ on the tensor cores, then the
    // decay and step per element. Only this warp reads these rows back.
    {
      float cb[Q / 8][4];
#pragma unroll
      for (int n = 0; n < Q / 8; ++n) cb[n][0] = cb[n][1] = cb[n][2] = cb[n][3] = 0.0f;
      warp_gemm_3xtf32<Q / 8>(
          cb, N, 2 * (warp + 1), [&](int r, int k) { return Cs[(r0 + r) * kLdC + k]; },
          [&](int k, int j) { return Bs[j * kLdB + k]; });
#pragma unroll
      for (int n = 0; n < Q / 8; ++n) {
        if (n < 2 * (warp + 1)) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = r0 + g + (e >> 1) * 8;
            const int j = 8 * n + 2 * t + (e & 1);
            float w = 0.0f;
            if (j <= i) w = cb[n][e] * expf(static_cast<float>(cum[i] - cum[j])) * dtv[j];
            Ws[i * kLdW + j] = w;
          }
        }
      }
    }
    __syncwarp();

    // (b) S_loc rows p in [r0, r0+16), all N columns: A(p, j) = coef_j·x_j[p], B(j, n) = B_j[n].
    float sl[N / 8][4];
#pragma unroll
    for (int n = 0; n < N / 8; ++n) sl[n][0] = sl[n][1] = sl[n][2] = sl[n][3] = 0.0f;
    warp_gemm_3xtf32<N / 8>(
        sl, Q, N / 8, [&](int r, int k) { return Xs[k * kLdX + r0 + r] * coef[k]; },
        [&](int k, int n) { return Bs[k * kLdB + n]; });

    // (d, intra) y rows [r0, r0+16) = W[rows, j < r0+16] · X.
    float acc[P / 8][4];
#pragma unroll
    for (int n = 0; n < P / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    warp_gemm_3xtf32<P / 8>(
        acc, r0 + 16, P / 8, [&](int r, int k) { return Ws[(r0 + r) * kLdW + k]; },
        [&](int k, int n) { return Xs[k * kLdX + n]; });

    // (c) Wait for the previous chunk of this (row, head), then S_out = exp(cum_L)·S_in + S_loc.
    int* flag = ws.flags + b * H + h;
    if (tid == 0 && kc > 0) {
      while (load_acquire(flag) < kc) __nanosleep(32);
      __threadfence();
    }
    __syncthreads();  // also: every warp is done with Bs, which Ss overlays
    const state_chain<TS> st(p, ws, b, slot, h, static_cast<int64_t>(P) * N);
    const bool last = gc + 1 == ws.chunk_offsets[b + 1];
    const float total = static_cast<float>(exp(cum_end));
#pragma unroll
    for (int n = 0; n < N / 8; ++n) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int pp = r0 + g + 8 * half;
        const int nn = 8 * n + 2 * t;
        float2 s_in = make_float2(0.0f, 0.0f);
        if (carry) s_in = st.load(kc == 0, pp * N + nn);
        float2 s_out;
        s_out.x = total * s_in.x + sl[n][2 * half];
        s_out.y = total * s_in.y + sl[n][2 * half + 1];
        st.store(last, pp * N + nn, s_out);
        *reinterpret_cast<float2*>(&Ss[pp * kLdS + nn]) = s_in;
      }
    }
    __syncthreads();  // Ss complete; every S_out store issued
    if (tid == 0) {
      __threadfence();
      store_release(flag, kc + 1);
    }

    // (d, inter) y rows += exp(cum_i)·C_i·S_inᵀ.
    if (carry) {
      warp_gemm_3xtf32<P / 8>(
          acc, N, P / 8, [&](int r, int k) { return Cs[(r0 + r) * kLdC + k] * ecum[r0 + r]; },
          [&](int k, int n) { return Ss[n * kLdS + k]; });
    }
#pragma unroll
    for (int n = 0; n < P / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = r0 + g + (e >> 1) * 8;
        const int pp = 8 * n + 2 * t + (e & 1);
        if (i < L) yg[(t0 + i) * p.y_stride + h * P + pp] = from_float<T>(acc[n][e] + d_skip * Xs[i * kLdX + pp]);
      }
    }
    __syncthreads();  // tiles free before the next item is staged
  }
}

}  // namespace ssd_chunked
}  // namespace hyserve::kernels::cuda_detail
