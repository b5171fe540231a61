// Backend ops: sparse Top-K decode attention, CUDA against the CPU ops on the same inputs.
//  - page_summary_update: identical bits (min/max is exact and order-independent).
//  - sparse_select: effective lengths identical; page lists identical except pages whose
//    score (double, from the summaries) lies within 1e-5·Σ|terms| of the row's cut-off score
//    (fp32 sums in another order may swap a near-tie). Exact-tie inputs (integer scores) must
//    match exactly, ties to the lower page index.
//  - selection + paged attention: |Δ| <= 2e-5 + 1e-4·|want| (as the paged attention tests).
// Rows cover GQA 1/4/8, page sizes 1/16/64, partial last pages, dense rows (short, flagged, no
// query), a verify row, and 8192-page rows (several scoring blocks per row, radix select).
// Every selection case runs both CUDA selection kernels, chosen through kernels::run by the
// context's kernels.sparse_select (v2, the default:
// scoring kernel + one 1024-thread selecting block per row, keys in registers up to 8192 middle
// pages, re-read beyond; v1: the last scoring block selects).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "hyserve/kernels/device.h"

#if defined(HYSERVE_HAVE_CUDA)

#include "cuda_test_util.h"
#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/graph.h"
#include "hyserve/kernels/run.h"
#include "hyserve/kernels/sparse_attention.h"

