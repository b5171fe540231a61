#pragma once
// Host-side checks of the sparse selection op, shared by the CPU and CUDA backends.
#include <string>

#include "hyserve/kernels/sparse_attention.h"
#include "validate.h"

namespace hyserve::kernels::cpu_detail {

// The values of locs are checked by the CPU op only (on the CUDA backend they live on the
// device, where -1 is skipped).
inline void check_page_summary_update(const page_summary_update_params& p, const char* op) {
  require_ptr(p.k, op, "k");
  require_ptr(p.locs, op, "locs");
  require_ptr(p.key_min, op, "key_min");
  require_ptr(p.key_max, op, "key_max");
  require_non_negative(p.n_tokens, op, "n_tokens");
  require_positive(p.kv_heads, op, "kv_heads");
  require_positive(p.head_dim, op, "head_dim");
  require_positive(p.page_size, op, "page_size");
  require_positive(p.num_pages, op, "num_pages");
  require_stride(p.k_stride, p.kv_heads * p.head_dim, op, "k_stride");
}

inline void check_select(const sparse_select_params& p, const char* op) {
  require_ptr(p.q, op, "q");
  require_ptr(p.query_start_loc, op, "query_start_loc");
  require_ptr(p.seq_lens.data, op, "seq_lens");
  require_ptr(p.page_table, op, "page_table");
  require_ptr(p.key_min, op, "key_min");
  require_ptr(p.key_max, op, "key_max");
  require_ptr(p.out_page_table, op, "out_page_table");
  require_ptr(p.out_seq_lens, op, "out_seq_lens");
  require_positive(p.batch, op, "batch");
  if (p.seq_lens.size != p.batch) {
    fail(op, "seq_lens.size", p.seq_lens.size, ("must equal batch = " + std::to_string(p.batch)).c_str());
  }
  require_positive(p.q_heads, op, "q_heads");
  require_positive(p.kv_heads, op, "kv_heads");
  require_positive(p.head_dim, op, "head_dim");
  require_positive(p.page_size, op, "page_size");
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
  require_non_negative(p.sink_pages, op, "sink_pages");
  require_non_negative(p.recent_pages, op, "recent_pages");
  require_non_negative(p.min_seq_len, op, "min_seq_len");
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
