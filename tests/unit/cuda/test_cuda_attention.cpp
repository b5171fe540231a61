// Backend ops: paged attention (causal extend with prefix, decode, mixed batches), CUDA
// against CPU. Covers GQA ratios 1/4/8, page sizes 1 and 16, head_dim 32/64/128/256, rows
// without queries, and both decode paths: split-KV with a combine (small batch × kv_heads) and
// one slice per row (batch × kv_heads above ~8 blocks per SM); decode rows of GQA 1 to 8 take
// the register-streaming decode kernel (GQA 12 the extend kernel's decode branch), up to 256 slices (the 32K-context row). Batches whose
// rows have at most 16 queries run again with the host's max_q_len promise (a verify step: each
// query a decode query over its causal prefix on the decode kernel), also with a promise above
// the rows' counts, and again with kernels.attn_decode_cluster (the slices merged in a cluster).
// Tolerance (fp32): |Δ| <= 2e-5 + 1e-4·|want| (online softmax: rescaled partial sums).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "hyserve/kernels/device.h"

#if defined(HYSERVE_HAVE_CUDA)

#include "cuda_test_util.h"
#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/paths.h"

namespace hyserve::kernels {
namespace {

using cuda_test::expect_match;
using cuda_test::join;
using cuda_test::poison;
using cuda_test::random_floats;
using cuda_test::to_device;

struct attn_case {
  std::string label;
  int kv_heads, gqa, head_dim, page_size;
  std::vector<int> q_lens;    // per row; 0 = a row without queries
  std::vector<int> seq_lens;  // per row, including the new tokens
  int q_pad = 0;              // extra elements per q/out row stride
  int max_slices = 0;         // kernels.attn_decode_max_slices (0: default)
};

class PagedAttentionCuda : public testing::TestWithParam<attn_case> {};

TEST_P(PagedAttentionCuda, MatchesCpu) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const attn_case& c = GetParam();
  kernel_paths paths;
  paths.attn_decode_max_slices = c.max_slices;
  paths.attn_decode_cluster = -1;  // off: the slices' partials and the combine kernel (the cluster below)
  const paths_scope scope(paths);
  const int64_t batch = static_cast<int64_t>(c.q_lens.size());
  const int64_t kvh = c.kv_heads, qh = c.kv_heads * c.gqa, D = c.head_dim, ps = c.page_size;
  std::vector<int32_t> qsl{0};
  for (int ql : c.q_lens) qsl.push_back(qsl.back() + ql);
  const int64_t n_tokens = std::max<int32_t>(qsl.back(), 1);

  // Pages of all rows shuffled over the pool, with spare pages nobody uses.
  int64_t max_pages = 1, total_pages = 0;
  for (int len : c.seq_lens) {
    max_pages = std::max<int64_t>(max_pages, (len + ps - 1) / ps);
    total_pages += (len + ps - 1) / ps;
  }
  const int64_t n_pages = total_pages + 3;
  std::vector<int32_t> perm(static_cast<size_t>(n_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
  const int64_t pt_stride = max_pages + 2;
  std::vector<int32_t> page_table(static_cast<size_t>(batch * pt_stride), -1);
  int64_t next = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < (c.seq_lens[b] + ps - 1) / ps; ++i) page_table[b * pt_stride + i] = perm[next++];
  }

  const int64_t qs = qh * D + c.q_pad;
  const auto q = random_floats(static_cast<size_t>(n_tokens * qs), 91);
  const auto kc = random_floats(static_cast<size_t>(n_pages * ps * kvh * D), 92);
  const auto vc = random_floats(static_cast<size_t>(n_pages * ps * kvh * D), 93);
  std::vector<float> out(static_cast<size_t>(n_tokens * qs), poison());
  const std::vector<int32_t> seq_lens(c.seq_lens.begin(), c.seq_lens.end());
  auto dq = to_device(q), dkc = to_device(kc), dvc = to_device(vc);
  auto dqsl = to_device(qsl), dlens = to_device(seq_lens), dpt = to_device(page_table);
  device_array<float> dout(out.size());
  dout.fill_bytes(0xff);

