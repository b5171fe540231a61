#pragma once
// Sparse Top-K decode attention (docs/ARCHITECTURE.md, Sparse Top-K attention): per-page key summaries and Quest page selection.
//
// Page summaries: per attention layer key_min / key_max [num_pages, kv_heads, head_dim] f32,
// the element-wise minimum / maximum of the keys held by the page. They are updated from the
// keys written in a step (the same keys and locations kv_write stores): running min/max, so the
// partial last page is always current, and a token written to the first slot of a page resets
// the page's summary first, so a page reused after a free never keeps its former owner's values.
//
// Selection: for each row, q̄ = the mean of the query heads of each kv group (of the row's first
// query); score[p] = Σ_kv heads Σ_d max(q̄·key_min[p], q̄·key_max[p]) (the Quest upper bound of
// q·k over the page, since min ≤ max). A row keeps its first `sink_pages` and last
// `recent_pages` pages (and always every page holding one of its queries, so the current token
// sees itself), takes the top `page_budget − kept` of the remaining pages by score (ties to the
// lower page index), and writes them in ascending order as a compact page table with an
// effective length: all selected pages but the last are full and the row's own last (possibly
// partial) page stays last, so
//   eff_len = (n_selected − 1)·page_size + (seq_len − (n_pages − 1)·page_size)
// and paged attention over (compact table, eff_len) is sparse attention over exactly those
// pages. Keys in the cache already carry RoPE, so compaction changes nothing else. Rows that
// are not sparse (no query, page count ≤ page_budget, seq_len < min_seq_len, the per-row
// disable flag, or several queries while multi_query_rows is false) get their dense page table
// and seq_len copied unchanged.
//
// Multi-query rows (speculative verify): with multi_query_rows, a row of q_len > 1 is selected
// with its FIRST query, and all its queries use the same pages; the pages holding its queries
// are always kept, so the causal mask over the compact positions stays exact.
#include <cstdint>

#if defined(__CUDACC__)
#define HYSERVE_HOST_DEVICE __host__ __device__
#else
#define HYSERVE_HOST_DEVICE
#endif

