// The bf16 storage paths of the CPU ops (gemm weight, embedding table, KV cache) against the f32
// path of the same op on the same values: inputs are rounded to bf16 first, so the f32 op over
// the widened values is the exact reference, and unsupported element types are errors naming
// the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "hyserve/common/dtype.h"
#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/embedding.h"
#include "hyserve/kernels/gemm.h"
#include "kernel_test_util.h"

namespace hyserve::kernels {
namespace {

using test::expect_close;
using test::expect_invalid;
using test::random_floats;
using test::to_bf16;

std::vector<float> widen(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_f32(v[i]);
  return out;
}

TEST(Bf16Conversion, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3.0f / 256.0f), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
}

// gemm with a bf16 b against gemm with the widened f32 b: same values, same sgemm, so the
// results agree to f32 summation-order noise (the bf16 path feeds sgemm column blocks).
struct gemm_case {
  int64_t m, n, k;
  bool trans_a, trans_b;
  float beta;
};

class GemmBf16 : public testing::TestWithParam<gemm_case> {};

TEST_P(GemmBf16, MatchesF32OnWidenedWeights) {
  const gemm_case c = GetParam();
  const int64_t lda = (c.trans_a ? c.m : c.k) + 3;  // padded strides
  const int64_t ldb = (c.trans_b ? c.k : c.n) + 5;
  const int64_t ldc = c.n + 2;
  const int64_t a_rows = c.trans_a ? c.k : c.m, b_rows = c.trans_b ? c.n : c.k;
  const auto a = random_floats(static_cast<size_t>(a_rows * lda), 1);
  const std::vector<uint16_t> b16 = to_bf16(random_floats(static_cast<size_t>(b_rows * ldb), 2));
  const std::vector<float> b32 = widen(b16);
  const auto c0 = random_floats(static_cast<size_t>(c.m * ldc), 3);
  std::vector<float> got = c0, want = c0;

  gemm_params p;
  p.a = a.data();
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  p.lda = lda;
  p.ldb = ldb;
  p.ldc = ldc;
  p.trans_a = c.trans_a;
  p.trans_b = c.trans_b;
  p.alpha = 0.75f;
  p.beta = c.beta;
  p.b = b32.data();
  p.c = want.data();
  run_cpu(p);
  p.b = b16.data();
  p.b_dtype = dtype::kBF16;
  p.c = got.data();
  run_cpu(p);
  // |x|, |w| <= 1: a sum of k products has rounding noise ~k·2^-24 at worst.
  expect_close(got, want, 1e-6 * static_cast<double>(c.k), 1e-5, "gemm bf16 b");
  // Padding columns of c (between n and ldc) are untouched.
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = c.n; j < ldc; ++j) EXPECT_EQ(got[i * ldc + j], c0[i * ldc + j]);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmBf16,
                         testing::Values(gemm_case{1, 1, 1, false, true, 0.0f}, gemm_case{3, 37, 19, false, true, 0.0f},
                                         gemm_case{5, 29, 13, false, false, 1.0f},
                                         gemm_case{4, 23, 11, true, true, 0.5f},
                                         gemm_case{2, 300, 4096, false, true, 0.0f},  // several widen blocks
                                         gemm_case{7, 170, 3000, false, false, 1.0f},
                                         gemm_case{64, 96, 64, false, true, 0.0f}),
                         [](const testing::TestParamInfo<gemm_case>& param_info) {
                           const gemm_case& c = param_info.param;
                           return "m" + std::to_string(c.m) + "n" + std::to_string(c.n) + "k" + std::to_string(c.k) +
                                  (c.trans_a ? "_ta" : "") + (c.trans_b ? "_tb" : "") + (c.beta != 0.0f ? "_acc" : "");
                         });

TEST(GemmBf16Errors, UnsupportedWeightTypeNamesTheField) {
  std::vector<float> buf(16, 0.0f);
  gemm_params p;
  p.a = buf.data();
  p.b = buf.data();
  p.c = buf.data();
  p.m = p.n = p.k = 2;
  p.lda = p.ldb = p.ldc = 2;
  p.b_dtype = dtype::kF16;
  expect_invalid([&] { run_cpu(p); }, "b_dtype");
  p.b_dtype = dtype::kI32;
  expect_invalid([&] { run_cpu(p); }, "b_dtype");
}

