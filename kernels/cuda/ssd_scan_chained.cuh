#pragma once
// Chunk-parallel SSD scan for bf16 io (f32 or bf16 state) in one kernel: every (chunk, head) is
// an independent block except for the hand-off of the state from one chunk to the next, which
// goes through a small workspace and a flag per warp.
//
// Work item = (global chunk gc, head h), Q = 128 tokens per chunk (chunks per sequence: a
// sequence's last chunk may be short; a live row without tokens has one empty chunk, so that its
// final state is written like any other). Items are claimed by an atomic ticket in chunk-major
// order (ticket = gc·H + h): an item waits only on the item of the same head and the previous
// chunk of the same row, which holds an earlier ticket and is therefore running or done; no
// item waits on a later one, so the chain cannot deadlock whatever the residency.
// Per item, with cum_t = Σ_{s<=t} dt_s·A inside the chunk (double), 8 warps:
//   1. x, B, C of the chunk to shared memory (cp.async, C in its own group: it is needed from
//      step 4); dt, the cumsum, exp(cum_i) and coef_j = exp(cum_end − cum_j)·dt_j.
//   2. S_loc = (coef ∘ X)ᵀ·B (64 × 128 over K = 128 tokens; warp w owns a 32 × 32 tile), f32.
//   3. state hand-off, per warp: S_in = the previous chunk's S_out (wait for its flag), or the
//      slot state (first chunk, has_initial_state) or zeros; S_out = exp(cum_end)·S_in + S_loc
//      goes to the next chunk through the workspace (f32, then a release of the flag), or to
//      the slot in the state type (last chunk of the row). S_in (bf16) to shared memory.
//   4. y_i  = Σ_{j<=i} (C_i·B_j)·exp(cum_i − cum_j)·dt_j·x_j + D·x_i  (each warp owns 16 rows;
//      W in registers as the A operand of W·X).
//   5. y_i += exp(cum_i)·C_i·S_inᵀ, stored as bf16.
// The predecessor of an item holds the ticket H before it, so it started earlier and reaches
// its own hand-off earlier: in the steady state the wait is short, and the serial part per
// chunk is a flag, a 32 KiB f32 read and write through L2 per (chunk, head).
// Estimate at the production shape (T = 16384 tokens, H = 128, P = 64, N = 128, G = 8, bf16 io):
// 16384 items; per item 1888 mma.m16n8k16 (S_loc 512, C·Bᵀ 576 and W·X 288 over the 36 causal
// 16 × 16 blocks, C·S_in 512) ≈ 127 GFLOP in all; DRAM traffic x 256 MiB read, y 256 MiB
// written (B and C are re-read from L2 by the 16 heads of a group; the carries, 8 MiB, stay in
// L2) ≈ 0.13 ms at copy bandwidth. Two blocks of 8 warps per SM (128 registers, 106 KiB of
// shared memory each). The three-kernel path this replaced (chunk states, a state pass, outputs) moved ≈ 1.9 GiB.
// Traffic between L2 and the SMs per item at that shape: x 16 KiB, B and C 64 KiB (16 with
// kOptQuad, 8 with kOptOct), the carry 32 KiB read and 32 KiB written, y 16 KiB: ≈ 2.6 GB per call
// (1.8 with kOptQuad), far above the DRAM traffic; the carry is the largest part left.
// Numerics are those of the sequential kernel (ssd_scan_bf16.cuh): operands of the tensor-core
// products rounded to bf16 (coef·x, the C·Bᵀ weights, S_in), f32 accumulation, f32 chained state.
//
// Workspace per call: info [4] (total chunks, overflow, ticket), chunk_off [batch + 1], flags
// [batch, 2, heads, warps], carry [batch, 2, heads, P·N] f32: two carry slots per row (chunk k
// writes slot k & 1; chunk k + 2 overwrites it only after chunk k + 1, which read it, has
// published). Flags hold k + 1 once chunk k's S_out is in its slot; the host zeroes them.
// Chunk counts are device data: with one block per item the host launches
// kernels.ssd_max_tokens / Q + batch items' blocks, and past that the plan raises the overflow
// flag, the kernel exits at once and the general kernel (gated on the flag) computes the batch;
// the persistent grid takes any count (the workspace is per row).
#include <cuda_bf16.h>

#include <cstdint>

#include "ssd_scan_bf16.cuh"  // mma / ldmatrix helpers, load8
#include "ssm_common.cuh"