namespace hyserve::kernels {

// Running min/max of the keys written this step into the summaries of their pages.
struct page_summary_update_params {
  const float* __restrict__ k = nullptr;       // [n_tokens, kv_heads, head_dim], row stride k_stride
  const int32_t* __restrict__ locs = nullptr;  // [n_tokens] flat KV location; -1 = skip (padding)
  float* key_min = nullptr;                    // [num_pages, kv_heads, head_dim]
  float* key_max = nullptr;                    // [num_pages, kv_heads, head_dim]
  int64_t n_tokens = 0;
  int64_t kv_heads = 0, head_dim = 0;
  int64_t k_stride = 0;
  int64_t page_size = 0;
  int64_t num_pages = 0;  // locs must be < num_pages · page_size
};

void run_cpu(const page_summary_update_params& p);
void run_cuda(const page_summary_update_params& p, void* stream = nullptr);

// The row lengths of a retrieval op: a required, typed argument (never optional). `data` lives
// on the op's device and holds `size` entries, which must equal the batch. `host`, when given,
// is a host copy of the same values; the CUDA op checks it for negative lengths (the CPU op
// checks `data` itself). A missing pointer, a wrong size or a negative length is an
// invalid_argument_error naming seq_lens.
struct seq_lens_arg {
  const int32_t* data = nullptr;
  int64_t size = -1;
  const int32_t* host = nullptr;
};

struct sparse_select_params {
  const float* __restrict__ q = nullptr;  // [n_tokens, q_heads, head_dim], row stride q_stride (post-RoPE)
  const int32_t* __restrict__ query_start_loc = nullptr;  // [batch + 1]; row b selects with token qsl[b]
  seq_lens_arg seq_lens;                                  // [batch] total length incl. the new tokens
  const int32_t* __restrict__ page_table = nullptr;       // [batch, page_table_stride] dense pages
  const float* __restrict__ key_min = nullptr;            // [num_pages, kv_heads, head_dim]
  const float* __restrict__ key_max = nullptr;
  const uint8_t* __restrict__ dense_rows = nullptr;  // optional [batch]; nonzero = the row stays dense
  int32_t* __restrict__ out_page_table = nullptr;    // [batch, out_page_table_stride]
  int32_t* __restrict__ out_seq_lens = nullptr;      // [batch] effective lengths
  int64_t batch = 0;
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;
  int64_t page_size = 0;
  int64_t page_table_stride = 0;
  int64_t out_page_table_stride = 0;  // >= page_table_stride (a dense row is copied whole)
  int64_t q_stride = 0;
  int64_t page_budget = 0, sink_pages = 0, recent_pages = 0, min_seq_len = 0;
  bool multi_query_rows = false;  // rows of q_len > 1 are selected with their first query
  // A page's score sums over every KV head; tensor parallelism splits the heads over ranks, so
  // a sharded layer selects in two phases around an all-reduce of `scores`:
  //   kScore:  writes the score of middle page i of row b (this rank's heads) to
  //            scores[b · page_table_stride + i] for every row that chooses among its middle
  //            pages (0 < n_top < n_mid); nothing else is written;
  //   kSelect: selects from the summed scores (q, key_min, key_max are not read) and writes
  //            out_page_table / out_seq_lens.
  // kFused (one rank): both in one op, scores not used. Ties go to the lower page index.
  enum class phase : uint8_t { kFused, kScore, kSelect };
  phase mode = phase::kFused;
  float* scores = nullptr;  // [batch, page_table_stride] for kScore / kSelect
};

void run_cpu(const sparse_select_params& p);
void run_cuda(const sparse_select_params& p, void* stream = nullptr);

// What selection does with one row; shared by the CPU op, the CUDA kernel and tests.
struct sparse_row_plan {
  int64_t n_pages = 0;   // pages of the dense row
  int64_t n_sink = 0;    // first pages always kept
  int64_t n_recent = 0;  // last pages always kept
  int64_t n_top = 0;     // pages chosen by score among [n_sink, n_pages − n_recent)
  bool sparse = false;
  HYSERVE_HOST_DEVICE int64_t n_mid() const { return n_pages - n_sink - n_recent; }
  HYSERVE_HOST_DEVICE int64_t n_selected() const { return sparse ? n_sink + n_recent + n_top : n_pages; }
};

// len = seq_lens[b] (>= 0), q_len = the row's query count, dense = the row's disable flag.
HYSERVE_HOST_DEVICE inline sparse_row_plan plan_sparse_row(int64_t len, int64_t q_len, bool dense,
                                                           const sparse_select_params& p) {
  sparse_row_plan r;
  r.n_pages = len > 0 ? (len + p.page_size - 1) / p.page_size : 0;
  r.sparse = q_len >= 1 && len >= q_len && (q_len == 1 || p.multi_query_rows) && !dense && len >= p.min_seq_len &&
             r.n_pages > p.page_budget;
  if (!r.sparse) return r;
  r.n_sink = p.sink_pages < r.n_pages ? p.sink_pages : r.n_pages;
  const int64_t query_pages = r.n_pages - (len - q_len) / p.page_size;  // pages holding a query
  int64_t recent = p.recent_pages > query_pages ? p.recent_pages : query_pages;
  if (recent > r.n_pages - r.n_sink) recent = r.n_pages - r.n_sink;
  r.n_recent = recent;
  int64_t top = p.page_budget - r.n_sink - r.n_recent;
  if (top < 0) top = 0;
  if (top > r.n_mid()) top = r.n_mid();
  r.n_top = top;
  return r;
}

// Effective length of a sparse row (see the top of this file).
HYSERVE_HOST_DEVICE inline int64_t sparse_effective_len(int64_t len, const sparse_row_plan& r, int64_t page_size) {
  if (!r.sparse) return len;
  return (r.n_selected() - 1) * page_size + (len - (r.n_pages - 1) * page_size);
}

}  // namespace hyserve::kernels
