#pragma once
// Chunk-parallel SSD scan for bf16 io (f32 or bf16 state): the standard SSD decomposition in
// three kernels, so that no kernel walks a sequence's tokens serially.
//
// Chunks are defined per sequence (boundaries relative to each sequence start; a sequence's
// last chunk may be short). A plan kernel turns query_start_loc into chunk_off[b] (prefix sum
// of the chunk counts, 0 for padding rows and empty rows) on the device; the chunk kernels
// map their global chunk index back to (row, chunk) by binary search over chunk_off.
// Per chunk (length L <= Q) with cum_t = Σ_{s<=t} dt_s·A inside the chunk (double):
//   1. chunk_state:  S_c = Σ_t exp(cum_end − cum_t)·dt_t · x_t ⊗ B_t = (coef ∘ X)ᵀ·B
//                    (tensor cores, K = chunk tokens), stored f32 in the workspace, and
//                    decay_c = exp(cum_end) (f32).
//   2. state_pass:   per (row, head, 4 state elements), over the row's chunks in order:
//                    S_in(0) = slot state if has_initial_state else 0;
//                    S_in(c+1) = decay_c·S_in(c) + S_c.  S_in(c) overwrites S_c in place; the
//                    final state goes to the slot in the state type.
//   3. chunk_out:    y_i = exp(cum_i)·C_i·S_inᵀ + Σ_{j<=i} (C_i·B_j)·exp(cum_i − cum_j)·dt_j·x_j
//                    + D·x_i, per (chunk, head, 64-row tile) on the tensor cores.
// This is the CPU op's formulation (and the sequential kernel's, ssd_scan_bf16.cuh) with the
// state recurrence moved out of the token loop; operands of the tensor-core products are rounded
// to bf16 as there (coef·x, the C·Bᵀ weights, S_in), accumulation and the chained state are f32.
//
// Chunk length Q = 256 (64-token sub-tiles inside). Estimate at the production shape (T = 16384
// tokens, H = 128 heads, P = 64, N = 128, G = 8 groups, bf16 io, f32 workspace states):
//   states per pass: T/Q · H · P · N · 4 B = 64 · 128 · 32 KiB = 256 MiB at Q = 256
//                    (1 GiB at Q = 64, 512 MiB at Q = 128).
//   phase 1: reads x 256 MiB + B 32 MiB, writes states 256 MiB;  2·T·H·P·N = 34 GFLOP.
//   phase 2: reads states 256 MiB, writes S_in 256 MiB (+ slot states), elementwise.
//   phase 3: reads states 256 MiB, x 256 MiB (+ L2 re-reads of the diagonal tiles), B, C,
//            writes y 256 MiB; C·S_inᵀ 34 GFLOP; causal C·Bᵀ: per (chunk, head) 8.5 of the 16
//            64×64 blocks (6 below the diagonal, 4 diagonal ones at 10/16 by warp skipping),
//            2·T·Q·N·H·8.5/16 ≈ 73 GFLOP; W·X the same blocks at K = 64 ≈ 37 GFLOP.
//   total ≈ 1.9 GiB of DRAM traffic (≈ 0.42 ms at 4.8 TB/s) and ≈ 180 GFLOP of bf16 mma
//   (≈ 0.3 ms at a realistic 600 TFLOP/s for mma.sync); at Q = 64 the state traffic alone is
//   4 GiB (≈ 0.9 ms), at Q = 128 ≈ 2 GiB; Q = 256 doubles the causal C·Bᵀ and W·X work of
//   Q = 128 (+55 GFLOP, ≈ +0.09 ms) but halves its state traffic (−1 GiB, ≈ −0.2 ms), and
//   matches the upstream default.
// Workspace: the chunk states are indexed by global chunk; their number is not known on the
// host, so the host reserves a capacity (see ssd_scan.cu) and the plan kernel raises an
// overflow flag when the batch needs more: then the three kernels exit at once and the general
// kernel (gated on the same flag) computes the whole batch instead.
#include <cuda_bf16.h>

