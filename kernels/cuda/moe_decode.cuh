#pragma once
// The routed-experts op's decode path (moe.cu, the only includer; internal linkage): bf16
// weights, fast mode, up to kDecodeMaxTokens tokens and tokens · top_k <= kDecodeMaxRows pairs,
// with its shared expert, in two kernels instead of four for the routed experts (prepare, GEMV
// 1, GEMV 2, combine: moe.cu, moe_gemm.cuh) and two to four for the shared expert:
//   up:   tasks over as many blocks as are resident at once (block b: tasks b, b + grid, …;
//         a block routes once, however many routed tasks it has). The blocks with routed tasks
//         each route all the tokens themselves (route_token, a warp a token, into shared memory)
//         and order the (token, slot) pairs by expert, ties by pair index: the same order in
//         every block, without atomics. Routed task b takes the active
//         expert b / ceil(inter / 8) (ascending index) and 8 of its outputs, a warp each:
//         act[row] = bf16(silu(x_t · gate_eᵀ) ⊙ (x_t · up_eᵀ)), x rounded to bf16 as it is read.
//         Block 0 also writes the routing (each pair's expert, weight and row) for the down
//         kernel and the caller's topk outputs. The tasks after the routed ones take 8 outputs
//         of the shared expert (silu(x_t · gateᵀ) ⊙ (x_t · upᵀ) in f32, x unrounded, every
//         token) and, gated, one more: the gate's x_t · gate_wᵀ. One token takes a variant with
//         one activation row (a warp's whole row pair in flight). The shared expert's rows are
//         fetched into L2 before the wait for the router. (Fetching the active experts' down
//         rows into L2 at the end, for the down kernel, measured 1% slower a step:
//         bench/results/2026-12-06-h100-run34.md.)
//   down: block (t, y): token t and tiles of 8 output columns (y, y + grid.y, …: the grid is
//         what is resident at once, two blocks an SM), a warp a column; for each of t's experts in
//         ascending index order, y_e = act[row(t, e)] · down_e[col]ᵀ, and
//         out[t, col] (= or +=) Σ w_e · y_e, added in that order; then the shared expert's
//         ys = act_shared[t] · down_shared[col]ᵀ, added as ys + out (ungated) or
//         fma(sigmoid(gl_t), ys, out) (gated). The shared expert's down rows are fetched into L2
//         before the kernel waits for the up kernel.
// Every value is computed with the arithmetic of the ops it replaces: the GEMV kernel's
// (moe_gemm.cuh: lane l takes the 16-byte chunks l, l + 32, … in order, fmaf over their 8
// elements, then warp_sum) and the combine kernel's for the routed experts; the skinny kernels'
// (the same chunk order and reduction on f32 activations) and the gemm epilogue's or row_add's
// for the shared expert. So the results are those of the split path bit for bit
// (kernels.moe_decode: split; test CudaMoe.FusedDecodeIsTheSplitPathBitForBit). What the fusion
// saves is up to six dependent kernel boundaries a layer, the scratch copy of x in bf16 and the
// f32 rows of the down projections.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <vector>

#include "common.cuh"
#include "gemm_paths.h"
#include "hyserve/kernels/moe.h"
#include "hyserve/kernels/paths.h"
#include "launch.cuh"
#include "moe_route.cuh"
#include "stream_alloc.h"

