#pragma once
// Sparse Top-K decode attention inside the model (docs/ARCHITECTURE.md, Sparse Top-K attention; kernels/sparse_attention.h).
//
// With `sparsity.algorithm: quest`, every attention layer keeps per-page key summaries
// (kv_layer_cache::key_min / key_max, allocated on the first step that writes keys) and updates
// them right after each KV write, in every forward mode, so the summaries of every page are
// current whenever a decode step reads them. They cost 2·kv_heads·head_dim·4 bytes per page and
// attention layer (1/8 of bf16 K+V at page size 16), outside the KV memory plan.
//
// Selection runs in Decode and TargetVerify steps only. Per attention layer, sparse_select
// writes a compact page table and effective lengths into per-step scratch, and the paged
// attention call of that layer reads those instead of the dense table. A row stays dense
// (its dense table and length are used unchanged) when its length is below
// sparsity.min_seq_len, when its page count is at most sparsity.page_budget, when it is a
// padding row, or when its request disabled sparse attention (sampling_params.sparse: false).
//
// TargetVerify: a row's D queries share one page selection, made with the row's FIRST query
// (the last accepted token); the pages holding any of the row's queries are always kept, so the
// causal mask over the compact positions stays exact for every draft token.
//
// Whether a row is sparse and how many pages it reads depend only on host-side lengths, so the
// step's statistics (sparse_attention_stats) are known without reading anything back from the
// device.
#include <cstdint>
#include <vector>

#include "hyserve/common/config.h"
#include "hyserve/common/tensor.h"
#include "hyserve/kernels/device.h"
#include "hyserve/worker/forward_batch.h"
#include "hyserve/worker/hybrid_metadata.h"
#include "hyserve/worker/memory_pools.h"
#include "hyserve/worker/model.h"

namespace hyserve::worker::layers {

// rows × width f32 values at data, row r at data + r · stride (elements): a whole [rows, width]
// activation (stride = width), or a column range of a wider one, such as q, k or v inside the
// fused attention projection's output.
struct f32_rows {
  float* data = nullptr;
  int64_t rows = 0, stride = 0;
};
// The whole of a contiguous [rows, width] f32 tensor.
inline f32_rows rows_of(const tensor& t) { return {t.as<float>(), t.shape()[0], t.shape()[1]}; }

struct step_inputs;

// Per-step sparse attention state, built once per step and read by every attention layer.
struct sparse_step {
  bool summaries = false;  // quest configured: keep key_min / key_max current on every KV write
  bool select = false;     // at least one row of this step is sparse: run selection per layer
  sparsity_section cfg;
  bool multi_query_rows = false;     // TargetVerify
  std::vector<int32_t> seq_lens;     // host copy of the dense lengths [bs]
  tensor dense_rows;                 // u8 [bs] on the device (in an i32 tensor); nonzero = dense
  tensor page_table;                 // i32 [bs, page_table_stride] scratch: compact tables
  tensor eff_seq_lens;               // i32 [bs] scratch: effective lengths
  sparse_attention_stats stats;  // decode attention of this step (also without sparsity)
};

// Builds the step's sparse state from the batch (rows' dense_attention flags) and its metadata
// (mode, query_start_loc, seq_lens, mamba_slots). Padding rows (mamba slot -1) stay dense.
sparse_step plan_sparse_step(const sparsity_section& cfg, const forward_batch& batch, const hybrid_metadata& meta,
                             int64_t page_table_stride, int32_t page_size, const kernels::exec_context& ctx);

// After the KV write of a layer: folds the step's keys k (f32 rows [T, kv_heads·head_dim], post
// RoPE) into the page summaries of their pages. No-op unless in.sparse.summaries. Summaries are
// running min/max: keys of rejected draft tokens stay folded in until their page is rewritten
// from its first slot, which only loosens the bound (a page is never under-scored).
void update_page_summaries(kv_layer_cache& cache, f32_rows k, int64_t kv_heads, int64_t head_dim,
                           const step_inputs& in, const kernels::exec_context& ctx);

// The page table and lengths the layer's paged attention reads: the dense ones, or (when the
// step selects) this layer's selection from its queries q (f32 rows [T, q_heads·head_dim], post
// RoPE).
// Under tensor parallelism (comm of more than one rank) a page's score sums over the heads of
// every rank: each rank scores with its own heads, the scores are all-reduced, and every rank
// then selects the same pages from the sums. That holds when the ranks' KV heads are distinct
// (num_kv_heads a multiple of tp; hybrid_model refuses sparsity otherwise).
struct attention_pages {
  const int32_t* page_table = nullptr;
  const int32_t* seq_lens = nullptr;
  int64_t page_table_stride = 0;
};
attention_pages select_attention_pages(f32_rows q, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                                       const kv_layer_cache& cache, const step_inputs& in, collective* comm,
                                       const kernels::exec_context& ctx);

}  // namespace hyserve::worker::layers
