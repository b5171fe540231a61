#pragma once
// Host-side checks of the sparse selection op, shared by the CPU and CUDA backends.
#include <string>

#include "hyserve/kernels/sparse_attention.h"
#include "validate.h"

namespace hyserve::kernels::cpu_detail {

// The values of locs are checked by the CPU op only (on the CUDA backend they live on the
// device, where -1 is skipped).
inline void check_page_summary_update(const page_summary_update_params& p, const char* op) {
  require_ptrs(op, {{p.k, "k"}, {p.locs, "locs"}, {p.key_min, "key_min"}, {p.key_max, "key_max"}});
  require_non_negative(p.n_tokens, op, "n_tokens");
  require_sizes(op, {{p.kv_heads, "kv_heads"}, {p.head_dim, "head_dim"}, {p.page_size, "page_size"},
                     {p.num_pages, "num_pages"}});
  require_stride(p.k_stride, p.kv_heads * p.head_dim, op, "k_stride");
}

inline void check_select(const sparse_select_params& p, const char* op) {
  require_ptrs(op, {{p.q, "q"}, {p.query_start_loc, "query_start_loc"}, {p.seq_lens.data, "seq_lens"},
                    {p.page_table, "page_table"}, {p.key_min, "key_min"}, {p.key_max, "key_max"},
                    {p.out_page_table, "out_page_table"}, {p.out_seq_lens, "out_seq_lens"}});
  require_positive(p.batch, op, "batch");
  if (p.seq_lens.size != p.batch) {
    fail(op, "seq_lens.size", p.seq_lens.size, ("must equal batch = " + std::to_string(p.batch)).c_str());
  }
  require_sizes(op, {{p.q_heads, "q_heads"}, {p.kv_heads, "kv_heads"}, {p.head_dim, "head_dim"},
                     {p.page_size, "page_size"}});
  if (p.q_heads % p.kv_heads != 0) {
    fail(op, "kv_heads", p.kv_heads, ("must divide q_heads = " + std::to_string(p.q_heads)).c_str());
  }
  require_positive(p.page_table_stride, op, "page_table_stride");
  if (p.out_page_table_stride < p.page_table_stride) {
    fail(op, "out_page_table_stride", p.out_page_table_stride,
         ("must be >= page_table_stride = " + std::to_string(p.page_table_stride)).c_str());
  }
  require_stride(p.q_stride, p.q_heads * p.head_dim, op, "q_stride");
  require_positive(p.page_budget, op, "page_budget");
  require_counts(op, {{p.sink_pages, "sink_pages"}, {p.recent_pages, "recent_pages"}, {p.min_seq_len, "min_seq_len"}});
  if (p.mode != sparse_select_params::phase::kFused) require_ptr(p.scores, op, "scores");
}

inline void check_seq_lens_values(const int32_t* lens, const sparse_select_params& p, const char* op) {
  for (int64_t b = 0; b < p.batch; ++b) {
    if (lens[b] < 0) fail(op, "seq_lens[" + std::to_string(b) + "]", lens[b], "must be >= 0");
    const int64_t n_pages = (lens[b] + p.page_size - 1) / p.page_size;
    if (n_pages > p.page_table_stride) {
      fail(op, "seq_lens[" + std::to_string(b) + "]", lens[b],
           ("needs " + std::to_string(n_pages) + " pages, more than page_table_stride = " +
            std::to_string(p.page_table_stride))
               .c_str());
    }
  }
}

inline void check_sparse_select_params(const sparse_select_params& p, const char* op, bool values_on_host) {
  check_select(p, op);
  if (values_on_host) check_seq_lens_values(p.seq_lens.data, p, op);
  if (p.seq_lens.host) check_seq_lens_values(p.seq_lens.host, p, op);
}


}  // namespace hyserve::kernels::cpu_detail