namespace hyserve::kernels::cuda_detail {
namespace ssd_chain {

using bf16 = __nv_bfloat16;
using ssd_bf16::ldsm_x4;
using ssd_bf16::ldsm_x4_t;
using ssd_bf16::load8;
using ssd_bf16::mma_bf16;
using ssd_bf16::pack_bf16x2;
using ssd_bf16::unpack_bf16x2;

constexpr int kQ = 128;  // chunk length

// Variant flags of chain_kernel (template argument; 0 is the reference variant).
//   kOptFloatW   the C·Bᵀ weights from f32 cum·log2(e) (one ex2.approx per weight, no double
//                subtraction and conversion per weight; the f32 rounding of cum is far below
//                the bf16 rounding of the weights);
//   kOptOneFence the hand-off publishes with one release by lane 0 after a warp barrier (no
//                fence per thread) and polls the predecessor's flag from lane 0 only;
//   kOptPair, kOptQuad (persistent grid) a ticket claims 2 or 4 consecutive items, which are
//                heads of one chunk and one group when heads and heads per group are multiples
//                of 2 or 4 (the launcher checks): the block computes them in turn and stages only
//                x for all but the first (B and C stay in shared memory). Tickets stay in chunk
//                order, so the chain still waits only on earlier tickets. kOptOct: 8 heads.
//   kOptStoreY   y leaves through shared memory: after a block barrier that ends C·S_in, each
//                warp writes its 16 × P output rows into the S_in tile (free by then; XOR-swizzled
//                16-byte chunks, conflict-free both ways) and stores them as whole 16-byte vectors,
//                full 128-byte rows per 8 lanes (instead of 4-byte stores straight from the mma
//                fragments, eight rows per instruction, half-filled 32-byte sectors), with the
//                streaming hint (y is not read again: it should not push carries, B and C out of L2).
//   kOptPrefetchBC (persistent grid) warp 0 asks L2 for the B and C rows of the next item too when
//                it starts a new claim (with the next item's x, before the intra-chunk products).
//   kOptEarlyInter warps 0-3 (row blocks 0-3, the short intra-chunk rows) add C·S_in before their
//                intra-chunk products, while warps 4-7 still work on theirs; after the barrier
//                only warps 4-7 add it (one warp per scheduler instead of two). Same sums in
//                another order (f32).
//   kOptOneJb    (0x4000) the intra-chunk products take one 16-token block at a time instead of
//                two (fewer live registers: the two-block form spills at the 128-register bound).
// The kAbl* flags leave out a stage to locate the time (benchmarks only: the results are wrong):
// the chain (no wait, no carry read or write), the intra-chunk products, C·S_in, S_loc, the
// staging loads, the y stores.
enum : int {
  kOptFloatW = 1,
  kOptOneFence = 2,
  kOptPair = 4,
  kOptQuad = 8,
  kOptStoreY = 16,
  kOptOct = 32,
  kOptPrefetchBC = 64,
  kOptEarlyInter = 128,
  kOptOneJb = 1 << 14,
  kAblNoChain = 1 << 8,
  kAblNoIntra = 1 << 9,
  kAblNoInter = 1 << 10,
  kAblNoSloc = 1 << 11,
  kAblNoLoad = 1 << 12,
  kAblNoStore = 1 << 13,
};
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kPlanThreads = 1024;
static_assert(kQ == 16 * kWarps && kWarps == 8, "each warp owns 16 token rows (see rb)");

struct workspace {
  int* info = nullptr;       // [0] total chunks, [1] overflow (total > cap), [2] ticket
  int* chunk_off = nullptr;  // [batch + 1]
  int* flags = nullptr;      // [batch, 2, heads, kWarps]
  float* carry = nullptr;    // [batch, 2, heads, P·N] (per warp: its fragment order)
  int cap = 0;
};

// Chunks per row: ceil(len / Q) for live rows (at least one), 0 for padding rows.
__global__ void __launch_bounds__(kPlanThreads) plan_kernel(const ssd_chunk_scan_params p, workspace ws) {
  __shared__ int part[kPlanThreads];
  const int tid = threadIdx.x;
  const int64_t batch = p.batch;
  const int64_t per = (batch + kPlanThreads - 1) / kPlanThreads;
  const int64_t b0 = min(batch, tid * per), b1 = min(batch, b0 + per);
  auto count = [&](int64_t b) -> int {
    if (p.state_indices[b] < 0) return 0;
    const int64_t len = p.query_start_loc[b + 1] - p.query_start_loc[b];
    return len > 0 ? static_cast<int>(min((len + kQ - 1) / kQ, int64_t{1} << 30)) : 1;
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

// Row of global chunk gc: the last b with chunk_off[b] <= gc (rows without chunks share an
// offset with the next row and are skipped because chunk_off[b + 1] > gc must hold).
__device__ __forceinline__ int64_t chunk_row(const int* off, int64_t batch, int gc) {
  int64_t lo = 0, hi = batch;  // off[lo] <= gc < off[hi]
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (__ldg(off + mid) <= gc) lo = mid;
    else hi = mid;
  }
  return lo;
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const uint32_t s = ssd_bf16::smem_u32(smem);
  const int n = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled, nothing is read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most `pending` of this thread's committed groups are still in flight.
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}

__device__ __forceinline__ int ld_acquire(const int* ptr) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(ptr) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(int* ptr, int v) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;\n" ::"l"(ptr), "r"(v) : "memory");
}

// Two bf16 of an mma fragment register times two factors, rounded back to bf16.
__device__ __forceinline__ uint32_t scale2(uint32_t w, float a, float b) {
  const float2 f = unpack_bf16x2(w);
  return pack_bf16x2(f.x * a, f.y * b);
}

template <int P, int N>
struct chain_tiles {
  static constexpr int kLdN = N + 8, kLdP = P + 8;
  static constexpr size_t kBytes = sizeof(double) * (kQ + kWarps) + sizeof(float) * 4 * kQ +
                                   sizeof(bf16) * static_cast<size_t>(kQ * kLdP + 2 * kQ * kLdN + P * kLdN);
};

// A work item's place: row, chunk of the row, tokens, head and its group, state slot.
struct item_geom {
  int64_t b, h, grp, t0, slot;
  int k, L;
  int first, last, init;  // chunk 0 of the row, its last chunk, the row has an initial state
  int valid;              // 0: no item (ticket past the last one)
  int reuse;              // B and C are those of the block's previous item (kOptPair / kOptQuad / kOptOct)
  int64_t item;
};

__device__ __forceinline__ item_geom resolve_item(const ssd_chunk_scan_params& p, const workspace& ws, int64_t item,
                                                  int64_t n_items) {
  item_geom c{};
  c.item = item;
  c.valid = item < n_items;
  if (!c.valid) return c;
  const int64_t H = p.heads;
  const int gc = static_cast<int>(item / H);
  c.h = item % H;
  c.grp = c.h / (H / p.n_groups);
  c.b = chunk_row(ws.chunk_off, p.batch, gc);
  const int off = __ldg(ws.chunk_off + c.b), n_chunks = __ldg(ws.chunk_off + c.b + 1) - off;
  c.k = gc - off;
  const int64_t start = p.query_start_loc[c.b];
  const int64_t len = p.query_start_loc[c.b + 1] - start;
  c.t0 = start + static_cast<int64_t>(c.k) * kQ;
  c.L = static_cast<int>(max(int64_t{0}, min(static_cast<int64_t>(kQ), len - static_cast<int64_t>(c.k) * kQ)));
  c.first = c.k == 0;
  c.last = c.k + 1 == n_chunks;
  c.slot = p.state_indices[c.b];  // live row: padding rows have no chunks
  c.init = p.has_initial_state != nullptr && p.has_initial_state[c.b] != 0;
  return c;
}

// kPersist = false: one item per block (grid = reserved items). kPersist = true: a persistent
// grid; each block claims its next item while computing the current one, stages the next
// item's x and B once the current one is done with them (after the intra-chunk products) and
// its C at the end, so that the loads overlap the C·S_in product, the stores of y and the next
// item's cumsum.
__device__ __forceinline__ float ex2_approx(float v) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(v));
  return r;
}