TEST(EmbeddingBf16, RowsAreTheWidenedTableRows) {
  const int64_t rows = 13, hidden = 37, start = 100;
  const std::vector<uint16_t> t16 = to_bf16(random_floats(static_cast<size_t>(rows * hidden), 7, -3.0f, 3.0f));
  const std::vector<float> t32 = widen(t16);
  const std::vector<int32_t> ids = {100, 112, 5, 105, 113, 100};  // 5 and 113: another shard
  std::vector<float> got(ids.size() * hidden, -1.0f), want(ids.size() * hidden, -2.0f);
  embedding_params p;
  p.ids = ids.data();
  p.n_tokens = static_cast<int64_t>(ids.size());
  p.hidden = hidden;
  p.vocab_start = start;
  p.vocab_end = start + rows;
  p.table = t32.data();
  p.out = want.data();
  run_cpu(p);
  p.table = t16.data();
  p.table_dtype = dtype::kBF16;
  p.out = got.data();
  run_cpu(p);
  expect_close(got, want, 0.0, 0.0, "embedding bf16 table");  // widening is exact
  for (int64_t d = 0; d < hidden; ++d) EXPECT_EQ(got[2 * hidden + d], 0.0f);

  p.table_dtype = dtype::kF16;
  expect_invalid([&] { run_cpu(p); }, "table_dtype");
}

TEST(KvWriteBf16, StoresRoundedValuesAndSkipsPadding) {
  const int64_t kvh = 3, D = 24, row = kvh * D, n = 5, stride = row + 4, slots = 8;
  const auto k = random_floats(static_cast<size_t>(n * stride), 11, -4.0f, 4.0f);
  const auto v = random_floats(static_cast<size_t>(n * stride), 12, -4.0f, 4.0f);
  const std::vector<int32_t> locs = {6, -1, 0, 3, 7};
  const uint16_t sentinel = 0x7fc1;  // a NaN pattern kv_write never produces from finite input
  std::vector<uint16_t> kc(static_cast<size_t>(slots * row), sentinel), vc(kc);
  kv_write_params p;
  p.k = k.data();
  p.v = v.data();
  p.locs = locs.data();
  p.k_cache = kc.data();
  p.v_cache = vc.data();
  p.n_tokens = n;
  p.kv_heads = kvh;
  p.head_dim = D;
  p.k_stride = p.v_stride = stride;
  p.kv_dtype = dtype::kBF16;
  run_cpu(p);
  std::vector<bool> written(static_cast<size_t>(slots), false);
  for (int64_t t = 0; t < n; ++t) {
    if (locs[t] < 0) continue;
    written[static_cast<size_t>(locs[t])] = true;
    for (int64_t i = 0; i < row; ++i) {
      ASSERT_EQ(kc[locs[t] * row + i], f32_to_bf16(k[t * stride + i])) << "token " << t << " elem " << i;
      ASSERT_EQ(vc[locs[t] * row + i], f32_to_bf16(v[t * stride + i])) << "token " << t << " elem " << i;
    }
  }
  for (int64_t s = 0; s < slots; ++s) {
    if (written[static_cast<size_t>(s)]) continue;
    for (int64_t i = 0; i < row; ++i) ASSERT_EQ(kc[s * row + i], sentinel) << "slot " << s << " was written";
  }
  p.kv_dtype = dtype::kI64;
  expect_invalid([&] { run_cpu(p); }, "kv_dtype");
}

// Paged attention over a bf16 cache against the same op over an f32 cache holding the widened
// values: identical f32 arithmetic, so the outputs agree to 1e-6.
struct attn_bf16_case {
  int64_t page_size, kv_heads, gqa, head_dim;
  std::vector<std::pair<int32_t, int32_t>> rows;  // (prefix, q_len)
  std::string name;
};

class PagedAttentionBf16 : public testing::TestWithParam<attn_bf16_case> {};

TEST_P(PagedAttentionBf16, MatchesF32CacheOfWidenedValues) {
  const attn_bf16_case& c = GetParam();
  const int64_t batch = static_cast<int64_t>(c.rows.size()), D = c.head_dim, kvh = c.kv_heads, qh = kvh * c.gqa;
  const int64_t ps = c.page_size, kv_row = kvh * D;
  std::vector<int32_t> qsl(static_cast<size_t>(batch + 1), 0), seq_lens(static_cast<size_t>(batch));
  int64_t max_pages = 0, total_pages = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const auto [prefix, q_len] = c.rows[static_cast<size_t>(b)];
    qsl[b + 1] = qsl[b] + q_len;
    seq_lens[b] = prefix + q_len;
    max_pages = std::max<int64_t>(max_pages, (seq_lens[b] + ps - 1) / ps);
    total_pages += (seq_lens[b] + ps - 1) / ps;
  }
  const int64_t n_tokens = qsl[batch], num_pages = total_pages + 2, pt_stride = max_pages + 1;
  std::vector<int32_t> perm(static_cast<size_t>(num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(static_cast<uint32_t>(ps + D)));
  std::vector<int32_t> page_table(static_cast<size_t>(batch * pt_stride), -1);
  size_t next = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < (seq_lens[b] + ps - 1) / ps; ++i) page_table[b * pt_stride + i] = perm[next++];

  const size_t cache_n = static_cast<size_t>(num_pages * ps * kv_row);
  const std::vector<uint16_t> k16 = to_bf16(random_floats(cache_n, 21, -2.0f, 2.0f));
  const std::vector<uint16_t> v16 = to_bf16(random_floats(cache_n, 22, -2.0f, 2.0f));
  const std::vector<float> k32 = widen(k16), v32 = widen(v16);
  const int64_t q_stride = qh * D + 1;
  const auto q = random_floats(static_cast<size_t>(n_tokens * q_stride), 23, -2.0f, 2.0f);
  std::vector<float> got(static_cast<size_t>(n_tokens * qh * D), 0.0f), want(got);

  paged_attention_params p;
  p.q = q.data();
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
  p.out_stride = qh * D;
  p.scale = 1.0f / std::sqrt(static_cast<float>(D));
  p.k_cache = k32.data();
  p.v_cache = v32.data();
  p.out = want.data();
  run_cpu(p);
  p.k_cache = k16.data();
  p.v_cache = v16.data();
  p.kv_dtype = dtype::kBF16;
  p.out = got.data();
  run_cpu(p);
  expect_close(got, want, 1e-6, 1e-6, c.name);

  p.kv_dtype = dtype::kF16;
  expect_invalid([&] { run_cpu(p); }, "kv_dtype");
}