namespace hyserve::kernels::cuda_detail {
namespace {

constexpr int kDecodeWarps = 8, kDecodeThreads = 32 * kDecodeWarps;
constexpr int64_t kDecodeMaxTokens = kDecodeWarps;  // a routing warp a token
// Tokens the default (kernels.moe_decode: default) takes the fused path for. The down kernel
// reads the down rows (and the shared expert's) once per token, where the split path's GEMV
// reads an expert's rows once for all its tokens. Measured, graph decode steps, fused against
// split: Granite-4.0-H-Tiny (64 experts) on the H100, batch 1 2.305 against 2.653 ms, batch 8
// 9.150 against 7.927 ms (bench/results/2026-12-06-h100-run30.md); the Qwen3-Next-80B-A3B
// shape (512 experts: a few tokens rarely share one), 16 layers, on the H200, batch 2 2.079
// against 2.392 ms, batch 4 3.416 against 3.757, batch 8 6.209 against 6.151
// (bench/results/2026-12-06-h200-run33.md). So: one token, or up to 4 with at least 256
// experts. kernels.moe_decode: fused takes it up to kDecodeMaxTokens.
constexpr int64_t kDecodeDefaultMaxTokens = 1;
constexpr int64_t kDecodeDefaultManyExpertsMaxTokens = 4, kDecodeManyExperts = 256;
constexpr int kDecodeMaxRows = 64;                  // (token, slot) pairs
constexpr int64_t kDecodeMaxExperts = 1024;
constexpr int kDecodeMaxChunksPerLane = 4;  // the down kernel: inter <= 32 · 4 · 8 = 1024
constexpr size_t kDecodeMaxActBytes = 48 * 1024;  // the down kernel's staged routed act rows of a token
constexpr size_t kDecodeMaxSmem = 160 * 1024;     // the down kernel's staged rows, routed and shared

struct decode_args {
  route_args route;  // logits, sizes, scoring; its ids / wts / counts are the kernels' own
  const float* x = nullptr;
  int64_t x_stride = 0;
  const __nv_bfloat16* gate_up = nullptr;  // [experts, 2·inter, hidden]
  const __nv_bfloat16* down = nullptr;     // [experts, hidden, inter]
  int64_t hidden = 0, inter = 0;
  __nv_bfloat16* act = nullptr;  // [pairs, inter]: scratch
  int32_t* ids = nullptr;        // [pairs]: each pair's expert (scratch)
  float* wts = nullptr;          // [pairs]: its weight (scratch)
  int32_t* rows = nullptr;       // [pairs]: its row of act (scratch)
  float* out = nullptr;
  int64_t out_stride = 0;
  bool accumulate = false;
  int64_t routed_blocks = 0;  // the up kernel's blocks of routed experts (the shared expert's after)
  // The shared expert (s_inter 0: none): weights, and the scratch of its f32 act [tokens,
  // s_inter] and gate values [tokens] (gated: s_gate_w set).
  const __nv_bfloat16* s_gate = nullptr;
  const __nv_bfloat16* s_up = nullptr;
  const __nv_bfloat16* s_down = nullptr;  // [hidden, s_inter]
  const __nv_bfloat16* s_gate_w = nullptr;  // [hidden]
  int64_t s_inter = 0;
  float* s_act = nullptr;
  float* s_gl = nullptr;
};

// acc[s][rr] = x_rr · w_sᵀ over k / 8 16-byte chunks of the bf16 weight rows w[s], for nr <= NR
// f32 activation rows x[rr] (rounded to bf16 as read when kRound): lane l takes the chunks l,
// l + 32, … in order, U of them a row in flight, fmaf over their 8 elements, then warp_sum: the
// moe GEMV's arithmetic (kRound) and the skinny kernels' (f32 activations), whatever NR and U.
// kLdg: x in global memory (read-only loads), else in shared memory.
template <int S, bool kRound, bool kLdg = true, int NR = 4, int U = 4>
__device__ __forceinline__ void dot_rows(const uint4* const (&w)[S], const float4* const (&x)[NR], int nr,
                                         int64_t chunks, int lane, float (&acc)[S][NR]) {
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int rr = 0; rr < NR; ++rr) acc[s][rr] = 0.0f;
  for (int64_t c0 = lane; c0 < chunks; c0 += 32 * U) {
    uint4 wv[U][S];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + 32 * u;
#pragma unroll
      for (int s = 0; s < S; ++s) wv[u][s] = c < chunks ? __ldcs(w[s] + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + 32 * u;
      if (c >= chunks) break;
#pragma unroll
      for (int rr = 0; rr < NR; ++rr) {
        if (rr >= nr) break;
        const float4 x0 = kLdg ? __ldg(x[rr] + 2 * c) : x[rr][2 * c];
        const float4 x1 = kLdg ? __ldg(x[rr] + 2 * c + 1) : x[rr][2 * c + 1];
        float xf[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        if constexpr (kRound) {
#pragma unroll
          for (int i = 0; i < 8; ++i) xf[i] = __bfloat162float(__float2bfloat16(xf[i]));
        }
#pragma unroll
        for (int s = 0; s < S; ++s) {
          float wf[8];
          bf16x8_to_float(wv[u][s], wf);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[s][rr] = fmaf(xf[i], wf[i], acc[s][rr]);
        }
      }
    }
  }
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int rr = 0; rr < NR; ++rr) acc[s][rr] = warp_sum(acc[s][rr]);
}

// The up kernel's shared-expert block b: outputs j = 8·b + warp of every token (j = s_inter:
// the gate's x · gate_wᵀ), NR tokens at a time, U chunks of a row in flight.
template <int NR, int U>
__device__ __forceinline__ void shared_up_block(const decode_args& d, int64_t b, int warp, int lane) {
  const int64_t j = b * kDecodeWarps + warp;
  const bool gate_row = d.s_gate_w != nullptr && j == d.s_inter;
  if (j >= d.s_inter && !gate_row) return;
  const int T = static_cast<int>(d.route.tokens);
  const int64_t chunks = d.hidden / 8;
  for (int t0 = 0; t0 < T; t0 += NR) {
    const int nr = min(NR, T - t0);
    const float4* xr[NR];
#pragma unroll
    for (int rr = 0; rr < NR; ++rr) xr[rr] = reinterpret_cast<const float4*>(d.x + (t0 + (rr < nr ? rr : 0)) * d.x_stride);
    if (gate_row) {
      const uint4* w[1] = {reinterpret_cast<const uint4*>(d.s_gate_w)};
      float acc[1][NR];
      dot_rows<1, false, true, NR, U>(w, xr, nr, chunks, lane, acc);
      if (lane == 0)
        for (int rr = 0; rr < nr; ++rr) d.s_gl[t0 + rr] = acc[0][rr];  // the gemm epilogue: 1 · acc
    } else {
      const uint4* w[2] = {reinterpret_cast<const uint4*>(d.s_gate + j * d.hidden),
                           reinterpret_cast<const uint4*>(d.s_up + j * d.hidden)};
      float acc[2][NR];
      dot_rows<2, false, true, NR, U>(w, xr, nr, chunks, lane, acc);
      if (lane == 0)
        for (int rr = 0; rr < nr; ++rr) {
          const float g = acc[0][rr];
          d.s_act[(t0 + rr) * d.s_inter + j] = g / (1.0f + expf(-g)) * acc[1][rr];  // the swiglu op's formula
        }
    }
  }
}

// The shared expert's gate and up rows (and its gate's row) into L2, spread over the grid: weights,
// so before the wait for the router (the loads then overlap the kernels before).
__device__ __forceinline__ void prefetch_shared_up(const decode_args& d) {
  if (d.s_inter == 0) return;
  const int64_t lines = d.s_inter * d.hidden * 2 / 128;  // whole lines of each matrix
  const int64_t gate_lines = d.s_gate_w != nullptr ? ceil_div(d.hidden * 2, int64_t{128}) : 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < 2 * lines + gate_lines; i += stride) {
    const char* base = i < lines         ? reinterpret_cast<const char*>(d.s_gate) + 128 * i
                       : i < 2 * lines   ? reinterpret_cast<const char*>(d.s_up) + 128 * (i - lines)
                                         : reinterpret_cast<const char*>(d.s_gate_w) + 128 * (i - 2 * lines);
    prefetch_l2(base);
  }
}

