// Sparse Top-K decode attention on the CPU: page summaries against min/max over the raw keys,
// Quest selection against a brute-force reference (scores in double from the raw keys, full
// sort by (score desc, page index asc)), and sparse attention against dense softmax attention
// in double over exactly the selected tokens. Tolerances: attention 1e-5 abs + 1e-5 rel;
// selection must match exactly except for pages whose reference score is within 1e-9 (relative)
// of the cut-off score (a floating-point near-tie may fall either way).
#include "hyserve/kernels/sparse_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "hyserve/kernels/attention.h"
#include "kernel_test_util.h"

namespace hyserve::kernels {
namespace {

using test::expect_close;
using test::expect_invalid;
using test::random_floats;

// A batch of rows over a shared paged pool. Row b has lens[b] tokens and q_lens[b] queries
// (the last q_lens[b] positions). Keys and values per row and token are kept for the references.
struct scene {
  int64_t q_heads = 0, kv_heads = 0, D = 0, ps = 0;
  std::vector<int32_t> lens, q_lens;
  int64_t num_pages = 0, stride = 0;
  std::vector<int32_t> table, qsl;
  std::vector<std::vector<float>> k_tok, v_tok;  // [b] → [len, kv_heads, D]
  std::vector<float> k_cache, v_cache, key_min, key_max, q;

