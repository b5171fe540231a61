#pragma once
// kernels.linear_bulk: the fused linear kernel (norm.cu's rmsnorm_linear, m <= 4 rows of x) with its
// weights streamed into shared memory by the SM's bulk copy engine (cp.async.bulk) through a ring
// of kLinBulkStages stages, one block an SM, instead of each warp loading its rows into registers
// (norm.cu, the only includer, after stage_norm).
//
// Outputs go in groups of 8, a warp an output (its weight row, or its gate and up rows with
// swiglu). A stage is a group's rows over one segment of kLinBulkStageBytes / rows bytes of each
// (a row longer than that takes several stages, in order); block b takes the contiguous groups
// [groups · b / G, groups · (b + 1) / G). Thread 0 issues the first kLinBulkStages stages before
// the programmatic-launch wait (the weights are constants: a small matrix is then in flight
// during the kernel before), and each later one once every warp has released its slot. Each warp
// takes its row's chunks c ≡ lane (mod 32) in ascending order over the segments, fmaf over their 8
// elements, then the xor-shuffle reduction: the register kernel's and the skinny kernel's order,
// so every output is theirs bit for bit (the norm is stage_norm's, the epilogue theirs).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "async_copy.cuh"
#include "common.cuh"
#include "launch.cuh"

namespace hyserve::kernels::cuda_detail {
namespace {

constexpr int kLinBulkStages = 4;
constexpr int64_t kLinBulkStageBytes = 32 * 1024;

template <bool kSwiglu>
constexpr int kLinBulkRows = kLinWarps * (kSwiglu ? 2 : 1);  // weight rows a stage
template <bool kSwiglu>
constexpr int64_t kLinBulkSegChunks = kLinBulkStageBytes / 16 / kLinBulkRows<kSwiglu>;  // a multiple of 32

inline size_t linear_bulk_smem(const rmsnorm_linear_params& p) {
  return static_cast<size_t>(kLinBulkStages * kLinBulkStageBytes) +
         (p.norm_weight != nullptr ? static_cast<size_t>(p.m * p.k) * sizeof(float) : 0);
}

template <int M, bool kSwiglu, bool kNorm>
__global__ void __launch_bounds__(kNormThreads, 1) rmsnorm_linear_bulk_kernel(const rmsnorm_linear_params p,
                                                                              int64_t groups) {
  extern __shared__ __align__(128) uint4 lin_bulk_ring[];  // [stages][rows][seg chunks], then xs [M, k] (kNorm)
  __shared__ __align__(8) uint64_t full[kLinBulkStages], empty[kLinBulkStages];
  constexpr int kRowsPerWarp = kSwiglu ? 2 : 1, kRows = kLinBulkRows<kSwiglu>;
  constexpr int64_t kSeg = kLinBulkSegChunks<kSwiglu>;
  float* xs = reinterpret_cast<float*>(lin_bulk_ring + kLinBulkStages * kRows * kSeg);
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int64_t chunks = p.k / 8, nseg = ceil_div(chunks, kSeg);
  const int64_t G = gridDim.x, b = blockIdx.x;
  const int64_t g0 = groups * b / G, g1 = groups * (b + 1) / G, stages = (g1 - g0) * nseg;
  const auto* w0 = static_cast<const __nv_bfloat16*>(p.w);
  const auto* w1 = static_cast<const __nv_bfloat16*>(p.up_w);
  ring_init(full, empty, kLinWarps);

  auto issue = [&](int64_t i) {  // thread 0: stage i into its slot, once the slot is free
    const int slot = static_cast<int>(i % kLinBulkStages);
    if (i >= kLinBulkStages) mbar_wait(&empty[slot], static_cast<uint32_t>((i / kLinBulkStages - 1) & 1));
    const int64_t g = g0 + i / nseg, c0 = (i % nseg) * kSeg;
    const auto bytes = static_cast<uint32_t>(min(kSeg, chunks - c0) * 16);
    const int valid = static_cast<int>(min(int64_t{kLinWarps}, p.n - g * kLinWarps));
    mbar_arrive_expect_tx(&full[slot], bytes * static_cast<uint32_t>(valid * kRowsPerWarp));
    for (int r = 0; r < valid; ++r)
#pragma unroll
      for (int q = 0; q < kRowsPerWarp; ++q)
        bulk_copy(lin_bulk_ring + (static_cast<int64_t>(slot) * kRows + r * kRowsPerWarp + q) * kSeg,
                  (q == 0 ? w0 : w1) + (g * kLinWarps + r) * p.w_stride + c0 * 8, bytes, &full[slot]);
  };
  int64_t issued = 0;
  if (tid == 0)
    for (; issued < stages && issued < kLinBulkStages; ++issued) issue(issued);
  pdl_begin();  // x (and out, with beta) come from earlier kernels
  if constexpr (kNorm) stage_norm<M>(p, xs);
  const float* a = kNorm ? xs : p.x;
  const int64_t lda = kNorm ? p.k : p.x_stride;

  float acc[kRowsPerWarp][M] = {};
#pragma unroll 1
  for (int64_t i = 0; i < stages; ++i) {
    const int slot = static_cast<int>(i % kLinBulkStages);
    const int64_t g = g0 + i / nseg, seg = i % nseg, c0 = seg * kSeg, o = g * kLinWarps + warp;
    mbar_wait(&full[slot], static_cast<uint32_t>((i / kLinBulkStages) & 1));
    if (o < p.n) {
      const uint4* wr = lin_bulk_ring + (static_cast<int64_t>(slot) * kRows + warp * kRowsPerWarp) * kSeg;
      const int64_t cn = min(kSeg, chunks - c0);
#pragma unroll 2
      for (int64_t c = lane; c < cn; c += 32) {
        float wf[kRowsPerWarp][8];
#pragma unroll
        for (int q = 0; q < kRowsPerWarp; ++q) bf16x8_to_float(wr[q * kSeg + c], wf[q]);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float x[8];
          load_x8<kNorm>(a + m * lda + (c0 + c) * 8, x);
#pragma unroll
          for (int q = 0; q < kRowsPerWarp; ++q)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[q][m] = fmaf(x[e], wf[q][e], acc[q][m]);
        }
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[slot]);
    if (tid == 0 && issued < stages) issue(issued++);
    if (seg != nseg - 1) continue;
#pragma unroll
    for (int q = 0; q < kRowsPerWarp; ++q)
#pragma unroll
      for (int m = 0; m < M; ++m) acc[q][m] = warp_sum(acc[q][m]);  // the register kernel's xor-shuffle reduction
    if (lane == 0 && o < p.n) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if constexpr (kSwiglu) {
          p.out[m * p.out_stride + o] = silu(acc[0][m]) * acc[1][m];  // the swiglu op's formula
        } else {
          linear_epilogue(p, p.out + m * p.out_stride + o, acc[0][m]);
        }
      }
    }
#pragma unroll
    for (int q = 0; q < kRowsPerWarp; ++q)
#pragma unroll
      for (int m = 0; m < M; ++m) acc[q][m] = 0.0f;
  }
}

