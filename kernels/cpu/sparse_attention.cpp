#include "hyserve/kernels/sparse_attention.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "sparse_validate.h"
#include "validate.h"

namespace hyserve::kernels {

using namespace cpu_detail;

void run_cpu(const page_summary_update_params& p) {
  constexpr const char* op = "page_summary_update";
  check_page_summary_update(p, op);
  const int64_t row = p.kv_heads * p.head_dim;
  const int64_t n_locs = p.num_pages * p.page_size;
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    if (p.locs[t] < -1 || p.locs[t] >= n_locs) {
      fail(op, "locs[" + std::to_string(t) + "]", p.locs[t],
           ("must be -1 or a location in [0, " + std::to_string(n_locs) + ")").c_str());
    }
  }
  // Pass 1: a token in the first slot of its page starts the page afresh (a reused page forgets
  // its previous owner). Pass 2: running min/max over every written token, so the order of the
  // tokens within the step does not matter.
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    const int64_t loc = p.locs[t];
    if (loc < 0 || loc % p.page_size != 0) continue;
    const float* k = p.k + t * p.k_stride;
    std::copy(k, k + row, p.key_min + (loc / p.page_size) * row);
    std::copy(k, k + row, p.key_max + (loc / p.page_size) * row);
  }
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    const int64_t loc = p.locs[t];
    if (loc < 0) continue;
    const float* k = p.k + t * p.k_stride;
    float* mn = p.key_min + (loc / p.page_size) * row;
    float* mx = p.key_max + (loc / p.page_size) * row;
    for (int64_t e = 0; e < row; ++e) {
      mn[e] = std::min(mn[e], k[e]);
      mx[e] = std::max(mx[e], k[e]);
    }
  }
}

void run_cpu(const sparse_select_params& p) {
  constexpr const char* op = "sparse_select";
  check_sparse_select_params(p, op, true);
  require_query_start_loc(p.query_start_loc, p.batch, op);
  const int64_t D = p.head_dim, G = p.q_heads / p.kv_heads, E = p.kv_heads * D;

#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t len = p.seq_lens.data[b];
    const int64_t q_len = p.query_start_loc[b + 1] - p.query_start_loc[b];
    const bool dense = p.dense_rows != nullptr && p.dense_rows[b] != 0;
    const sparse_row_plan plan = plan_sparse_row(len, q_len, dense, p);
    const int32_t* in = p.page_table + b * p.page_table_stride;
    int32_t* out = p.out_page_table + b * p.out_page_table_stride;
    using phase = sparse_select_params::phase;
    if (p.mode != phase::kScore) p.out_seq_lens[b] = static_cast<int32_t>(sparse_effective_len(len, plan, p.page_size));
    if (!plan.sparse) {
      if (p.mode != phase::kScore) std::copy(in, in + plan.n_pages, out);
      continue;
    }
    const int64_t mid0 = plan.n_sink, n_mid = plan.n_mid();
    float* row_scores = p.scores != nullptr ? p.scores + b * p.page_table_stride : nullptr;
    std::vector<double> score(static_cast<size_t>(n_mid));
    if (p.mode == phase::kSelect) {
      if (plan.n_top > 0 && plan.n_top < n_mid) std::copy(row_scores, row_scores + n_mid, score.begin());
    } else {
      // q̄: mean of the G query heads of each kv head, of the row's first query.
      const float* q = p.q + p.query_start_loc[b] * p.q_stride;
      std::vector<double> qbar(static_cast<size_t>(E), 0.0);
      for (int64_t h = 0; h < p.kv_heads; ++h)
        for (int64_t d = 0; d < D; ++d) {
          double s = 0.0;
          for (int64_t g = 0; g < G; ++g) s += q[(h * G + g) * D + d];
          qbar[static_cast<size_t>(h * D + d)] = s / static_cast<double>(G);
        }
      for (int64_t i = 0; i < n_mid; ++i) {
        const int64_t page = in[mid0 + i];
        const float* mn = p.key_min + page * E;
        const float* mx = p.key_max + page * E;
        double s = 0.0;
        for (int64_t e = 0; e < E; ++e) {
          const double qe = qbar[static_cast<size_t>(e)];
          s += std::max(qe * mn[e], qe * mx[e]);
        }
        score[static_cast<size_t>(i)] = s;
      }
      if (p.mode == phase::kScore) {
        if (plan.n_top > 0 && plan.n_top < n_mid)
          for (int64_t i = 0; i < n_mid; ++i) row_scores[i] = static_cast<float>(score[static_cast<size_t>(i)]);
        continue;
      }
    }
    std::vector<int64_t> order(static_cast<size_t>(n_mid));
    std::iota(order.begin(), order.end(), int64_t{0});
    auto better = [&](int64_t a, int64_t c) {
      const double sa = score[static_cast<size_t>(a)], sc = score[static_cast<size_t>(c)];
      return sa > sc || (sa == sc && a < c);
    };
    std::partial_sort(order.begin(), order.begin() + plan.n_top, order.end(), better);
    order.resize(static_cast<size_t>(plan.n_top));
    std::sort(order.begin(), order.end());
    int64_t n = 0;
    for (int64_t i = 0; i < plan.n_sink; ++i) out[n++] = in[i];
    for (int64_t i : order) out[n++] = in[mid0 + i];
    for (int64_t i = plan.n_pages - plan.n_recent; i < plan.n_pages; ++i) out[n++] = in[i];
  }
}

}  // namespace hyserve::kernels
