#pragma once
// A linear layer on Hopper's warpgroup MMAs, weights streamed by the tensor copy engine:
//   y[m × n] (f32) = x[m × k] · w[n × k]ᵀ, x and w bf16, row-major (k contiguous), f32 accumulate.
// The weight is the MMA's A operand (64 output features a warpgroup), the activations its B
// (BN rows: 8 … 256), so a call of few rows streams the weight at the width of its rows, not of a
// 64-row tile. A block: one producer warp (of a warpgroup that gives its registers to the
// others) issues, for each 64-wide k block, two tensor copies into a ring of S stages — 64·WG
// weight rows and BN activation rows, each a K-major tile in the 128-byte swizzle — and WG (1 or
// 2) consumer warpgroups each multiply their 64 weight rows by the activation tile (four k16 MMAs
// a stage), releasing a stage once the MMAs after it are issued. Split-K: block (i, s, j) takes
// weight rows 64·WG·i…, k blocks [s·kbs, (s + 1)·kbs) and activation rows BN·j…, and writes its
// partial sums to partials[s] (one split: to y); wgmma_reduce_splits adds the splits in
// ascending order. Every output's sum is over its k16 steps in ascending order within a split.
// kSumSplits (determinism: batch_invariant, many rows): a block takes splits_per_block splits in
// turn, each from zero, and adds them up in ascending order in registers, the reduction's
// arithmetic, so an output has the same bits whether its splits met in a block or in
// wgmma_reduce_splits.
// Rows of x or w beyond m or n are read as zeros by the copy engine and not written.
// The tensor maps are built on the host for each call (wgmma_tensor_map). Launched with
// programmatic dependent launch, a block fetches its first stages' weights before it waits for
// the kernel before it.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <initializer_list>

#include "async_copy.cuh"
#include "launch.cuh"
#include "wgmma_ops.cuh"

