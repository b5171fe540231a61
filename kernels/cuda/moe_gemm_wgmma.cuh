#pragma once
// The routed experts' grouped GEMMs on warpgroup MMAs (kernels.moe_wgmma: bf16 weights, fast
// mode, the many-row path: prefill), beside moe_gemm.cuh's mma.sync tiles (moe.cu, the only
// includer; internal linkage). The same contract as moe_grouped_gemm_kernel:
//   swiglu: act[r] = bf16(silu(a[r] · gate_eᵀ) ⊙ (a[r] · up_eᵀ))
//   else:   y[r]   = a[r] · down_eᵀ (f32)
// for the permuted rows r of each expert e. A tile is one scan tile (BN rows of one expert,
// 192 or 128: the MMA's N, the activations its B operand) and 128 weight rows (the MMA's A, two
// consumer warpgroups of 64): swiglu, 64 outputs' gate rows and up rows (a warpgroup each; the
// gate warpgroup hands its sums to the up warpgroup through shared memory); else 128 outputs.
// The producer warpgroup fills a ring of stages: one thread the weight rows by tensor copies
// (gemm_wgmma.cuh's 128-byte-swizzled K-major tiles), all 128 threads the tile's activation rows
// by cp.async (gathered through a_rows, zero past the tile's rows and k), in the same swizzle,
// each thread's copies completing on the stage's barrier. Sums in f32 over k16 steps in order.
// A block takes one tile, or (kernels.moe_wgmma_persistent) one an SM in turn.
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "async_copy.cuh"
#include "gemm_wgmma.cuh"
#include "hyserve/kernels/moe.h"
#include "hyserve/kernels/paths.h"
#include "moe_gemm.cuh"
#include "wgmma_ops.cuh"

