// kv_write and paged attention against dense softmax attention computed in double over the
// same per-token K/V. Pages are scattered (shuffled page ids) and unused cache memory holds
// garbage, so a wrong page/offset computation shows up. Tolerance 1e-5 abs + 1e-5 rel.
#include "hyserve/kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"

namespace hyserve::kernels {
namespace {

using test::expect_close;
using test::random_floats;

constexpr double kAtol = 1e-5;
constexpr double kRtol = 1e-5;

TEST(KvWrite, ScattersRowsAndSkipsPadding) {
  const int64_t n_tokens = 5, kv_heads = 2, head_dim = 4, row = kv_heads * head_dim, n_locs = 12;
  const int64_t k_stride = row + 3, v_stride = row + 1;
  const auto k = random_floats(static_cast<size_t>(n_tokens * k_stride), 1u);
  const auto v = random_floats(static_cast<size_t>(n_tokens * v_stride), 2u);
  const std::vector<int32_t> locs{7, -1, 0, 11, 3};
  std::vector<float> k_cache(static_cast<size_t>(n_locs * row), -5.0f), v_cache(k_cache);

  kv_write_params p;
  p.k = k.data();
  p.v = v.data();
  p.locs = locs.data();
  p.k_cache = k_cache.data();
  p.v_cache = v_cache.data();
  p.n_tokens = n_tokens;
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.k_stride = k_stride;
  p.v_stride = v_stride;
  run_cpu(p);

  for (int64_t loc = 0; loc < n_locs; ++loc) {
    const auto it = std::find(locs.begin(), locs.end(), loc);
    for (int64_t e = 0; e < row; ++e) {
      if (it == locs.end()) {
        EXPECT_EQ(k_cache[loc * row + e], -5.0f) << "loc " << loc;
        EXPECT_EQ(v_cache[loc * row + e], -5.0f) << "loc " << loc;
      } else {
        const int64_t t = it - locs.begin();
        EXPECT_EQ(k_cache[loc * row + e], k[t * k_stride + e]) << "loc " << loc;
        EXPECT_EQ(v_cache[loc * row + e], v[t * v_stride + e]) << "loc " << loc;
      }
    }
  }
}

struct attn_row {
  int prefix;  // tokens already cached
  int q_len;   // new tokens (queries)
};

struct attn_case {
  int page_size, kv_heads, gqa, head_dim;
  std::vector<attn_row> rows;
  const char* label;
};

std::string attn_name(const testing::TestParamInfo<attn_case>& info) {
  const auto& c = info.param;
  std::string s = std::string(c.label) + "_ps" + std::to_string(c.page_size) + "_kvh" + std::to_string(c.kv_heads) +
                  "_gqa" + std::to_string(c.gqa) + "_hd" + std::to_string(c.head_dim) + "_rows";
  for (const auto& r : c.rows) s += "_p" + std::to_string(r.prefix) + "q" + std::to_string(r.q_len);
  return s;
}

class PagedAttention : public testing::TestWithParam<attn_case> {};

TEST_P(PagedAttention, MatchesDenseSoftmax) {
  const attn_case& c = GetParam();
  const int64_t batch = static_cast<int64_t>(c.rows.size());
  const int64_t kvh = c.kv_heads, qh = c.kv_heads * c.gqa, D = c.head_dim, ps = c.page_size;
  const int64_t kv_row = kvh * D;

  std::vector<int32_t> qsl{0}, seq_lens;
  int64_t max_pages = 0, total_pages = 0;
  for (const auto& r : c.rows) {
    qsl.push_back(qsl.back() + r.q_len);
    seq_lens.push_back(r.prefix + r.q_len);
    const int64_t pages = (seq_lens.back() + ps - 1) / ps;
    max_pages = std::max(max_pages, pages);
    total_pages += pages;
  }
  const int64_t n_tokens = qsl.back();
  const int64_t num_pages = total_pages + 5;  // spare pages hold garbage
  const int64_t pt_stride = max_pages + 2;

  // Scattered page table: a shuffled permutation of page ids; unused entries are -1.
  std::vector<int32_t> perm(static_cast<size_t>(num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(static_cast<uint32_t>(ps * 31 + n_tokens)));
  std::vector<int32_t> page_table(static_cast<size_t>(batch * pt_stride), -1);
  size_t next = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < (seq_lens[b] + ps - 1) / ps; ++i) page_table[b * pt_stride + i] = perm[next++];
  }