INSTANTIATE_TEST_SUITE_P(
    Grid, PagedAttentionBf16,
    testing::Values(attn_bf16_case{16, 2, 4, 16, {{0, 5}, {7, 3}, {20, 1}, {33, 17}}, "extend_prefix"},
                    attn_bf16_case{16, 8, 4, 128, {{40, 1}, {0, 1}, {100, 1}}, "decode_gqa4_d128"},
                    attn_bf16_case{3, 1, 2, 24, {{5, 4}, {11, 1}}, "odd_page_mixed"}),
    [](const testing::TestParamInfo<attn_bf16_case>& param_info) { return param_info.param.name; });

// kv_write into a bf16 cache, then attention: against f32 attention over the rounded K/V.
TEST(PagedAttentionBf16Write, WriteThenAttendMatchesRoundedReference) {
  const int64_t kvh = 2, D = 32, qh = 4, ps = 4, len = 9, row = kvh * D;
  const auto k = random_floats(static_cast<size_t>(len * row), 31);
  const auto v = random_floats(static_cast<size_t>(len * row), 32);
  std::vector<int32_t> locs(static_cast<size_t>(len));
  const std::vector<int32_t> pages = {2, 0, 1};
  for (int64_t s = 0; s < len; ++s) locs[s] = static_cast<int32_t>(pages[s / ps] * ps + s % ps);
  std::vector<uint16_t> kc(static_cast<size_t>(3 * ps * row)), vc(kc);
  kv_write_params w;
  w.k = k.data();
  w.v = v.data();
  w.locs = locs.data();
  w.k_cache = kc.data();
  w.v_cache = vc.data();
  w.n_tokens = len;
  w.kv_heads = kvh;
  w.head_dim = D;
  w.k_stride = w.v_stride = row;
  w.kv_dtype = dtype::kBF16;
  run_cpu(w);
  // Reference cache: f32 pages of the rounded values.
  std::vector<float> kr(kc.size()), vr(vc.size());
  for (size_t i = 0; i < kc.size(); ++i) {
    kr[i] = bf16_to_f32(kc[i]);
    vr[i] = bf16_to_f32(vc[i]);
  }
  for (int64_t s = 0; s < len; ++s)
    for (int64_t i = 0; i < row; ++i)
      ASSERT_EQ(kr[locs[s] * row + i], bf16_to_f32(f32_to_bf16(k[s * row + i])));

  const auto q = random_floats(static_cast<size_t>(len * qh * D), 33);
  const std::vector<int32_t> qsl = {0, len}, seq = {static_cast<int32_t>(len)};
  std::vector<float> got(static_cast<size_t>(len * qh * D)), want(got);
  paged_attention_params p;
  p.q = q.data();
  p.query_start_loc = qsl.data();
  p.seq_lens = seq.data();
  p.page_table = pages.data();
  p.batch = 1;
  p.q_heads = qh;
  p.kv_heads = kvh;
  p.head_dim = D;
  p.page_size = ps;
  p.page_table_stride = 3;
  p.q_stride = p.out_stride = qh * D;
  p.scale = 0.2f;
  p.k_cache = kr.data();
  p.v_cache = vr.data();
  p.out = want.data();
  run_cpu(p);
  p.k_cache = kc.data();
  p.v_cache = vc.data();
  p.kv_dtype = dtype::kBF16;
  p.out = got.data();
  run_cpu(p);
  expect_close(got, want, 1e-6, 1e-6, "write then attend");
}

}  // namespace
}  // namespace hyserve::kernels