namespace hyserve::kernels {
namespace {

using cuda_test::expect_equal;
using cuda_test::expect_invalid;
using cuda_test::expect_match;
using cuda_test::random_floats;
using cuda_test::to_device;

bool no_device() { return cuda_device_count() == 0; }

TEST(PageSummaryCuda, MatchesCpuBitForBit) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  for (int64_t ps : {1, 16, 64}) {
    const int64_t kvh = 4, D = 64, row = kvh * D, num_pages = 40;
    auto key_min = random_floats(static_cast<size_t>(num_pages * row), 1u, -5.0f, 5.0f);
    auto key_max = random_floats(static_cast<size_t>(num_pages * row), 2u, -5.0f, 5.0f);
    device_array<float> dmin(key_min), dmax(key_max);
    std::mt19937 gen(static_cast<uint32_t>(ps));
    for (int step = 0; step < 3; ++step) {
      // A prefill-like step: runs of consecutive slots (some starting a page, some not), many
      // tokens per page, padding; later steps a few decode-like tokens.
      std::vector<int32_t> locs;
      const int64_t n_locs = num_pages * ps;
      if (step == 0) {
        for (int64_t l = 0; l < n_locs; l += 3) locs.push_back(static_cast<int32_t>(l));
        locs.push_back(-1);
      } else {
        for (int i = 0; i < 8; ++i) locs.push_back(static_cast<int32_t>(gen() % n_locs));
      }
      const int64_t n = static_cast<int64_t>(locs.size()), k_stride = row + 4;
      const auto k = random_floats(static_cast<size_t>(n * k_stride), 10u + step, -3.0f, 3.0f);
      page_summary_update_params p;
      p.k = k.data();
      p.locs = locs.data();
      p.key_min = key_min.data();
      p.key_max = key_max.data();
      p.n_tokens = n;
      p.kv_heads = kvh;
      p.head_dim = D;
      p.k_stride = k_stride;
      p.page_size = ps;
      p.num_pages = num_pages;
      run_cpu(p);
      auto dk = to_device(k);
      auto dlocs = to_device(locs);
      page_summary_update_params d = p;
      d.k = dk.data();
      d.locs = dlocs.data();
      d.key_min = dmin.data();
      d.key_max = dmax.data();
      run_cuda(d);
      device_synchronize();
      const std::string what = "ps " + std::to_string(ps) + " step " + std::to_string(step);
      expect_match(dmin.download(), key_min, 0.0, 0.0, what + " key_min");
      expect_match(dmax.download(), key_max, 0.0, 0.0, what + " key_max");
    }
  }
}

struct select_case {
  int64_t q_heads, kv_heads, D, ps;
  std::vector<int32_t> lens, q_lens;
  std::vector<uint8_t> dense;
  int64_t page_budget, sink, recent, min_seq_len;
  bool multi;
  bool integer_scores = false;  // few distinct, exactly representable scores: many exact ties
  int levels = 3;               // integer_scores: distinct levels (1: every score equal)
  bool wide_scores = false;     // summaries of both signs, pages scaled by 2^[-20, 20]: scores of both signs over many binades
  int needle_row = -1;          // plant a needle (a page scoring far above every other) in this row's middle pages
};

struct select_data {
  int64_t stride = 0, num_pages = 0;
  std::vector<int32_t> table, qsl;
  std::vector<float> q, key_min, key_max;
};

select_data make_data(const select_case& c, uint32_t seed) {
  select_data s;
  int64_t total = 0;
  for (int32_t len : c.lens) {
    const int64_t n = (len + c.ps - 1) / c.ps;
    total += n;
    s.stride = std::max(s.stride, n);
  }
  s.num_pages = total + 2;
  std::vector<int32_t> ids(static_cast<size_t>(s.num_pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  s.table.assign(c.lens.size() * static_cast<size_t>(s.stride), 0);
  size_t next = 0;
  for (size_t b = 0; b < c.lens.size(); ++b)
    for (int64_t i = 0; i < (c.lens[b] + c.ps - 1) / c.ps; ++i) s.table[b * s.stride + i] = ids[next++];
  s.qsl.assign(c.lens.size() + 1, 0);
  for (size_t b = 0; b < c.lens.size(); ++b) s.qsl[b + 1] = s.qsl[b] + c.q_lens[b];
  const int64_t row = c.kv_heads * c.D;
  if (c.integer_scores) {
    // q ≡ 1, so q̄ ≡ 1 and score = Σ key_max = row · level, level in {0, 1, 2}.
    s.q.assign(static_cast<size_t>(std::max(1, s.qsl.back()) * c.q_heads * c.D), 1.0f);
    std::mt19937 gen(seed);
    for (int64_t p = 0; p < s.num_pages; ++p) {
      const float level = static_cast<float>(gen() % static_cast<uint32_t>(c.levels));
      s.key_max.insert(s.key_max.end(), static_cast<size_t>(row), level);
      s.key_min.insert(s.key_min.end(), static_cast<size_t>(row), level - 1.0f);
    }
  } else if (c.wide_scores) {
    s.q = random_floats(static_cast<size_t>(std::max(1, s.qsl.back()) * c.q_heads * c.D), seed + 1);
    s.key_min = random_floats(static_cast<size_t>(s.num_pages * row), seed + 2, -3.0f, 1.0f);
    const auto spread = random_floats(static_cast<size_t>(s.num_pages * row), seed + 3, 0.0f, 1.0f);
    std::mt19937 gen(seed);
    for (int64_t p = 0; p < s.num_pages; ++p) {
      const float scale = std::ldexp(1.0f, static_cast<int>(gen() % 41) - 20);
      for (int64_t e = p * row; e < (p + 1) * row; ++e) {
        s.key_max.push_back((s.key_min[e] + spread[e]) * scale);
        s.key_min[e] *= scale;
      }
    }
  } else {
    s.q = random_floats(static_cast<size_t>(std::max(1, s.qsl.back()) * c.q_heads * c.D), seed + 1);
    s.key_min = random_floats(static_cast<size_t>(s.num_pages * row), seed + 2, -1.0f, 0.0f);
    s.key_max = random_floats(static_cast<size_t>(s.num_pages * row), seed + 3, 0.0f, 1.0f);
  }
  if (c.needle_row >= 0) {
    // The row's middle page 2/3 of the way in: key = 10·sign(q̄) in every element, so its score
    // is 10·Σ|q̄| while every other page (|key| ≤ 1) scores at most Σ|q̄|.
    const auto b = static_cast<size_t>(c.needle_row);
    const int64_t n_pages = (c.lens[b] + c.ps - 1) / c.ps;
    const int32_t page = s.table[b * s.stride + n_pages * 2 / 3];
    const int64_t G = c.q_heads / c.kv_heads;
    const float* q = s.q.data() + s.qsl[b] * c.q_heads * c.D;
    for (int64_t h = 0; h < c.kv_heads; ++h)
      for (int64_t d = 0; d < c.D; ++d) {
        double qb = 0.0;
        for (int64_t g = 0; g < G; ++g) qb += q[(h * G + g) * c.D + d];
        const float v = qb >= 0.0 ? 10.0f : -10.0f;
        s.key_min[page * row + h * c.D + d] = v;
        s.key_max[page * row + h * c.D + d] = v;
      }
  }
  return s;
}

constexpr const char* kVariants[] = {"v2", "v1"};

// A CUDA context on `stream` whose kernels.sparse_select is variant v ("v2" or "v1").
exec_context select_ctx(const std::string& v, void* stream = nullptr) {
  exec_context ctx;
  ctx.device = device_kind::kCuda;
  ctx.stream = stream;
  ctx.paths.sparse_select = v == "v1" ? kernel_paths::sparse_select_kind::kV1 : kernel_paths::sparse_select_kind::kV2;
  return ctx;
}

sparse_select_params host_params(const select_case& c, select_data& s, std::vector<int32_t>& out_table,
                                 std::vector<int32_t>& out_lens) {
  const int64_t bs = static_cast<int64_t>(c.lens.size());
  out_table.assign(static_cast<size_t>(bs * s.stride), -3);
  out_lens.assign(static_cast<size_t>(bs), -3);
  sparse_select_params p;
  p.q = s.q.data();
  p.query_start_loc = s.qsl.data();
  p.seq_lens = {c.lens.data(), bs, nullptr};
  p.page_table = s.table.data();
  p.key_min = s.key_min.data();
  p.key_max = s.key_max.data();
  p.dense_rows = c.dense.empty() ? nullptr : c.dense.data();
  p.out_page_table = out_table.data();
  p.out_seq_lens = out_lens.data();
  p.batch = bs;
  p.q_heads = c.q_heads;
  p.kv_heads = c.kv_heads;
  p.head_dim = c.D;
  p.page_size = c.ps;
  p.page_table_stride = p.out_page_table_stride = s.stride;
  p.q_stride = c.q_heads * c.D;
  p.page_budget = c.page_budget;
  p.sink_pages = c.sink;
  p.recent_pages = c.recent;
  p.min_seq_len = c.min_seq_len;
  p.multi_query_rows = c.multi;
  return p;
}

// Device copies of a host params struct's inputs, and its outputs.
struct device_select {
  device_array<float> q, key_min, key_max;
  device_array<int32_t> qsl, lens, table, out_table, out_lens;
  device_array<uint8_t> dense;
  sparse_select_params p;

  explicit device_select(const sparse_select_params& h, const select_case& c, const select_data& s)
      : q(s.q), key_min(s.key_min), key_max(s.key_max), qsl(s.qsl), lens(c.lens), table(s.table),
        out_table(s.table.size()), out_lens(c.lens.size()) {
    p = h;
    p.q = q.data();
    p.query_start_loc = qsl.data();
    p.seq_lens = {lens.data(), h.seq_lens.size, nullptr};
    p.page_table = table.data();
    p.key_min = key_min.data();
    p.key_max = key_max.data();
    if (!c.dense.empty()) {
      dense = device_array<uint8_t>(c.dense);
      p.dense_rows = dense.data();
    }
    p.out_page_table = out_table.data();
    p.out_seq_lens = out_lens.data();
  }
};

// Quest score in double from the summaries, and the magnitude Σ|term| that bounds its fp32 error.
std::pair<double, double> score_of(const select_case& c, const select_data& s, size_t b, int32_t page) {
  const int64_t G = c.q_heads / c.kv_heads, row = c.kv_heads * c.D;
  const float* q = s.q.data() + s.qsl[b] * c.q_heads * c.D;
  double sum = 0.0, mag = 0.0;
  for (int64_t h = 0; h < c.kv_heads; ++h)
    for (int64_t d = 0; d < c.D; ++d) {
      double qb = 0.0;
      for (int64_t g = 0; g < G; ++g) qb += q[(h * G + g) * c.D + d];
      qb /= static_cast<double>(G);
      const double t = std::max(qb * s.key_min[page * row + h * c.D + d], qb * s.key_max[page * row + h * c.D + d]);
      sum += t;
      mag += std::fabs(t);
    }
  return {sum, mag};
}

void run_select_variant(const select_case& c, const select_data& s, const sparse_select_params& h,
                        const std::vector<int32_t>& out_table, const std::vector<int32_t>& out_lens,
                        const std::string& what, const exec_context& ctx) {
  device_select d(h, c, s);
  d.out_table.fill_bytes(0xff);
  d.out_lens.fill_bytes(0xff);
  run(d.p, ctx);
  device_synchronize();
  const auto got_table = d.out_table.download();
  const auto got_lens = d.out_lens.download();
  expect_equal(got_lens, out_lens, what + " eff lens");
  if (c.needle_row >= 0) {
    const auto b = static_cast<size_t>(c.needle_row);
    const int64_t n_pages = (c.lens[b] + c.ps - 1) / c.ps;
    const int32_t needle = s.table[b * s.stride + n_pages * 2 / 3];
    const int32_t* row = got_table.data() + b * s.stride;
    const int64_t n_sel = (out_lens[b] + c.ps - 1) / c.ps;
    EXPECT_NE(std::find(row, row + n_sel, needle), row + n_sel) << what << ": needle not selected";
  }
  for (size_t b = 0; b < c.lens.size(); ++b) {
    const int64_t n_pages = (c.lens[b] + c.ps - 1) / c.ps;
    const int64_t n_sel = out_lens[b] == c.lens[b] ? n_pages : (out_lens[b] + c.ps - 1) / c.ps;
    const int32_t* want = out_table.data() + b * s.stride;
    const int32_t* got = got_table.data() + b * s.stride;
    const std::vector<int32_t> want_v(want, want + n_sel), got_v(got, got + n_sel);
    if (want_v == got_v) continue;
    ASSERT_FALSE(c.integer_scores) << what << " row " << b << ": exact ties must select identically";
    EXPECT_TRUE(std::is_sorted(got_v.begin(), got_v.end(), [&](int32_t x, int32_t y) {
      const int32_t* in = s.table.data() + b * s.stride;
      return std::find(in, in + n_pages, x) < std::find(in, in + n_pages, y);
    })) << what << " row " << b << ": pages not in ascending order";
    // The cut-off: the lowest score among the CPU's selected middle pages.
    const std::set<int32_t> ws(want_v.begin(), want_v.end()), gs(got_v.begin(), got_v.end());
    const bool dense_flag = !c.dense.empty() && c.dense[b] != 0;
    const sparse_row_plan plan = plan_sparse_row(c.lens[b], c.q_lens[b], dense_flag, h);
    ASSERT_TRUE(plan.sparse) << what << " row " << b << ": a dense row differs";
    double cutoff = INFINITY;
    for (int64_t j = plan.n_sink; j < plan.n_sink + plan.n_top; ++j)
      cutoff = std::min(cutoff, score_of(c, s, b, want[j]).first);
    for (int32_t pg : ws) {
      if (gs.count(pg)) continue;
      const auto [sc, mag] = score_of(c, s, b, pg);
      EXPECT_LE(std::fabs(sc - cutoff), 1e-5 * mag) << what << " row " << b << ": page " << pg << " dropped";
    }
    for (int32_t pg : gs) {
      if (ws.count(pg)) continue;
      const auto [sc, mag] = score_of(c, s, b, pg);
      EXPECT_LE(std::fabs(sc - cutoff), 1e-5 * mag) << what << " row " << b << ": page " << pg << " added";
    }
  }
}

void run_select_case(const select_case& c, uint32_t seed, const std::string& what) {
  select_data s = make_data(c, seed);
  std::vector<int32_t> out_table, out_lens;
  const sparse_select_params h = host_params(c, s, out_table, out_lens);
  run_cpu(h);
  if (c.needle_row >= 0) {
    // The CPU op keeps the needle (checked here once, so the comparison below covers CUDA).
    const auto b = static_cast<size_t>(c.needle_row);
    const int64_t n_pages = (c.lens[b] + c.ps - 1) / c.ps;
    const int32_t needle = s.table[b * s.stride + n_pages * 2 / 3];
    const int32_t* row = out_table.data() + b * s.stride;
    const int64_t n_sel = (out_lens[b] + c.ps - 1) / c.ps;
    ASSERT_NE(std::find(row, row + n_sel, needle), row + n_sel) << what << ": needle not selected";
  }
  for (const char* v : kVariants) run_select_variant(c, s, h, out_table, out_lens, what + " [" + v + "]", select_ctx(v));
}

TEST(SparseSelectCuda, MatchesCpu) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  for (int64_t gqa : {1, 4, 8}) {
    for (int64_t ps : {1, 16, 64}) {
      select_case c;
      c.kv_heads = 2;
      c.q_heads = 2 * gqa;
      c.D = 64;
      c.ps = ps;
      const auto P = static_cast<int32_t>(ps);
      c.lens = {40 * P + 3, 9 * P, 5 * P - 1, 600 * P + P / 2, 30 * P, 30 * P, 31 * P - 1};
      c.q_lens = {1, 1, 1, 1, 1, 0, 4};
      c.dense = {0, 0, 0, 0, 1, 0, 0};
      c.page_budget = 8;
      c.sink = 1;
      c.recent = 2;
      c.min_seq_len = 0;
      c.multi = true;
      run_select_case(c, static_cast<uint32_t>(gqa * 10 + ps), "gqa " + std::to_string(gqa) + " ps " + std::to_string(ps));
      c.sink = 0;
      c.recent = 0;
      c.page_budget = 3;
      c.multi = false;
      run_select_case(c, static_cast<uint32_t>(gqa * 10 + ps + 1), "no sink/recent gqa " + std::to_string(gqa));
    }
  }
}

TEST(SparseSelectCuda, ManyPagesAndExactTies) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  for (bool ties : {false, true}) {
    select_case c;
    c.kv_heads = 8;
    c.q_heads = 32;
    c.D = 128;
    c.ps = 16;
    c.lens = {8192 * 16, 8192 * 16 - 7, 4000 * 16 + 1, 300 * 16};
    c.q_lens = {1, 1, 1, 1};
    c.page_budget = 256;
    c.sink = 4;
    c.recent = 8;
    c.min_seq_len = 1024;
    c.multi = false;
    c.integer_scores = ties;
    run_select_case(c, 77u, ties ? "8192 pages, exact ties" : "8192 pages");
  }
}

// Small summaries (several pages scored per warp: 1, 2, 4 or 8 threads per page) and rows longer
// than the selecting block keeps in shared memory (16384 pages: those re-read their scores from
// global memory), with and without exact ties.
TEST(SparseSelectCuda, SmallSummariesAndRowsBeyondSharedMemory) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  for (int64_t D : {4, 8, 16, 32}) {
    for (bool ties : {false, true}) {
      select_case c;
      c.kv_heads = 1;
      c.q_heads = 4;
      c.D = D;
      c.ps = 16;
      c.lens = {20000 * 16, 20000 * 16 - 3, 8192 * 16, 17 * 16 + 1};
      c.q_lens = {1, 1, 1, 1};
      c.page_budget = 256;
      c.sink = 1;
      c.recent = 4;
      c.min_seq_len = 0;
      c.multi = false;
      c.integer_scores = ties;
      run_select_case(c, static_cast<uint32_t>(100 + D + ties),
                      "D " + std::to_string(D) + (ties ? " exact ties" : "") + ", 20000 pages");
    }
  }
}