// A block's routing, in shared memory: each (token, slot) pair's expert and weight (slots in
// ascending expert order, route_token's), its row of act, and the tiles: the active experts
// ascending, each with its rows.
struct route_smem {
  int sel_id[kDecodeWarps][kMaxTopK];
  float sel_s[kDecodeWarps][kMaxTopK];
  int32_t ids[kDecodeMaxRows];
  float wts[kDecodeMaxRows];
  int first[kDecodeMaxRows];
  int pair_row[kDecodeMaxRows];
  int row_token[kDecodeMaxRows];
  int tile_begin[kDecodeMaxRows], tile_rows[kDecodeMaxRows], tile_expert[kDecodeMaxRows];
  int tiles;
};

// Routes every token (the prepare kernel's route_token, a warp a token, scores in `scores`:
// [tokens][experts] floats of shared memory) and orders the pairs by expert, ties by pair index.
// publish: also the routing for the down kernel (d.ids / wts / rows) and the caller's topk
// outputs (one block does). Every thread of the block calls it; it ends with a barrier.
__device__ __forceinline__ void route_block(const decode_args& d, float* scores, route_smem& rs, bool publish) {
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5;
  const int T = static_cast<int>(d.route.tokens), K = d.route.top_k, R = T * K, E = d.route.experts;
  route_args a = d.route;
  a.ids = rs.ids;
  a.wts = rs.wts;
  a.counts = nullptr;
  if (!publish) {
    a.user_ids = nullptr;
    a.user_wts = nullptr;
  }
  if (tid == 0) rs.tiles = 0;
  if (warp < T) route_token(a, warp, scores + static_cast<int64_t>(warp) * E, rs.sel_id[warp], rs.sel_s[warp], nullptr);
  __syncthreads();

  // Pair i's row = #{pairs of a lower expert} + #{earlier pairs of its expert}; the x-th active
  // expert (ascending) is tile x.
  int e = 0, below = 0, before = 0, count = 0;
  if (tid < R) {
    e = rs.ids[tid];
    for (int i = 0; i < R; ++i) {
      const int f = rs.ids[i];
      below += f < e;
      count += f == e;
      before += f == e && i < tid;
    }
    rs.first[tid] = before == 0;
  }
  __syncthreads();
  if (tid < R) {
    const int row = below + before;
    rs.row_token[row] = tid / K;
    rs.pair_row[tid] = row;
    if (before == 0) {
      int tile = 0;  // active experts below e
      for (int i = 0; i < R; ++i) tile += rs.first[i] && rs.ids[i] < e;
      rs.tile_expert[tile] = e;
      rs.tile_begin[tile] = below;
      rs.tile_rows[tile] = count;
      atomicAdd(&rs.tiles, 1);
    }
    if (publish) {
      d.ids[tid] = e;
      d.wts[tid] = rs.wts[tid];
      d.rows[tid] = row;
    }
  }
  __syncthreads();
}