#include <cstdint>

#include "ssd_scan_bf16.cuh"  // mma / ldmatrix helpers, load8
#include "ssm_common.cuh"

namespace hyserve::kernels::cuda_detail {
namespace ssd_par {

using bf16 = __nv_bfloat16;
using ssd_bf16::ldsm_x4;
using ssd_bf16::ldsm_x4_t;
using ssd_bf16::load8;
using ssd_bf16::mma_bf16;
using ssd_bf16::pack_bf16x2;
using ssd_bf16::unpack_bf16x2;

constexpr int kQ = 256;     // chunk length
constexpr int kTile = 64;   // token sub-tile (16 rows per warp)
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kPlanThreads = 1024;
constexpr int kPassThreads = 256;
constexpr int kStateWarps = 8;  // phase 1: 2 × 4 warps over the P × N state tile
constexpr int kStateThreads = 32 * kStateWarps;
static_assert(kTile == 16 * kWarps && kQ % kTile == 0, "16 rows per warp");

struct workspace {
  int* info = nullptr;       // [0] total chunks, [1] overflow (total > cap)
  int* chunk_off = nullptr;  // [batch + 1]
  float* decay = nullptr;    // [cap, heads] exp(cum_end)
  float* states = nullptr;   // [cap, heads, P, N] S_c, then S_in (in place)
  int cap = 0;
};

// Chunk offsets per row: n_b = ceil(len_b / Q) for live rows, 0 for padding rows.
__global__ void __launch_bounds__(kPlanThreads) plan_kernel(const ssd_chunk_scan_params p, workspace ws) {
  __shared__ int part[kPlanThreads];
  const int tid = threadIdx.x;
  const int64_t batch = p.batch;
  const int64_t per = (batch + kPlanThreads - 1) / kPlanThreads;
  const int64_t b0 = min(batch, tid * per), b1 = min(batch, b0 + per);
  auto count = [&](int64_t b) -> int {
    if (p.state_indices[b] < 0) return 0;
    const int64_t len = p.query_start_loc[b + 1] - p.query_start_loc[b];
    return len > 0 ? static_cast<int>((len + kQ - 1) / kQ) : 0;
  };
  int local = 0;
  for (int64_t b = b0; b < b1; ++b) local += count(b);
  part[tid] = local;
  __syncthreads();
  for (int o = 1; o < kPlanThreads; o <<= 1) {  // inclusive Hillis-Steele scan
    const int v = tid >= o ? part[tid - o] : 0;
    __syncthreads();
    part[tid] += v;
    __syncthreads();
  }
  int run = part[tid] - local;
  for (int64_t b = b0; b < b1; ++b) {
    ws.chunk_off[b] = run;
    run += count(b);
  }
  if (tid == kPlanThreads - 1) {
    const int total = part[tid];
    ws.chunk_off[batch] = total;
    ws.info[0] = total;
    ws.info[1] = total > ws.cap ? 1 : 0;
  }
}

// Row of global chunk gc: the last b with chunk_off[b] <= gc (empty rows share an offset with
// the next row and are skipped because chunk_off[b + 1] > gc must hold).
__device__ __forceinline__ int64_t chunk_row(const int* off, int64_t batch, int gc) {
  int64_t lo = 0, hi = batch;  // off[lo] <= gc < off[hi]
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (__ldg(off + mid) <= gc) lo = mid;
    else hi = mid;
  }
  return lo;
}

struct chunk_geom {
  int64_t b, h, grp, t0;
  int L;
  double A;
};

// Resolves (row, chunk start, length) of global chunk gc for head h; false: nothing to do.
__device__ __forceinline__ bool resolve(const ssd_chunk_scan_params& p, const workspace& ws, int gc, int64_t h,
                                        chunk_geom& c) {
  if (ws.info[1] != 0 || gc >= ws.info[0]) return false;
  c.b = chunk_row(ws.chunk_off, p.batch, gc);
  const int64_t k = gc - ws.chunk_off[c.b];
  const int64_t start = p.query_start_loc[c.b];
  const int64_t len = p.query_start_loc[c.b + 1] - start;
  c.t0 = start + k * kQ;
  c.L = static_cast<int>(min(static_cast<int64_t>(kQ), len - k * kQ));
  c.h = h;
  c.grp = h / (p.heads / p.n_groups);
  c.A = -exp(static_cast<double>(p.A_log[h]));
  return c.L > 0;
}

// Step sizes (0 past L) and the inclusive cumsum of dt·A over the chunk, in double, by a block
// of kThr threads; thread tid owns tokens [tid·R, tid·R + R), R = Q / kThr. wsum holds one double
// per warp. Ends with a barrier.
template <int kThr>
__device__ __forceinline__ void chunk_cum(const ssd_chunk_scan_params& p, const chunk_geom& c, float* dtv,
                                          double* cum, double* wsum) {
  constexpr int R = kQ / kThr;
  static_assert(R * kThr == kQ && (R == 1 || R == 2), "one or two tokens per thread");
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const bf16* dtg = static_cast<const bf16*>(p.dt);
  double a[R];
  double run = 0.0;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int j = R * tid + r;
    const float d = j < c.L ? step_size(p, __bfloat162float(dtg[(c.t0 + j) * p.dt_stride + c.h]), c.h) : 0.0f;
    dtv[j] = d;
    a[r] = static_cast<double>(d) * c.A;
    run += a[r];
  }
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double v = __shfl_up_sync(0xffffffffu, run, o);
    if (lane >= o) run += v;
  }
  if (lane == 31) wsum[warp] = run;
  __syncthreads();
  for (int w = 0; w < warp; ++w) run += wsum[w];