namespace hyserve::kernels::cuda_detail {
namespace {

constexpr int kWgmmaBK = 64;  // k a stage: one 128-byte swizzled row

// WG consumer warpgroups (1 or 2) a block, 64 weight rows each, and the producer warpgroup. Two
// consumers: one block an SM (200 KB of ring); one: two blocks an SM (100 KB each).
__host__ __device__ constexpr int wgmma_threads(int wg) { return 128 * (wg + 1); }
__host__ __device__ constexpr int wgmma_rows(int wg) { return 64 * wg; }
__host__ __device__ constexpr int wgmma_budget(int wg) { return wg == 2 ? 200 * 1024 : 100 * 1024; }
// A stage: the block's weight rows and BN activation rows, 128 bytes each.
__host__ __device__ constexpr int wgmma_stage_bytes(int bn, int wg) { return (wgmma_rows(wg) + bn) * 128; }
__host__ __device__ constexpr int wgmma_stages(int bn, int wg) {
  return wgmma_budget(wg) / wgmma_stage_bytes(bn, wg) < 8 ? wgmma_budget(wg) / wgmma_stage_bytes(bn, wg) : 8;
}
__host__ __device__ constexpr int wgmma_smem(int bn, int wg) {
  return wgmma_stages(bn, wg) * wgmma_stage_bytes(bn, wg) + 1024;
}

struct wgmma_linear_args {
  int64_t m = 0, n = 0, k = 0;
  float* y = nullptr;       // [m][ldy] (one split) or partials [splits][m][n] (ldy = n)
  int64_t ldy = 0;
  float beta = 0.0f;        // one split: y = acc + beta · y (beta 0: y not read)
  int kb_per_split = 0;     // 64-wide k blocks a split
  int splits_per_block = 1; // kSumSplits: the splits a block sums (blockIdx.y then 0)
};

__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
          "r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}

// A stage's MMAs on a consumer warpgroup: d (+)= the 64 weight rows at ws (A) times the BN
// activation rows at xs (B), 64 k in four k16 steps, ascending; returns once the previous
// stage's MMAs are done (its slot may be released), this stage's in flight (kPending 1), or once
// this stage's are done too (kPending 0: its own slot may be released).
template <int BN, int kPending = 1>
__device__ __forceinline__ void wgmma_stage_mma(float (&d)[BN / 2], const uint8_t* ws, const uint8_t* xs) {
  wgmma_fence_regs(d);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kWgmmaBK / 16; ++kk)
    wgmma_bf16<BN>::run(d, wgmma_desc_sw128(ws + kk * 32), wgmma_desc_sw128(xs + kk * 32), 1);
  wgmma_commit();
  wgmma_wait<kPending>();
  wgmma_fence_regs(d);
}

// Blocks an SM: one with two consumers or with one of 256 activation rows (its 128 accumulators a
// thread do not fit 128 registers), else two.
__host__ __device__ constexpr int wgmma_blocks_per_sm(int bn, int wg) { return wg == 2 || bn == 256 ? 1 : 2; }

template <int BN, int WG, bool kSumSplits = false>
__global__ void __launch_bounds__(wgmma_threads(WG), wgmma_blocks_per_sm(BN, WG))
    wgmma_linear_kernel(const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap tx,
                        const wgmma_linear_args a) {
  constexpr int S = wgmma_stages(BN, WG), W_BYTES = wgmma_rows(WG) * 128, STAGE = wgmma_stage_bytes(BN, WG);
  extern __shared__ uint8_t wgmma_smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(wgmma_smem_raw) + 1023) & ~uintptr_t{1023});
  __shared__ __align__(8) uint64_t full[S], empty[S];
  const int wg = static_cast<int>(threadIdx.x) / 128, t = static_cast<int>(threadIdx.x) % 128;
  const int n0 = static_cast<int>(blockIdx.x) * wgmma_rows(WG), m0 = static_cast<int>(blockIdx.z) * BN;
  const int kbs = static_cast<int>((a.k + kWgmmaBK - 1) / kWgmmaBK);
  const int kb_block = a.kb_per_split * (kSumSplits ? a.splits_per_block : 1);
  const int kb0 = static_cast<int>(blockIdx.y) * kb_block;
  const int nk = min(kbs, kb0 + kb_block) - kb0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], WG);
    }
    fence_mbar_init();
  }
  __syncthreads();

  if (wg == 0) {  // the producer
    if constexpr (WG == 2 || BN < 256) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (t == 0) {
      // The first S stages' weights before the programmatic-launch wait (no earlier kernel
      // writes them), their activations after it.
      const int pre = min(S, nk);
      for (int i = 0; i < pre; ++i) {
        mbar_arrive_expect_tx(&full[i], STAGE);
        tma_load_2d(smem + i * STAGE, &tw, (kb0 + i) * kWgmmaBK, n0, &full[i]);
      }
      pdl_wait();
      for (int i = 0; i < pre; ++i) tma_load_2d(smem + i * STAGE + W_BYTES, &tx, (kb0 + i) * kWgmmaBK, m0, &full[i]);
      for (int i = pre; i < nk; ++i) {
        const int s = i % S;
        mbar_wait(&empty[s], static_cast<uint32_t>((i / S - 1) & 1));
        uint8_t* dst = smem + s * STAGE;
        mbar_arrive_expect_tx(&full[s], STAGE);
        tma_load_2d(dst, &tw, (kb0 + i) * kWgmmaBK, n0, &full[s]);
        tma_load_2d(dst + W_BYTES, &tx, (kb0 + i) * kWgmmaBK, m0, &full[s]);
      }
    }
    return;
  }
  if constexpr (WG == 2) {  // 128 · 40 + 256 · 232 registers: one block an SM
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  } else if constexpr (BN < 256) {  // 128 · 40 + 128 · 216: two blocks an SM
    asm volatile("setmaxnreg.inc.sync.aligned.u32 216;\n");
  }
  const int c = wg - 1;  // weight rows [64c, 64c + 64) of the block's
  float d[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) d[i] = 0.0f;
  float sum[kSumSplits ? BN / 2 : 1];  // kSumSplits: the splits done, added in ascending order
  for (int i = 0; i < nk; ++i) {
    const int s = i % S;
    mbar_wait(&full[s], static_cast<uint32_t>((i / S) & 1));
    const uint8_t* ws = smem + s * STAGE + c * 64 * 128;
    const uint8_t* xs = smem + s * STAGE + W_BYTES;
    wgmma_stage_mma<BN>(d, ws, xs);  // stage i - 1's MMAs are done: release it
    if (i > 0 && t == 0) mbar_arrive(&empty[(i - 1) % S]);
    if constexpr (kSumSplits) {
      if ((i + 1) % a.kb_per_split == 0 || i + 1 == nk) {  // a split ends: into the sum, d from zero
        wgmma_wait<0>();
        wgmma_fence_regs(d);
        const bool first = i < a.kb_per_split;
#pragma unroll
        for (int j = 0; j < BN / 2; ++j) {
          sum[j] = first ? d[j] : sum[j] + d[j];
          d[j] = 0.0f;
        }
      }
    }
  }
  wgmma_wait<0>();
  wgmma_fence_regs(d);
  if constexpr (kSumSplits) {
#pragma unroll
    for (int j = 0; j < BN / 2; ++j) d[j] = sum[j];
  }
  pdl_wait();  // y: read (beta) and written after the kernels before this one
  pdl_launch_dependents();

  // d[4j + e]: feature row r (+8 for e >= 2) of the warpgroup's 64, activation row 8j + 2·(lane % 4) (+1 for odd e).
  const int warp = t / 32, lane = t % 32;
  const int f = n0 + 64 * c + 16 * warp + lane / 4;
  float* y = a.y + static_cast<int64_t>(blockIdx.y) * a.m * a.ldy;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = m0 + 8 * j + 2 * (lane % 4) + (e & 1), col = f + (e >= 2 ? 8 : 0);
      if (row < a.m && col < a.n) {
        float* o = y + static_cast<int64_t>(row) * a.ldy + col;
        *o = a.beta != 0.0f ? d[4 * j + e] + a.beta * *o : d[4 * j + e];
      }
    }
  }
}