  paged_attention_params p;
  p.batch = batch;
  p.q_heads = qh;
  p.kv_heads = kvh;
  p.head_dim = D;
  p.page_size = ps;
  p.page_table_stride = pt_stride;
  p.q_stride = p.out_stride = qs;
  p.scale = 1.0f / std::sqrt(static_cast<float>(D));
  paged_attention_params pc = p;
  pc.q = q.data();
  pc.k_cache = kc.data();
  pc.v_cache = vc.data();
  pc.out = out.data();
  pc.query_start_loc = qsl.data();
  pc.seq_lens = seq_lens.data();
  pc.page_table = page_table.data();
  run_cpu(pc);
  paged_attention_params pg = p;
  pg.q = dq.data();
  pg.k_cache = dkc.data();
  pg.v_cache = dvc.data();
  pg.out = dout.data();
  pg.query_start_loc = dqsl.data();
  pg.seq_lens = dlens.data();
  pg.page_table = dpt.data();
  run_cuda(pg);
  device_synchronize();
  expect_match(dout.download(), out, 2e-5, 1e-4, "out");
  // Again with the host's promise of at most max_q_len queries per row (no extend kernel when
  // it is at most 16): the rows' largest count, and one more.
  const int most = *std::max_element(c.q_lens.begin(), c.q_lens.end());
  if (most >= 1 && most <= 16) {
    for (const int promise : {most, most + 1}) {
      dout.fill_bytes(0xff);
      pg.max_q_len = promise;
      run_cuda(pg);
      device_synchronize();
      expect_match(dout.download(), out, 2e-5, 1e-4, "out (max_q_len " + std::to_string(promise) + ")");
    }
  }
  // kernels.attn_decode_cluster: the decode rows' slices merged inside a thread-block cluster (no
  // combine kernel; its own merge order), with and without the promise: the same tolerance.
  kernel_paths cluster = paths;
  cluster.attn_decode_cluster = 1 << 20;
  const paths_scope cluster_scope(cluster);
  for (const int promise : {0, most}) {
    if (promise > 16) continue;
    dout.fill_bytes(0xff);
    pg.max_q_len = promise;
    run_cuda(pg);
    device_synchronize();
    expect_match(dout.download(), out, 2e-5, 1e-4, "out (cluster merge, max_q_len " + std::to_string(promise) + ")");
  }
}

// Decode rows of batch size bs with lengths spread over [lo, hi].
attn_case decode_case(std::string label, int bs, int kv_heads, int gqa, int hd, int ps, int lo, int hi,
                      int max_slices = 0) {
  attn_case c{std::move(label), kv_heads, gqa, hd, ps, {}, {}};
  c.max_slices = max_slices;
  std::mt19937 gen(static_cast<uint32_t>(bs * 131 + hd));
  std::uniform_int_distribution<int> dist(lo, hi);
  for (int b = 0; b < bs; ++b) {
    c.q_lens.push_back(1);
    c.seq_lens.push_back(b == 0 ? hi : dist(gen));
  }
  return c;
}

std::string attn_name(const testing::TestParamInfo<attn_case>& info) {
  const auto& c = info.param;
  return "Cuda_f32_" + c.label + "_kvheads" + std::to_string(c.kv_heads) + "_gqa" + std::to_string(c.gqa) + "_hd" +
         std::to_string(c.head_dim) + "_page" + std::to_string(c.page_size) + "_rows" +
         std::to_string(c.q_lens.size()) + (c.q_pad ? "_padded" : "") +
         (c.max_slices > 0 ? "_maxslices" + std::to_string(c.max_slices) : "");
}

INSTANTIATE_TEST_SUITE_P(
    Grid, PagedAttentionCuda,
    testing::Values(
        // Decode, production attention shape (head_dim 128, 32 q heads over 8 kv heads).
        decode_case("decode_bs64", 64, 8, 4, 128, 16, 1, 1500),
        decode_case("decode_bs160", 160, 8, 4, 128, 16, 1, 300),  // enough blocks: one slice per row
        decode_case("decode_bs1_long", 1, 8, 4, 128, 16, 1, 8192),  // split-KV path
        // Batch 1 at short contexts: most slices past the row's end (exit; the combine skips
        // them), a single key, a partial last slice.
        decode_case("decode_bs1_ctx1024", 1, 8, 4, 128, 16, 1, 1024),
        // kernels.attn_decode_max_slices: one slice (no combine) and four.
        decode_case("decode_bs1_ctx1024", 1, 8, 4, 128, 16, 1, 1024, 1),
        decode_case("decode_bs2_gqa6_ctx900", 2, 2, 6, 128, 16, 1, 900, 4),
        decode_case("decode_bs1_ctx1", 1, 8, 4, 128, 16, 1, 1),
        decode_case("decode_bs2_ctx77", 2, 8, 4, 128, 16, 1, 77),
        decode_case("decode_bs1_gqa3_ctx300", 1, 4, 3, 64, 16, 1, 300),  // decode kernel, G not a power of 2
        decode_case("decode_bs2_gqa6_ctx900", 2, 2, 6, 128, 16, 1, 900),
        decode_case("decode_bs1_gqa12_ctx300", 1, 2, 12, 64, 16, 1, 300),  // extend kernel's decode branch
        decode_case("decode_bs4", 4, 8, 8, 128, 16, 1, 3000),
        decode_case("decode_bs16", 16, 4, 1, 64, 1, 1, 700),
        decode_case("decode_bs3", 3, 2, 8, 256, 16, 1, 2000),
        decode_case("decode_bs5", 5, 1, 4, 32, 1, 1, 100),
        // Long context: one 32K row on 2 kv heads (the most decode slices, 128+ keys each), and
        // GQA 2 at head_dim 64.
        decode_case("decode_bs1_ctx32k", 1, 2, 4, 128, 16, 1, 32768),
        decode_case("decode_bs6_gqa2", 6, 4, 2, 64, 16, 1, 5000),
        // Extend: prefill from scratch, extend over a prefix, mixed with decode rows and with
        // rows without queries.
        attn_case{"prefill", 8, 4, 128, 16, {300}, {300}},
        attn_case{"extend", 8, 4, 128, 16, {17, 1, 100, 0, 5}, {50, 1000, 100, 0, 5}, 4},
        attn_case{"extend", 2, 8, 64, 1, {33, 1, 0, 64}, {40, 77, 10, 64}},
        attn_case{"extend", 4, 1, 32, 16, {2, 16, 1}, {2, 31, 33}},
        attn_case{"extend", 1, 8, 256, 16, {20, 1}, {500, 260}},
        // Verify-shaped: every row the last accepted token and its drafts (production shape),
        // a long row on the split-KV path, a row shorter than its slice, mixed query counts,
        // GQA 1 and 8, and rows without queries.
        attn_case{"verify", 8, 4, 128, 16, {5}, {1024}},
        attn_case{"verify", 8, 4, 128, 16, {8, 8, 8}, {9000, 40, 8}},
        attn_case{"verify", 8, 4, 128, 16, {5, 1, 3, 0}, {300, 77, 3, 0}},
        attn_case{"verify", 4, 1, 64, 1, {4, 4}, {100, 5}},
        attn_case{"verify", 2, 8, 128, 16, {16, 2}, {2000, 17}}),
    attn_name);

}  // namespace
}  // namespace hyserve::kernels

#endif