template <class TS, int P, int N, bool kPersist, int kFlags = 0>
__global__ void __launch_bounds__(kThreads, 2)
    chain_kernel(const ssd_chunk_scan_params p, const workspace ws, bool vec) {
  constexpr bool kFloatW = (kFlags & kOptFloatW) != 0, kOneFence = (kFlags & kOptOneFence) != 0;
  constexpr bool kNoChain = (kFlags & kAblNoChain) != 0, kNoIntra = (kFlags & kAblNoIntra) != 0;
  constexpr bool kNoInter = (kFlags & kAblNoInter) != 0, kNoSloc = (kFlags & kAblNoSloc) != 0;
  constexpr bool kNoLoad = (kFlags & kAblNoLoad) != 0, kNoStore = (kFlags & kAblNoStore) != 0;
  // The y tile [Q][P] must fit the S_in tile [P][N + 8] (N >= 120); else direct stores.
  constexpr bool kStoreY = (kFlags & kOptStoreY) != 0 && kQ <= N + 8;
  constexpr bool kPfBC = (kFlags & kOptPrefetchBC) != 0, kEarlyInter = (kFlags & kOptEarlyInter) != 0;
  constexpr bool kOneJb = (kFlags & kOptOneJb) != 0;
  static_assert(!kStoreY || P % 64 == 0, "the swizzle spans 8 chunks of 16 bytes per row");
  constexpr int kClaim = !kPersist                    ? 1
                         : (kFlags & kOptOct) != 0  ? 8
                         : (kFlags & kOptQuad) != 0 ? 4
                         : (kFlags & kOptPair) != 0 ? 2
                                                    : 1;
  using tl = chain_tiles<P, N>;
  constexpr int kLdN = tl::kLdN, kLdP = tl::kLdP;
  constexpr int PW = P / 2, NW = N / 4, MT = PW / 16, NT = NW / 8;  // S tile of a warp: PW × NW
  constexpr int kWarpState = P * N / kWarps;                          // floats of S per warp
  constexpr int kX = kQ * P / 8 / kThreads, kBC = kQ * N / 8 / kThreads;
  static_assert(kX * kThreads * 8 == kQ * P && kBC * kThreads * 8 == kQ * N, "whole load batches");
  static_assert(PW % 16 == 0 && NT % 2 == 0 && P % 16 == 0 && N % 16 == 0, "whole mma tiles");
  static_assert(MT * NT * 4 * 32 == kWarpState, "the warps' S tiles cover S");

  extern __shared__ double smem_d[];
  double* cum = smem_d;                                  // [Q]
  double* wsum = cum + kQ;                               // [warps]
  float* dtv = reinterpret_cast<float*>(wsum + kWarps);  // [Q] step sizes (0 past L)
  float* coef = dtv + kQ;                                // [Q] exp(cum_end − cum_j)·dt_j
  float* ecum = coef + kQ;                               // [Q] exp(cum_i)
  float* lcum = ecum + kQ;                               // [Q] cum_i·log2(e) (kOptFloatW)
  bf16* Xs = reinterpret_cast<bf16*>(lcum + kQ);         // [Q][kLdP] x of the chunk
  bf16* Bs = Xs + kQ * kLdP;                             // [Q][kLdN]
  bf16* Cs = Bs + kQ * kLdN;                             // [Q][kLdN]
  bf16* Ss = Cs + kQ * kLdN;                             // [P][kLdN] S_in (bf16)
  __shared__ item_geom geo[2];                           // current item and the next one

  if (ws.info[1] != 0) return;  // overflow: the general kernel computes the batch
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int64_t H = p.heads;
  const int64_t n_items = static_cast<int64_t>(ws.info[0]) * H;
  const bf16* xg = static_cast<const bf16*>(p.x);
  const bf16* dtg = static_cast<const bf16*>(p.dt);
  const bf16* Bg = static_cast<const bf16*>(p.B);
  const bf16* Cg = static_cast<const bf16*>(p.C);
  bf16* yg = static_cast<bf16*>(p.y);

  // Staging of an item's x and B, and of its C (rows past L zero); raw dt of token tid.
  auto stage_x = [&](const item_geom& c) {
    if constexpr (kNoLoad) return;
    else {
#pragma unroll
    for (int u = 0; u < kX; ++u) {
      const int e = u * kThreads + tid, j = e / (P / 8), cc = e % (P / 8);
      bf16* dst = Xs + j * kLdP + 8 * cc;
      const bool in = j < c.L;
      if (vec) {
        cp_async16(dst, in ? xg + (c.t0 + j) * p.x_stride + c.h * P + 8 * cc : xg, in);
      } else {
        *reinterpret_cast<uint4*>(dst) =
            in ? load8(xg + (c.t0 + j) * p.x_stride + c.h * P + 8 * cc, false) : make_uint4(0, 0, 0, 0);
      }
    }
    }
  };
  // The item's rows of B or C (global src, the group's N columns) into smem (B and C tile alike).
  auto stage_bc = [&](const item_geom& c, bf16* sm, const bf16* src) {
    if constexpr (kNoLoad) return;
    else {
#pragma unroll
    for (int u = 0; u < kBC; ++u) {
      const int e = u * kThreads + tid, j = e / (N / 8), cc = e % (N / 8);
      bf16* dst = sm + j * kLdN + 8 * cc;
      const bool in = j < c.L;
      const int64_t off = in ? (c.t0 + j) * p.bc_stride + c.grp * N + 8 * cc : 0;
      if (vec) cp_async16(dst, src + off, in);
      else *reinterpret_cast<uint4*>(dst) = in ? load8(src + off, false) : make_uint4(0, 0, 0, 0);
    }
    }
  };
  auto stage_b = [&](const item_geom& c) { stage_bc(c, Bs, Bg); };
  auto stage_c = [&](const item_geom& c) { stage_bc(c, Cs, Cg); };
  auto stage_xb = [&](const item_geom& c) {
    stage_x(c);
    if (!c.reuse) stage_b(c);
  };
  auto load_dt = [&](const item_geom& c) -> float {
    if constexpr (kNoLoad) return 0.5f;
    return tid < c.L ? __bfloat162float(dtg[(c.t0 + tid) * p.dt_stride + c.h]) : 0.0f;
  };

  if (tid == 0) geo[0] = resolve_item(p, ws, static_cast<int64_t>(atomicAdd(ws.info + 2, 1)) * kClaim, n_items);
  __syncthreads();
  if (!geo[0].valid) return;  // spare block
  stage_xb(geo[0]);
  cp_async_commit();
  stage_c(geo[0]);
  cp_async_commit();
  float dt_raw = load_dt(geo[0]);

  // The item's fields are read from shared memory where used (fewer live registers).
  for (int ci = 0;; ci ^= 1) {
    const item_geom& c = geo[ci];
    const bool carry = kNoChain || !c.first || c.init;  // false: S_in is zero
    const double A = -exp(static_cast<double>(p.A_log[c.h]));
    const float d_skip = p.D != nullptr ? p.D[c.h] : 0.0f;
    const int L = c.L;

    // 1. dt and the inclusive cumsum of dt·A in double (thread tid < Q owns token tid); the
    //    staged tiles land.
    double run = 0.0;
    if (tid < kQ) {
      const float d = tid < L ? step_size(p, dt_raw, c.h) : 0.0f;
      dtv[tid] = d;
      run = static_cast<double>(d) * A;
    }
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double v = __shfl_up_sync(0xffffffffu, run, o);
      if (lane >= o) run += v;
    }
    if (lane == 31) wsum[warp] = run;
    cp_async_wait<1>();  // x and B landed (C may still be in flight: it is needed from step 4)
    __syncthreads();
    if (tid < kQ) {
      for (int w = 0; w < warp; ++w) run += wsum[w];
      cum[tid] = run;
    }
    __syncthreads();
    const double cum_end = cum[kQ - 1];  // = cum[L - 1]: dt is 0 past L
    if (tid < kQ) {
      ecum[tid] = static_cast<float>(exp(cum[tid]));
      coef[tid] = static_cast<float>(exp(cum_end - cum[tid])) * dtv[tid];
      if constexpr (kFloatW) lcum[tid] = static_cast<float>(cum[tid] * 1.4426950408889634);
    }
    __syncthreads();

    // 2. S_loc of this warp's tile: rows pw0 + [0, PW), columns nw0 + [0, NW).
    //    A(p, j) = x_j[p]·coef_j (.trans from Xs, scaled in registers), B(j, n) = Bs[j][n] (.trans).
    const int pw0 = PW * (warp / 4), nw0 = NW * (warp % 4);
    float sl[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) sl[mt][nt][0] = sl[mt][nt][1] = sl[mt][nt][2] = sl[mt][nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kQ / 16; ++kk) {
      if (!kNoSloc && kk * 16 < L) {
        const int j0 = 16 * kk;
        const float ca0 = coef[j0 + 2 * t], ca1 = coef[j0 + 2 * t + 1];
        const float cb0 = coef[j0 + 2 * t + 8], cb1 = coef[j0 + 2 * t + 9];
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          ldsm_x4_t(a[mt], Xs + (j0 + (lane & 7) + 8 * (lane >> 4)) * kLdP + pw0 + 16 * mt + 8 * ((lane >> 3) & 1));
          // a0, a1: tokens j0 + 2t, +1; a2, a3: tokens j0 + 2t + 8, +9.
          a[mt][0] = scale2(a[mt][0], ca0, ca1);
          a[mt][1] = scale2(a[mt][1], ca0, ca1);
          a[mt][2] = scale2(a[mt][2], cb0, cb1);
          a[mt][3] = scale2(a[mt][3], cb0, cb1);
        }
#pragma unroll
        for (int ntp = 0; ntp < NT / 2; ++ntp) {
          uint32_t bq[4];
          ldsm_x4_t(bq, Bs + (j0 + (lane & 15)) * kLdN + nw0 + 16 * ntp + 8 * (lane >> 4));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_bf16(sl[mt][2 * ntp], a[mt], bq[0], bq[1]);
            mma_bf16(sl[mt][2 * ntp + 1], a[mt], bq[2], bq[3]);
          }
        }
      }
    }

    // 3. State hand-off of this warp's tile (before the intra-chunk products: S_loc is then dead
    //    and its registers free for them).
    {
      const float total = static_cast<float>(exp(cum_end));
      TS* state = static_cast<TS*>(p.ssm_states) + (c.slot * H + c.h) * static_cast<int64_t>(P) * N;
      float si[MT][NT][4];
      if (kNoChain && !c.first) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) si[mt][nt][0] = si[mt][nt][1] = si[mt][nt][2] = si[mt][nt][3] = 0.0f;
      } else if (c.first) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int pr = pw0 + 16 * mt + g + 8 * half, nc = nw0 + 8 * nt + 2 * t;
              const float2 v =
                  c.init ? load_state2(state + static_cast<int64_t>(pr) * N + nc) : make_float2(0.0f, 0.0f);
              si[mt][nt][2 * half] = v.x;
              si[mt][nt][2 * half + 1] = v.y;
            }
      } else {
        const int64_t prev = (c.b * 2 + ((c.k - 1) & 1)) * H + c.h;
        const int* flag = ws.flags + prev * kWarps + warp;
        // A predecessor publishes within microseconds; a wait of seconds is a bug: fail the
        // launch loudly instead of hanging the device.
        if constexpr (kOneFence) {
          if (lane == 0) {
            for (uint32_t spins = 0; ld_acquire(flag) < c.k; ++spins) {
              if (spins == (1u << 22)) __trap();
              __nanosleep(40);
            }
          }
          __syncwarp();  // the other lanes' reads follow lane 0's acquire
        } else {
          for (uint32_t spins = 0; ld_acquire(flag) < c.k; ++spins) {
            if (spins == (1u << 22)) __trap();
            __nanosleep(40);
          }
        }
        const float4* src = reinterpret_cast<const float4*>(ws.carry + prev * P * N + warp * kWarpState);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const float4 v = __ldcg(src + (mt * NT + nt) * 32 + lane);
            si[mt][nt][0] = v.x;
            si[mt][nt][1] = v.y;
            si[mt][nt][2] = v.z;
            si[mt][nt][3] = v.w;
          }
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) sl[mt][nt][e] = total * si[mt][nt][e] + sl[mt][nt][e];  // S_out
      if (c.last) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int pr = pw0 + 16 * mt + g + 8 * half, nc = nw0 + 8 * nt + 2 * t;
              store_state2(state + static_cast<int64_t>(pr) * N + nc,
                           make_float2(sl[mt][nt][2 * half], sl[mt][nt][2 * half + 1]));
            }
      } else if (!kNoChain) {
        const int64_t cur = (c.b * 2 + (c.k & 1)) * H + c.h;
        float4* dst = reinterpret_cast<float4*>(ws.carry + cur * P * N + warp * kWarpState);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
            __stcg(dst + (mt * NT + nt) * 32 + lane,
                   make_float4(sl[mt][nt][0], sl[mt][nt][1], sl[mt][nt][2], sl[mt][nt][3]));
        if constexpr (!kOneFence) __threadfence();
        __syncwarp();  // kOneFence: the warp's carry stores precede lane 0's release (cumulative)
        if (lane == 0) st_release(ws.flags + cur * kWarps + warp, c.k + 1);
      }
      if (carry) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int pr = pw0 + 16 * mt + g + 8 * half, nc = nw0 + 8 * nt + 2 * t;
              *reinterpret_cast<uint32_t*>(Ss + pr * kLdN + nc) =
                  pack_bf16x2(si[mt][nt][2 * half], si[mt][nt][2 * half + 1]);
            }
      }
    }
    cp_async_wait<0>();  // C landed
    __syncthreads();
    if constexpr (kPersist) {
      // The next item, claimed and resolved by lane 0 of warp 0 (one intra-chunk block to do,
      // while warp 4 on its scheduler does eight) and read after the barrier that ends step 4.
      // Warp 0 also asks L2 for the next item's x (one 128-byte line per token row at the
      // production shape), so that its staging reads L2 rather than DRAM; B and C are shared by
      // the group's heads and mostly in L2 already.
      if (warp == 0) {
        if (lane == 0) {
          int64_t next = c.item + 1;  // the rest of this claim, then a new ticket
          const bool same = kClaim > 1 && next % kClaim != 0;
          if (!same) next = static_cast<int64_t>(atomicAdd(ws.info + 2, 1)) * kClaim;
          geo[ci ^ 1] = resolve_item(p, ws, next, n_items);
          geo[ci ^ 1].reuse = same;
        }
        __syncwarp();
        const item_geom& q = geo[ci ^ 1];
        if (q.valid) {
          for (int j = lane; j < q.L; j += 32) {
            const bf16* row = xg + (q.t0 + j) * p.x_stride + q.h * P;
#pragma unroll
            for (int o = 0; o < P * 2; o += 128) prefetch_l2(reinterpret_cast<const char*>(row) + o);
          }
          if constexpr (kPfBC) {
            if (!q.reuse) {  // a new claim: its B and C too (its group's first claim reads DRAM)
              for (int j = lane; j < q.L; j += 32) {
                const int64_t off = (q.t0 + j) * p.bc_stride + q.grp * N;
#pragma unroll
                for (int o = 0; o < N * 2; o += 128) {
                  prefetch_l2(reinterpret_cast<const char*>(Bg + off) + o);
                  prefetch_l2(reinterpret_cast<const char*>(Cg + off) + o);
                }
              }
            }
          }
        }
      }
    }

    // 4. Intra-chunk y of rows [r0, r0 + 16), r0 = 16·rb: W·X over the 16-token blocks jb <= rb,
    //    two blocks at a time (independent mma chains). Row block rb = w for warps 0-3 and
    //    11 − w for warps 4-7: warps w and w + 4 share a scheduler and together do 9 of the 36
    //    blocks, whichever w.
    const int rb = warp < 4 ? warp : 11 - warp;
    const int r0 = 16 * rb;
    const int i_lo = r0 + g, i_hi = i_lo + 8;
    float acc[P / 8][4];