// The up projection's tasks b = blockIdx.x, + gridDim.x, …: routed tasks (b < routed_blocks:
// the block has routed into rs) and then the shared expert's. Routed task b: the GEMV of
// moe_gemv_kernel<true> (gate and up rows of one output a warp) over its tile's rows, x read in
// f32 and rounded to bf16 (the split path's xa), NR rows at a time, U chunks of a row in flight.
template <int NR, int U>
__device__ __forceinline__ void up_tasks(const decode_args& d, int tasks, const route_smem& rs) {
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int per_tile = static_cast<int>(ceil_div(d.inter, int64_t{kDecodeWarps}));
  const int routed = static_cast<int>(d.routed_blocks);
#pragma unroll 1
  for (int b = static_cast<int>(blockIdx.x); b < tasks; b += static_cast<int>(gridDim.x)) {
    if (b >= routed) {
      shared_up_block<NR, U>(d, b - d.routed_blocks, warp, lane);
      continue;
    }
    const int tile = b / per_tile;
    if (tile >= rs.tiles) continue;  // uniform over the block
    const int ex = rs.tile_expert[tile], row_begin = rs.tile_begin[tile], row_end = row_begin + rs.tile_rows[tile];
    const int64_t j = (b % per_tile) * kDecodeWarps + warp;
    if (j >= d.inter) continue;
    const __nv_bfloat16* B = d.gate_up + static_cast<int64_t>(ex) * 2 * d.inter * d.hidden;
    const uint4* wrow[2] = {reinterpret_cast<const uint4*>(B + j * d.hidden),
                            reinterpret_cast<const uint4*>(B + (d.inter + j) * d.hidden)};
#pragma unroll 1
    for (int r0 = row_begin; r0 < row_end; r0 += NR) {
      const int nr = min(NR, row_end - r0);
      const float4* xrow[NR];
#pragma unroll
      for (int rr = 0; rr < NR; ++rr)
        xrow[rr] = reinterpret_cast<const float4*>(d.x + rs.row_token[r0 + (rr < nr ? rr : 0)] * d.x_stride);
      float acc[2][NR];
      dot_rows<2, true, true, NR, U>(wrow, xrow, nr, d.hidden / 8, lane, acc);
      if (lane != 0) continue;
#pragma unroll
      for (int rr = 0; rr < NR; ++rr) {
        if (rr >= nr) break;
        const float gate = acc[0][rr];
        d.act[static_cast<int64_t>(r0 + rr) * d.inter + j] = __float2bfloat16(gate / (1.0f + expf(-gate)) * acc[1][rr]);
      }
    }
  }
}

// kernels.moe_decode: pipelined (one token): up_tasks<1, …> with each warp's loads
// software-pipelined. The warp's routed tasks' gate and up rows are one stream of steps of
// kPipeU chunks a lane (chunks c0 + 32·u, c0 = lane + 32·kPipeU·s). Each step's loads go out
// before the step before it is multiplied, so two steps are in flight a warp across task
// boundaries, and a task's reduction and store overlap the next task's first loads. The per-row
// fmaf order is dot_rows's (chunks lane, lane + 32, … ascending, then warp_sum), so the bits are
// the one-row kernel's. Then the warp's shared-expert tasks as up_tasks does.
constexpr int kPipeU = 4;

__device__ __forceinline__ void up_tasks_pipelined(const decode_args& d, int tasks, const route_smem& rs) {
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int grid = static_cast<int>(gridDim.x);
  const int per_tile = static_cast<int>(ceil_div(d.inter, int64_t{kDecodeWarps}));
  const int routed = static_cast<int>(d.routed_blocks);
  const int64_t chunks = d.hidden / 8, step_chunks = 32 * kPipeU;
  const auto* x = reinterpret_cast<const float4*>(d.x);  // the one token
  auto output = [&](int b) { return static_cast<int64_t>(b % per_tile) * kDecodeWarps + warp; };
  auto valid = [&](int b) { return b / per_tile < rs.tiles && output(b) < d.inter; };
  auto next_task = [&](int b) {  // the warp's next routed task after b (>= routed: none)
    do b += grid;
    while (b < routed && !valid(b));
    return b;
  };
  auto load = [&](int b, int64_t c0, uint4 (&w)[kPipeU][2]) {
    const __nv_bfloat16* B = d.gate_up + static_cast<int64_t>(rs.tile_expert[b / per_tile]) * 2 * d.inter * d.hidden;
    const uint4* g = reinterpret_cast<const uint4*>(B + output(b) * d.hidden);
    const uint4* u = reinterpret_cast<const uint4*>(B + (d.inter + output(b)) * d.hidden);
#pragma unroll
    for (int i = 0; i < kPipeU; ++i) {
      const int64_t c = c0 + 32 * i;
      w[i][0] = c < chunks ? __ldcs(g + c) : make_uint4(0, 0, 0, 0);
      w[i][1] = c < chunks ? __ldcs(u + c) : make_uint4(0, 0, 0, 0);
    }
  };
  float acc_g = 0.0f, acc_u = 0.0f;
  auto multiply = [&](int64_t c0, const uint4 (&w)[kPipeU][2]) {
#pragma unroll
    for (int i = 0; i < kPipeU; ++i) {
      const int64_t c = c0 + 32 * i;
      if (c >= chunks) break;
      const float4 x0 = __ldg(x + 2 * c), x1 = __ldg(x + 2 * c + 1);
      float xf[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      float wg[8], wu[8];
      bf16x8_to_float(w[i][0], wg);
      bf16x8_to_float(w[i][1], wu);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        xf[e] = __bfloat162float(__float2bfloat16(xf[e]));
        acc_g = fmaf(xf[e], wg[e], acc_g);
        acc_u = fmaf(xf[e], wu[e], acc_u);
      }
    }
  };
  auto finish = [&](int b) {  // the task's reduction and its act element (up_tasks's formula)
    const float gate = warp_sum(acc_g), up = warp_sum(acc_u);
    if (lane == 0)
      d.act[static_cast<int64_t>(rs.tile_begin[b / per_tile]) * d.inter + output(b)] =
          __float2bfloat16(gate / (1.0f + expf(-gate)) * up);
    acc_g = acc_u = 0.0f;
  };

  int b = static_cast<int>(blockIdx.x);
  if (b < routed && !valid(b)) b = next_task(b);
  if (b < routed) {
    uint4 wa[kPipeU][2], wb[kPipeU][2];
    int64_t s0 = 0;  // the step's first chunk, lane 0's (the same step for every lane)
    load(b, s0 + lane, wa);
    // One step: the next step's loads into `next`, then this step's products from `cur`; false
    // when this was the warp's last routed step.
    auto step = [&](uint4 (&cur)[kPipeU][2], uint4 (&next)[kPipeU][2]) {
      int nb = b;
      int64_t ns0 = s0 + step_chunks;
      if (ns0 >= chunks) {
        nb = next_task(b);
        ns0 = 0;
      }
      const bool more = nb < routed;
      if (more) load(nb, ns0 + lane, next);
      multiply(s0 + lane, cur);
      if (nb != b || !more) finish(b);
      b = nb;
      s0 = ns0;
      return more;
    };
    while (step(wa, wb) && step(wb, wa)) {
    }
  }
  // The shared expert's tasks of this warp's sequence (b >= routed).
  int sb = static_cast<int>(blockIdx.x);
  if (sb < routed) sb += static_cast<int>(ceil_div(int64_t{routed} - sb, int64_t{grid})) * grid;
#pragma unroll 1
  for (; sb < tasks; sb += grid) shared_up_block<1, 8>(d, sb - d.routed_blocks, warp, lane);
}