// Whether kernels.linear_bulk takes a call the fused kernel takes (rmsnorm_linear_fused holds:
// m <= 4, weight rows 16-byte aligned, the staged norm within its shared memory).
inline bool linear_bulk_takes(const rmsnorm_linear_params&) { return current_paths().linear_bulk; }

template <int M, bool kSwiglu>
void launch_rmsnorm_linear_bulk_m(const rmsnorm_linear_params& p, cudaStream_t stream) {
  const int64_t groups = ceil_div(p.n, int64_t{kLinWarps});
  const size_t smem = linear_bulk_smem(p);
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(sm_count(), groups));
  auto run = [&](auto kernel) {
    reserve_dynamic_shared(reinterpret_cast<const void*>(kernel), smem);
    launch_pdl(kernel, dim3(blocks), dim3(kNormThreads), smem, stream, p, groups);
  };
  if (p.norm_weight != nullptr) run(rmsnorm_linear_bulk_kernel<M, kSwiglu, true>);
  else run(rmsnorm_linear_bulk_kernel<M, kSwiglu, false>);
}

template <bool kSwiglu>
void launch_rmsnorm_linear_bulk(const rmsnorm_linear_params& p, cudaStream_t stream) {
  switch (p.m) {
    case 1: launch_rmsnorm_linear_bulk_m<1, kSwiglu>(p, stream); break;
    case 2: launch_rmsnorm_linear_bulk_m<2, kSwiglu>(p, stream); break;
    case 3: launch_rmsnorm_linear_bulk_m<3, kSwiglu>(p, stream); break;
    default: launch_rmsnorm_linear_bulk_m<4, kSwiglu>(p, stream); break;
  }
}

}  // namespace
}  // namespace hyserve::kernels::cuda_detail