#pragma unroll
    for (int n = 0; n < P / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    // acc += exp(cum_i)·C_i·S_inᵀ for the warp's rows (step 5; kOptEarlyInter: warps 0-3 here).
    auto add_inter = [&]() {
      float a2[P / 8][4];
#pragma unroll
      for (int n = 0; n < P / 8; ++n) a2[n][0] = a2[n][1] = a2[n][2] = a2[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < N / 16; ++kk) {
        uint32_t a[4];
        ldsm_x4(a, Cs + (r0 + (lane & 15)) * kLdN + kk * 16 + 8 * (lane >> 4));
#pragma unroll
        for (int np = 0; np < P / 16; ++np) {
          uint32_t bq[4];
          ldsm_x4(bq, Ss + (np * 16 + (lane & 7) + 8 * (lane >> 4)) * kLdN + kk * 16 + 8 * ((lane >> 3) & 1));
          mma_bf16(a2[2 * np], a, bq[0], bq[1]);
          mma_bf16(a2[2 * np + 1], a, bq[2], bq[3]);
        }
      }
      const float e_lo = ecum[i_lo], e_hi = ecum[i_hi];
#pragma unroll
      for (int n = 0; n < P / 8; ++n) {
        acc[n][0] += e_lo * a2[n][0];
        acc[n][1] += e_lo * a2[n][1];
        acc[n][2] += e_hi * a2[n][2];
        acc[n][3] += e_hi * a2[n][3];
      }
    };
    const bool early_inter = kEarlyInter && warp < 4;  // warp-uniform
    if (r0 < L) {
      if (early_inter && !kNoInter && carry) add_inter();
      const double ci_lo = cum[i_lo], ci_hi = cum[i_hi];
      [[maybe_unused]] const float li_lo = lcum[i_lo], li_hi = lcum[i_hi];
      // W of block j0 from its C·Bᵀ fragment, as the A operand of W·X.
      auto weights = [&](const float (&cb)[2][4], int j0, uint32_t (&wa)[4]) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int ja = j0 + 8 * half + 2 * t, jb2 = ja + 1;
          const float da = dtv[ja], db = dtv[jb2];
          if constexpr (kFloatW) {
            const float la = lcum[ja], lb = lcum[jb2];
            const float w00 = ja <= i_lo ? cb[half][0] * ex2_approx(li_lo - la) * da : 0.0f;
            const float w01 = jb2 <= i_lo ? cb[half][1] * ex2_approx(li_lo - lb) * db : 0.0f;
            const float w10 = ja <= i_hi ? cb[half][2] * ex2_approx(li_hi - la) * da : 0.0f;
            const float w11 = jb2 <= i_hi ? cb[half][3] * ex2_approx(li_hi - lb) * db : 0.0f;
            wa[2 * half] = pack_bf16x2(w00, w01);
            wa[2 * half + 1] = pack_bf16x2(w10, w11);
            continue;
          }
          const double ca = cum[ja], cbb = cum[jb2];
          const float w00 = ja <= i_lo ? cb[half][0] * expf(static_cast<float>(ci_lo - ca)) * da : 0.0f;
          const float w01 = jb2 <= i_lo ? cb[half][1] * expf(static_cast<float>(ci_lo - cbb)) * db : 0.0f;
          const float w10 = ja <= i_hi ? cb[half][2] * expf(static_cast<float>(ci_hi - ca)) * da : 0.0f;
          const float w11 = jb2 <= i_hi ? cb[half][3] * expf(static_cast<float>(ci_hi - cbb)) * db : 0.0f;
          wa[2 * half] = pack_bf16x2(w00, w01);
          wa[2 * half + 1] = pack_bf16x2(w10, w11);
        }
      };
      for (int jb = 0; jb <= (kNoIntra ? -1 : rb); jb += kOneJb ? 1 : 2) {
        const bool two = !kOneJb && jb + 1 <= rb;  // warp-uniform
        const int j0 = 16 * jb, j1 = j0 + 16;
        float cb0[2][4], cb1[2][4];
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          cb0[n][0] = cb0[n][1] = cb0[n][2] = cb0[n][3] = 0.0f;
          cb1[n][0] = cb1[n][1] = cb1[n][2] = cb1[n][3] = 0.0f;
        }