// kOne: one token (what the default fuses): one activation row, so a warp's whole gate and up rows
// of a 2048-wide hidden are in flight at once (U = 8), at two blocks an SM. Otherwise up to 4 rows
// at a time, U = 4, three blocks an SM. The same arithmetic either way (dot_rows). A block with
// a routed task routes once, before its first. kPipe (with kOne): up_tasks_pipelined.
template <bool kOne, bool kPipe = false>
__global__ void __launch_bounds__(kDecodeThreads, kOne ? 2 : 3) moe_decode_up_kernel(const decode_args d, int tasks) {
  constexpr int NR = kOne ? 1 : 4, U = kOne ? 8 : 4;
  extern __shared__ float up_scores[];  // [tokens][experts]
  __shared__ route_smem rs;
  prefetch_shared_up(d);
  pdl_begin();  // the router's logits (and x)
  if (static_cast<int64_t>(blockIdx.x) < d.routed_blocks) route_block(d, up_scores, rs, blockIdx.x == 0);
  if constexpr (kOne && kPipe) {
    up_tasks_pipelined(d, tasks, rs);
  } else {
    up_tasks<NR, U>(d, tasks, rs);
  }
}

__device__ __forceinline__ float sigmoid_of(float v) { return 1.0f / (1.0f + expf(-v)); }  // row_add's

// The shared expert's down row of column tile `tile` into L2 (a weight: before any wait).
__device__ __forceinline__ void prefetch_shared_down(const decode_args& d, int64_t tile, int warp, int lane) {
  const int64_t c = tile * kDecodeWarps + warp;
  if (d.s_inter == 0 || c >= d.hidden) return;
  const char* row = reinterpret_cast<const char*>(d.s_down + c * d.s_inter);
  for (int64_t off = 128 * lane; off < d.s_inter * 2; off += 32 * 128) prefetch_l2(row + off);
}

