#include "sparse_select.h"

#include <string>

#include "hyserve/common/error.h"
#include "hyserve/kernels/run.h"
#include "hyserve/kernels/sparse_attention.h"
#include "layers.h"

namespace hyserve::worker::layers {

namespace {

// The selection parameters shared by planning (host, per row) and the per-layer op.
kernels::sparse_select_params base_params(const sparsity_section& cfg, int32_t page_size, bool multi_query_rows) {
  kernels::sparse_select_params p;
  p.page_size = page_size;
  p.page_budget = cfg.page_budget;
  p.sink_pages = cfg.sink_pages;
  p.recent_pages = cfg.recent_pages;
  p.min_seq_len = cfg.min_seq_len;
  p.multi_query_rows = multi_query_rows;
  return p;
}

}  // namespace

sparse_step plan_sparse_step(const sparsity_section& cfg, const forward_batch& batch, const hybrid_metadata& meta,
                             int64_t page_table_stride, int32_t page_size, const kernels::exec_context& ctx) {
  sparse_step s;
  s.cfg = cfg;
  bool quest = false;
  switch (cfg.algorithm) {
    case sparsity_algorithm::kNone:
      break;
    case sparsity_algorithm::kQuest:
      quest = true;
      break;
  }
  s.summaries = quest;
  bool decode_like = false;
  switch (meta.mode) {
    case forward_mode::kDecode:
      decode_like = true;
      break;
    case forward_mode::kTargetVerify:
      decode_like = true;
      s.multi_query_rows = true;
      break;
    case forward_mode::kExtend:
    case forward_mode::kMixed:
    case forward_mode::kIdle:
    case forward_mode::kDraftExtend:
    case forward_mode::kDraft:
      break;
  }
  if (!decode_like) return s;

  const std::vector<int32_t>& seq_lens = meta.seq_lens;
  const size_t bs = seq_lens.size();
  HYSERVE_CHECK(meta.query_start_loc.size() == bs + 1 && meta.mamba_slots.size() == bs && batch.rows.size() == bs,
                "sparse attention: the batch and its metadata disagree on the row count");
  std::vector<uint8_t> dense(bs, 0);
  const kernels::sparse_select_params p = base_params(cfg, page_size, s.multi_query_rows);
  // Extend rows riding in a verify step (rows from meta.verify_rows on) are prefill: dense.
  const size_t decode_rows = meta.mode == forward_mode::kTargetVerify ? static_cast<size_t>(meta.verify_rows) : bs;
  for (size_t b = 0; b < bs; ++b) {
    if (meta.mamba_slots[b] < 0 || batch.rows[b].req_slot < 0 || b >= decode_rows) {
      dense[b] = 1;  // padding row or extend row
      continue;
    }
    dense[b] = !quest || batch.rows[b].dense_attention ? 1 : 0;
    const int64_t q_len = meta.query_start_loc[b + 1] - meta.query_start_loc[b];
    const kernels::sparse_row_plan r = kernels::plan_sparse_row(seq_lens[b], q_len, dense[b] != 0, p);
    s.stats.decode_rows += 1;
    s.stats.sparse_rows += r.sparse ? 1 : 0;
    s.stats.pages_read += r.n_selected();
    s.stats.dense_pages += r.n_pages;
  }
  s.select = s.stats.sparse_rows > 0;
  if (!s.select) return s;  // every row dense: the layers read the dense table unchanged
  s.seq_lens = seq_lens;
  s.dense_rows = tensor::i32({(static_cast<int64_t>(bs) + 3) / 4}, ctx.device);
  s.dense_rows.copy_from_host(dense.data(), bs);
  s.page_table = tensor::i32({static_cast<int64_t>(bs) * page_table_stride}, ctx.device);
  s.eff_seq_lens = tensor::i32({static_cast<int64_t>(bs)}, ctx.device);
  return s;
}

void update_page_summaries(kv_layer_cache& cache, f32_rows k, int64_t kv_heads, int64_t head_dim,
                           const step_inputs& in, const kernels::exec_context& ctx) {
  if (!in.sparse.summaries || in.num_tokens == 0) return;
  const int64_t num_pages = cache.k.shape()[0];
  if (cache.key_min.data() == nullptr && num_pages > 0) {  // a default tensor is rank 0, not empty
    cache.key_min = tensor::f32({num_pages, kv_heads, head_dim}, ctx.device);
    cache.key_max = tensor::f32({num_pages, kv_heads, head_dim}, ctx.device);
  }
  HYSERVE_CHECK(cache.key_min.numel() == num_pages * kv_heads * head_dim,
                "sparse attention: page summaries of " + cache.key_min.shape().str() + " for " +
                    std::to_string(num_pages) + " pages of " + std::to_string(kv_heads) + " kv heads × " +
                    std::to_string(head_dim));
  kernels::page_summary_update_params p;
  p.k = k.data;
  p.locs = in.locs.as<int32_t>();
  p.key_min = cache.key_min.as<float>();
  p.key_max = cache.key_max.as<float>();
  p.n_tokens = in.num_tokens;
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.k_stride = k.stride;
  p.page_size = in.page_size;
  p.num_pages = num_pages;
  kernels::run(p, ctx);
}

attention_pages select_attention_pages(f32_rows q, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                                       const kv_layer_cache& cache, const step_inputs& in, collective* comm,
                                       const kernels::exec_context& ctx) {
  attention_pages dense{in.page_table.as<int32_t>(), in.seq_lens.as<int32_t>(), in.page_table_stride};
  const sparse_step& s = in.sparse;
  if (!s.select) return dense;
  HYSERVE_CHECK(cache.key_min.data() != nullptr, "sparse attention: the layer has no page summaries");
  kernels::sparse_select_params p = base_params(s.cfg, in.page_size, s.multi_query_rows);
  p.q = q.data;
  p.query_start_loc = in.query_start_loc.as<int32_t>();
  p.seq_lens = kernels::seq_lens_arg{in.seq_lens.as<int32_t>(), in.batch_size, s.seq_lens.data()};
  p.page_table = in.page_table.as<int32_t>();
  p.key_min = cache.key_min.as<float>();
  p.key_max = cache.key_max.as<float>();
  p.dense_rows = s.dense_rows.as<uint8_t>();
  p.out_page_table = s.page_table.as<int32_t>();
  p.out_seq_lens = s.eff_seq_lens.as<int32_t>();
  p.batch = in.batch_size;
  p.q_heads = q_heads;
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.page_table_stride = p.out_page_table_stride = in.page_table_stride;
  p.q_stride = q.stride;
  if (comm && comm->size() > 1) {
    tensor scores = tensor::f32({in.batch_size, in.page_table_stride}, ctx.device);
    p.scores = scores.as<float>();
    p.mode = kernels::sparse_select_params::phase::kScore;
    kernels::run(p, ctx);
    comm->all_reduce_sum(p.scores, scores.numel());
    p.mode = kernels::sparse_select_params::phase::kSelect;
    kernels::run(p, ctx);
  } else {
    kernels::run(p, ctx);
  }
  return attention_pages{s.page_table.as<int32_t>(), s.eff_seq_lens.as<int32_t>(), in.page_table_stride};
}

}  // namespace hyserve::worker::layers
