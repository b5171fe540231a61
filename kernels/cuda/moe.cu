// The routed-experts op on the GPU (moe.h), with no host synchronisation (steps 1-4 in one
// block, moe_prepare_kernel, for up to 8 tokens and 1024 experts; the decode path of bf16
// weights fuses 1-4 into GEMM 1 and 7 into GEMM 2 instead: moe_decode.cuh):
//   1. memset of the per-expert counts;
//   2. router: one warp per token: scores (softmax or sigmoid), top-k by repeated warp arg-max
//      (ties to the lower index), renormalisation, the selection sorted by expert index, and the
//      per-expert counts (atomics);
//   3. scan: one block: exclusive prefix sums of the counts (row offsets of each expert in the
//      permuted order) and of the counts' tiles of BM rows (the grouped GEMMs' tile list);
//   4. scatter: each (token, slot) pair takes a row of its expert's segment (slot_pos, and the
//      row's token in row_token); x is copied in the GEMM operand type (xa);
//   5. GEMM 1: act[r] = silu(xa[token(r)] · gate_eᵀ) ⊙ (xa[token(r)] · up_eᵀ);
//   6. GEMM 2: y[r] = act[r] · down_eᵀ (f32);
//   7. combine: out[t] (= or +=) Σ_j w[t, j] · y[slot_pos[t, j]], j in ascending expert order.
// The order of rows inside an expert's segment depends on the atomics, but no result does: a
// GEMM row's value depends only on its own operands, and the combine sums in a fixed order.
// The GEMM kernels and the choice between them: moe_gemm.cuh.
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "../cpu/moe_shared.h"
#include "../cpu/moe_validate.h"
#include "common.cuh"
#include "hyserve/kernels/moe.h"
#include "launch.cuh"
#include "moe_decode.cuh"
#include "moe_gemm.cuh"
#include "moe_gemm_wgmma.cuh"
#include "moe_route.cuh"
#include "stream_alloc.h"