// Token t's down projection over the column tiles tile0, tile0 + step, … (a warp a column): for
// each of t's experts in ascending index order (s_e, s_w, s_row: its K slots), y_e = act[row] ·
// down_e[col]ᵀ, out[t, col] (= or +=) Σ w_e · y_e in that order; then the shared expert's
// ys = act_shared[t] · down_shared[col]ᵀ added as ys + out (ungated) or fma(sigmoid(gl_t), ys,
// out) (gated). CPL: 16-byte chunks of a routed down row a lane (inter <= 256 · CPL); G experts'
// loads in flight. The first tile's weights are loaded before wait_act() (act, s_act and s_gl are
// read after it); kCoherent: they were written by other blocks of this kernel (loads through L2).
template <int CPL, bool kCoherent, class WaitAct>
__device__ __forceinline__ void down_tiles(const decode_args& d, int64_t t, int64_t tile0, int64_t step, const int* s_e,
                                           const float* s_w, const int* s_row, uint4* smem, WaitAct wait_act) {
  constexpr int G = 24 / CPL;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int K = d.route.top_k;
  const int64_t chunks = d.inter / 8;
  const int64_t col_tiles = ceil_div(d.hidden, int64_t{kDecodeWarps});
  int64_t col = tile0 * kDecodeWarps + warp;
  uint4 w[G][CPL];
  auto load_group = [&](int j0) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const bool used = j0 + g < K;
      const uint4* row = reinterpret_cast<const uint4*>(
          d.down + (static_cast<int64_t>(s_e[used ? j0 + g : 0]) * d.hidden + col) * d.inter);
#pragma unroll
      for (int m = 0; m < CPL; ++m) {
        const int64_t c = lane + 32 * m;
        w[g][m] = used && c < chunks ? __ldcs(row + c) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  if (tile0 < col_tiles && col < d.hidden) load_group(0);  // in flight while the act rows are staged
  wait_act();
  uint4* act_s = smem;
  for (int64_t i = tid; i < K * chunks; i += kDecodeThreads) {
    const int64_t jj = i / chunks, c = i - jj * chunks;
    const uint4* src = reinterpret_cast<const uint4*>(d.act + static_cast<int64_t>(s_row[jj]) * d.inter) + c;
    act_s[i] = kCoherent ? __ldcg(src) : __ldg(src);
  }
  auto* shared_act = reinterpret_cast<float4*>(smem + K * chunks);
  for (int64_t i = tid; i < d.s_inter / 4; i += kDecodeThreads) {
    const float4* src = reinterpret_cast<const float4*>(d.s_act + t * d.s_inter) + i;
    shared_act[i] = kCoherent ? __ldcg(src) : __ldg(src);
  }
  __syncthreads();  // no barrier below
  const float gl = d.s_gate_w != nullptr ? (kCoherent ? __ldcg(d.s_gl + t) : d.s_gl[t]) : 0.0f;
  for (int64_t tile = tile0; tile < col_tiles; tile += step) {
    col = tile * kDecodeWarps + warp;
    if (col >= d.hidden) break;
    if (tile != tile0) load_group(0);
    prefetch_shared_down(d, tile + step, warp, lane);
    float* o = d.out + t * d.out_stride + col;
    float acc = d.accumulate ? *o : 0.0f;
    for (int j0 = 0; j0 < K; j0 += G) {
      if (j0 > 0) load_group(j0);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (j0 + g >= K) break;
        float y = 0.0f;
#pragma unroll
        for (int m = 0; m < CPL; ++m) {
          const int64_t c = lane + 32 * m;
          if (c >= chunks) break;
          float xf[8], wf[8];
          bf16x8_to_float(act_s[(j0 + g) * chunks + c], xf);
          bf16x8_to_float(w[g][m], wf);
#pragma unroll
          for (int i = 0; i < 8; ++i) y = fmaf(xf[i], wf[i], y);
        }
        y = warp_sum(y);
        acc += s_w[j0 + g] * y;  // the combine kernel's sum
      }
    }
    if (d.s_inter > 0) {  // the shared expert: the skinny kernel's dot on f32 act, then its add
      const float4* xr[4] = {shared_act, shared_act, shared_act, shared_act};
      const uint4* wr[1] = {reinterpret_cast<const uint4*>(d.s_down + col * d.s_inter)};
      float ys[1][4];
      dot_rows<1, false, false>(wr, xr, 1, d.s_inter / 8, lane, ys);
      acc = d.s_gate_w != nullptr ? __fmaf_rn(sigmoid_of(gl), ys[0][0], acc)               // row_add
                                  : __fmaf_rn(1.0f, ys[0][0], __fmul_rn(1.0f, acc));  // the gemm epilogue, beta 1
    }
    if (lane == 0) *o = acc;
  }
}

// Block (t, y): token t, column tiles y, y + gridDim.y, … (the grid is what is resident at once,
// two blocks an SM: at most 128 registers a thread). The shared expert's down rows are fetched
// into L2 before the wait for the up kernel (they then overlap it), and one tile ahead after.
template <int CPL>
__global__ void __launch_bounds__(kDecodeThreads, 2) moe_decode_down_kernel(const decode_args d) {
  extern __shared__ uint4 down_smem[];  // the token's act rows: routed [top_k][inter / 8], then shared f32 [s_inter]
  __shared__ int s_e[kMaxTopK], s_row[kMaxTopK];
  __shared__ float s_w[kMaxTopK];
  const int tid = static_cast<int>(threadIdx.x);
  const int K = d.route.top_k;
  const int64_t t = blockIdx.x;
  prefetch_shared_down(d, blockIdx.y, tid >> 5, tid & 31);
  pdl_begin();  // act and the routing of the up kernel
  if (tid < K) {
    s_e[tid] = d.ids[t * K + tid];
    s_w[tid] = d.wts[t * K + tid];
    s_row[tid] = d.rows[t * K + tid];
  }
  __syncthreads();
  down_tiles<CPL, false>(d, t, blockIdx.y, gridDim.y, s_e, s_w, s_row, down_smem, [] {});
}

// ---- kernels.moe_decode: single (one token): up and down in one kernel ----------------------
// Every block routes the token, takes its up tasks as the one-row up kernel, loads the down
// weights of its first column tile (they depend only on the routing), waits at a grid barrier
// until every block's act rows are written, then runs the down kernel's tiles (blockIdx.x,
// + gridDim.x, …). The grid is at most what is resident at once (every block must reach the
// barrier); the arithmetic is the two kernels'. What it saves is the kernel boundary between up
// and down, and the down loads' start after it.

// Arrivals and generation of the grid barrier: zero at module load; every use leaves the
// arrivals at zero and advances the generation. One such kernel runs at a time per context
// (the stream order of a model's layers).
__device__ unsigned g_decode_barrier[2];

