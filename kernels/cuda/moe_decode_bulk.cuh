#pragma once
// kernels.moe_decode default at one token: the up projection's weights streamed into shared memory
// by the SM's bulk copy engine (cp.async.bulk) through a ring of stages (bulk_plan::stages), one block an
// SM, where the one-row up kernel (moe_decode.cuh) has each warp load its own row pair into
// registers and multiply it before its next loads go out; and the down projection the same way
// (below: moe_decode_down_bulk_kernel). moe_decode.cuh's only includer.
//
// The work is a list of stages of up to R consecutive outputs each (R·hidden·2 bytes of gate
// rows and as many of up rows: two bulk copies): first the shared expert's (and, gated, one
// stage of its gate's single row), then each of the token's top_k experts' in ascending index
// (the routing's tiles). Its length is known before the routing (one token: top_k experts), so
// block b takes an even share of each part: the shared expert's stages [S·b / G, S·(b + 1) / G)
// and the routed ones likewise. A producer warp (the ninth)
// issues the copies, the shared expert's before the wait for the router (weights do not depend
// on it), each later one once its ring slot is released; the 8 consumer warps take the stages in
// turn, R warps a stage (8 / R stages at once), a warp an output: lane l's chunks l, l + 32, …
// ascending, fmaf over their 8 elements, then warp_sum: dot_rows's order, so the results are the
// one-row kernel's and the split path's bits (routed: x rounded to bf16 as read, act in bf16;
// the shared expert: x in f32, act and the gate's value in f32).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "async_copy.cuh"
#include "common.cuh"
#include "launch.cuh"
#include "moe_decode_parts.cuh"