#pragma unroll
        for (int kk = 0; kk < N / 16; ++kk) {
          uint32_t a[4], bq[4];
          ldsm_x4(a, Cs + (r0 + (lane & 15)) * kLdN + kk * 16 + 8 * (lane >> 4));
          ldsm_x4(bq, Bs + (j0 + (lane & 7) + 8 * (lane >> 4)) * kLdN + kk * 16 + 8 * ((lane >> 3) & 1));
          mma_bf16(cb0[0], a, bq[0], bq[1]);
          mma_bf16(cb0[1], a, bq[2], bq[3]);
          if (two) {
            uint32_t bq1[4];
            ldsm_x4(bq1, Bs + (j1 + (lane & 7) + 8 * (lane >> 4)) * kLdN + kk * 16 + 8 * ((lane >> 3) & 1));
            mma_bf16(cb1[0], a, bq1[0], bq1[1]);
            mma_bf16(cb1[1], a, bq1[2], bq1[3]);
          }
        }
        uint32_t wa0[4], wa1[4];
        weights(cb0, j0, wa0);
        if (two) weights(cb1, j1, wa1);
#pragma unroll
        for (int np = 0; np < P / 16; ++np) {
          uint32_t bq[4];
          ldsm_x4_t(bq, Xs + (j0 + (lane & 15)) * kLdP + np * 16 + 8 * (lane >> 4));
          mma_bf16(acc[2 * np], wa0, bq[0], bq[1]);
          mma_bf16(acc[2 * np + 1], wa0, bq[2], bq[3]);
        }
        if (two) {
#pragma unroll
          for (int np = 0; np < P / 16; ++np) {
            uint32_t bq[4];
            ldsm_x4_t(bq, Xs + (j1 + (lane & 15)) * kLdP + np * 16 + 8 * (lane >> 4));
            mma_bf16(acc[2 * np], wa1, bq[0], bq[1]);
            mma_bf16(acc[2 * np + 1], wa1, bq[2], bq[3]);
          }
        }
      }
      // The skip term D·x_i while Xs still holds this item's x.