__device__ __forceinline__ void grid_barrier() {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned* gen = &g_decode_barrier[1];
    const unsigned g0 = *gen;  // it advances only once this block has arrived
    __threadfence();           // this block's writes before its arrival
    if (atomicAdd(&g_decode_barrier[0], 1u) == gridDim.x - 1) {
      atomicExch(&g_decode_barrier[0], 0u);
      __threadfence();
      atomicAdd(&g_decode_barrier[1], 1u);
    } else {
      long long spins = 0;
      while (*gen == g0) {
        __nanosleep(64);
        if (++spins > (1ll << 26)) __trap();  // seconds: a block never came (not co-resident)
      }
    }
    __threadfence();
  }
  __syncthreads();
}

template <int CPL>
__global__ void __launch_bounds__(kDecodeThreads, 2) moe_decode_single_kernel(const decode_args d, int tasks) {
  extern __shared__ uint4 single_smem[];  // the router's scores [experts], later the down kernel's staged rows
  __shared__ route_smem rs;
  const int tid = static_cast<int>(threadIdx.x);
  prefetch_shared_up(d);
  prefetch_shared_down(d, blockIdx.x, tid >> 5, tid & 31);
  pdl_begin();  // the router's logits (and x)
  route_block(d, reinterpret_cast<float*>(single_smem), rs, blockIdx.x == 0);
  up_tasks<1, 8>(d, tasks, rs);
  down_tiles<CPL, true>(d, 0, blockIdx.x, gridDim.x, rs.ids, rs.wts, rs.pair_row, single_smem, [] { grid_barrier(); });
}

// The down kernel's dynamic shared memory: the token's routed act rows (bf16) and its shared
// expert's (f32).
size_t decode_down_smem(const moe_experts_params& p) {
  return static_cast<size_t>(p.top_k * p.inter) * sizeof(__nv_bfloat16) + static_cast<size_t>(p.shared_inter) * 4;
}

// Whether the fused decode path takes a call of the op (bf16 weights, the GEMV path).
bool moe_decode_takes(const moe_experts_params& p) {
  const auto kind = current_paths().moe_decode;
  if (kind == kernel_paths::moe_decode_kind::kSplit) return false;
  if (kind == kernel_paths::moe_decode_kind::kDefault &&
      p.tokens > (p.experts >= kDecodeManyExperts ? kDecodeDefaultManyExpertsMaxTokens : kDecodeDefaultMaxTokens))
    return false;
  const int64_t R = p.tokens * p.top_k, chunks = p.inter / 8;
  const bool shared_ok =
      p.shared_inter == 0 ||
      (p.shared_inter % 8 == 0 && !skinny_uses_mma() && aligned16(p.shared_gate) && aligned16(p.shared_up) &&
       aligned16(p.shared_down) && (p.shared_gate_w == nullptr || aligned16(p.shared_gate_w)));
  return p.tokens <= kDecodeMaxTokens && R <= kDecodeMaxRows && p.experts <= kDecodeMaxExperts &&
         chunks <= 32 * kDecodeMaxChunksPerLane &&
         static_cast<size_t>(p.top_k * p.inter) * sizeof(__nv_bfloat16) <= kDecodeMaxActBytes &&
         decode_down_smem(p) <= kDecodeMaxSmem && p.x_stride % 4 == 0 && aligned16(p.x) && shared_ok;
}

// Blocks of `kernel` resident on the device at once with `smem` bytes of dynamic shared memory
// (asked once per kernel, size and device; a layer's calls repeat a few sizes).
int64_t decode_resident_blocks(const void* kernel, size_t smem) {
  struct entry {
    const void* kernel;
    size_t smem;
    int device;
    int64_t blocks;
  };
  static std::mutex mu;
  static std::vector<entry> cache;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mu);
  for (const entry& e : cache)
    if (e.kernel == kernel && e.smem == smem && e.device == device) return e.blocks;
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kDecodeThreads, smem));
  const int64_t blocks = std::max<int64_t>(1, int64_t{per_sm} * sm_count());
  cache.push_back(entry{kernel, smem, device, blocks});
  return blocks;
}

// The down kernel: a block per token and column tile, or, when those are more than are resident
// at once, as many column tiles per token as are, each looping over the others.
template <int CPL>
void launch_moe_decode_down(const decode_args& d, size_t smem, cudaStream_t stream) {
  auto kernel = moe_decode_down_kernel<CPL>;
  if (smem > 48 * 1024) reserve_dynamic_shared(reinterpret_cast<const void*>(kernel), smem);
  const int64_t T = d.route.tokens, tiles = ceil_div(d.hidden, int64_t{kDecodeWarps});
  const int64_t per_token =
      std::clamp<int64_t>(decode_resident_blocks(reinterpret_cast<const void*>(kernel), smem) / T, 1, tiles);
  launch_pdl(kernel, dim3(static_cast<unsigned>(T), static_cast<unsigned>(per_token)), dim3(kDecodeThreads), smem,
             stream, d);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

// f(std::integral_constant<int, CPL>) for the expert width's chunks a lane of the down projection.
template <class F>
void with_down_cpl(int64_t inter, F&& f) {
  switch (ceil_div(inter / 8, int64_t{32})) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, 4>{}); break;
  }
}