  // Dense per-row K/V [len, kv_heads, D]; copied into the cache at page_table locations.
  const uint32_t seed = static_cast<uint32_t>(1000 * ps + 10 * c.gqa + D);
  auto k_cache = random_floats(static_cast<size_t>(num_pages * ps * kv_row), seed, 50.0f, 60.0f);
  auto v_cache = random_floats(static_cast<size_t>(num_pages * ps * kv_row), seed + 1, 50.0f, 60.0f);
  std::vector<std::vector<float>> k_dense(static_cast<size_t>(batch)), v_dense(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    k_dense[b] = random_floats(static_cast<size_t>(seq_lens[b] * kv_row), seed + 10 + static_cast<uint32_t>(b));
    v_dense[b] = random_floats(static_cast<size_t>(seq_lens[b] * kv_row), seed + 50 + static_cast<uint32_t>(b));
    for (int64_t s = 0; s < seq_lens[b]; ++s) {
      const int64_t loc = page_table[b * pt_stride + s / ps] * ps + s % ps;
      std::copy_n(k_dense[b].data() + s * kv_row, kv_row, k_cache.data() + loc * kv_row);
      std::copy_n(v_dense[b].data() + s * kv_row, kv_row, v_cache.data() + loc * kv_row);
    }
  }

  const int64_t q_stride = qh * D + 3, out_stride = qh * D + 2;
  const auto q = random_floats(static_cast<size_t>(n_tokens * q_stride), seed + 2, -2.0f, 2.0f);
  std::vector<float> out(static_cast<size_t>(n_tokens * out_stride), 0.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  std::vector<double> ref(static_cast<size_t>(n_tokens * qh * D));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < c.rows[b].q_len; ++i) {
      const int64_t t = qsl[b] + i;
      const int64_t pos = c.rows[b].prefix + i;
      for (int64_t h = 0; h < qh; ++h) {
        const int64_t g = h / c.gqa;
        std::vector<double> sc(static_cast<size_t>(pos + 1));
        for (int64_t s = 0; s <= pos; ++s) {
          double dot = 0.0;
          for (int64_t d = 0; d < D; ++d)
            dot += static_cast<double>(q[t * q_stride + h * D + d]) * k_dense[b][s * kv_row + g * D + d];
          sc[s] = dot * scale;
        }
        const double m = *std::max_element(sc.begin(), sc.end());
        double z = 0.0;
        for (auto& e : sc) z += (e = std::exp(e - m));
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0.0;
          for (int64_t s = 0; s <= pos; ++s) acc += sc[s] * v_dense[b][s * kv_row + g * D + d];
          ref[(t * qh + h) * D + d] = acc / z;
        }
      }
    }
  }

  paged_attention_params p;
  p.q = q.data();
  p.k_cache = k_cache.data();
  p.v_cache = v_cache.data();
  p.out = out.data();
  p.query_start_loc = qsl.data();
  p.seq_lens = seq_lens.data();
  p.page_table = page_table.data();
  p.batch = batch;
  p.q_heads = qh;
  p.kv_heads = kvh;
  p.head_dim = D;
  p.page_size = ps;
  p.page_table_stride = pt_stride;
  p.q_stride = q_stride;
  p.out_stride = out_stride;
  p.scale = scale;
  run_cpu(p);

  for (int64_t t = 0; t < n_tokens; ++t) {
    expect_close(out.data() + t * out_stride, ref.data() + t * qh * D, static_cast<size_t>(qh * D), kAtol, kRtol,
                 "out token " + std::to_string(t));
  }
}

const std::vector<attn_row> kExtend{{0, 5}, {7, 3}, {20, 1}, {33, 17}};
const std::vector<attn_row> kDecode{{0, 1}, {15, 1}, {40, 1}, {1, 1}};

INSTANTIATE_TEST_SUITE_P(
    Grid, PagedAttention,
    testing::Values(attn_case{1, 2, 1, 8, kExtend, "extend"}, attn_case{3, 2, 2, 8, kExtend, "extend"},
                    attn_case{16, 2, 4, 16, kExtend, "extend"}, attn_case{16, 1, 4, 8, kExtend, "extend"},
                    attn_case{1, 2, 4, 16, kDecode, "decode"}, attn_case{3, 1, 2, 8, kDecode, "decode"},
                    attn_case{16, 2, 1, 64, kDecode, "decode"}, attn_case{16, 4, 2, 64, {{0, 40}}, "prefill"},
                    attn_case{5, 2, 2, 8, {{64, 0}, {3, 2}}, "emptyrow"}),
    attn_name);

}  // namespace
}  // namespace hyserve::kernels