namespace hyserve::kernels {
namespace cuda_detail {
namespace {

constexpr int kRouteWarps = 4;
constexpr int kScanThreads = 1024;

// ---- 2. router (route_token: moe_route.cuh) ------------------------------------------------

__global__ void __launch_bounds__(32 * kRouteWarps) moe_route_kernel(const route_args a) {
  extern __shared__ float route_scores[];  // [kRouteWarps][experts]
  __shared__ int sel_id[kRouteWarps][kMaxTopK];
  __shared__ float sel_s[kRouteWarps][kMaxTopK];
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp;
  if (t >= a.tokens) return;  // whole warps only; the kernel has no block-wide barrier
  route_token(a, t, route_scores + static_cast<int64_t>(warp) * a.experts, sel_id[warp], sel_s[warp], a.counts);
}

// ---- 3. scan ------------------------------------------------------------------------------

// offsets[e] = Σ_{e' < e} counts[e'], tile_offsets[e] = Σ_{e' < e} ceil(counts[e'] / bm), both
// with the total at [experts]; cursor zeroed. By the THREADS threads of one block (s_rows,
// s_tiles: THREADS ints of shared memory each).
template <int THREADS>
__device__ void scan_counts(const int32_t* counts, int32_t* offsets, int32_t* tile_offsets, int32_t* cursor,
                            int experts, int bm, int* s_rows, int* s_tiles) {
  const int tid = static_cast<int>(threadIdx.x);
  const int per = (experts + THREADS - 1) / THREADS;
  const int begin = min(tid * per, experts), end = min(begin + per, experts);
  int rows = 0, tiles = 0;
  for (int e = begin; e < end; ++e) {
    const int c = counts[e];
    rows += c;
    tiles += (c + bm - 1) / bm;
  }
  s_rows[tid] = rows;
  s_tiles[tid] = tiles;
  __syncthreads();
  for (int o = 1; o < THREADS; o <<= 1) {  // inclusive Hillis-Steele scan
    const int r = tid >= o ? s_rows[tid - o] : 0;
    const int ti = tid >= o ? s_tiles[tid - o] : 0;
    __syncthreads();
    s_rows[tid] += r;
    s_tiles[tid] += ti;
    __syncthreads();
  }
  int row_off = s_rows[tid] - rows, tile_off = s_tiles[tid] - tiles;
  for (int e = begin; e < end; ++e) {
    const int c = counts[e];
    offsets[e] = row_off;
    tile_offsets[e] = tile_off;
    cursor[e] = 0;
    row_off += c;
    tile_off += (c + bm - 1) / bm;
  }
  if (tid == THREADS - 1) {
    offsets[experts] = s_rows[tid];
    tile_offsets[experts] = s_tiles[tid];
  }
}

__global__ void __launch_bounds__(kScanThreads) moe_scan_kernel(const int32_t* __restrict__ counts,
                                                                 int32_t* __restrict__ offsets,
                                                                 int32_t* __restrict__ tile_offsets,
                                                                 int32_t* __restrict__ cursor, int experts, int bm) {
  __shared__ int s_rows[kScanThreads];
  __shared__ int s_tiles[kScanThreads];
  scan_counts<kScanThreads>(counts, offsets, tile_offsets, cursor, experts, bm, s_rows, s_tiles);
}

// ---- 4. scatter (and x in the operand type) ---------------------------------------------------

// Pairs i0, i0 + stride, … take their rows (cursor: atomics, global or shared memory); x's
// elements i0, i0 + stride, … in the operand type.
__device__ void scatter_pairs(const int32_t* ids, int64_t pairs, int top_k, const int32_t* offsets, int32_t* cursor,
                              int32_t* slot_pos, int32_t* row_token, int64_t i0, int64_t stride) {
  for (int64_t i = i0; i < pairs; i += stride) {
    const int e = ids[i];
    const int pos = offsets[e] + atomicAdd(cursor + e, 1);
    slot_pos[i] = pos;
    row_token[pos] = static_cast<int32_t>(i / top_k);
  }
}
template <class W>
__device__ void convert_x(const float* x, int64_t x_stride, W* xa, int64_t tokens, int64_t hidden, int64_t i0,
                          int64_t stride) {
  const int64_t n = tokens * hidden;
  for (int64_t i = i0; i < n; i += stride) {
    const int64_t t = i / hidden, h = i - t * hidden;
    xa[i] = from_float<W>(x[t * x_stride + h]);
  }
}

template <class W>
__global__ void moe_scatter_kernel(const int32_t* __restrict__ ids, int64_t pairs, int top_k,
                                   const int32_t* __restrict__ offsets, int32_t* __restrict__ cursor,
                                   int32_t* __restrict__ slot_pos, int32_t* __restrict__ row_token,
                                   const float* __restrict__ x, int64_t x_stride, W* __restrict__ xa, int64_t tokens,
                                   int64_t hidden) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  scatter_pairs(ids, pairs, top_k, offsets, cursor, slot_pos, row_token, i0, stride);
  convert_x<W>(x, x_stride, xa, tokens, hidden, i0, stride);
}

// ---- 2-4 in one block (a few tokens: decode) ---------------------------------------------------
//
// Up to kPrepWarps tokens and kPrepMaxExperts experts: one block routes (a warp a token), scans
// and scatters, with the counts and cursors in shared memory: one launch instead of a memset
// and three kernels. The same arithmetic as the separate kernels (route_token, scan_counts,
// scatter_pairs, convert_x).
constexpr int kPrepWarps = 8, kPrepThreads = 32 * kPrepWarps;
constexpr int64_t kPrepMaxExperts = 1024;

template <class W>
__global__ void __launch_bounds__(kPrepThreads)
    moe_prepare_kernel(const route_args a, int32_t* __restrict__ offsets, int32_t* __restrict__ tile_offsets, int bm,
                       int32_t* __restrict__ slot_pos, int32_t* __restrict__ row_token, const float* __restrict__ x,
                       int64_t x_stride, W* __restrict__ xa, int64_t hidden) {
  pdl_begin();
  extern __shared__ float prep_smem[];  // scores [kPrepWarps][E], counts [E], cursor [E]
  __shared__ int sel_id[kPrepWarps][kMaxTopK];
  __shared__ float sel_s[kPrepWarps][kMaxTopK];
  __shared__ int s_rows[kPrepThreads], s_tiles[kPrepThreads];
  const int E = a.experts, tid = static_cast<int>(threadIdx.x), warp = tid >> 5;
  auto* counts = reinterpret_cast<int32_t*>(prep_smem + static_cast<int64_t>(kPrepWarps) * E);
  int32_t* cursor = counts + E;
  for (int e = tid; e < E; e += kPrepThreads) counts[e] = 0;
  __syncthreads();
  if (warp < a.tokens)
    route_token(a, warp, prep_smem + static_cast<int64_t>(warp) * E, sel_id[warp], sel_s[warp], counts);
  __syncthreads();
  scan_counts<kPrepThreads>(counts, offsets, tile_offsets, cursor, E, bm, s_rows, s_tiles);
  __syncthreads();  // offsets (global) and cursor visible to the block
  scatter_pairs(a.ids, a.tokens * a.top_k, a.top_k, offsets, cursor, slot_pos, row_token, tid, kPrepThreads);
  convert_x<W>(x, x_stride, xa, a.tokens, hidden, tid, kPrepThreads);
}

size_t prepare_smem_bytes(int64_t experts) { return static_cast<size_t>((kPrepWarps + 2) * experts) * 4; }

// ---- 7. combine ---------------------------------------------------------------------------

__global__ void moe_combine_kernel(const float* __restrict__ y, int64_t hidden, const int32_t* __restrict__ slot_pos,
                                   const float* __restrict__ wts, int top_k, float* __restrict__ out,
                                   int64_t out_stride, bool accumulate) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  const int64_t h4n = hidden / 4;
  for (int64_t h4 = threadIdx.x; h4 < h4n; h4 += blockDim.x) {
    float4* o = reinterpret_cast<float4*>(out + t * out_stride) + h4;
    float4 acc = accumulate ? *o : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int j = 0; j < top_k; ++j) {
      const int64_t i = t * top_k + j;
      const float w = wts[i];
      const float4 v = reinterpret_cast<const float4*>(y + static_cast<int64_t>(slot_pos[i]) * hidden)[h4];
      acc.x += w * v.x;
      acc.y += w * v.y;
      acc.z += w * v.z;
      acc.w += w * v.w;
    }
    *o = acc;
  }
}