// Budgets near the page count (n_top = n_mid − 1, a few pages to drop), rows whose queries' pages
// leave no page to choose (n_top = 0), middle-page counts around the selecting block's register
// capacity (8191 / 8192 / 8193: registers, then re-read keys) and lengths that split unevenly
// over the scoring blocks, with random, exactly tied and all-equal scores.
TEST(SparseSelectCuda, BudgetsNearPageCountAndRowSizes) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  for (int mode = 0; mode < 3; ++mode) {
    select_case c;
    c.kv_heads = 2;
    c.q_heads = 8;
    c.D = 8;
    c.ps = 16;
    // Budget 40, sink 2, recent 3: rows of 41, 42 and 47 pages keep all but 1, 2 and 7 middle
    // pages; 8196 / 8197 / 8198 pages leave 8191 / 8192 / 8193 middle pages; the verify row's
    // 50 queries span 4–5 pages (recent ≥ 4), and the 700-query row's 44–45 pages exceed the
    // budget (n_top = 0). Some lengths end in a partial page.
    c.lens = {41 * 16, 42 * 16 - 5, 47 * 16, 8196 * 16, 8197 * 16 - 1, 8198 * 16, 1000 * 16 + 3, 3 * 16 + 300 * 16 + 7, 1200 * 16};
    c.q_lens = {1, 1, 1, 1, 1, 1, 50, 1, 700};
    c.page_budget = 40;
    c.sink = 2;
    c.recent = 3;
    c.min_seq_len = 0;
    c.multi = true;
    c.integer_scores = mode > 0;
    c.levels = mode == 2 ? 1 : 3;
    const char* names[] = {"random", "exact ties", "all equal"};
    run_select_case(c, 500u + static_cast<uint32_t>(mode), std::string("near budget, ") + names[mode]);
  }
}