// The op on the decode path (moe_decode_takes holds): scratch, the up kernel, the down kernel
// (or, kernels.moe_decode: single and one token, the one kernel of both).
void run_moe_decode(const moe_experts_params& p, const route_args& ra, cudaStream_t stream) {
  const int64_t T = p.tokens, I = p.inter, E = p.experts, R = T * p.top_k, Is = p.shared_inter;
  auto round_up = [](size_t b) { return (b + 255) & ~size_t{255}; };
  const size_t act_bytes = round_up(static_cast<size_t>(R * I) * sizeof(__nv_bfloat16));
  const size_t small = round_up(static_cast<size_t>(R) * 4);
  const size_t s_act_bytes = round_up(static_cast<size_t>(T * Is) * 4), s_gl_bytes = round_up(static_cast<size_t>(T) * 4);
  char* base = nullptr;
  CUDA_CHECK(scratch_alloc(reinterpret_cast<void**>(&base), act_bytes + 3 * small + s_act_bytes + s_gl_bytes, stream));
  decode_args d;
  d.route = ra;
  d.x = p.x;
  d.x_stride = p.x_stride;
  d.gate_up = static_cast<const __nv_bfloat16*>(p.gate_up);
  d.down = static_cast<const __nv_bfloat16*>(p.down);
  d.hidden = p.hidden;
  d.inter = I;
  d.act = reinterpret_cast<__nv_bfloat16*>(base);
  d.ids = reinterpret_cast<int32_t*>(base + act_bytes);
  d.wts = reinterpret_cast<float*>(base + act_bytes + small);
  d.rows = reinterpret_cast<int32_t*>(base + act_bytes + 2 * small);
  d.out = p.out;
  d.out_stride = p.out_stride;
  d.accumulate = p.accumulate;
  d.routed_blocks = std::min(E, R) * ceil_div(I, int64_t{kDecodeWarps});
  int64_t shared_blocks = 0;
  if (Is > 0) {
    d.s_gate = static_cast<const __nv_bfloat16*>(p.shared_gate);
    d.s_up = static_cast<const __nv_bfloat16*>(p.shared_up);
    d.s_down = static_cast<const __nv_bfloat16*>(p.shared_down);
    d.s_gate_w = static_cast<const __nv_bfloat16*>(p.shared_gate_w);
    d.s_inter = Is;
    d.s_act = reinterpret_cast<float*>(base + act_bytes + 3 * small);
    d.s_gl = reinterpret_cast<float*>(base + act_bytes + 3 * small + s_act_bytes);
    shared_blocks = ceil_div(Is + (p.shared_gate_w != nullptr ? 1 : 0), int64_t{kDecodeWarps});
  }

  const size_t up_smem = static_cast<size_t>(T * E) * sizeof(float);
  const int64_t tasks = d.routed_blocks + shared_blocks;
  const auto kind = current_paths().moe_decode;
  if (T == 1 && kind == kernel_paths::moe_decode_kind::kSingle) {
    // At most the resident blocks: every block must reach the grid barrier.
    const size_t smem = std::max(up_smem, decode_down_smem(p));
    const int64_t work = std::max(tasks, ceil_div(p.hidden, int64_t{kDecodeWarps}));
    with_down_cpl(I, [&](auto cpl) {
      auto kernel = moe_decode_single_kernel<decltype(cpl)::value>;
      if (smem > 48 * 1024) reserve_dynamic_shared(reinterpret_cast<const void*>(kernel), smem);
      const int64_t blocks = std::min(work, decode_resident_blocks(reinterpret_cast<const void*>(kernel), smem));
      launch_pdl(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kDecodeThreads), smem, stream, d,
                 static_cast<int>(tasks));
      HYSERVE_CUDA_CHECK_LAUNCH();
    });
    CUDA_CHECK(scratch_free(base, stream));
    return;
  }

  // The up kernel: its tasks over as many blocks as are resident at once (a block routes once,
  // whatever the number of its routed tasks). One token takes the one-row kernel unless
  // kernels.moe_decode: fused asks for the general one.
  const bool one = T == 1 && kind != kernel_paths::moe_decode_kind::kFused;
  auto up_kernel = !one                                                ? moe_decode_up_kernel<false>
                   : kind == kernel_paths::moe_decode_kind::kPipelined ? moe_decode_up_kernel<true, true>
                                                                       : moe_decode_up_kernel<true>;
  const int64_t up_blocks =
      std::min(tasks, decode_resident_blocks(reinterpret_cast<const void*>(up_kernel), up_smem));
  launch_pdl(up_kernel, dim3(static_cast<unsigned>(up_blocks)), dim3(kDecodeThreads), up_smem, stream, d,
             static_cast<int>(tasks));
  HYSERVE_CUDA_CHECK_LAUNCH();
  const size_t down_smem = decode_down_smem(p);
  with_down_cpl(I, [&](auto cpl) { launch_moe_decode_down<decltype(cpl)::value>(d, down_smem, stream); });
  CUDA_CHECK(scratch_free(base, stream));
}

}  // namespace
}  // namespace hyserve::kernels::cuda_detail
