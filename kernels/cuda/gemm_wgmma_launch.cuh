#pragma once
// The launches of the warpgroup-MMA linear kernel (gemm_wgmma.cuh) for gemm.cu, the only
// includer (internal linkage):
//   - kernels.linear_wgmma (fast mode): 9..256 rows, the grid by wgmma_plan_for (the k splits by
//     the call's rows);
//   - kernels.invariant_gemm: wgmma (determinism: batch_invariant): any rows, the consumer
//     warpgroups and the k splits by wgmma_invariant_plan (the weight's shape alone), the splits
//     added by wgmma_reduce_splits up to 256 rows and inside the blocks above, in the same order,
//     so that a row's bits do not depend on the call's rows (if the MMA's own sums do not depend
//     on its N, the row tile: the device tests and bench/probes/wgmma_linear_probe.cu check it).
// Both take the activations already rounded to bf16, compact [m, k].
#include <cuda_bf16.h>

#include <cstdint>

#include "common.cuh"
#include "gemm_wgmma.cuh"
#include "hyserve/common/error.h"
#include "hyserve/kernels/gemm.h"
#include "hyserve/kernels/paths.h"
#include "launch.cuh"
#include "stream_alloc.h"

namespace hyserve::kernels::cuda_detail {
namespace {

// y[m × n] = x16 · wᵀ (+ beta · y), w [n, k] with row stride ldw (bf16), y f32 with row stride ldy.
struct wgmma_call {
  const void* w = nullptr;
  int64_t ldw = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t m = 0, n = 0, k = 0;
  float beta = 0.0f;
};

// The layouts both paths take: 16-byte weight rows (TMA), k a multiple of 8 (the activations'
// rows), y's rows float4-aligned (the reduction), dimensions a tensor map holds.
bool wgmma_layout_applies(const wgmma_call& c) {
  return c.k % 8 == 0 && c.ldw % 8 == 0 && c.n % 4 == 0 && c.ldy % 4 == 0 && aligned16(c.w) && aligned16(c.y) &&
         c.n < (int64_t{1} << 31) && c.k < (int64_t{1} << 31);
}

// One launch: k in splits of kb_per_split 64-wide blocks; kSumSplits: a block sums every split
// of its tile (grid y 1), else a block a split and wgmma_reduce_splits (more than one).
template <int BN, int WG, bool kSumSplits>
void launch_wgmma_grid(const wgmma_call& c, const __nv_bfloat16* x16, int kb_per_split, cudaStream_t stream) {
  const int rows = wgmma_rows(WG);
  CUtensorMap tw, tx;
  if (!wgmma_tensor_map(&tw, c.w, c.n, c.k, rows, c.ldw) || !wgmma_tensor_map(&tx, x16, c.m, c.k, BN))
    throw error("gemm: cuTensorMapEncodeTiled failed for the warpgroup-MMA linear kernel");
  const int64_t splits = ceil_div(ceil_div(c.k, int64_t{kWgmmaBK}), int64_t{kb_per_split});
  const bool reduce = !kSumSplits && splits > 1;
  wgmma_linear_args a;
  a.m = c.m;
  a.n = c.n;
  a.k = c.k;
  a.kb_per_split = kb_per_split;
  a.splits_per_block = kSumSplits ? static_cast<int>(splits) : 1;
  float* part = nullptr;
  if (reduce) {
    CUDA_CHECK(scratch_alloc(reinterpret_cast<void**>(&part), static_cast<size_t>(splits * c.m * c.n) * 4, stream));
    a.y = part;
    a.ldy = c.n;
  } else {
    a.y = c.y;
    a.ldy = c.ldy;
    a.beta = c.beta;
  }
  auto kernel = wgmma_linear_kernel<BN, WG, kSumSplits>;
  reserve_dynamic_shared(reinterpret_cast<const void*>(kernel), wgmma_smem(BN, WG));
  const dim3 grid(static_cast<unsigned>(ceil_div(c.n, int64_t{rows})), static_cast<unsigned>(reduce ? splits : 1),
                  static_cast<unsigned>(ceil_div(c.m, int64_t{BN})));
  launch_pdl(kernel, grid, dim3(wgmma_threads(WG)), wgmma_smem(BN, WG), stream, tw, tx, a);
  HYSERVE_CUDA_CHECK_LAUNCH();
  if (reduce) {
    const int64_t q = c.m * c.n / 4;
    wgmma_reduce_splits<<<static_cast<unsigned>(ceil_div(q, int64_t{256})), 256, 0, stream>>>(
        part, c.y, c.m, c.n, c.ldy, static_cast<int>(splits), c.beta);
    HYSERVE_CUDA_CHECK_LAUNCH();
    CUDA_CHECK(scratch_free(part, stream));
  }
}

// The row tile (the MMA's N) of m rows: the smallest of 8 … 256 that holds them.
int wgmma_bn_for(int64_t m) {
  for (const int bn : {8, 16, 32, 64, 128})
    if (m <= bn) return bn;
  return 256;
}

// One call of at most 256 rows, a block a split, on WG consumer warpgroups.
template <int WG>
void launch_wgmma_rows(const wgmma_call& c, const __nv_bfloat16* x16, int kb_per_split, cudaStream_t stream) {
  switch (wgmma_bn_for(c.m)) {
    case 8: return launch_wgmma_grid<8, WG, false>(c, x16, kb_per_split, stream);
    case 16: return launch_wgmma_grid<16, WG, false>(c, x16, kb_per_split, stream);
    case 32: return launch_wgmma_grid<32, WG, false>(c, x16, kb_per_split, stream);
    case 64: return launch_wgmma_grid<64, WG, false>(c, x16, kb_per_split, stream);
    case 128: return launch_wgmma_grid<128, WG, false>(c, x16, kb_per_split, stream);
    default: return launch_wgmma_grid<256, WG, false>(c, x16, kb_per_split, stream);
  }
}

int wgmma_kb_per_split(int64_t k, int splits) {
  return static_cast<int>(ceil_div(ceil_div(k, int64_t{kWgmmaBK}), int64_t{splits}));
}

// ---- kernels.linear_wgmma (fast mode) ----

// A gemm op's call (B [n, k] the weight, C the output).
wgmma_call wgmma_call_of(const gemm_params& p) {
  wgmma_call c;
  c.w = p.b;
  c.ldw = p.ldb;
  c.y = p.c;
  c.ldy = p.ldc;
  c.m = p.m;
  c.n = p.n;
  c.k = p.k;
  c.beta = p.beta;
  return c;
}

// 9..256 rows of a weight [n, k] (trans_b), alpha 1, on the wgmma layouts.
bool wgmma_linear_applies(const gemm_params& p) {
  return current_paths().linear_wgmma && !p.trans_a && p.trans_b && p.m >= 1 && p.m <= 256 && p.alpha == 1.0f &&
         wgmma_layout_applies(wgmma_call_of(p));
}

void launch_wgmma_linear(const gemm_params& p, const __nv_bfloat16* x16, cudaStream_t stream) {
  const wgmma_call c = wgmma_call_of(p);
  const wgmma_plan plan = wgmma_plan_for(p.m, p.n, p.k, wgmma_bn_for(p.m), sm_count());
  const int kbps = wgmma_kb_per_split(p.k, plan.splits);
  if (plan.wg == 1 && wgmma_bn_for(p.m) < 256) launch_wgmma_rows<1>(c, x16, kbps, stream);
  else launch_wgmma_rows<2>(c, x16, kbps, stream);
}

// ---- kernels.invariant_gemm: wgmma (determinism: batch_invariant) ----

// Up to 256 rows: a block a split (the decode and verify steps); above: tiles of 128 rows (two
// consumer warpgroups) or 64 (one), each block summing its splits in registers.
void launch_wgmma_invariant(const wgmma_call& c, const __nv_bfloat16* x16, cudaStream_t stream) {
  const wgmma_plan plan = wgmma_invariant_plan(c.n, c.k, sm_count());
  const int kbps = wgmma_kb_per_split(c.k, plan.splits);
  if (c.m <= 256) {
    if (plan.wg == 1) launch_wgmma_rows<1>(c, x16, kbps, stream);
    else launch_wgmma_rows<2>(c, x16, kbps, stream);
  } else if (plan.wg == 1) {
    launch_wgmma_grid<64, 1, true>(c, x16, kbps, stream);
  } else {
    launch_wgmma_grid<128, 2, true>(c, x16, kbps, stream);
  }
}

}  // namespace
}  // namespace hyserve::kernels::cuda_detail