  int64_t row() const { return kv_heads * D; }
  int64_t n_pages(size_t b) const { return (lens[b] + ps - 1) / ps; }
};

// Writes every row's tokens in two steps (the history, then the row's queries' tokens), through
// kv_write and page_summary_update, into pages shuffled over a pool with spare pages full of
// garbage.
scene make_scene(int64_t q_heads, int64_t kv_heads, int64_t D, int64_t ps, std::vector<int32_t> lens,
                 std::vector<int32_t> q_lens, uint32_t seed, float key_lo = -1.0f, float key_hi = 1.0f) {
  scene s;
  s.q_heads = q_heads;
  s.kv_heads = kv_heads;
  s.D = D;
  s.ps = ps;
  s.lens = std::move(lens);
  s.q_lens = std::move(q_lens);
  const size_t bs = s.lens.size();
  int64_t total_pages = 0;
  for (size_t b = 0; b < bs; ++b) {
    total_pages += s.n_pages(b);
    s.stride = std::max(s.stride, s.n_pages(b));
  }
  s.stride = std::max<int64_t>(s.stride, 1);
  s.num_pages = total_pages + 3;
  std::vector<int32_t> ids(static_cast<size_t>(s.num_pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  s.table.assign(bs * static_cast<size_t>(s.stride), -7);
  size_t next = 0;
  for (size_t b = 0; b < bs; ++b)
    for (int64_t i = 0; i < s.n_pages(b); ++i) s.table[b * static_cast<size_t>(s.stride) + i] = ids[next++];
  const size_t cache = static_cast<size_t>(s.num_pages * ps * s.row());
  s.k_cache = random_floats(cache, seed + 1, -9.0f, 9.0f);  // garbage where nothing is written
  s.v_cache = random_floats(cache, seed + 2, -9.0f, 9.0f);
  s.key_min = random_floats(static_cast<size_t>(s.num_pages * s.row()), seed + 3, -9.0f, 9.0f);
  s.key_max = random_floats(static_cast<size_t>(s.num_pages * s.row()), seed + 4, -9.0f, 9.0f);
  s.qsl.assign(bs + 1, 0);
  for (size_t b = 0; b < bs; ++b) s.qsl[b + 1] = s.qsl[b] + s.q_lens[b];
  s.q = random_floats(static_cast<size_t>(s.qsl[bs] * q_heads * D), seed + 5);
  for (size_t b = 0; b < bs; ++b) {
    s.k_tok.push_back(random_floats(static_cast<size_t>(s.lens[b] * s.row()), seed + 100 + b, key_lo, key_hi));
    s.v_tok.push_back(random_floats(static_cast<size_t>(s.lens[b] * s.row()), seed + 200 + b));
  }
  for (int step = 0; step < 2; ++step) {
    std::vector<float> k, v;
    std::vector<int32_t> locs;
    for (size_t b = 0; b < bs; ++b) {
      const int32_t split = s.lens[b] - s.q_lens[b];
      const int32_t t0 = step == 0 ? 0 : split, t1 = step == 0 ? split : s.lens[b];
      for (int32_t t = t0; t < t1; ++t) {
        locs.push_back(static_cast<int32_t>(s.table[b * static_cast<size_t>(s.stride) + t / ps] * ps + t % ps));
        k.insert(k.end(), s.k_tok[b].begin() + t * s.row(), s.k_tok[b].begin() + (t + 1) * s.row());
        v.insert(v.end(), s.v_tok[b].begin() + t * s.row(), s.v_tok[b].begin() + (t + 1) * s.row());
      }
      locs.push_back(-1);  // a padding token between rows
      k.insert(k.end(), static_cast<size_t>(s.row()), 1e6f);
      v.insert(v.end(), static_cast<size_t>(s.row()), 1e6f);
    }
    kv_write_params w;
    w.k = k.data();
    w.v = v.data();
    w.locs = locs.data();
    w.k_cache = s.k_cache.data();
    w.v_cache = s.v_cache.data();
    w.n_tokens = static_cast<int64_t>(locs.size());
    w.kv_heads = kv_heads;
    w.head_dim = D;
    w.k_stride = w.v_stride = s.row();
    run_cpu(w);
    page_summary_update_params u;
    u.k = k.data();
    u.locs = locs.data();
    u.key_min = s.key_min.data();
    u.key_max = s.key_max.data();
    u.n_tokens = w.n_tokens;
    u.kv_heads = kv_heads;
    u.head_dim = D;
    u.k_stride = s.row();
    u.page_size = ps;
    u.num_pages = s.num_pages;
    run_cpu(u);
  }
  return s;
}

struct budget {
  int64_t page_budget = 4, sink = 1, recent = 1, min_seq_len = 0;
  bool multi = false;
};

sparse_select_params select_params(const scene& s, const budget& bu, std::vector<int32_t>& out_table,
                                   std::vector<int32_t>& out_lens, const std::vector<uint8_t>* dense = nullptr) {
  const int64_t bs = static_cast<int64_t>(s.lens.size());
  out_table.assign(static_cast<size_t>(bs * s.stride), -3);
  out_lens.assign(static_cast<size_t>(bs), -3);
  sparse_select_params p;
  p.q = s.q.data();
  p.query_start_loc = s.qsl.data();
  p.seq_lens = {s.lens.data(), bs, nullptr};
  p.page_table = s.table.data();
  p.key_min = s.key_min.data();
  p.key_max = s.key_max.data();
  p.dense_rows = dense ? dense->data() : nullptr;
  p.out_page_table = out_table.data();
  p.out_seq_lens = out_lens.data();
  p.batch = bs;
  p.q_heads = s.q_heads;
  p.kv_heads = s.kv_heads;
  p.head_dim = s.D;
  p.page_size = s.ps;
  p.page_table_stride = p.out_page_table_stride = s.stride;
  p.q_stride = s.q_heads * s.D;
  p.page_budget = bu.page_budget;
  p.sink_pages = bu.sink;
  p.recent_pages = bu.recent;
  p.min_seq_len = bu.min_seq_len;
  p.multi_query_rows = bu.multi;
  return p;
}

// Brute-force Quest scores of row b's pages (index = page position in the row), from the raw keys.
std::vector<double> reference_scores(const scene& s, size_t b) {
  const int64_t G = s.q_heads / s.kv_heads, n_pages = s.n_pages(b), len = s.lens[b];
  const float* q = s.q.data() + s.qsl[b] * s.q_heads * s.D;  // the row's first query
  std::vector<double> scores(static_cast<size_t>(n_pages), 0.0);
  for (int64_t i = 0; i < n_pages; ++i) {
    double sum = 0.0;
    for (int64_t h = 0; h < s.kv_heads; ++h)
      for (int64_t d = 0; d < s.D; ++d) {
        double qb = 0.0;
        for (int64_t g = 0; g < G; ++g) qb += q[(h * G + g) * s.D + d];
        qb /= static_cast<double>(G);
        double mn = INFINITY, mx = -INFINITY;
        for (int64_t t = i * s.ps; t < std::min<int64_t>(len, (i + 1) * s.ps); ++t) {
          const double k = s.k_tok[b][(t * s.kv_heads + h) * s.D + d];
          mn = std::min(mn, k);
          mx = std::max(mx, k);
        }
        sum += std::max(qb * mn, qb * mx);
      }
    scores[static_cast<size_t>(i)] = sum;
  }
  return scores;
}

struct ref_row {
  bool sparse = false;
  std::vector<int64_t> keep;  // page positions always kept
  std::vector<int64_t> mid;   // candidate positions
  int64_t n_top = 0;
};

ref_row reference_plan(const scene& s, size_t b, const budget& bu, bool dense) {
  ref_row r;
  const int64_t n_pages = s.n_pages(b), len = s.lens[b], q_len = s.q_lens[b];
  r.sparse = q_len >= 1 && (q_len == 1 || bu.multi) && !dense && len >= bu.min_seq_len && n_pages > bu.page_budget;
  if (!r.sparse) return r;
  const int64_t sink = std::min(bu.sink, n_pages);
  const int64_t first_query_page = (len - q_len) / s.ps;
  const int64_t recent = std::min(std::max(bu.recent, n_pages - first_query_page), n_pages - sink);
  for (int64_t i = 0; i < n_pages; ++i) {
    if (i < sink || i >= n_pages - recent)
      r.keep.push_back(i);
    else
      r.mid.push_back(i);
  }
  r.n_top = std::clamp<int64_t>(bu.page_budget - sink - recent, 0, static_cast<int64_t>(r.mid.size()));
  return r;
}

// Checks row b of the selection output against the brute-force reference.
void expect_selection(const scene& s, size_t b, const budget& bu, bool dense, const std::vector<int32_t>& out_table,
                      const std::vector<int32_t>& out_lens, const std::string& what) {
  const int32_t* in = s.table.data() + b * s.stride;
  const int32_t* out = out_table.data() + b * s.stride;
  const ref_row r = reference_plan(s, b, bu, dense);
  const int64_t n_pages = s.n_pages(b), len = s.lens[b];
  if (!r.sparse) {
    EXPECT_EQ(out_lens[b], len) << what << " row " << b << " (dense)";
    for (int64_t i = 0; i < n_pages; ++i) EXPECT_EQ(out[i], in[i]) << what << " row " << b << " page " << i;
    return;
  }
  const std::vector<double> score = reference_scores(s, b);
  std::vector<int64_t> order = r.mid;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t c) {
    return score[static_cast<size_t>(a)] > score[static_cast<size_t>(c)];
  });  // stable: ties keep the lower index first
  std::set<int64_t> want(r.keep.begin(), r.keep.end());
  want.insert(order.begin(), order.begin() + r.n_top);
  const double cutoff = r.n_top > 0 ? score[static_cast<size_t>(order[static_cast<size_t>(r.n_top - 1)])] : 0.0;
  const int64_t n_sel = static_cast<int64_t>(want.size());
  EXPECT_EQ(out_lens[b], (n_sel - 1) * s.ps + (len - (n_pages - 1) * s.ps)) << what << " row " << b << " eff len";
  // Map the output pages back to positions in the row; they must be ascending.
  std::vector<int64_t> got;
  for (int64_t j = 0; j < n_sel; ++j) {
    const int32_t* it = std::find(in, in + n_pages, out[j]);
    ASSERT_NE(it, in + n_pages) << what << " row " << b << ": output page " << out[j] << " is not in the row";
    got.push_back(it - in);
  }
  EXPECT_TRUE(std::is_sorted(got.begin(), got.end())) << what << " row " << b << ": pages not ascending";
  EXPECT_EQ(std::set<int64_t>(got.begin(), got.end()).size(), got.size()) << what << " row " << b << ": duplicates";
  for (int64_t k : r.keep)
    EXPECT_NE(std::find(got.begin(), got.end(), k), got.end()) << what << " row " << b << ": sink/recent page " << k;
  EXPECT_EQ(got.back(), n_pages - 1) << what << " row " << b << ": the last page must stay last";
  const std::set<int64_t> got_set(got.begin(), got.end());
  for (int64_t i = 0; i < n_pages; ++i) {
    if (want.count(i) == got_set.count(i)) continue;
    const double sc = score[static_cast<size_t>(i)];
    EXPECT_LE(std::fabs(sc - cutoff), 1e-9 * (1.0 + std::fabs(cutoff)))
        << what << " row " << b << ": page " << i << " (score " << sc << ", cut-off " << cutoff << ") "
        << (got_set.count(i) ? "selected but not in the top" : "in the top but not selected");
  }
}

TEST(PageSummary, RunningMinMaxOverSteps) {
  for (int64_t ps : {1, 16, 64}) {
    // Rows with partial last pages; tokens written in two steps (history, then the last q_len).
    const scene s = make_scene(4, 2, 8, ps, {1, 37, 200, 64}, {1, 1, 3, 1}, 11u);
    for (size_t b = 0; b < s.lens.size(); ++b) {
      for (int64_t i = 0; i < s.n_pages(b); ++i) {
        const int64_t page = s.table[b * s.stride + i];
        std::vector<float> mn(static_cast<size_t>(s.row()), INFINITY), mx(static_cast<size_t>(s.row()), -INFINITY);
        for (int64_t t = i * ps; t < std::min<int64_t>(s.lens[b], (i + 1) * ps); ++t)
          for (int64_t e = 0; e < s.row(); ++e) {
            mn[e] = std::min(mn[e], s.k_tok[b][t * s.row() + e]);
            mx[e] = std::max(mx[e], s.k_tok[b][t * s.row() + e]);
          }
        const std::string what = "ps " + std::to_string(ps) + " row " + std::to_string(b) + " page " + std::to_string(i);
        expect_close(s.key_min.data() + page * s.row(), mn.data(), mn.size(), 0.0, 0.0, what + " key_min");
        expect_close(s.key_max.data() + page * s.row(), mx.data(), mx.size(), 0.0, 0.0, what + " key_max");
      }
    }
  }
}

TEST(PageSummary, ReusedPageIsNotStale) {
  const int64_t kvh = 2, D = 4, row = kvh * D, ps = 16, num_pages = 3;
  std::vector<float> key_min(static_cast<size_t>(num_pages * row)), key_max(key_min);
  auto write = [&](const std::vector<float>& k, const std::vector<int32_t>& locs) {
    page_summary_update_params u;
    u.k = k.data();
    u.locs = locs.data();
    u.key_min = key_min.data();
    u.key_max = key_max.data();
    u.n_tokens = static_cast<int64_t>(locs.size());
    u.kv_heads = kvh;
    u.head_dim = D;
    u.k_stride = row;
    u.page_size = ps;
    u.num_pages = num_pages;
    run_cpu(u);
  };
  // First owner fills page 1 with extreme keys.
  std::vector<float> big(static_cast<size_t>(ps * row));
  std::vector<int32_t> locs(static_cast<size_t>(ps));
  for (int64_t t = 0; t < ps; ++t) {
    locs[t] = static_cast<int32_t>(1 * ps + t);
    for (int64_t e = 0; e < row; ++e) big[t * row + e] = (t % 2 ? 100.0f : -100.0f);
  }
  write(big, locs);
  EXPECT_EQ(key_max[1 * row], 100.0f);
  // The page is freed and reused: the new owner writes 3 tokens, one per decode step.
  const auto fresh = random_floats(static_cast<size_t>(3 * row), 5u);
  for (int64_t t = 0; t < 3; ++t)
    write(std::vector<float>(fresh.begin() + t * row, fresh.begin() + (t + 1) * row), {static_cast<int32_t>(ps + t)});
  for (int64_t e = 0; e < row; ++e) {
    const float mn = std::min({fresh[e], fresh[row + e], fresh[2 * row + e]});
    const float mx = std::max({fresh[e], fresh[row + e], fresh[2 * row + e]});
    EXPECT_EQ(key_min[row + e], mn) << "element " << e;
    EXPECT_EQ(key_max[row + e], mx) << "element " << e;
  }
  // Rejects a location outside the pool.
  expect_invalid([&] { write(fresh, {static_cast<int32_t>(num_pages * ps), -1, -1}); }, "locs[0]");
}

TEST(SparseSelect, MatchesBruteForce) {
  for (int64_t gqa : {1, 4, 8}) {
    for (int64_t ps : {1, 16, 64}) {
      const int64_t kvh = 2, D = 16;
      // Page counts around and above the budget; partial last pages; one short row.
      const std::vector<int32_t> lens{static_cast<int32_t>(40 * ps + 3), static_cast<int32_t>(9 * ps),
                                      static_cast<int32_t>(5 * ps - 1), static_cast<int32_t>(2 * ps),
                                      static_cast<int32_t>(23 * ps + ps / 2 + 1)};
      const scene s = make_scene(kvh * gqa, kvh, D, ps, lens, {1, 1, 1, 1, 1}, static_cast<uint32_t>(gqa * 100 + ps));
      for (const budget bu : {budget{6, 1, 2, 0}, budget{5, 0, 1, 0}, budget{8, 2, 2, 0}, budget{3, 1, 1, 0}}) {
        std::vector<int32_t> out_table, out_lens;
        const sparse_select_params p = select_params(s, bu, out_table, out_lens);
        run_cpu(p);
        for (size_t b = 0; b < lens.size(); ++b)
          expect_selection(s, b, bu, false, out_table, out_lens,
                           "gqa " + std::to_string(gqa) + " ps " + std::to_string(ps) + " budget " +
                               std::to_string(bu.page_budget));
      }
    }
  }
}

// Tensor parallelism: `parts` ranks each hold kv_heads / parts KV heads with their query heads.
// The scene's queries and summaries of rank `part`'s heads.
scene shard_of(const scene& s, int64_t parts, int64_t part) {
  scene r = s;
  const int64_t G = s.q_heads / s.kv_heads, kvl = s.kv_heads / parts, D = s.D;
  r.kv_heads = kvl;
  r.q_heads = kvl * G;
  const int64_t tokens = static_cast<int64_t>(s.q.size()) / (s.q_heads * D);
  r.q.assign(static_cast<size_t>(tokens * r.q_heads * D), 0.0f);
  for (int64_t t = 0; t < tokens; ++t)
    std::copy_n(s.q.begin() + (t * s.q_heads + part * r.q_heads) * D, r.q_heads * D, r.q.begin() + t * r.q_heads * D);
  r.key_min.assign(static_cast<size_t>(s.num_pages * kvl * D), 0.0f);
  r.key_max = r.key_min;
  for (int64_t pg = 0; pg < s.num_pages; ++pg) {
    std::copy_n(s.key_min.begin() + (pg * s.kv_heads + part * kvl) * D, kvl * D, r.key_min.begin() + pg * kvl * D);
    std::copy_n(s.key_max.begin() + (pg * s.kv_heads + part * kvl) * D, kvl * D, r.key_max.begin() + pg * kvl * D);
  }
  return r;
}

// Each rank scores its heads (phase kScore), the scores are summed (the all-reduce), and the
// selection from the sums (phase kSelect) equals one rank's fused selection over every head.
TEST(SparseSelect, ShardedScorePhasesSumToTheFusedSelection) {
  for (int64_t parts : {2, 4}) {
    const int64_t kvh = 4, gqa = 2, D = 16, ps = 16;
    const std::vector<int32_t> lens{40 * 16 + 3, 9 * 16, 5 * 16 - 1, 2 * 16, 23 * 16 + 9};
    const scene s = make_scene(kvh * gqa, kvh, D, ps, lens, {1, 1, 1, 1, 1}, static_cast<uint32_t>(31 + parts));
    for (const budget bu : {budget{6, 1, 2, 0}, budget{3, 1, 1, 0}}) {
      std::vector<int32_t> want_table, want_lens;
      run_cpu(select_params(s, bu, want_table, want_lens));
      std::vector<float> sum(static_cast<size_t>(static_cast<int64_t>(lens.size()) * s.stride), 0.0f);
      std::vector<int32_t> unused_table, unused_lens;
      for (int64_t part = 0; part < parts; ++part) {
        const scene sh = shard_of(s, parts, part);
        std::vector<float> scores(sum.size(), 0.0f);
        sparse_select_params p = select_params(sh, bu, unused_table, unused_lens);
        p.mode = sparse_select_params::phase::kScore;
        p.scores = scores.data();
        run_cpu(p);
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += scores[i];
      }
      // kScore writes no selection.
      EXPECT_TRUE(std::all_of(unused_table.begin(), unused_table.end(), [](int32_t v) { return v == -3; }));
      std::vector<int32_t> got_table, got_lens;
      const scene first = shard_of(s, parts, 0);  // kSelect reads no q or summaries: any rank's
      sparse_select_params p = select_params(first, bu, got_table, got_lens);
      p.mode = sparse_select_params::phase::kSelect;
      p.scores = sum.data();
      run_cpu(p);
      EXPECT_EQ(got_lens, want_lens) << parts << " ranks, budget " << bu.page_budget;
      EXPECT_EQ(got_table, want_table) << parts << " ranks, budget " << bu.page_budget;
    }
  }
  // A phase without its scores buffer is refused.
  const scene s = make_scene(4, 2, 16, 16, {300}, {1}, 5u);
  std::vector<int32_t> t, l;
  sparse_select_params p = select_params(s, budget{}, t, l);
  p.mode = sparse_select_params::phase::kSelect;
  expect_invalid([&] { run_cpu(p); }, "scores");
}

TEST(SparseSelect, DenseRowsByLengthFlagAndQueryCount) {
  const scene s = make_scene(8, 2, 16, 16, {600, 600, 600, 600, 600}, {1, 1, 1, 2, 0}, 7u);
  const std::vector<uint8_t> dense{0, 1, 0, 0, 0};
  budget bu{4, 1, 1, 0};
  std::vector<int32_t> out_table, out_lens;
  run_cpu(select_params(s, bu, out_table, out_lens, &dense));
  for (size_t b = 0; b < 5; ++b) expect_selection(s, b, bu, dense[b] != 0, out_table, out_lens, "flags");
  EXPECT_LT(out_lens[0], 600);   // sparse
  EXPECT_EQ(out_lens[1], 600);   // disabled
  EXPECT_EQ(out_lens[3], 600);   // two queries, multi_query_rows off
  EXPECT_EQ(out_lens[4], 600);   // no query
  bu.min_seq_len = 601;          // every row below min_seq_len
  run_cpu(select_params(s, bu, out_table, out_lens, &dense));
  for (size_t b = 0; b < 5; ++b) EXPECT_EQ(out_lens[b], 600) << "row " << b;
}

TEST(SparseSelect, NeedlePageIsAlwaysSelected) {
  const int64_t qh = 8, kvh = 2, D = 32, ps = 16, n_pages = 64;
  std::mt19937 gen(3);
  for (int trial = 0; trial < 20; ++trial) {
    scene s = make_scene(qh, kvh, D, ps, {static_cast<int32_t>(n_pages * ps - 5)}, {1}, 1000u + trial, -0.1f, 0.1f);
    // Plant: every key of one middle page points along q̄ of its kv group.
    const int64_t needle = 1 + static_cast<int64_t>(gen() % (n_pages - 3));
    const int64_t G = qh / kvh;
    std::vector<float> qbar(static_cast<size_t>(kvh * D), 0.0f);
    for (int64_t h = 0; h < kvh; ++h)
      for (int64_t d = 0; d < D; ++d)
        for (int64_t g = 0; g < G; ++g) qbar[h * D + d] += s.q[(h * G + g) * D + d] / G;
    std::vector<float> k(static_cast<size_t>(ps * s.row()));
    std::vector<int32_t> locs(static_cast<size_t>(ps));
    const int64_t page = s.table[needle];
    for (int64_t t = 0; t < ps; ++t) {
      locs[t] = static_cast<int32_t>(page * ps + t);
      for (int64_t e = 0; e < s.row(); ++e) k[t * s.row() + e] = 0.5f * qbar[e];
      std::copy(k.begin() + t * s.row(), k.begin() + (t + 1) * s.row(), s.k_tok[0].begin() + (needle * ps + t) * s.row());
    }
    page_summary_update_params u;
    u.k = k.data();
    u.locs = locs.data();
    u.key_min = s.key_min.data();
    u.key_max = s.key_max.data();
    u.n_tokens = ps;
    u.kv_heads = kvh;
    u.head_dim = D;
    u.k_stride = s.row();
    u.page_size = ps;
    u.num_pages = s.num_pages;
    run_cpu(u);
    const budget bu{4, 1, 2, 0};  // exactly one page chosen by score
    std::vector<int32_t> out_table, out_lens;
    run_cpu(select_params(s, bu, out_table, out_lens));
    EXPECT_EQ(out_lens[0], 3 * ps + (s.lens[0] - (n_pages - 1) * ps)) << "trial " << trial;
    EXPECT_EQ(out_table[0], s.table[0]) << "sink, trial " << trial;
    EXPECT_EQ(out_table[1], page) << "needle at page " << needle << ", trial " << trial;
    EXPECT_EQ(out_table[2], s.table[n_pages - 2]) << "recent, trial " << trial;
    EXPECT_EQ(out_table[3], s.table[n_pages - 1]) << "recent, trial " << trial;
    expect_selection(s, 0, bu, false, out_table, out_lens, "needle");
  }
}

TEST(SparseSelect, RejectsBadSeqLens) {
  const scene s = make_scene(4, 2, 8, 16, {100, 50}, {1, 1}, 9u);
  std::vector<int32_t> out_table, out_lens;
  const budget bu;
  sparse_select_params p = select_params(s, bu, out_table, out_lens);
  p.seq_lens.size = 1;
  expect_invalid([&] { run_cpu(p); }, "seq_lens.size");
  p.seq_lens.size = 3;
  expect_invalid([&] { run_cpu(p); }, "seq_lens.size");
  p.seq_lens = {};
  expect_invalid([&] { run_cpu(p); }, "seq_lens");
  const std::vector<int32_t> negative{100, -1};
  p.seq_lens = {negative.data(), 2, nullptr};
  expect_invalid([&] { run_cpu(p); }, "seq_lens[1]");
  const std::vector<int32_t> too_long{100, 50 + 16 * 100};
  p.seq_lens = {too_long.data(), 2, nullptr};
  expect_invalid([&] { run_cpu(p); }, "seq_lens[1]");
}

paged_attention_params attention_params(const scene& s, const int32_t* table, const int32_t* lens,
                                        std::vector<float>& out) {
  out.assign(static_cast<size_t>(s.qsl.back() * s.q_heads * s.D), 0.0f);
  paged_attention_params a;
  a.q = s.q.data();
  a.k_cache = s.k_cache.data();
  a.v_cache = s.v_cache.data();
  a.out = out.data();
  a.query_start_loc = s.qsl.data();
  a.seq_lens = lens;
  a.page_table = table;
  a.batch = static_cast<int64_t>(s.lens.size());
  a.q_heads = s.q_heads;
  a.kv_heads = s.kv_heads;
  a.head_dim = s.D;
  a.page_size = s.ps;
  a.page_table_stride = s.stride;
  a.q_stride = a.out_stride = s.q_heads * s.D;
  a.scale = 1.0f / std::sqrt(static_cast<float>(s.D));
  return a;
}

TEST(SparseAttention, BudgetCoveringEveryPageEqualsDense) {
  for (int64_t ps : {1, 16, 64}) {
    const scene s = make_scene(8, 2, 32, ps, {static_cast<int32_t>(12 * ps + 1), static_cast<int32_t>(7 * ps)},
                               {1, 1}, 21u);
    const budget bu{12 + 1, 1, 2, 0};  // >= every row's page count
    std::vector<int32_t> out_table, out_lens;
    run_cpu(select_params(s, bu, out_table, out_lens));
    std::vector<float> dense, sparse;
    run_cpu(attention_params(s, s.table.data(), s.lens.data(), dense));
    run_cpu(attention_params(s, out_table.data(), out_lens.data(), sparse));
    expect_close(sparse, dense, 1e-5, 1e-5, "ps " + std::to_string(ps));
  }
}

// Sparse attention (selection + paged attention over the compact table) against softmax in
// double over exactly the tokens of the reference's selected pages, causal per query.
TEST(SparseAttention, EqualsAttentionOverSelectedPages) {
  for (int64_t ps : {1, 16, 64}) {
    for (int64_t gqa : {1, 4, 8}) {
      const int64_t kvh = 2, D = 32;
      // A decode row with a partial last page, a verify row of 5 queries spanning a page
      // boundary (selected with its first query), a short dense row.
      const int32_t l0 = static_cast<int32_t>(30 * ps + 1 + (ps > 2 ? ps / 3 : 0));
      const int32_t l1 = static_cast<int32_t>(20 * ps + 2);
      const scene s = make_scene(kvh * gqa, kvh, D, ps, {l0, l1, static_cast<int32_t>(2 * ps)}, {1, 5, 1},
                                 static_cast<uint32_t>(31 * ps + gqa));
      budget bu{6, 1, 2, 0};
      bu.multi = true;
      std::vector<int32_t> out_table, out_lens;
      run_cpu(select_params(s, bu, out_table, out_lens));
      std::vector<float> got;
      run_cpu(attention_params(s, out_table.data(), out_lens.data(), got));
      std::vector<double> want(got.size(), 0.0);
      const int64_t G = gqa;
      for (size_t b = 0; b < s.lens.size(); ++b) {
        expect_selection(s, b, bu, false, out_table, out_lens, "attention");
        // Selected token positions in order.
        std::vector<int64_t> toks;
        const int32_t* in = s.table.data() + b * s.stride;
        for (int64_t j = 0; j < s.n_pages(b); ++j) {
          const int32_t pg = out_table[b * s.stride + j];
          if (j * s.ps >= out_lens[b]) break;
          const int64_t pos = std::find(in, in + s.n_pages(b), pg) - in;
          for (int64_t t = pos * s.ps; t < std::min<int64_t>(s.lens[b], (pos + 1) * s.ps); ++t) toks.push_back(t);
        }
        ASSERT_EQ(static_cast<int64_t>(toks.size()), out_lens[b]) << "row " << b;
        for (int64_t qi = 0; qi < s.q_lens[b]; ++qi) {
          const int64_t tok = s.qsl[b] + qi, qpos = s.lens[b] - s.q_lens[b] + qi;
          for (int64_t h = 0; h < s.q_heads; ++h) {
            const float* q = s.q.data() + (tok * s.q_heads + h) * D;
            const int64_t kh = h / G;
            std::vector<double> w;
            double m = -INFINITY;
            for (int64_t t : toks) {
              if (t > qpos) {
                w.push_back(-INFINITY);
                continue;
              }
              double dot = 0.0;
              for (int64_t d = 0; d < D; ++d) dot += q[d] * s.k_tok[b][(t * kvh + kh) * D + d];
              w.push_back(dot / std::sqrt(static_cast<double>(D)));
              m = std::max(m, w.back());
            }
            double den = 0.0;
            for (double& x : w) den += (x = std::exp(x - m));
            for (int64_t d = 0; d < D; ++d) {
              double acc = 0.0;
              for (size_t j = 0; j < toks.size(); ++j) acc += w[j] * s.v_tok[b][(toks[j] * kvh + kh) * D + d];
              want[static_cast<size_t>((tok * s.q_heads + h) * D + d)] = acc / den;
            }
          }
        }
      }
      expect_close(got, want, 1e-5, 1e-5, "ps " + std::to_string(ps) + " gqa " + std::to_string(gqa));
    }
  }
}

}  // namespace
}  // namespace hyserve::kernels