namespace hyserve::kernels::cuda_detail {
namespace {

constexpr int kBulkMaxStages = 8;
constexpr int kBulkThreads = kDecodeThreads + 32;       // 8 consumer warps and the producer
constexpr int64_t kBulkStageBytes = 32 * 1024;          // gate and up rows of a stage
constexpr int64_t kBulkMaxHidden = kBulkStageBytes / 4;  // one output a stage

// The rings' bytes, up and down kernels: kernels.moe_decode_ring_kb, default 128 KB (the up
// kernel's default is 4 stages, whatever their size: 32 KB each at the Qwen3-Next shape; the down
// kernel's 16 of 8 KB there).
inline int64_t bulk_ring_bytes() {
  const int32_t kb = current_paths().moe_decode_ring_kb;
  return int64_t{kb > 0 ? kb : 128} * 1024;
}

// Outputs a stage: the largest power of two <= 8 whose gate and up rows fit kBulkStageBytes.
inline int bulk_rows(int64_t hidden) {
  int r = 8;
  while (r > 1 && 2 * r * hidden * 2 > kBulkStageBytes) r /= 2;
  return r;
}

// Stages of the up kernel's ring: 4 (the default: up to 128 KB); with kernels.moe_decode_ring_kb
// set, as many of its stages (2·R·hidden·2 bytes) as those bytes hold, 2 to kBulkMaxStages.
inline int bulk_stages(int64_t hidden) {
  if (current_paths().moe_decode_ring_kb <= 0) return 4;
  const int64_t stage = 2 * bulk_rows(hidden) * hidden * 2;
  return static_cast<int>(std::clamp<int64_t>(bulk_ring_bytes() / stage, 2, kBulkMaxStages));
}

// The dynamic shared memory: the ring, then the router's scores (E floats).
inline size_t bulk_smem(int64_t hidden, int64_t experts) {
  return static_cast<size_t>(bulk_stages(hidden) * 2 * bulk_rows(hidden) * hidden) * sizeof(__nv_bfloat16) +
         static_cast<size_t>(experts) * sizeof(float);
}

struct bulk_plan {
  int stages = 4;        // S: ring slots
  int rows = 1;          // R: outputs a stage
  int shared_out = 0;    // stages of the shared expert's outputs
  int shared_gate = 0;   // 1: one more stage, the shared expert gate's row
  int per_expert = 0;    // stages an expert: ceil(inter / R)
  int total = 0;         // shared_out + shared_gate + top_k · per_expert
};

// Stage g: where its rows are (gate rows; up rows, nullptr for the gate's row), how many, its
// first output, and what it is (-2 the shared expert, -1 its gate's row, x >= 0 the tile x).
struct bulk_stage {
  const __nv_bfloat16* gate;
  const __nv_bfloat16* up;
  int rows, j0, tile;
};

__device__ __forceinline__ bulk_stage bulk_stage_at(const decode_args& d, const bulk_plan& p, const route_smem& rs,
                                                    int g) {
  const int R = p.rows;
  if (g < p.shared_out) {
    const int j0 = g * R;
    return {d.s_gate + static_cast<int64_t>(j0) * d.hidden, d.s_up + static_cast<int64_t>(j0) * d.hidden,
            static_cast<int>(min(int64_t{R}, d.s_inter - j0)), j0, -2};
  }
  g -= p.shared_out;
  if (g < p.shared_gate) return {d.s_gate_w, nullptr, 1, 0, -1};
  g -= p.shared_gate;
  const int tile = g / p.per_expert, j0 = (g % p.per_expert) * R;
  const __nv_bfloat16* B = d.gate_up + static_cast<int64_t>(rs.tile_expert[tile]) * 2 * d.inter * d.hidden;
  return {B + static_cast<int64_t>(j0) * d.hidden, B + (d.inter + j0) * d.hidden,
          static_cast<int>(min(int64_t{R}, d.inter - j0)), j0, tile};
}

__global__ void __launch_bounds__(kBulkThreads, 1) moe_decode_up_bulk_kernel(const decode_args d, const bulk_plan p) {
  extern __shared__ __align__(128) uint4 bulk_ring[];  // [stages][2][R · hidden] bf16, then the router's scores
  __shared__ route_smem rs;
  __shared__ __align__(8) uint64_t full[kBulkMaxStages], empty[kBulkMaxStages];
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int R = p.rows, groups = kDecodeWarps / R, S = p.stages;
  const int64_t row_chunks = d.hidden / 8, slot_chunks = 2 * R * row_chunks;
  float* scores = reinterpret_cast<float*>(bulk_ring + S * slot_chunks);
  // Block b: its even share of the shared expert's stages (they need no routing: every block
  // has loads in flight while it routes), then its share of the routed ones.
  const int64_t G = gridDim.x, b = blockIdx.x;
  const int64_t SS = p.shared_out + p.shared_gate, RS = p.total - SS;  // stages before / after the routing
  const int s0 = static_cast<int>(SS * b / G), ns = static_cast<int>(SS * (b + 1) / G) - s0;
  const int r0 = static_cast<int>(SS + RS * b / G), nr = static_cast<int>(SS + RS * (b + 1) / G) - r0;
  const int n = ns + nr;
  auto global = [&](int i) { return i < ns ? s0 + i : r0 + (i - ns); };
  ring_init(full, empty, R);

  const bool producer = warp == kDecodeWarps && lane == 0;
  auto issue = [&](int i) {  // local stage i into its slot (the producer)
    const int slot = i % S;
    if (i >= S) mbar_wait(&empty[slot], static_cast<uint32_t>((i / S - 1) & 1));
    const bulk_stage st = bulk_stage_at(d, p, rs, global(i));
    const uint32_t bytes = static_cast<uint32_t>(st.rows * d.hidden * 2);
    uint4* dst = bulk_ring + slot * slot_chunks;
    mbar_arrive_expect_tx(&full[slot], st.up != nullptr ? 2 * bytes : bytes);
    bulk_copy(dst, st.gate, bytes, &full[slot]);
    if (st.up != nullptr) bulk_copy(dst + R * row_chunks, st.up, bytes, &full[slot]);
  };
  int issued = 0;
  if (producer)  // the shared expert's stages need no routing: before the wait for the router
    while (issued < ns && issued < S) issue(issued++);
  pdl_begin();  // the router's logits and x
  if (nr > 0 || b == 0) route_block(d, scores, rs, b == 0);  // block-uniform; block 0 publishes
  if (producer) {
    while (issued < n) issue(issued++);
    return;
  }
  if (warp >= kDecodeWarps) return;

  const float4* x = reinterpret_cast<const float4*>(d.x);  // the one token
  const int group = warp / R, out = warp % R;
#pragma unroll 1
  for (int i = group; i < n; i += groups) {
    const int slot = i % S;
    const bulk_stage st = bulk_stage_at(d, p, rs, global(i));
    mbar_wait(&full[slot], static_cast<uint32_t>((i / S) & 1));
    if (out < st.rows) {
      const uint4* wg = bulk_ring + slot * slot_chunks + out * row_chunks;
      const uint4* wu = wg + R * row_chunks;
      const bool round = st.tile >= 0, two = st.up != nullptr;
      float acc_g = 0.0f, acc_u = 0.0f;
#pragma unroll 4
      for (int64_t c = lane; c < row_chunks; c += 32) {
        const float4 x0 = __ldg(x + 2 * c), x1 = __ldg(x + 2 * c + 1);
        float xf[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        if (round) {
#pragma unroll
          for (int e = 0; e < 8; ++e) xf[e] = __bfloat162float(__float2bfloat16(xf[e]));
        }
        float fg[8], fu[8];
        bf16x8_to_float(wg[c], fg);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc_g = fmaf(xf[e], fg[e], acc_g);
        if (two) {
          bf16x8_to_float(wu[c], fu);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc_u = fmaf(xf[e], fu[e], acc_u);
        }
      }
      const float gate = warp_sum(acc_g), up = warp_sum(acc_u);
      if (lane == 0) {
        const int j = st.j0 + out;
        if (st.tile >= 0)
          d.act[static_cast<int64_t>(rs.tile_begin[st.tile]) * d.inter + j] =
              __float2bfloat16(gate / (1.0f + expf(-gate)) * up);  // up_tasks's formula
        else if (st.tile == -2)
          d.s_act[j] = gate / (1.0f + expf(-gate)) * up;  // shared_up_block's (the swiglu op's)
        else
          d.s_gl[0] = gate;  // the gemm epilogue: 1 · acc
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[slot]);
  }
}

// Whether the bulk kernel takes a one-token call the one-row kernel would (moe_decode_takes
// holds: the shared expert's weights are 16-byte aligned): rows a multiple of 16 bytes, a
// stage's rows within kBulkStageBytes, the experts' weights 16-byte aligned, the ring and the
// router's scores within a block's shared memory.
inline bool bulk_takes(const decode_args& d, int64_t experts) {
  return d.hidden % 8 == 0 && d.hidden <= kBulkMaxHidden && aligned16(d.gate_up) &&
         bulk_smem(d.hidden, experts) <= 200 * 1024;
}

void launch_moe_decode_up_bulk(const decode_args& d, int64_t experts, cudaStream_t stream) {
  bulk_plan p;
  p.stages = bulk_stages(d.hidden);
  p.rows = bulk_rows(d.hidden);
  p.shared_out = static_cast<int>(ceil_div(d.s_inter, int64_t{p.rows}));
  p.shared_gate = d.s_gate_w != nullptr ? 1 : 0;
  p.per_expert = static_cast<int>(ceil_div(d.inter, int64_t{p.rows}));
  p.total = p.shared_out + p.shared_gate + d.route.top_k * p.per_expert;
  const size_t smem = bulk_smem(d.hidden, experts);
  reserve_dynamic_shared(reinterpret_cast<const void*>(moe_decode_up_bulk_kernel), smem);
  const int blocks = static_cast<int>(std::min<int64_t>(sm_count(), p.total));
  launch_pdl(moe_decode_up_bulk_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kBulkThreads), smem, stream, d, p);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

// ---- The down kernel through a ring (the default at one token) ------------------
// Block b takes the column tiles [C·b / G, C·(b + 1) / G) of 8 output columns (C tiles, G
// blocks), a warp a column. Its stages, each one bulk copy of a tile's 8 rows of one expert
// (contiguous: 8 · width · 2 bytes): first the shared expert's rows of each of its tiles (they
// need no routing: issued before the wait for the up kernel), then for each tile its top_k
// experts' rows in the routing's order (ascending index, the slots of d.ids). A warp takes two
// routed stages at a time (two independent dots in flight), y_e = act[row_e] · down_e[col]ᵀ by
// down_tiles's chunk order and reduction, out (= or +=) Σ w_e · y_e in the same order, then the
// shared expert's ys (computed from its stage first, kept in shared memory) added as down_tiles
// adds it. So the bits are the down kernel's and the split path's.
constexpr int kDownBulkMaxStages = 16;

struct down_bulk_plan {
  int stages = 0;            // S: ring slots
  int64_t slot_chunks = 0;   // 16-byte chunks a slot: 8 rows of max(inter, s_inter)
  int max_tiles = 0;         // the most column tiles a block takes
};

inline int64_t down_bulk_width(const decode_args& d) { return std::max(d.inter, d.s_inter); }

// The grid: a block an SM, at most one a column tile.
inline int down_bulk_blocks(const decode_args& d) {
  return static_cast<int>(std::min<int64_t>(sm_count(), ceil_div(d.hidden, int64_t{kDecodeWarps})));
}

// The ring takes the configured bytes; with kernels.moe_decode_ring_kb set, less where the rest of
// the block's shared memory (the act rows and the shared expert's ys: down_bulk_smem) would then
// pass 200 KB (the default's 128 KB leaves such shapes to the down kernel, as before).
inline down_bulk_plan down_bulk_plan_for(const decode_args& d, int blocks) {
  down_bulk_plan p;
  p.slot_chunks = kDecodeWarps * down_bulk_width(d) / 8;
  p.max_tiles = static_cast<int>(ceil_div(ceil_div(d.hidden, int64_t{kDecodeWarps}), int64_t{blocks}));
  const int64_t rest = d.route.top_k * d.inter * 2 + d.s_inter * 4 + int64_t{p.max_tiles} * kDecodeWarps * 4;
  const int64_t ring =
      current_paths().moe_decode_ring_kb > 0 ? std::min(bulk_ring_bytes(), 200 * 1024 - rest) : bulk_ring_bytes();
  p.stages = static_cast<int>(std::clamp<int64_t>(ring / (p.slot_chunks * 16), 2, kDownBulkMaxStages));
  return p;
}

// The dynamic shared memory: the ring, the token's routed act rows (bf16), its shared expert's
// act row (f32), then the shared expert's ys of the block's columns.
inline size_t down_bulk_smem(const decode_args& d, const down_bulk_plan& p) {
  return static_cast<size_t>(p.stages * p.slot_chunks) * 16 +
         static_cast<size_t>(d.route.top_k * d.inter) * sizeof(__nv_bfloat16) + static_cast<size_t>(d.s_inter) * 4 +
         static_cast<size_t>(p.max_tiles * kDecodeWarps) * 4;
}

__global__ void __launch_bounds__(kBulkThreads, 1)
    moe_decode_down_bulk_kernel(const decode_args d, const down_bulk_plan p) {
  extern __shared__ __align__(128) uint4 down_ring[];  // see down_bulk_smem
  __shared__ int s_e[kMaxTopK], s_row[kMaxTopK];
  __shared__ float s_w[kMaxTopK];
  __shared__ __align__(8) uint64_t full[kDownBulkMaxStages], empty[kDownBulkMaxStages];
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int K = d.route.top_k, S = p.stages;
  const int64_t chunks = d.inter / 8, s_chunks = d.s_inter / 8;
  uint4* act_s = down_ring + S * p.slot_chunks;
  float4* shared_act = reinterpret_cast<float4*>(act_s + K * chunks);
  float* ys_s = reinterpret_cast<float*>(shared_act + d.s_inter / 4);
  const int64_t col_tiles = ceil_div(d.hidden, int64_t{kDecodeWarps});
  const int64_t G = gridDim.x, b = blockIdx.x;
  const int64_t t0 = col_tiles * b / G, nt = col_tiles * (b + 1) / G - t0;
  const int ns = d.s_inter > 0 ? static_cast<int>(nt) : 0;  // the shared expert's stages
  const int n = ns + static_cast<int>(nt) * K;
  ring_init(full, empty, kDecodeWarps);

  auto issue = [&](int i) {  // local stage i into its slot (the producer)
    const int slot = i % S;
    if (i >= S) mbar_wait(&empty[slot], static_cast<uint32_t>((i / S - 1) & 1));
    int64_t tile, width;
    const __nv_bfloat16* src;
    if (i < ns) {
      tile = t0 + i;
      width = d.s_inter;
      src = d.s_down + tile * kDecodeWarps * width;
    } else {
      const int j = i - ns;
      tile = t0 + j / K;
      width = d.inter;
      src = d.down + (static_cast<int64_t>(s_e[j % K]) * d.hidden + tile * kDecodeWarps) * width;
    }
    const int64_t rows = min(int64_t{kDecodeWarps}, d.hidden - tile * kDecodeWarps);
    const uint32_t bytes = static_cast<uint32_t>(rows * width * 2);
    mbar_arrive_expect_tx(&full[slot], bytes);
    bulk_copy(down_ring + slot * p.slot_chunks, src, bytes, &full[slot]);
  };
  const bool producer = warp == kDecodeWarps && lane == 0;
  int issued = 0;
  if (producer)  // the shared expert's rows: before the wait for the up kernel
    while (issued < ns && issued < S) issue(issued++);
  pdl_begin();  // act, the routing and the shared expert's act and gate value of the up kernel
  if (tid < K) {
    s_e[tid] = d.ids[tid];
    s_w[tid] = d.wts[tid];
    s_row[tid] = d.rows[tid];
  }
  __syncthreads();
  if (warp == kDecodeWarps) {
    if (producer)
      while (issued < n) issue(issued++);
    return;
  }
  for (int64_t i = tid; i < K * chunks; i += kDecodeThreads) {
    const int64_t jj = i / chunks, c = i - jj * chunks;
    act_s[i] = __ldg(reinterpret_cast<const uint4*>(d.act + static_cast<int64_t>(s_row[jj]) * d.inter) + c);
  }
  for (int64_t i = tid; i < d.s_inter / 4; i += kDecodeThreads)
    shared_act[i] = __ldg(reinterpret_cast<const float4*>(d.s_act) + i);
  named_sync(1, kDecodeThreads);  // the consumers: act staged
  const float gl = d.s_gate_w != nullptr ? d.s_gl[0] : 0.0f;

  auto wait = [&](int i) { mbar_wait(&full[i % S], static_cast<uint32_t>((i / S) & 1)); };
  auto release = [&](int i) {
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[i % S]);
  };
  auto row = [&](int i, int64_t width) { return down_ring + (i % S) * p.slot_chunks + warp * (width / 8); };
  // The shared expert's ys of each tile (the skinny kernel's dot on f32 act: dot_rows's order).
  for (int i = 0; i < ns; ++i) {
    wait(i);
    if ((t0 + i) * kDecodeWarps + warp < d.hidden) {
      const uint4* w = row(i, d.s_inter);
      float ys = 0.0f;
      for (int64_t c = lane; c < s_chunks; c += 32) {
        const float4 x0 = shared_act[2 * c], x1 = shared_act[2 * c + 1];
        const float xf[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        float wf[8];
        bf16x8_to_float(w[c], wf);
#pragma unroll
        for (int e = 0; e < 8; ++e) ys = fmaf(xf[e], wf[e], ys);
      }
      ys = warp_sum(ys);
      if (lane == 0) ys_s[i * kDecodeWarps + warp] = ys;
    }
    release(i);
  }
  // The routed experts, two stages at a time; the combine and the shared expert's add.
  for (int lt = 0; lt < nt; ++lt) {
    const int64_t col = (t0 + lt) * kDecodeWarps + warp;
    const bool live = col < d.hidden;
    float* o = d.out + col;
    float acc = live && d.accumulate ? *o : 0.0f;
    for (int k = 0; k < K; k += 2) {
      const int i = ns + lt * K + k;
      const bool two = k + 1 < K;
      wait(i);
      if (two) wait(i + 1);
      if (live) {
        const uint4* w0 = row(i, d.inter);
        const uint4* w1 = row(two ? i + 1 : i, d.inter);
        const uint4* a0 = act_s + k * chunks;
        const uint4* a1 = act_s + (two ? k + 1 : k) * chunks;
        float y0 = 0.0f, y1 = 0.0f;
        for (int64_t c = lane; c < chunks; c += 32) {
          float xf[8], wf[8], xg[8], wg[8];
          bf16x8_to_float(a0[c], xf);
          bf16x8_to_float(w0[c], wf);
          bf16x8_to_float(a1[c], xg);
          bf16x8_to_float(w1[c], wg);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            y0 = fmaf(xf[e], wf[e], y0);
            y1 = fmaf(xg[e], wg[e], y1);
          }
        }
        y0 = warp_sum(y0);
        y1 = warp_sum(y1);
        acc += s_w[k] * y0;  // the combine kernel's sum
        if (two) acc += s_w[k + 1] * y1;
      }
      release(i);
      if (two) release(i + 1);
    }
    if (live && lane == 0) {
      if (d.s_inter > 0) {
        const float ys = ys_s[lt * kDecodeWarps + warp];
        acc = d.s_gate_w != nullptr ? __fmaf_rn(sigmoid_of(gl), ys, acc)            // row_add
                                    : __fmaf_rn(1.0f, ys, __fmul_rn(1.0f, acc));  // the gemm epilogue, beta 1
      }
      *o = acc;
    }
  }
}

// Whether the bulk down kernel takes a one-token call the down kernel would: row widths a
// multiple of 16 bytes, a tile's 8 rows within a slot of at most 32 KB, the weights 16-byte
// aligned, its shared memory within a block's.
inline bool down_bulk_takes(const decode_args& d) {
  if (d.inter % 8 != 0 || d.s_inter % 8 != 0 || 16 * down_bulk_width(d) > 32 * 1024 || !aligned16(d.down) ||
      (d.s_inter > 0 && !aligned16(d.s_down)))
    return false;
  return down_bulk_smem(d, down_bulk_plan_for(d, down_bulk_blocks(d))) <= 200 * 1024;
}

void launch_moe_decode_down_bulk(const decode_args& d, cudaStream_t stream) {
  const int blocks = down_bulk_blocks(d);
  const down_bulk_plan p = down_bulk_plan_for(d, blocks);
  const size_t smem = down_bulk_smem(d, p);
  auto kernel = moe_decode_down_bulk_kernel;
  reserve_dynamic_shared(reinterpret_cast<const void*>(kernel), smem);
  launch_pdl(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kBulkThreads), smem, stream, d, p);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace
}  // namespace hyserve::kernels::cuda_detail
