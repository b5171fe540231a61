#pragma once
// The device-side parts of the routed-experts op's decode path (moe_decode.cuh, the only
// includer; internal linkage): its limits, the kernels' arguments, the GEMV arithmetic
// (dot_rows), the routing of a block (route_block), the up projection's tasks (up_tasks), the
// down projection's tiles (down_tiles), the L2 prefetches of the shared expert's rows and the grid barrier of
// kernels.moe_decode: single. moe_decode.cuh states what the kernels compute and how it keeps
// the split path's bits.
#include <cuda_bf16.h>

#include <cstdint>

#include "common.cuh"
#include "moe_route.cuh"

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
// (bench/results/2026-12-06-h200-run33.md). Since then the fused up kernel got faster: on the
// H100, Granite-4.0-H-Tiny at batch 8, fused 6.938 against split 8.159 ms
// (bench/results/2026-12-07-h100-run36.md). So: every count the fused kernels take.
constexpr int64_t kDecodeDefaultMaxTokens = kDecodeMaxTokens;
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

}  // namespace
}  // namespace hyserve::kernels::cuda_detail