// y[r][c] = Σ_s partials[s][r][c], s ascending (+ beta · y[r][c]; float4 columns: n % 4 == 0,
// ldy % 4 == 0).
__global__ void wgmma_reduce_splits(const float* __restrict__ partials, float* __restrict__ y, int64_t m, int64_t n,
                                    int64_t ldy, int splits, float beta) {
  const int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, per_row = n / 4;
  if (q >= m * per_row) return;
  const int64_t r = q / per_row, c4 = q - r * per_row;
  float4 acc = reinterpret_cast<const float4*>(partials)[q];
  for (int s = 1; s < splits; ++s) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(partials + s * m * n) + q);
    acc.x += v.x;
    acc.y += v.y;
    acc.z += v.z;
    acc.w += v.w;
  }
  float4* o = reinterpret_cast<float4*>(y + r * ldy) + c4;
  if (beta != 0.0f) {
    const float4 old = *o;
    acc.x += beta * old.x;
    acc.y += beta * old.y;
    acc.z += beta * old.z;
    acc.w += beta * old.w;
  }
  *o = acc;
}

// The grid of a call: consumer warpgroups (WG) and splits of k. Each candidate (WG 2, or 1 below
// 256 rows a tile; 1..8 splits of at least 8 k blocks each) is costed as its bytes (weights,
// activations, the outputs, and with splits the partial sums written and read back) over the
// share of the device's block slots (SMs · blocks an SM) its whole waves fill; the cheapest
// wins, then fewer splits, then WG 2.
struct wgmma_plan {
  int wg = 2, splits = 1;
};
inline wgmma_plan wgmma_plan_for(int64_t m, int64_t n, int64_t k, int bn, int sms) {
  const int64_t kbs = (k + kWgmmaBK - 1) / kWgmmaBK, mtiles = (m + bn - 1) / bn;
  const double fixed = 2.0 * static_cast<double>(n * k + m * k) + 4.0 * static_cast<double>(m * n);
  wgmma_plan best;
  double best_cost = 0.0;
  for (int wg : {2, 1}) {
    if (wg == 1 && bn == 256) continue;
    const int64_t tiles = (n + wgmma_rows(wg) - 1) / wgmma_rows(wg) * mtiles;
    const int64_t slots = int64_t{sms} * wgmma_blocks_per_sm(bn, wg);
    for (int s = 1; s <= 8; ++s) {
      if (s > 1 && kbs / s < 8) break;
      const int64_t blocks = tiles * s, waves = (blocks + slots - 1) / slots;
      const double fill = static_cast<double>(blocks) / static_cast<double>(waves * slots);
      const double cost = (fixed + (s > 1 ? 8.0 * s * static_cast<double>(m * n) : 0.0)) / fill;
      if (best_cost == 0.0 || cost < best_cost * (1.0 - 1e-9)) {
        best_cost = cost;
        best = {wg, s};
      }
    }
  }
  return best;
}

// determinism: batch_invariant: the consumer warpgroups and the k splits of every call on a
// weight [n, k], whatever its rows: one row's plan (the decode step's), so that a row is summed
// over the same splits at any m.
inline wgmma_plan wgmma_invariant_plan(int64_t n, int64_t k, int sms) { return wgmma_plan_for(1, n, k, 8, sms); }

// A tensor map of a row-major bf16 matrix [rows][cols] with row stride ld elements (ld % 8 == 0,
// 16-byte aligned) read in boxes of box_rows × 64 with the 128-byte swizzle; rows and columns
// beyond the matrix read as zeros.
inline bool wgmma_tensor_map(CUtensorMap* map, const void* base, int64_t rows, int64_t cols, int box_rows,
                             int64_t ld = 0) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld > 0 ? ld : cols) * 2};
  const cuuint32_t box[2] = {kWgmmaBK, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t estr[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box, estr,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace
}  // namespace hyserve::kernels::cuda_detail
