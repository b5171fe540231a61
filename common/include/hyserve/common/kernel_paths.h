#pragma once
// Kernel path choices of the CUDA backend: the `kernels:` section of the service config
// (README, Configuration), carried to the launchers in kernels::exec_context::paths. Every
// field's default selects what the kernels pick on their own; another value forces one variant
// (benchmarks, tests, bisecting a numerical difference). The CPU kernels ignore them.
// Here rather than in kernels/ because the config loader (hyserve_common) fills it and the kernels
// library depends on common, not the other way round. Plain C++17, no CUDA: .cu files include it.
#include <cstdint>

namespace hyserve {

struct kernel_paths {
  // `attn_decode`: the paged decode / verify attention over a bf16 cache: default (mma) | simt
  // (CUDA-core FMAs) | mma (tensor cores).
  enum class attn_decode_kind : uint8_t { kDefault, kSimt, kMma };
  // `gdn_decode`: the Gated DeltaNet decode state update: default (tiles8) | grid | persistent
  // | persistent8 | tiles8.
  enum class gdn_decode_kind : uint8_t { kDefault, kGrid, kPersistent, kPersistent8, kTiles8 };
  // `gdn_prefill`: the GDN chunked prefill path of ops that leave it to the default (model
  // layers choose theirs by model.gdn_prefill): default (tc) | recurrent | tc | tf32 | bf16.
  enum class gdn_prefill_kind : uint8_t { kDefault, kRecurrent, kTc, kTf32, kBf16 };
  // `invariant_gemm`: the row-invariant bf16 GEMMs of determinism: batch_invariant: default
  // (cublaslt) | kernels (hyserve's tensor-core kernels) | cublaslt (cuBLASLt, split-K 1, a
  // 32 MB workspace; layouts it does not take stay on the kernels) | wgmma (the warpgroup-MMA
  // linear kernel, its k splits by the weight's shape; slower than cublaslt in the 9B step and
  // prefill, run 36).
  enum class invariant_gemm_kind : uint8_t { kDefault, kKernels, kCublasLt, kWgmma };
  // `moe_decode`: the routed experts and shared expert of a few tokens (bf16 weights, fast mode):
  // default (fused up to 8 tokens; one token with its up and down weights streamed into shared
  // memory by bulk copies through rings, one block an SM (moe_decode_bulk.cuh; the one-row up
  // kernel where they do not take the shapes); split above) | fused (up to 8 tokens, the general
  // up kernel: routing in the up-projection kernel, the combine and the shared expert in the
  // down projection's: two kernels) | single (one token: up and down in one kernel, a grid
  // barrier between them; more tokens as fused) | split (prepare, two GEMVs, combine, and the
  // shared expert's own kernels). The same bits every way.
  enum class moe_decode_kind : uint8_t { kDefault, kFused, kSingle, kSplit };
  // `moe_tile_order`: the launch order of the warpgroup-MMA experts' GEMM blocks (moe_wgmma):
  // default (outputs) | rows (a weight-row tile's blocks over every scan tile, then the next) |
  // outputs (a scan tile's blocks over every weight-row tile, then the next: its activation rows
  // read from memory once). The same bits. Measured (H100, Qwen3-Next shape, 8192 tokens): the
  // experts 3.240 ms outputs against 3.522 rows; 16-layer 8K prefill 71635 against 68339 tokens/s.
  enum class moe_tile_order_kind : uint8_t { kDefault, kRows, kOutputs };
  // `skinny`: the bf16 skinny GEMM (m <= 8): default (fma) | fma | mma.
  enum class skinny_kind : uint8_t { kDefault, kFma, kMma };
  // `sparse_select`: the Quest page selection kernel: default (v2) | v1 (the last scoring block
  // selects) | v2.
  enum class sparse_select_kind : uint8_t { kDefault, kV1, kV2 };
  // `ssd_scan`: the bf16-io SSD chunk scan (names of ssd_scan_path, kernels/cuda/ssd_scan_paths.h):
  // default (parallel_quad_y; sequential for batches of more than 64 rows) or one of the list.
  enum class ssd_scan_kind : uint8_t {
    kDefault,
    kSequential,
    kParallel,
    kParallelSingle,
    kParallelFast,
    kParallelPair,
    kParallelQuad,
    kParallelY,
    kParallelQuadY,
    kParallelOctY,
  };