// Scores of both signs over many binades (several radix passes, keys on both sides of zero), and
// a planted needle that must always be selected, at the bench's 8192-page shape.
TEST(SparseSelectCuda, WideScoresAndNeedle) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  for (int64_t D : {4, 128}) {
    select_case c;
    c.kv_heads = D == 4 ? 1 : 2;
    c.q_heads = 4 * c.kv_heads;
    c.D = D;
    c.ps = 16;
    c.lens = {8192 * 16, 5000 * 16 + 9, 8192 * 16 - 15, 257 * 16, 12000 * 16};
    c.q_lens = {1, 1, 1, 1, 1};
    c.page_budget = 256;
    c.sink = 1;
    c.recent = 4;
    c.min_seq_len = 0;
    c.multi = false;
    c.wide_scores = true;
    run_select_case(c, 600u + static_cast<uint32_t>(D), "wide scores D " + std::to_string(D));
    c.wide_scores = false;
    c.needle_row = 0;
    run_select_case(c, 700u + static_cast<uint32_t>(D), "needle row 0 D " + std::to_string(D));
    c.needle_row = 4;
    run_select_case(c, 800u + static_cast<uint32_t>(D), "needle row 4 D " + std::to_string(D));
  }
}

// The bench's shape (64 rows × 8192 pages, budget 256, 1 kv head × 4 dims): the selection
// kernels agree with the CPU op.
TEST(SparseSelectCuda, BenchShape) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  select_case c;
  c.kv_heads = 1;
  c.q_heads = 4;
  c.D = 4;
  c.ps = 16;
  c.lens.assign(64, 8192 * 16);
  c.q_lens.assign(64, 1);
  c.page_budget = 256;
  c.sink = 1;
  c.recent = 4;
  c.min_seq_len = 0;
  c.multi = false;
  run_select_case(c, 900u, "bench shape");
}