size_t round_up(size_t b) { return (b + 255) & ~size_t{255}; }

// The shared expert as its separate ops (cpu/moe_shared.h), after the routed experts.
void run_shared_expert(const moe_experts_params& p, cudaStream_t stream) {
  if (p.shared_inter == 0) return;
  const bool gated = p.shared_gate_w != nullptr;
  const size_t act = round_up(static_cast<size_t>(p.tokens * p.shared_inter) * 4);
  const size_t ys = gated ? round_up(static_cast<size_t>(p.tokens * p.hidden) * 4) : 0;
  char* base = nullptr;
  CUDA_CHECK(scratch_alloc(reinterpret_cast<void**>(&base), act + ys + (gated ? round_up(p.tokens * 4) : 0), stream));
  cpu_detail::run_moe_shared_unfused(p, reinterpret_cast<float*>(base), gated ? reinterpret_cast<float*>(base + act) : nullptr,
                                     gated ? reinterpret_cast<float*>(base + act + ys) : nullptr,
                                     [&](const auto& q) { run_cuda(q, stream); });
  CUDA_CHECK(scratch_free(base, stream));
}

template <class W>
void run_moe(const moe_experts_params& p, cudaStream_t stream) {
  const int64_t T = p.tokens, H = p.hidden, I = p.inter, E = p.experts, k = p.top_k, R = T * k;
  moe_gemm_path path = choose_moe_gemm<W>(R, E);
  if constexpr (std::is_same_v<W, bf16>) {
    if (path == moe_gemm_path::kLarge && moe_wgmma_applies(p)) path = moe_gemm_path::kWgmma;
  }
  const int bm = moe_tile_rows(path);
  route_args ra;
  ra.logits = p.router_logits;
  ra.logits_stride = p.logits_stride;
  ra.tokens = T;
  ra.experts = static_cast<int>(E);
  ra.top_k = static_cast<int>(k);
  ra.softmax = p.scoring == moe_scoring::kSoftmax;
  ra.norm = p.norm_topk_prob;
  ra.user_ids = p.topk_ids;
  ra.user_wts = p.topk_weights;
  if constexpr (std::is_same_v<W, bf16>) {
    // A few tokens: the two fused kernels (moe_decode.cuh), the same bits as the path below.
    if (path == moe_gemm_path::kGemv && moe_decode_takes(p)) return run_moe_decode(p, ra, stream);
  }
  // Scratch, one allocation.
  size_t off = 0;
  auto carve = [&](size_t bytes) {
    const size_t at = off;
    off += round_up(bytes);
    return at;
  };
  const size_t o_counts = carve(E * 4), o_cursor = carve(E * 4), o_offsets = carve((E + 1) * 4),
               o_tiles = carve((E + 1) * 4), o_ids = carve(R * 4), o_wts = carve(R * 4), o_pos = carve(R * 4),
               o_rowtok = carve(R * 4), o_xa = carve(static_cast<size_t>(T * H) * sizeof(W)),
               o_act = carve(static_cast<size_t>(R * I) * sizeof(W)), o_y = carve(static_cast<size_t>(R * H) * 4);
  char* base = nullptr;
  CUDA_CHECK(scratch_alloc(reinterpret_cast<void**>(&base), off, stream));
  auto* counts = reinterpret_cast<int32_t*>(base + o_counts);
  auto* cursor = reinterpret_cast<int32_t*>(base + o_cursor);
  auto* offsets = reinterpret_cast<int32_t*>(base + o_offsets);
  auto* tiles = reinterpret_cast<int32_t*>(base + o_tiles);
  auto* ids = reinterpret_cast<int32_t*>(base + o_ids);
  auto* wts = reinterpret_cast<float*>(base + o_wts);
  auto* slot_pos = reinterpret_cast<int32_t*>(base + o_pos);
  auto* row_token = reinterpret_cast<int32_t*>(base + o_rowtok);
  auto* xa = reinterpret_cast<W*>(base + o_xa);
  auto* act = reinterpret_cast<W*>(base + o_act);
  auto* y = reinterpret_cast<float*>(base + o_y);

  ra.ids = ids;
  ra.wts = wts;
  ra.counts = counts;
  if (T <= kPrepWarps && E <= kPrepMaxExperts) {
    const size_t smem = prepare_smem_bytes(E);
    if (smem > 48 * 1024) reserve_dynamic_shared(reinterpret_cast<const void*>(moe_prepare_kernel<W>), smem);
    launch_pdl(moe_prepare_kernel<W>, dim3(1), dim3(kPrepThreads), smem, stream, ra, offsets, tiles, bm, slot_pos,
               row_token, p.x, p.x_stride, xa, H);
    HYSERVE_CUDA_CHECK_LAUNCH();
  } else {
    CUDA_CHECK(cudaMemsetAsync(counts, 0, static_cast<size_t>(E) * 4, stream));
    const size_t route_smem = static_cast<size_t>(kRouteWarps) * E * sizeof(float);
    if (route_smem > 48 * 1024) reserve_dynamic_shared(reinterpret_cast<const void*>(moe_route_kernel), route_smem);
    moe_route_kernel<<<static_cast<unsigned>(ceil_div(T, kRouteWarps)), 32 * kRouteWarps, route_smem, stream>>>(ra);
    HYSERVE_CUDA_CHECK_LAUNCH();

    moe_scan_kernel<<<1, kScanThreads, 0, stream>>>(counts, offsets, tiles, cursor, static_cast<int>(E), bm);
    HYSERVE_CUDA_CHECK_LAUNCH();

    const int64_t scatter_work = std::max(R, T * H);
    const auto scatter_blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(scatter_work, 256), 8 * sm_count()));
    moe_scatter_kernel<W><<<scatter_blocks, 256, 0, stream>>>(ids, R, static_cast<int>(k), offsets, cursor, slot_pos,
                                                              row_token, p.x, p.x_stride, xa, T, H);
    HYSERVE_CUDA_CHECK_LAUNCH();
  }

  gg_args g1;
  g1.a = xa;
  g1.lda = H;
  g1.a_rows = row_token;
  g1.b = p.gate_up;
  g1.b_expert = 2 * I * H;
  g1.b_up = I * H;
  g1.ldb = H;
  g1.c = act;
  g1.ldc = I;
  g1.n = I;
  g1.k = H;
  g1.offsets = offsets;
  g1.tile_offsets = tiles;
  g1.experts = static_cast<int>(E);
  launch_experts_gemm<W, true>(g1, R, path, stream);

  gg_args g2 = g1;
  g2.a = act;
  g2.lda = I;
  g2.a_rows = nullptr;
  g2.b = p.down;
  g2.b_expert = H * I;
  g2.b_up = 0;
  g2.ldb = I;
  g2.c = y;
  g2.ldc = H;
  g2.n = H;
  g2.k = I;
  launch_experts_gemm<W, false>(g2, R, path, stream);

  const int combine_threads = static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, ceil_div(H / 4, 32) * 32)));
  launch_pdl(moe_combine_kernel, dim3(static_cast<unsigned>(T)), dim3(combine_threads), 0, stream, y, H, slot_pos, wts,
             static_cast<int>(k), p.out, p.out_stride, p.accumulate);
  HYSERVE_CUDA_CHECK_LAUNCH();
  CUDA_CHECK(scratch_free(base, stream));
  run_shared_expert(p, stream);
}

}  // namespace
}  // namespace cuda_detail