namespace hyserve::kernels::cuda_detail {
namespace {

// Activation rows a tile (the scan's tile rows, the MMA's N): 192 (kernels.moe_wgmma_rows, the
// default), or 128. 192: an expert of up to 192 rows in one tile (its weights read once, and
// fewer rows of padding when experts get 129–192 rows, e.g. ~160 at 8192 tokens of Qwen3-Next's
// 512 experts, top 10).
template <int BN>
struct moe_wgmma_shape {
  static_assert(BN == 128 || BN == 192, "128 or 192 activation rows a tile");
  static constexpr int kStages = BN == 128 ? 5 : 4;  // 32 or 40 KB a stage (weights and activations of 64 k)
  static constexpr int kStage = 128 * 128 + BN * 128;
  static constexpr int kGateBytes = 128 * (BN / 2) * 4;  // the gate warpgroup's sums
  static constexpr int kSmem = kStages * kStage + kGateBytes + 1024;
};

__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}

// The block order (kernels.moe_tile_order). outputs_first (outputs, the default): tile index
// x = scan tile · out_tiles + weight-row tile, so the blocks that run together share their
// activation rows (read from memory once, then from L2). rows: x = weight-row tile · scan_tiles
// + scan tile; the blocks of one weight-row tile run over all the scan tiles before the next
// weight-row tile starts, and every activation row is read from memory once per weight-row tile
// (8 times for Qwen3-Next's gate/up, 16 for down, about 4 GB at 8192 tokens). scan_tiles is the
// host's bound (max_tiles); tiles past the routing's count are skipped. The arithmetic of a tile
// is the same either way.
struct moe_wgmma_order {
  int64_t out_tiles = 0, scan_tiles = 0;
  bool outputs_first = true;
  bool x_tma = false;  // the activation rows by tensor copies (kernels.moe_wgmma_tma_x; no a_rows)
  bool tile_handoff = false;  // the consumers take a tile's rows from tile_rows (kernels.moe_wgmma_tile_handoff)
};

// A block takes tiles x = blockIdx.x, + gridDim.x, ... (one a block when the grid covers them
// all; kernels.moe_wgmma_persistent: a block an SM, so that the producer fills the next tile's
// stages while the consumers store the last one's outputs). The ring's stages and phases run on
// over the block's tiles. kEarly: kernels.moe_wgmma_early_release (below). It is a template
// argument, not a run-time flag: with both releases in one body ptxas cannot tell that a tile's
// MMAs are waited for before its sums are read on every path, injects waits and serialises every
// wgmma (its C7514/C7518 warnings).
template <bool kSwiglu, int BN, bool kEarly>
__global__ void __launch_bounds__(384, 1)
    moe_wgmma_kernel(const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap tx, const gg_args g,
                     const moe_wgmma_order order) {
  using shape = moe_wgmma_shape<BN>;
  constexpr int S = shape::kStages, W_BYTES = 128 * 128, kStage = shape::kStage;
  extern __shared__ uint8_t moe_wg_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(moe_wg_raw) + 1023) & ~uintptr_t{1023});
  float* gate_sums = reinterpret_cast<float*>(smem + S * kStage);
  __shared__ __align__(8) uint64_t full[S], empty[S];
  // order.tile_handoff: a tile's rows [x, y) of the permuted order, written by the producer with
  // the tile's first stage (before that stage's arrival on full) and read by the consumers once
  // they have waited for that stage (the slot is not refilled before they release it), so only
  // the producer searches the tile offsets. Else the consumers search too.
  __shared__ int2 tile_rows[S];

  const int wg = static_cast<int>(threadIdx.x) / 128, t = static_cast<int>(threadIdx.x) % 128;
  // order.x_tma: the activation rows are the permuted rows themselves (no a_rows: the down
  // projection's), loaded by a tensor copy of the tile's BN rows (tx; rows past the tile's end are
  // the next expert's or zeros, their outputs not stored) instead of the 128 threads' cp.async.
  const bool x_tma = order.x_tma;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(&full[s], x_tma ? 1 : 1 + 128);  // the tensor copies' arrival (and 128 cp.async arrivals)
      mbar_init(&empty[s], 2);
    }
    fence_mbar_init();
  }
  __syncthreads();
  const int nk = static_cast<int>((g.k + kWgmmaBK - 1) / kWgmmaBK);
  const int64_t rows_per_expert = g.b_expert / g.ldb;
  // Tiles in order: past the routing's scan tiles every later tile of the outputs order is
  // empty too.
  const int64_t routed = g.tile_offsets[g.experts];
  const int64_t tiles =
      order.out_tiles * (order.outputs_first ? (routed < order.scan_tiles ? routed : order.scan_tiles) : order.scan_tiles);
  // Tile x's scan tile (none at or past routed) and weight-row tile.
  const auto scan_of = [&](int64_t x, int64_t& out_tile) {
    out_tile = order.outputs_first ? x % order.out_tiles : x / order.scan_tiles;
    return order.outputs_first ? x / order.out_tiles : x % order.scan_tiles;
  };

  if (wg == 0) {  // the producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");
    const bf16* A = static_cast<const bf16*>(g.a);
    constexpr int R = BN * 8 / 128;  // this thread's rows of a tile: t / 8 + 16 j, 16-byte chunk t % 8
    const int kc = t & 7;
    uint32_t it = 0;  // the block's stage count so far
    for (int64_t x = blockIdx.x; x < tiles; x += gridDim.x) {
      int64_t out_tile = 0;
      const expert_tile tile = find_expert_tile(g, BN, static_cast<int>(scan_of(x, out_tile)));
      if (!tile.valid) continue;  // uniform over the block
      // The tile's weight rows in the [experts · rows an expert, k] map: two boxes of 64.
      const int64_t j0 = out_tile * (kSwiglu ? 64 : 128);
      const int64_t wrow0 = tile.e * rows_per_expert + j0;
      const int64_t wrow1 = kSwiglu ? tile.e * rows_per_expert + g.b_up / g.ldb + j0 : wrow0 + 64;
      int32_t src[R];  // this thread's rows' operands (their row in a); -1: none
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const int r = tile.row_begin + (t >> 3) + 16 * j;
        src[j] = r < tile.row_end ? (g.a_rows ? g.a_rows[r] : r) : -1;
      }
      for (int i = 0; i < nk; ++i, ++it) {
        const uint32_t s = it % S;
        if (it >= S) mbar_wait(&empty[s], (it / S - 1) & 1);
        uint8_t* st = smem + s * kStage;
        const int k0 = i * kWgmmaBK;
        uint8_t* xs = st + W_BYTES;
        if (t == 0) {
          if (i == 0 && order.tile_handoff) tile_rows[s] = make_int2(tile.row_begin, tile.row_end);
          mbar_arrive_expect_tx(&full[s], W_BYTES + (x_tma ? BN * 128 : 0));
          tma_load_2d(st, &tw, k0, static_cast<int>(wrow0), &full[s]);
          tma_load_2d(st + W_BYTES / 2, &tw, k0, static_cast<int>(wrow1), &full[s]);
          if (x_tma) tma_load_2d(xs, &tx, k0, tile.row_begin, &full[s]);
        }
        if (x_tma) continue;
        const bool k_in = k0 + kc * 8 < g.k;
#pragma unroll
        for (int j = 0; j < R; ++j) {
          const int row = (t >> 3) + 16 * j;
          const bool valid = src[j] >= 0 && k_in;
          void* dst = xs + row * 128 + ((kc ^ (row & 7)) << 4);
          const bf16* from = valid ? A + static_cast<int64_t>(src[j]) * g.lda + k0 + kc * 8 : A;
          cp_async16_zfill(dst, from, valid);
        }
        cp_async_mbar_arrive(&full[s]);
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");  // 128 · 56 + 256 · 224 registers
  const int c = wg - 1;
  const int warp = t / 32, lane = t % 32;
  uint32_t it = 0;
  bool stored = false;  // swiglu: the gate warpgroup has handed over sums before
  for (int64_t x = blockIdx.x; x < tiles; x += gridDim.x) {
    int64_t out_tile = 0;
    const int64_t scan = scan_of(x, out_tile);
    int row_begin = 0, row_end = 0;
    if (order.tile_handoff) {
      if (scan >= routed) continue;  // find_expert_tile's invalid tiles
    } else {
      const expert_tile tile = find_expert_tile(g, BN, static_cast<int>(scan));
      if (!tile.valid) continue;
      row_begin = tile.row_begin;
      row_end = tile.row_end;
    }
    const int64_t j0 = out_tile * (kSwiglu ? 64 : 128);
    float d[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) d[i] = 0.0f;
    for (int i = 0; i < nk; ++i, ++it) {
      const uint32_t s = it % S;
      mbar_wait(&full[s], (it / S) & 1);
      if (i == 0 && order.tile_handoff) {
        const int2 rows = tile_rows[s];
        row_begin = rows.x;
        row_end = rows.y;
      }
      fence_proxy_async();  // the rows cp.async wrote (generic proxy), then read by the MMAs (async proxy)
      const uint8_t* ws = smem + s * kStage + c * 64 * 128;
      const uint8_t* xs = smem + s * kStage + W_BYTES;
      // kEarly: a stage's slot goes back as soon as its own MMAs are done, rather
      // than once the next stage's rows have landed and its MMAs are issued (the MMAs of two
      // stages then never overlap; the loads run one stage further ahead).
      if constexpr (kEarly) {
        wgmma_stage_mma<BN, 0>(d, ws, xs);
        if (t == 0) mbar_arrive(&empty[s]);
      } else {
        wgmma_stage_mma<BN>(d, ws, xs);
        if (i > 0 && t == 0) mbar_arrive(&empty[(it - 1) % S]);
      }
    }
    if constexpr (!kEarly) {
      wgmma_wait<0>();
      wgmma_fence_regs(d);
      if (t == 0) mbar_arrive(&empty[(it - 1) % S]);  // the tile's last stage
    }

    // d[4j + q]: weight row 16·warp + lane / 4 (+8 for q >= 2) of the warpgroup's 64, tile row
    // 8j + 2·(lane % 4) (+1 for odd q).
    if constexpr (kSwiglu) {
      // The gate warpgroup hands its sums over through shared memory (barrier 1) once the up
      // warpgroup has read the last tile's (barrier 2).
      if (c == 0) {
        if (stored) named_sync(2, 256);
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) gate_sums[i * 128 + t] = d[i];
        named_arrive(1, 256);
        stored = true;
        continue;
      }
      named_sync(1, 256);
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int r = row_begin + 8 * j + 2 * (lane % 4) + (q & 1);
          const int64_t col = j0 + 16 * warp + lane / 4 + (q >= 2 ? 8 : 0);
          if (r >= row_end || col >= g.n) continue;
          const float gv = gate_sums[(4 * j + q) * 128 + t];
          const float v = gv / (1.0f + expf(-gv)) * d[4 * j + q];  // the swiglu op's formula
          static_cast<bf16*>(g.c)[static_cast<int64_t>(r) * g.ldc + col] = __float2bfloat16(v);
        }
      named_arrive(2, 256);
    } else {
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int r = row_begin + 8 * j + 2 * (lane % 4) + (q & 1);
          const int64_t col = j0 + 64 * c + 16 * warp + lane / 4 + (q >= 2 ? 8 : 0);
          if (r >= row_end || col >= g.n) continue;
          static_cast<float*>(g.c)[static_cast<int64_t>(r) * g.ldc + col] = d[4 * j + q];
        }
    }
  }
  if constexpr (kSwiglu) {
    if (c == 0 && stored) named_sync(2, 256);  // the up warpgroup's last arrival
  }
}