// On a created stream, eagerly and captured in a CUDA graph (replayed twice), each selection
// kernel writes what it writes on the default stream (v2's selecting kernel is then launched
// with programmatic dependent launch after its scoring kernel).
TEST(SparseSelectCuda, StreamAndGraphMatchDefaultStream) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  select_case c;
  c.kv_heads = 1;
  c.q_heads = 4;
  c.D = 4;
  c.ps = 16;
  c.lens = {8192 * 16, 100, 3000 * 16 + 5, 8192 * 16, 9000 * 16, 40 * 16};
  c.q_lens = {1, 1, 1, 1, 1, 1};
  c.dense = {0, 0, 0, 1, 0, 0};
  c.page_budget = 256;
  c.sink = 1;
  c.recent = 4;
  c.min_seq_len = 0;
  c.multi = false;
  select_data s = make_data(c, 1000u);
  std::vector<int32_t> out_table, out_lens;
  const sparse_select_params h = host_params(c, s, out_table, out_lens);
  device_select d(h, c, s);
  void* stream = stream_create();
  for (const char* v : kVariants) {
    const exec_context on_stream = select_ctx(v, stream);
    d.out_table.fill_bytes(0xff);
    d.out_lens.fill_bytes(0xff);
    run(d.p, select_ctx(v));
    device_synchronize();
    const auto want_table = d.out_table.download();
    const auto want_lens = d.out_lens.download();
    for (bool graph : {false, true}) {
      const std::string what = std::string(v) + (graph ? " graph" : " stream");
      d.out_table.fill_bytes(0xff);
      d.out_lens.fill_bytes(0xff);
      device_synchronize();
      if (graph) {
        captured_graph::capture_begin(stream);
        try {
          run(d.p, on_stream);
        } catch (...) {
          captured_graph::capture_abort(stream);
          throw;
        }
        const captured_graph g = captured_graph::capture_end(stream);
        g.launch(stream);
        g.launch(stream);
      } else {
        run(d.p, on_stream);
      }
      stream_synchronize(stream);
      expect_equal(d.out_table.download(), want_table, what + " table");
      expect_equal(d.out_lens.download(), want_lens, what + " lens");
    }
  }
  stream_destroy(stream);
}