#pragma unroll
  for (int r = R - 1; r >= 0; --r) {
    cum[R * tid + r] = run;
    run -= a[r];
  }
  __syncthreads();
}

template <int P, int N>
struct state_tiles {
  static constexpr int kLdN = N + 8, kLdP = P + 8;
  static constexpr size_t kBytes = sizeof(double) * (kQ + kStateWarps) + sizeof(float) * 2 * kQ +
                                   sizeof(bf16) * static_cast<size_t>(kTile * kLdP + kTile * kLdN);
};

// Phase 1: block = (head, global chunk), 8 warps; warp w owns state rows [PW·(w / 4), +PW) and
// columns [NW·(w % 4), +NW) of S_c (PW = P / 2, NW = N / 4).
template <int P, int N>
__global__ void __launch_bounds__(kStateThreads, 2)
    chunk_state_kernel(const ssd_chunk_scan_params p, const workspace ws, bool vec) {
  using tl = state_tiles<P, N>;
  constexpr int kThr = kStateThreads;
  constexpr int kLdN = tl::kLdN, kLdP = tl::kLdP;
  constexpr int PW = P / 2, NW = N / 4, MT = PW / 16, NT = NW / 8;
  constexpr int kX = kTile * P / 8 / kThr, kB = kTile * N / 8 / kThr;
  static_assert(kX * kThr * 8 == kTile * P && kB * kThr * 8 == kTile * N, "whole load batches");
  static_assert(NT % 2 == 0 && PW % 16 == 0, "whole m-tiles and pairs of n-tiles");
  extern __shared__ double smem_d[];
  double* cum = smem_d;                                       // [Q]
  double* wsum = cum + kQ;                                    // [warps]
  float* dtv = reinterpret_cast<float*>(wsum + kStateWarps);  // [Q]
  float* coef = dtv + kQ;                                  // [Q]
  bf16* Xc = reinterpret_cast<bf16*>(coef + kQ);           // [tile][kLdP] coef_j · x_j
  bf16* Bs = Xc + kTile * kLdP;                            // [tile][kLdN]

  chunk_geom c;
  const int gc = static_cast<int>(blockIdx.y);
  if (!resolve(p, ws, gc, blockIdx.x, c)) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int pw0 = PW * (warp / 4), nw0 = NW * (warp % 4);
  const int64_t H = p.heads;
  chunk_cum<kThr>(p, c, dtv, cum, wsum);
  const double cum_end = cum[kQ - 1];  // = cum[L - 1]: dt is 0 past L
  for (int j = tid; j < kQ; j += kThr) coef[j] = static_cast<float>(exp(cum_end - cum[j])) * dtv[j];
  if (tid == 0) ws.decay[static_cast<int64_t>(gc) * H + c.h] = static_cast<float>(exp(cum_end));
  __syncthreads();

  const bf16* xg = static_cast<const bf16*>(p.x);
  const bf16* Bg = static_cast<const bf16*>(p.B);
  float sl[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) sl[mt][nt][0] = sl[mt][nt][1] = sl[mt][nt][2] = sl[mt][nt][3] = 0.0f;

  for (int j0 = 0; j0 < c.L; j0 += kTile) {
#pragma unroll
    for (int u = 0; u < kX; ++u) {
      const int e = u * kThr + tid, j = e / (P / 8), cc = e % (P / 8);
      uint4 v = make_uint4(0, 0, 0, 0);
      if (j0 + j < c.L) v = load8(xg + (c.t0 + j0 + j) * p.x_stride + c.h * P + 8 * cc, vec);
      float f[8];
      pack_traits<bf16>::unpack(v, f);
      const float cj = coef[j0 + j];
#pragma unroll
      for (int k = 0; k < 8; ++k) f[k] *= cj;
      *reinterpret_cast<uint4*>(Xc + j * kLdP + 8 * cc) = pack_traits<bf16>::pack(f);
    }
#pragma unroll
    for (int u = 0; u < kB; ++u) {
      const int e = u * kThr + tid, j = e / (N / 8), cc = e % (N / 8);
      uint4 v = make_uint4(0, 0, 0, 0);
      if (j0 + j < c.L) v = load8(Bg + (c.t0 + j0 + j) * p.bc_stride + c.grp * N + 8 * cc, vec);
      *reinterpret_cast<uint4*>(Bs + j * kLdN + 8 * cc) = v;
    }
    __syncthreads();
    // S_c tile of this warp: A(p, j) = Xc[j][p] (.trans), B(j, n) = Bs[j][n] (.trans).
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      if (j0 + kk * 16 < c.L) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          ldsm_x4_t(a[mt], Xc + (kk * 16 + (lane & 7) + 8 * (lane >> 4)) * kLdP + pw0 + 16 * mt + 8 * ((lane >> 3) & 1));
#pragma unroll
        for (int ntp = 0; ntp < NT / 2; ++ntp) {
          uint32_t bq[4];
          ldsm_x4_t(bq, Bs + (kk * 16 + (lane & 15)) * kLdN + nw0 + 16 * ntp + 8 * (lane >> 4));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_bf16(sl[mt][2 * ntp], a[mt], bq[0], bq[1]);
            mma_bf16(sl[mt][2 * ntp + 1], a[mt], bq[2], bq[3]);
          }
        }
      }
    }
    __syncthreads();  // tiles free before the next sub-tile is staged
  }

  float* dst = ws.states + (static_cast<int64_t>(gc) * H + c.h) * P * N;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int pr = pw0 + 16 * mt + g + 8 * half, nc = nw0 + 8 * nt + 2 * t;
        __stcg(reinterpret_cast<float2*>(dst + pr * N + nc),
               make_float2(sl[mt][nt][2 * half], sl[mt][nt][2 * half + 1]));
      }
}