  // The top-level `determinism` key (not in `kernels:`): batch_invariant makes every CUDA op's
  // result for a row independent of the other rows of its call (README, "Batch invariance"):
  // GEMMs of any row count on the row-invariant tensor-core kernel (bf16 weights) or a fixed-order
  // CUDA-core kernel (f32 weights, other layouts) instead of cuBLAS, the split-KV decode slices
  // and the SSD scan path chosen without looking at the batch. fast (false): the kernels' own
  // choices. The CPU kernels are row-invariant either way.
  bool batch_invariant = false;
  attn_decode_kind attn_decode = attn_decode_kind::kDefault;
  int32_t attn_decode_waves = 0;  // 1..8 waves of decode blocks; 0 = default (1 mma, 3 simt)
  // 1..256: at most this many split-KV slices a decode row (1: no combine kernel); 0 = default
  // (as many as attn_decode_waves asks for). The same for every row, so batch_invariant holds.
  int32_t attn_decode_max_slices = 0;
  // true (default): the tensor-core extend attention's grid sized for about 8 blocks an SM
  // whatever the kv-head count; false: the shared slice count (at most 64 a (row, kv head): 128
  // blocks for a prompt of a 2-kv-head model, one an SM). The same bits. Measured (H100, run 37,
  // 8K prefill): Falcon-H1-7B 21845 against 19939 tokens/s, the Qwen3-Next shape (16 layers)
  // 78052 against 73448.
  bool attn_extend_fill = true;
  // N > 0 (fast mode): a call's decode kernel (either) runs in thread-block clusters (a query's
  // slices, 16 or 8, merged in the cluster through distributed shared memory: no combine kernel)
  // when its contexts are at most N keys (the page table's stride × the page size bound them) and
  // the call would split a query into 8 or more slices (small batches); 0 = default (2048);
  // -1 = off (`off`). Measured (H100, run 38, batch-1 graph step at context 1024, GPU): Falcon-H1-7B
  // 6.595 against 6.750 ms; Nemotron-H-8B, the 9B Bamba and the Qwen3-Next shape within 0.8%.
  int32_t attn_decode_cluster = 0;
  // 2..8: the decode kernels' clusters (above) of this many blocks, a query's keys over that many
  // slices; 0 = default (16 where the device co-schedules clusters of 16, else 8). Fewer, longer
  // slices a query and a cluster that fits a GPC more easily. Not yet measured.
  int32_t attn_decode_cluster_size = 0;
  // true: decode and verify queries over a bf16 cache at head_dim 256 (Qwen3-Next's gated
  // attention) on the tensor-core decode kernel too (its q fragments in shared memory), where
  // false (default) keeps the CUDA-core kernel there. Its tolerance against the CPU op is the
  // other head_dims'. Not yet measured: on the H200 (run 40) the CUDA-core kernel took 25.5 µs a
  // layer at batch 1, context 1024 (eight dependent 8-key steps a block).
  bool attn_decode_mma_hd256 = false;
  // true: the tensor-core decode kernel's causal calls (head_dim <= 128) locate their keys and load their warps'
  // first tiles of K and V (all but this step's keys) before the programmatic-launch wait, then q
  // and this step's keys after it, so that the page lookups and the cache's older keys overlap the
  // rope and kv_write kernel before it; false (default): everything after the wait. The same
  // loads and bits. Not yet measured: on the H200 (run 40) a batch-1 Falcon-H1-7B layer's decode
  // attention took 12.4 µs for 0.3 µs of bytes.
  bool attn_decode_early_loads = false;
  int32_t gdn_cluster = 0;        // 1 | 2 | 4: cluster size of the GDN prefill state kernel; 0 = automatic
  gdn_decode_kind gdn_decode = gdn_decode_kind::kDefault;
  int32_t gdn_max_tokens = 0;  // tokens the GDN tensor-core prefill workspace is sized for; 0 = 16384
  gdn_prefill_kind gdn_prefill = gdn_prefill_kind::kDefault;
  invariant_gemm_kind invariant_gemm = invariant_gemm_kind::kDefault;
  moe_decode_kind moe_decode = moe_decode_kind::kDefault;
  // 32..200: KB of shared memory each ring of the one-token MoE kernels takes (the up kernel's
  // stages of gate and up rows, 2 to 8 of them; the down kernel's 8-row tiles, 2 to 16); 0 =
  // default (the up kernel's 4 stages, whatever their size; the down kernel's 128 KB). More bytes
  // in flight an SM, or fewer (room for another block). The same sums.
  // Not yet measured.
  int32_t moe_decode_ring_kb = 0;
  bool norm_linear = true;             // false: rmsnorm_linear runs the norm and the GEMM apart
  int32_t norm_linear_blocks_per_sm = 0;  // 1..8 blocks per SM of the fused kernel; 0 = default (2)
  // true: a mixer's gated output norm runs inside its out_proj's fused kernel; false (default):
  // apart (the gated norm op, then the GEMM). Off by default: on one H100 the fused staging cost
  // about as much as the kernel it saves (bench/results/2026-12-06-h100-run32.md)
  bool norm_linear_gate = false;
  // true: rmsnorm_linear without a norm at one row of x (a mixer's out_proj, an MLP's down) and
  // k <= 4096 loads each warp's whole task before the programmatic-launch wait, when the grid
  // is one wave at one block an SM (same bits). false (default): one step of 8 chunks a lane.
  // H100 (bench/results/2026-12-07-h100-run35.md): Qwen3-Next's out_proj alone 66.6% of copy
  // bandwidth against 59.9%; a Falcon-H1-7B step within noise; a Qwen3-Next step not measured.
  bool norm_linear_wide = false;
  // true: the fused linear kernel's tasks (two weight rows, or one swiglu output, a warp) spread
  // over a grid of the blocks resident at once (at most norm_linear_blocks_per_sm an SM), task t
  // to block t mod grid, so every SM streams an equal share of the weights; false (default): a
  // block takes 8 consecutive tasks (or equal runs of them with the norm) and the grid is as many
  // blocks as that needs, so a layer of 1536 tasks (192 blocks on 132 SMs) gives 60 SMs twice the
  // bytes of the others. The same arithmetic per task. Not yet measured.
  bool norm_linear_spread = false;
  // true: fast-mode linear layers (bf16 weights) of 9..256 rows of activations on hyserve's
  // warpgroup-MMA kernel (gemm_wgmma.cuh: the weight streamed by the tensor copy engine as the
  // MMA's A operand, the rows as its B, split-K with an ordered reduction) instead of cuBLAS;
  // false (default): cuBLAS. The 9B batch-64 step was 1.3% slower with it (run 36).
  bool linear_wgmma = false;
  // true: the routed experts' grouped GEMMs of the many-row path (prefill; bf16 weights, fast
  // mode) on hyserve's warpgroup-MMA kernel (moe_gemm_wgmma.cuh: 128-row tiles, the weights by
  // tensor copies, the rows gathered by cp.async) (default); false: mma.sync tiles. Measured at
  // 8192 tokens of the Qwen3-Next-80B-A3B shape on the H100: 3.494 against 4.179 ms
  // (bench/results/2026-12-07-h100-run36.md).
  bool moe_wgmma = true;
  moe_tile_order_kind moe_tile_order = moe_tile_order_kind::kDefault;
  // 128 | 192: activation rows a tile of the warpgroup-MMA experts' GEMMs (moe_wgmma; the MMA's
  // N); 0 = default (192): an expert of up to 192 rows in one tile (its weights read once, less
  // padding at 129–192 rows an expert). The same sums per output. Measured (H100, run 38, the
  // Qwen3-Next shape's experts at 8192 tokens): 2.559 against 3.278 ms at 128. Under skewed
  // routing (run 39: 425 experts used, the busiest 4680 rows) 128 is 4% faster: 3.003 against
  // 3.126 ms; trained routers are balanced, so 192 stays the default.
  int32_t moe_wgmma_rows = 0;
  // true (default): the warpgroup-MMA experts' GEMMs (moe_wgmma) as one block an SM taking the
  // tiles in turn, so that a block's producer fills the next tile's stages (and finds its expert)
  // while its consumers store the last tile's outputs; false: a block a tile. The same sums per
  // output. Measured (H100, run 38, the Qwen3-Next shape's experts at 8192 tokens, 192-row
  // tiles): 2.574 against 2.767 ms; 16-layer 8K prefill 77263 against 73649 tokens/s,
  // Granite-4.0-H-Tiny 52865 against 51431.
  bool moe_wgmma_persistent = true;
  // true (default): where a warpgroup-MMA experts' GEMM reads the permuted rows in place (the
  // down projection), a tile's activation rows by one tensor copy a stage instead of 128 threads'
  // cp.async; false: cp.async. The same bits. Measured (H100, run 38, as above): 2.631 against
  // 2.767 ms a block a tile, 2.515 against 2.574 ms persistent; 8K prefill 77140 against 73649.
  bool moe_wgmma_tma_x = true;
  // true (default): a warpgroup-MMA experts' GEMM consumer releases a stage's slot as soon as
  // that stage's MMAs are done (wait for none pending), so the producer refills it one stage
  // earlier; false: once the next stage's rows have landed and its MMAs are issued (one MMA group
  // in flight). The same sums. Measured (H200, run 40): the Qwen3-Next shape's experts at 8192
  // tokens 2617.4 against 2653.9 µs; 16-layer 8K prefill 79827 against 79144 tokens/s, both with
  // every wgmma serialised by ptxas (the release was then a run-time flag in one kernel body;
  // a template argument since, test Ptxas.WgmmaNotSerialized): to be measured again.
  bool moe_wgmma_early_release = true;
  // true: a warpgroup-MMA experts' GEMM's producer hands each tile's rows to the consumers in
  // shared memory with the tile's first stage, so only it searches the tile offsets; false
  // (default): every warpgroup searches them itself (the consumers before each tile's MMAs). The
  // same sums. Not yet measured.
  bool moe_wgmma_tile_handoff = false;
  // true (default): a bf16 model's Mamba2 prefill scan at head_dim 64 / d_state 128 on the
  // sequential bf16 kernel too (f32 activations rounded to bf16 as loaded,
  // ssd_chunk_scan_params::bf16_operands); false: the 3xTF32 kernel there. Shapes the 3xTF32
  // kernel lacks (Falcon-H1's 128 × 256) take the sequential kernel either way. Measured, the 9B
  // Bamba's 8K prefill on the H100: 23928 against 21456 tokens/s (run 36).
  bool ssd_seq_bf16 = true;
  // 16 | 32: head channels a block of the sequential bf16 scan takes in a bfloat16 model's
  // prefill at head_dim 128 (Falcon-H1: twice the blocks with 16); 0 = default (32). The same
  // arithmetic per channel. Measured once (H200, run 40): Falcon-H1-7B 8K prefill 22882 against
  // 22542 tokens/s (+1.5%, one round).
  int32_t ssd_seq_slice = 0;
  bool pdl = true;                     // false: no programmatic dependent launch anywhere
  // 1..100: every kernel launched through the programmatic-launch helper (the decode path's)
  // prefers that percent of the SM's most shared memory as its shared-memory carveout (the rest
  // is L1); 0 = default: the driver's choice per kernel, from what the kernel needs. An SM runs
  // blocks of one carveout at a time, so where consecutive kernels differ (the MoE decode
  // kernels' 130–140 KB rings beside kernels of a few KB) the next kernel's blocks wait for the
  // SM to drain before they can start. The same arithmetic. Not yet measured.
  int32_t smem_carveout = 0;
  skinny_kind skinny = skinny_kind::kDefault;
  sparse_select_kind sparse_select = sparse_select_kind::kDefault;
  int32_t ssd_max_tokens = 0;  // tokens the parallel_single SSD scan workspace is sized for; 0 = 16384
  ssd_scan_kind ssd_scan = ssd_scan_kind::kDefault;
  // 2 | 4: weight rows a task of the fused linear kernel (rmsnorm_linear, 1-4 rows of x, without
  // swiglu); 0 = default (2). 4 loads each chunk of x once for four weight rows (half the
  // activation loads per weight byte); the same bits. Faster at 3-4 rows on wide weights, slower
  // on Qwen3-Next's out_proj at one row (run 36); not measured in a step.
  int32_t norm_linear_rows = 0;
  int32_t ssm_update_unroll = 0;  // 4 | 8: rows unrolled by the f32-state SSM update; 0 = default (4)
};

}  // namespace hyserve