TEST(SparseSelectCuda, RejectsBadSeqLens) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  select_case c;
  c.kv_heads = 2;
  c.q_heads = 8;
  c.D = 64;
  c.ps = 16;
  c.lens = {100, 50};
  c.q_lens = {1, 1};
  c.page_budget = 4;
  c.sink = 1;
  c.recent = 1;
  c.min_seq_len = 0;
  c.multi = false;
  select_data s = make_data(c, 5u);
  std::vector<int32_t> out_table, out_lens;
  device_select d(host_params(c, s, out_table, out_lens), c, s);
  sparse_select_params p = d.p;
  p.seq_lens.size = 1;
  expect_invalid([&] { run_cuda(p); }, "seq_lens.size");
  p.seq_lens = {};
  expect_invalid([&] { run_cuda(p); }, "seq_lens");
  const std::vector<int32_t> negative{100, -4};
  p.seq_lens = {d.lens.data(), 2, negative.data()};
  expect_invalid([&] { run_cuda(p); }, "seq_lens[1]");
}

// Selection + paged attention on CUDA against the same on the CPU.
TEST(SparseAttentionCuda, MatchesCpu) {
  if (no_device()) GTEST_SKIP() << "no CUDA device";
  for (int64_t gqa : {1, 4, 8}) {
    select_case c;
    c.kv_heads = 2;
    c.q_heads = 2 * gqa;
    c.D = 128;
    c.ps = 16;
    c.lens = {3000, 777, 100, 2049};
    c.q_lens = {1, 1, 1, 3};
    c.page_budget = 16;
    c.sink = 1;
    c.recent = 2;
    c.min_seq_len = 0;
    c.multi = true;
    select_data s = make_data(c, static_cast<uint32_t>(300 + gqa));
    const size_t cache = static_cast<size_t>(s.num_pages * c.ps * c.kv_heads * c.D);
    const auto k_cache = random_floats(cache, 1u), v_cache = random_floats(cache, 2u);
    std::vector<int32_t> out_table, out_lens;
    const sparse_select_params h = host_params(c, s, out_table, out_lens);
    run_cpu(h);
    std::vector<float> want(static_cast<size_t>(s.qsl.back() * c.q_heads * c.D), cuda_test::poison());
    paged_attention_params a;
    a.q = s.q.data();
    a.k_cache = k_cache.data();
    a.v_cache = v_cache.data();
    a.out = want.data();
    a.query_start_loc = s.qsl.data();
    a.seq_lens = out_lens.data();
    a.page_table = out_table.data();
    a.batch = static_cast<int64_t>(c.lens.size());
    a.q_heads = c.q_heads;
    a.kv_heads = c.kv_heads;
    a.head_dim = c.D;
    a.page_size = c.ps;
    a.page_table_stride = s.stride;
    a.q_stride = a.out_stride = c.q_heads * c.D;
    a.scale = 1.0f / std::sqrt(static_cast<float>(c.D));
    run_cpu(a);

    device_select d(h, c, s);
    device_array<float> dk(k_cache), dv(v_cache), dout(want.size());
    dout.fill_bytes(0xff);
    run_cuda(d.p);
    paged_attention_params da = a;
    da.q = d.q.data();
    da.k_cache = dk.data();
    da.v_cache = dv.data();
    da.out = dout.data();
    da.query_start_loc = d.qsl.data();
    da.seq_lens = d.out_lens.data();
    da.page_table = d.out_table.data();
    run_cuda(da);
    device_synchronize();
    expect_equal(d.out_lens.download(), out_lens, "eff lens gqa " + std::to_string(gqa));
    expect_match(dout.download(), want, 2e-5, 1e-4, "sparse attention gqa " + std::to_string(gqa));
  }
}

}  // namespace
}  // namespace hyserve::kernels

#endif  // HYSERVE_HAVE_CUDA