using namespace cuda_detail;

void run_cuda(const moe_experts_params& p, void* stream) {
  constexpr const char* op = "moe_experts";
  cpu_detail::check_moe_experts_fields(p, op);
  if (p.top_k > kMaxTopK) fail(op, "top_k", p.top_k, "exceeds the CUDA router's 32");
  if (p.experts > 8192) fail(op, "experts", p.experts, "exceeds the CUDA router's 8192");
  if (p.hidden % 8 != 0) fail(op, "hidden", p.hidden, "must be a multiple of 8 on CUDA");
  if (p.inter % 8 != 0) fail(op, "inter", p.inter, "must be a multiple of 8 on CUDA");
  if (p.tokens == 0) return;
  if (p.tokens * p.top_k > INT32_MAX / 2) fail(op, "tokens", p.tokens, "times top_k exceeds the CUDA op's row range");
  if (p.tokens > INT32_MAX) fail(op, "tokens", p.tokens, "exceeds the CUDA grid");
  require_aligned16(p.gate_up, op, "gate_up");
  require_aligned16(p.down, op, "down");
  require_aligned16(p.out, op, "out");
  if (p.out_stride % 4 != 0) fail(op, "out_stride", p.out_stride, "must be a multiple of 4 on CUDA");
  if (p.w_dtype == dtype::kBF16)
    run_moe<bf16>(p, as_stream(stream));
  else
    run_moe<float>(p, as_stream(stream));
}

}  // namespace hyserve::kernels