// Four consecutive state elements (16-byte aligned for float, 8 for bf16) as floats, and back.
__device__ __forceinline__ float4 load_state4(const float* s) { return __ldcg(reinterpret_cast<const float4*>(s)); }
__device__ __forceinline__ float4 load_state4(const bf16* s) {
  const uint2 w = __ldcg(reinterpret_cast<const uint2*>(s));
  const float2 a = unpack_bf16x2(w.x), b = unpack_bf16x2(w.y);
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ void store_state4(float* s, float4 v) { __stcg(reinterpret_cast<float4*>(s), v); }
__device__ __forceinline__ void store_state4(bf16* s, float4 v) {
  __stcg(reinterpret_cast<uint2*>(s), make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w)));
}

// Phase 2: thread = (row blockIdx.y, head, 4 consecutive state elements).
template <class TS, int P, int N>
__global__ void __launch_bounds__(kPassThreads) state_pass_kernel(const ssd_chunk_scan_params p, const workspace ws) {
  constexpr int PN4 = P * N / 4;
  const int64_t H = p.heads;
  const int64_t e4 = static_cast<int64_t>(blockIdx.x) * kPassThreads + threadIdx.x;
  if (e4 >= H * PN4) return;
  if (ws.info[1] != 0) return;
  const int64_t b = blockIdx.y;
  const int64_t slot = p.state_indices[b];
  if (slot < 0) return;  // padding row: state untouched
  const int64_t h = e4 / PN4, e = 4 * (e4 % PN4);
  const bool init = p.has_initial_state != nullptr && p.has_initial_state[b] != 0;
  TS* st = static_cast<TS*>(p.ssm_states) + (slot * H + h) * static_cast<int64_t>(P) * N + e;
  float4 s = init ? load_state4(st) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const int off = ws.chunk_off[b], n = ws.chunk_off[b + 1] - off;
  auto at = [&](int k) { return reinterpret_cast<float4*>(ws.states) + ((off + k) * H + h) * PN4 + e4 % PN4; };
  float4 cur = n > 0 ? __ldcg(at(0)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int k = 0; k < n; ++k) {
    const float4 nxt = k + 1 < n ? __ldcg(at(k + 1)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float d = __ldcg(ws.decay + (off + k) * H + h);
    __stcg(at(k), s);  // S_in of chunk k
    s.x = d * s.x + cur.x;
    s.y = d * s.y + cur.y;
    s.z = d * s.z + cur.z;
    s.w = d * s.w + cur.w;
    cur = nxt;
  }
  store_state4(st, s);  // a row without tokens keeps its initial state, or zeros
}

template <int P, int N>
struct out_tiles {
  static constexpr int kLdN = N + 8, kLdP = P + 8;
  static constexpr size_t kBytes = sizeof(double) * (kQ + kWarps) + sizeof(float) * kQ +
                                   sizeof(bf16) * static_cast<size_t>((2 * kTile + P) * kLdN + kTile * kLdP);
};

// Phase 3: block = (head, global chunk · Q/64 + row tile). Warp w owns rows [16w, 16w+16) of the
// tile; the tile's C rows and the chunk's S_in stay in shared memory while the B and x sub-tiles
// j <= the row tile stream through.
template <int P, int N>
__global__ void __launch_bounds__(kThreads, 3)
    chunk_out_kernel(const ssd_chunk_scan_params p, const workspace ws, bool vec) {
  using tl = out_tiles<P, N>;
  constexpr int kLdN = tl::kLdN, kLdP = tl::kLdP;
  constexpr int kRowTiles = kQ / kTile;
  constexpr int kBC = kTile * N / 8 / kThreads, kX = kTile * P / 8 / kThreads, kS = P * N / 4 / kThreads;
  static_assert(kBC * kThreads * 8 == kTile * N && kX * kThreads * 8 == kTile * P && kS * kThreads * 4 == P * N,
                "whole load batches");
  extern __shared__ double smem_d[];
  double* cum = smem_d;                                  // [Q]
  double* wsum = cum + kQ;                               // [warps]
  float* dtv = reinterpret_cast<float*>(wsum + kWarps);  // [Q]
  bf16* Cs = reinterpret_cast<bf16*>(dtv + kQ);          // [tile][kLdN] C rows of the row tile
  bf16* Bs = Cs + kTile * kLdN;                          // [tile][kLdN] B rows of sub-tile jt
  bf16* Ss = Bs + kTile * kLdN;                          // [P][kLdN] S_in
  bf16* Xs = Ss + P * kLdN;                              // [tile][kLdP] x rows of sub-tile jt

  chunk_geom c;
  const int gc = static_cast<int>(blockIdx.y / kRowTiles), it = static_cast<int>(blockIdx.y % kRowTiles);
  if (!resolve(p, ws, gc, blockIdx.x, c)) return;
  const int i0 = kTile * it;
  if (i0 >= c.L) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int r0 = 16 * warp;
  const int64_t H = p.heads;
  const bf16* xg = static_cast<const bf16*>(p.x);
  const bf16* Bg = static_cast<const bf16*>(p.B);
  const bf16* Cg = static_cast<const bf16*>(p.C);
  bf16* yg = static_cast<bf16*>(p.y);
  const float d_skip = p.D != nullptr ? p.D[c.h] : 0.0f;

#pragma unroll
  for (int u = 0; u < kBC; ++u) {
    const int e = u * kThreads + tid, j = e / (N / 8), cc = e % (N / 8);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (i0 + j < c.L) v = load8(Cg + (c.t0 + i0 + j) * p.bc_stride + c.grp * N + 8 * cc, vec);
    *reinterpret_cast<uint4*>(Cs + j * kLdN + 8 * cc) = v;
  }
  const float* s_in = ws.states + (static_cast<int64_t>(gc) * H + c.h) * P * N;
#pragma unroll
  for (int u = 0; u < kS; ++u) {
    const int e = u * kThreads + tid, pr = e / (N / 4), c4 = e % (N / 4);
    const float4 v = __ldcg(reinterpret_cast<const float4*>(s_in) + e);
    *reinterpret_cast<uint2*>(Ss + pr * kLdN + 4 * c4) = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
  }
  chunk_cum<kThreads>(p, c, dtv, cum, wsum);  // its barriers also publish Cs and Ss

  const int i_lo = i0 + r0 + g, i_hi = i_lo + 8;  // chunk-relative rows of this lane
  const double ci_lo = cum[i_lo], ci_hi = cum[i_hi];

  // y = exp(cum_i) · C_i·S_inᵀ
  float acc[P / 8][4];
#pragma unroll
  for (int n = 0; n < P / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    uint32_t a[4];
    ldsm_x4(a, Cs + (r0 + (lane & 15)) * kLdN + kk * 16 + 8 * (lane >> 4));
#pragma unroll
    for (int np = 0; np < P / 16; ++np) {
      uint32_t bq[4];
      ldsm_x4(bq, Ss + (np * 16 + (lane & 7) + 8 * (lane >> 4)) * kLdN + kk * 16 + 8 * ((lane >> 3) & 1));
      mma_bf16(acc[2 * np], a, bq[0], bq[1]);
      mma_bf16(acc[2 * np + 1], a, bq[2], bq[3]);
    }
  }
  {
    const float e_lo = static_cast<float>(exp(ci_lo)), e_hi = static_cast<float>(exp(ci_hi));
#pragma unroll
    for (int n = 0; n < P / 8; ++n) {
      acc[n][0] *= e_lo;
      acc[n][1] *= e_lo;
      acc[n][2] *= e_hi;
      acc[n][3] *= e_hi;
    }
  }

  // y += W·X over the sub-tiles jt <= it; W = (C·Bᵀ) ∘ exp(cum_i − cum_j)·dt_j, j <= i.
  for (int jt = 0; jt <= it; ++jt) {
    const int j0 = kTile * jt;
    const bool diag = jt == it;
#pragma unroll
    for (int u = 0; u < kBC; ++u) {
      const int e = u * kThreads + tid, j = e / (N / 8), cc = e % (N / 8);
      uint4 v = make_uint4(0, 0, 0, 0);
      if (j0 + j < c.L) v = load8(Bg + (c.t0 + j0 + j) * p.bc_stride + c.grp * N + 8 * cc, vec);
      *reinterpret_cast<uint4*>(Bs + j * kLdN + 8 * cc) = v;
    }
#pragma unroll
    for (int u = 0; u < kX; ++u) {
      const int e = u * kThreads + tid, j = e / (P / 8), cc = e % (P / 8);
      uint4 v = make_uint4(0, 0, 0, 0);
      if (j0 + j < c.L) v = load8(xg + (c.t0 + j0 + j) * p.x_stride + c.h * P + 8 * cc, vec);
      *reinterpret_cast<uint4*>(Xs + j * kLdP + 8 * cc) = v;
    }
    __syncthreads();

    uint32_t wa[kTile / 16][4];
    {
      float cb[kTile / 8][4];
#pragma unroll
      for (int n = 0; n < kTile / 8; ++n) cb[n][0] = cb[n][1] = cb[n][2] = cb[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < N / 16; ++kk) {
        uint32_t a[4];
        ldsm_x4(a, Cs + (r0 + (lane & 15)) * kLdN + kk * 16 + 8 * (lane >> 4));
#pragma unroll
        for (int np = 0; np < kTile / 16; ++np) {
          if (!diag || np <= warp) {
            uint32_t bq[4];
            ldsm_x4(bq, Bs + (np * 16 + (lane & 7) + 8 * (lane >> 4)) * kLdN + kk * 16 + 8 * ((lane >> 3) & 1));
            mma_bf16(cb[2 * np], a, bq[0], bq[1]);
            mma_bf16(cb[2 * np + 1], a, bq[2], bq[3]);
          }
        }
      }
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        wa[kk][0] = wa[kk][1] = wa[kk][2] = wa[kk][3] = 0u;
        if (!diag || kk <= warp) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int n = 2 * kk + half;
            const int ja = j0 + 8 * n + 2 * t, jb = ja + 1;
            const double ca = cum[ja], cbb = cum[jb];
            const float da = dtv[ja], db = dtv[jb];
            const float w00 = ja <= i_lo ? cb[n][0] * expf(static_cast<float>(ci_lo - ca)) * da : 0.0f;
            const float w01 = jb <= i_lo ? cb[n][1] * expf(static_cast<float>(ci_lo - cbb)) * db : 0.0f;
            const float w10 = ja <= i_hi ? cb[n][2] * expf(static_cast<float>(ci_hi - ca)) * da : 0.0f;
            const float w11 = jb <= i_hi ? cb[n][3] * expf(static_cast<float>(ci_hi - cbb)) * db : 0.0f;
            wa[kk][2 * half] = pack_bf16x2(w00, w01);
            wa[kk][2 * half + 1] = pack_bf16x2(w10, w11);
          }
        }
      }
    }
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      if (!diag || kk <= warp) {
#pragma unroll
        for (int np = 0; np < P / 16; ++np) {
          uint32_t bq[4];
          ldsm_x4_t(bq, Xs + (kk * 16 + (lane & 15)) * kLdP + np * 16 + 8 * (lane >> 4));
          mma_bf16(acc[2 * np], wa[kk], bq[0], bq[1]);
          mma_bf16(acc[2 * np + 1], wa[kk], bq[2], bq[3]);
        }
      }
    }
    if (!diag) __syncthreads();  // Bs and Xs free before the next sub-tile is staged
  }

  // Xs holds the diagonal sub-tile: x of this tile's rows, for the skip term.
#pragma unroll
  for (int n = 0; n < P / 8; ++n) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = r0 + g + 8 * half, pc = 8 * n + 2 * t;
      if (i0 + i < c.L) {
        const float2 xf = unpack_bf16x2(*reinterpret_cast<const uint32_t*>(Xs + i * kLdP + pc));
        const float y0 = acc[n][2 * half] + d_skip * xf.x, y1 = acc[n][2 * half + 1] + d_skip * xf.y;
        bf16* dst = yg + (c.t0 + i0 + i) * p.y_stride + c.h * P + pc;
        if (vec) {
          *reinterpret_cast<uint32_t*>(dst) = pack_bf16x2(y0, y1);
        } else {
          dst[0] = __float2bfloat16_rn(y0);
          dst[1] = __float2bfloat16_rn(y1);
        }
      }
    }
  }
}

}  // namespace ssd_par
}  // namespace hyserve::kernels::cuda_detail