#pragma unroll
      for (int n = 0; n < P / 8; ++n) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = r0 + g + 8 * half, pc = 8 * n + 2 * t;
          const float2 xf = unpack_bf16x2(*reinterpret_cast<const uint32_t*>(Xs + i * kLdP + pc));
          acc[n][2 * half] += d_skip * xf.x;
          acc[n][2 * half + 1] += d_skip * xf.y;
        }
      }
    }

    __syncthreads();  // Ss complete; every warp is done with Xs and Bs; the next item is resolved
    const item_geom& nx = geo[ci ^ 1];
    if constexpr (kPersist) {
      if (nx.valid) {
        stage_xb(nx);  // lands while C·S_in runs and the next item starts
        cp_async_commit();
        dt_raw = load_dt(nx);
      }
    }

    // 5. y rows += exp(cum_i)·C_i·S_inᵀ (the skip term is in already), stored.
    if (r0 < L) {
      if (!early_inter && !kNoInter && carry) add_inter();
    }
    if (kStoreY && vec) {
      // Every warp is done with Ss (C·S_in); warp rows [r0, r0 + 16) go to Ss as [Q][P] bf16,
      // 16-byte chunk c of row i at chunk c ^ (i & 7), then out as 16-byte vectors.
      __syncthreads();
      bf16* Ys = Ss + r0 * P;
#pragma unroll
      for (int n = 0; n < P / 8; ++n) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int ri = g + 8 * half;
          *reinterpret_cast<uint32_t*>(Ys + ri * P + 8 * (n ^ (ri & 7)) + 2 * t) =
              pack_bf16x2(acc[n][2 * half], acc[n][2 * half + 1]);
        }
      }
      __syncwarp();
      constexpr int kChunks = P / 8, kRowsPer = 32 / kChunks;  // 16-byte chunks per row, rows per pass
      static_assert(32 % kChunks == 0 && 16 % kRowsPer == 0, "whole rows per pass");
      const int cc = lane % kChunks;