// Whether the many-row path of a call runs here (kernels.moe_wgmma; bf16 weights, fast mode):
// 16-byte weight and activation rows, the weights 16-byte aligned.
inline bool moe_wgmma_applies(const moe_experts_params& p) {
  return current_paths().moe_wgmma && !current_paths().batch_invariant && p.hidden % 8 == 0 && p.inter % 8 == 0 &&
         aligned16(p.gate_up) && aligned16(p.down);
}

template <bool kSwiglu>
void launch_moe_wgmma(const gg_args& g, int64_t rows, cudaStream_t stream) {
  CUtensorMap tw;
  const int64_t map_rows = static_cast<int64_t>(g.experts) * (g.b_expert / g.ldb);
  if (!wgmma_tensor_map(&tw, g.b, map_rows, g.k, 64, g.ldb))
    throw error("moe: cuTensorMapEncodeTiled failed for the warpgroup-MMA experts' GEMM");
  const auto launch = [&](auto bn_tag, auto early_tag) {
    constexpr int BN = decltype(bn_tag)::value;
    auto kernel = moe_wgmma_kernel<kSwiglu, BN, decltype(early_tag)::value>;
    constexpr int smem = moe_wgmma_shape<BN>::kSmem;
    reserve_dynamic_shared(reinterpret_cast<const void*>(kernel), smem);
    moe_wgmma_order order;
    order.scan_tiles = max_tiles(rows, g.experts, BN);
    order.out_tiles = ceil_div(g.n, int64_t{kSwiglu ? 64 : 128});
    order.outputs_first = current_paths().moe_tile_order != kernel_paths::moe_tile_order_kind::kRows;
    CUtensorMap tx = tw;
    order.x_tma = current_paths().moe_wgmma_tma_x && g.a_rows == nullptr;
    order.tile_handoff = current_paths().moe_wgmma_tile_handoff;
    if (order.x_tma && !wgmma_tensor_map(&tx, g.a, rows, g.k, BN, g.lda))
      throw error("moe: cuTensorMapEncodeTiled failed for the warpgroup-MMA experts' activation rows");
    const int64_t tiles = order.scan_tiles * order.out_tiles;
    const int64_t blocks = current_paths().moe_wgmma_persistent ? std::min<int64_t>(tiles, sm_count()) : tiles;
    kernel<<<static_cast<unsigned>(blocks), 384, smem, stream>>>(tw, tx, g, order);
  };
  const auto rows_of = [&](auto early_tag) {
    if (moe_tile_rows(moe_gemm_path::kWgmma) == 192)  // the scan's tiles: kernels.moe_wgmma_rows
      launch(std::integral_constant<int, 192>{}, early_tag);
    else
      launch(std::integral_constant<int, 128>{}, early_tag);
  };
  if (current_paths().moe_wgmma_early_release)
    rows_of(std::true_type{});
  else
    rows_of(std::false_type{});
  HYSERVE_CUDA_CHECK_LAUNCH();
}

// The experts' GEMM of a path: kWgmma (moe_wgmma_applies held, the scan's tiles of
// moe_tile_rows(kWgmma) rows) here, the others moe_gemm.cuh's.
template <class W, bool kSwiglu>
void launch_experts_gemm(const gg_args& g, int64_t rows, moe_gemm_path path, cudaStream_t stream) {
  if constexpr (std::is_same_v<W, bf16>) {
    if (path == moe_gemm_path::kWgmma) return launch_moe_wgmma<kSwiglu>(g, rows, stream);
  }
  launch_gemm<W, kSwiglu>(g, rows, path, stream);
}

}  // namespace
}  // namespace hyserve::kernels::cuda_detail
