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
//         token) and, gated, one more: the gate's x_t · gate_wᵀ. One token takes the ring of bulk
//         copies (moe_decode_bulk.cuh, the same tasks and arithmetic), or where that does not
//         take the shapes a variant with one activation row (a warp's whole row pair in flight);
//         its down projection likewise takes the bulk ring. The shared expert's rows are
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
// f32 rows of the down projections. Here: the kernels and their launch; their device-side parts
// (routing, tasks, tiles, the grid barrier) are in moe_decode_parts.cuh.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "gemm_paths.h"
#include "hyserve/kernels/moe.h"
#include "hyserve/kernels/paths.h"
#include "launch.cuh"
#include "moe_decode_bulk.cuh"
#include "moe_decode_parts.cuh"
#include "moe_route.cuh"
#include "stream_alloc.h"

namespace hyserve::kernels::cuda_detail {
namespace {

// kOne: one token (what the default fuses): one activation row, so a warp's whole gate and up rows
// of a 2048-wide hidden are in flight at once (U = 8), at two blocks an SM. Otherwise up to 4 rows
// at a time, U = 4, three blocks an SM. The same arithmetic either way (dot_rows). A block with
// a routed task routes once, before its first.
template <bool kOne>
__global__ void __launch_bounds__(kDecodeThreads, kOne ? 2 : 3) moe_decode_up_kernel(const decode_args d, int tasks) {
  constexpr int NR = kOne ? 1 : 4, U = kOne ? 8 : 4;
  extern __shared__ float up_scores[];  // [tokens][experts]
  __shared__ route_smem rs;
  prefetch_shared_up(d);
  pdl_begin();  // the router's logits (and x)
  if (static_cast<int64_t>(blockIdx.x) < d.routed_blocks) route_block(d, up_scores, rs, blockIdx.x == 0);
  up_tasks<NR, U>(d, tasks, rs);
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
  if (kind == kernel_paths::moe_decode_kind::kDefault && p.tokens > kDecodeDefaultMaxTokens) return false;
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

// Blocks of `kernel` resident on the device at once with `smem` bytes of dynamic shared memory.
int64_t decode_resident_blocks(const void* kernel, size_t smem) {
  return int64_t{resident_blocks_per_sm(kernel, kDecodeThreads, smem)} * sm_count();
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
  // whatever the number of its routed tasks). One token takes the rings of bulk copies
  // (moe_decode_bulk.cuh) where they take the shapes, else the one-row kernel, unless
  // kernels.moe_decode: fused asks for the general one. Measured, one token, graph decode steps
  // on the H100, GPU time: the rings against the one-row kernel and the down kernel,
  // Qwen3-Next-80B-A3B shape (16 layers) 1.527 against 1.559 ms (mean of 3), Granite-4.0-H-Tiny
  // 2.074 against 2.117 ms (mean of 2); the up ring alone 1.548
  // (bench/results/2026-12-07-h100-run35.md). Two variants lost at one token and were removed
  // (run 36, Granite-4.0-H-Tiny, wall time): the one-row kernel with its loads software-pipelined
  // across tasks, 2.172 against 2.105 ms, and the down ring routing the token itself to stream
  // its weights beside the up kernel, 2.423 (last version at 907f852).
  const bool one = T == 1 && kind != kernel_paths::moe_decode_kind::kFused;
  const bool bulk = one && kind == kernel_paths::moe_decode_kind::kDefault;
  if (bulk && bulk_takes(d, E)) {
    launch_moe_decode_up_bulk(d, E, stream);
  } else {
    auto up_kernel = one ? moe_decode_up_kernel<true> : moe_decode_up_kernel<false>;
    const int64_t up_blocks =
        std::min(tasks, decode_resident_blocks(reinterpret_cast<const void*>(up_kernel), up_smem));
    launch_pdl(up_kernel, dim3(static_cast<unsigned>(up_blocks)), dim3(kDecodeThreads), up_smem, stream, d,
               static_cast<int>(tasks));
    HYSERVE_CUDA_CHECK_LAUNCH();
  }
  if (bulk && down_bulk_takes(d)) {
    launch_moe_decode_down_bulk(d, stream);
  } else {
    const size_t down_smem = decode_down_smem(p);
    with_down_cpl(I, [&](auto cpl) { launch_moe_decode_down<decltype(cpl)::value>(d, down_smem, stream); });
  }
  CUDA_CHECK(scratch_free(base, stream));
}

}  // namespace
}  // namespace hyserve::kernels::cuda_detail