#pragma unroll
      for (int u = 0; u < 16 / kRowsPer; ++u) {
        const int ri = u * kRowsPer + lane / kChunks, i = r0 + ri;
        if (!kNoStore && i < L) {
          const uint4 v = *reinterpret_cast<const uint4*>(Ys + ri * P + 8 * (cc ^ (ri & 7)));
          __stcs(reinterpret_cast<uint4*>(yg + (c.t0 + i) * p.y_stride + c.h * P + 8 * cc), v);  // streamed
        }
      }
    } else if (r0 < L) {
#pragma unroll
      for (int n = 0; n < P / 8; ++n) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = r0 + g + 8 * half, pc = 8 * n + 2 * t;
          if (!kNoStore && i < L) {
            const float y0 = acc[n][2 * half], y1 = acc[n][2 * half + 1];
            bf16* dst = yg + (c.t0 + i) * p.y_stride + c.h * P + pc;
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

    if constexpr (!kPersist) {
      break;
    } else {
      if (!nx.valid) break;
      __syncthreads();  // Cs, Ss, cum and the rest are free; every thread is done with c
      if (!nx.reuse) stage_c(nx);
      cp_async_commit();
    }
  }
}

}  // namespace ssd_chain
}  // namespace hyserve::kernels::cuda_detail
