// Speculative tree attention on the CPU: tree-masked attention against a double-precision
// softmax over each node's prefix and ancestors, chain parents equal to causal attention, a bf16
// cache equal to the widened f32 cache, and each draft node equal to the decode query at its
// position bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "hyserve/common/dtype.h"
#include "hyserve/common/error.h"
#include "hyserve/kernels/attention.h"
#include "kernel_test_util.h"
#include "tree_decode_rows.h"

namespace hyserve::kernels {
namespace {

using test::expect_close;
using test::random_floats;
using test::to_bf16;

// Tree attention: with chain parents it equals causal paged attention; with a tree, node k's
// output equals softmax attention (in double) over the prefix and k's ancestors and itself.
TEST(SpecDecode, TreeAttentionMasksToAncestors) {
  const int64_t batch = 2, Dn = 5, qh = 4, kvh = 2, hd = 8, ps = 4, prefix = 6;
  const int64_t len = prefix + Dn, n_pages = (len + ps - 1) / ps, kv_row = kvh * hd;
  const std::vector<int32_t> page_table = {3, 0, 5, 1, 2, 4};  // [batch, 3]
  auto kc = random_floats(static_cast<size_t>(6 * ps * kv_row), 81);
  auto vc = random_floats(static_cast<size_t>(6 * ps * kv_row), 82);
  auto q = random_floats(static_cast<size_t>(batch * Dn * qh * hd), 83);
  const std::vector<int32_t> qsl = {0, static_cast<int32_t>(Dn), static_cast<int32_t>(2 * Dn)};
  const std::vector<int32_t> seq = {static_cast<int32_t>(len), static_cast<int32_t>(len)};
  auto fill = [&](paged_attention_params& a, float* out) {
    a.q = q.data();
    a.k_cache = kc.data();
    a.v_cache = vc.data();
    a.out = out;
    a.query_start_loc = qsl.data();
    a.seq_lens = seq.data();
    a.page_table = page_table.data();
    a.batch = batch;
    a.q_heads = qh;
    a.kv_heads = kvh;
    a.head_dim = hd;
    a.page_size = ps;
    a.page_table_stride = n_pages;
    a.q_stride = a.out_stride = qh * hd;
    a.scale = 0.35f;
  };
  std::vector<float> causal(q.size()), chain_out(q.size()), tree_out(q.size());
  paged_attention_params c;
  fill(c, causal.data());
  run_cpu(c);
  const std::vector<int32_t> chain = {-1, 0, 1, 2, 3, -1, 0, 1, 2, 3};
  paged_attention_tree_params t;
  fill(t, chain_out.data());
  t.retrieve_parent = chain.data();
  t.tree_nodes = Dn;
  run_cpu(t);
  expect_close(chain_out, causal, 1e-6, 1e-6, "chain tree attention vs causal");

  const std::vector<int32_t> tree = {-1, 0, 0, 1, 2, -1, 0, 1, 0, 3};
  t.out = tree_out.data();
  t.retrieve_parent = tree.data();
  run_cpu(t);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t k = 0; k < Dn; ++k)
      for (int64_t h = 0; h < qh; ++h) {
        std::vector<int64_t> keys;
        for (int64_t s2 = 0; s2 < prefix; ++s2) keys.push_back(s2);
        std::vector<int64_t> path;
        for (int64_t a = k; a >= 0; a = tree[static_cast<size_t>(b * Dn + a)]) path.push_back(prefix + a);
        keys.insert(keys.end(), path.rbegin(), path.rend());
        const float* qq = q.data() + ((b * Dn + k) * qh + h) * hd;
        std::vector<double> sc, o(static_cast<size_t>(hd), 0.0);
        double mx = -1e300, den = 0;
        auto off = [&](int64_t s2) {
          return (page_table[static_cast<size_t>(b * n_pages + s2 / ps)] * ps + s2 % ps) * kv_row + (h / 2) * hd;
        };
        for (int64_t s2 : keys) {
          double d = 0;
          for (int64_t e = 0; e < hd; ++e) d += static_cast<double>(qq[e]) * kc[static_cast<size_t>(off(s2) + e)];
          sc.push_back(d * 0.35);
          mx = std::max(mx, sc.back());
        }
        for (size_t i = 0; i < keys.size(); ++i) {
          const double w = std::exp(sc[i] - mx);
          den += w;
          for (int64_t e = 0; e < hd; ++e) o[static_cast<size_t>(e)] += w * vc[static_cast<size_t>(off(keys[i]) + e)];
        }
        for (auto& e : o) e /= den;
        expect_close(tree_out.data() + ((b * Dn + k) * qh + h) * hd, o.data(), static_cast<size_t>(hd), 1e-5, 1e-5,
                     "tree attention b" + std::to_string(b) + " node " + std::to_string(k));
      }
}

// Tree attention over a bf16 cache equals tree attention over the f32 cache holding the same
// (widened) values: elements are widened exactly and the arithmetic is shared; only the
// vectorised sum order may differ (|Δ| <= 1e-6 + 1e-6·|want|).
TEST(SpecDecode, TreeAttentionOverBf16CacheEqualsWidenedF32Cache) {
  const int64_t batch = 2, Dn = 5, qh = 4, kvh = 2, hd = 8, ps = 4, len = 11, n_pages = 3, kv_row = kvh * hd;
  const std::vector<int32_t> page_table = {3, 0, 5, 1, 2, 4};
  const auto kh = to_bf16(random_floats(static_cast<size_t>(6 * ps * kv_row), 91));
  const auto vh = to_bf16(random_floats(static_cast<size_t>(6 * ps * kv_row), 92));
  std::vector<float> kf(kh.size()), vf(vh.size());
  for (size_t i = 0; i < kh.size(); ++i) {
    kf[i] = bf16_to_f32(kh[i]);
    vf[i] = bf16_to_f32(vh[i]);
  }
  const auto q = random_floats(static_cast<size_t>(batch * Dn * qh * hd), 93);
  const std::vector<int32_t> qsl = {0, static_cast<int32_t>(Dn), static_cast<int32_t>(2 * Dn)};
  const std::vector<int32_t> seq = {static_cast<int32_t>(len), static_cast<int32_t>(len)};
  const std::vector<int32_t> tree = {-1, 0, 0, 1, 2, -1, 0, 1, 0, 3};
  std::vector<float> out_f(q.size(), 0.0f), out_h(q.size(), 1.0f);
  paged_attention_tree_params t;
  t.q = q.data();
  t.query_start_loc = qsl.data();
  t.seq_lens = seq.data();
  t.page_table = page_table.data();
  t.batch = batch;
  t.q_heads = qh;
  t.kv_heads = kvh;
  t.head_dim = hd;
  t.page_size = ps;
  t.page_table_stride = n_pages;
  t.q_stride = t.out_stride = qh * hd;
  t.scale = 0.35f;
  t.retrieve_parent = tree.data();
  t.tree_nodes = Dn;
  t.k_cache = kf.data();
  t.v_cache = vf.data();
  t.out = out_f.data();
  run_cpu(t);
  t.k_cache = kh.data();
  t.v_cache = vh.data();
  t.kv_dtype = dtype::kBF16;
  t.out = out_h.data();
  run_cpu(t);
  expect_close(out_h, out_f, 1e-6, 1e-6, "bf16 cache vs widened f32 cache");
  t.kv_dtype = dtype::kF16;
  EXPECT_THROW(run_cpu(t), invalid_argument_error);
}

// A draft node's tree-masked attention is the decode query at its position, bit for bit: the
// same keys (the prefix, then its ancestors root .. itself) in the same order. Trees of 6 and 20
// nodes over prefixes that do and do not end on a page, f32 and bf16 caches. What makes
// speculative trees return exactly the tokens of plain decoding (the CUDA op's equivalent runs
// under determinism: batch_invariant, test_cuda_batch_invariant.cpp).
TEST(SpecDecode, TreeNodeEqualsTheDecodeQueryAtItsPositionBitForBit) {
  const int64_t qh = 8, kvh = 2, hd = 16, ps = 16, kv_row = kvh * hd;
  for (const int64_t Dn : {6, 20}) {
    const std::vector<int32_t> seq = {static_cast<int32_t>(37 + Dn), static_cast<int32_t>(Dn),
                                      static_cast<int32_t>(64 + Dn)};
    const int64_t batch = static_cast<int64_t>(seq.size()), stride = (64 + Dn + ps - 1) / ps;
    std::vector<int32_t> table(static_cast<size_t>(batch * stride));
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>((i * 7 + 3) % table.size());
    std::mt19937 rng(static_cast<uint32_t>(Dn));
    const test_support::random_tree_layout trees = test_support::random_trees(batch, Dn, rng);
    const std::vector<int32_t>& qsl = trees.query_start_loc;
    const std::vector<int32_t>& parent = trees.parent;
    const size_t cache = table.size() * static_cast<size_t>(ps * kv_row);
    const auto q = random_floats(static_cast<size_t>(batch * Dn * qh * hd), 95);
    const auto kf = random_floats(cache, 96), vf = random_floats(cache, 97);
    const auto kh = to_bf16(kf), vh = to_bf16(vf);
    for (const dtype kv : {dtype::kF32, dtype::kBF16}) {
      const bool bf16 = kv == dtype::kBF16;
      std::vector<float> tree_out(q.size(), 0.0f), decode_out(q.size(), 1.0f);
      paged_attention_tree_params t;
      t.q = q.data();
      t.query_start_loc = qsl.data();
      t.seq_lens = seq.data();
      t.page_table = table.data();
      t.batch = batch;
      t.q_heads = qh;
      t.kv_heads = kvh;
      t.head_dim = hd;
      t.page_size = ps;
      t.page_table_stride = stride;
      t.q_stride = t.out_stride = qh * hd;
      t.scale = 0.25f;
      t.kv_dtype = kv;
      t.retrieve_parent = parent.data();
      t.tree_nodes = Dn;
      t.k_cache = bf16 ? static_cast<const void*>(kh.data()) : kf.data();
      t.v_cache = bf16 ? static_cast<const void*>(vh.data()) : vf.data();
      t.out = tree_out.data();
      run_cpu(t);
      auto check = [&](const auto& rows) {
        paged_attention_params d = t;
        d.batch = batch * Dn;
        d.k_cache = rows.k.data();
        d.v_cache = rows.v.data();
        d.page_table = rows.page_table.data();
        d.page_table_stride = rows.stride;
        d.seq_lens = rows.seq_lens.data();
        d.query_start_loc = rows.query_start_loc.data();
        d.out = decode_out.data();
        run_cpu(d);
      };
      if (bf16)
        check(test_support::tree_as_decode_rows(kh, vh, table, stride, seq, parent, Dn, ps, kv_row));
      else
        check(test_support::tree_as_decode_rows(kf, vf, table, stride, seq, parent, Dn, ps, kv_row));
      EXPECT_EQ(std::memcmp(tree_out.data(), decode_out.data(), q.size() * sizeof(float)), 0)
          << Dn << " nodes, " << dtype_name(kv) << " cache: a node differs from its decode query";
    }
  }
}

}  // namespace
}  // namespace hyserve::kernels
