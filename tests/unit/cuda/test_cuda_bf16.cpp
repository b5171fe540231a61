// Backend ops with bf16 storage, CUDA against the CPU op on the same bf16 data: gemm with a bf16
// weight, embedding with a bf16 table, kv_write into a bf16 cache, paged attention over a bf16
// cache (extend with prefix, decode through the decode kernel for GQA 1 to 8 and the generic
// split-KV branch for GQA 12, production shape 32 q / 8 kv heads, head_dim 128, page 16).
// Tolerances: gemm |Δ| <= 1e-5 + 1e-6·k + 1e-4·|want| (a is bf16-exact, so the CUDA op's
// rounding of a is the identity and only the summation order differs); attention 2e-5 +
// 1e-4·|want| (both widen the same bf16 values; online softmax order differs); embedding and
// kv_write exact (widening is exact; both round to nearest even).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "hyserve/common/dtype.h"
#include "hyserve/kernels/device.h"

#if defined(HYSERVE_HAVE_CUDA)

#include "cuda/attention_paths.h"
#include "cuda_test_util.h"
#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/embedding.h"
#include "hyserve/kernels/gemm.h"
#include "hyserve/kernels/paths.h"

namespace hyserve::kernels {
namespace {

using cuda_test::expect_equal;
using cuda_test::expect_match;
using cuda_test::poison;
using cuda_test::random_floats;
using cuda_test::to_bf16;
using cuda_test::round_bf16;
using cuda_test::to_device;

#define HYSERVE_REQUIRE_CUDA() \
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

// ---------------------------------------------------------------------------------------------
// gemm, bf16 b

struct gemm_case {
  int64_t m, n, k;
  bool ta, tb;
  float alpha, beta;
  int pad;
};

class GemmBf16Cuda : public testing::TestWithParam<gemm_case> {};

void check_gemm_bf16(const gemm_case& c) {
  gemm_params p;
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  p.trans_a = c.ta;
  p.trans_b = c.tb;
  p.alpha = c.alpha;
  p.beta = c.beta;
  p.lda = (c.ta ? c.m : c.k) + c.pad;
  p.ldb = (c.tb ? c.k : c.n) + c.pad;
  p.ldc = c.n + c.pad;
  p.b_dtype = dtype::kBF16;
  const auto a = round_bf16(random_floats(static_cast<size_t>((c.ta ? c.k : c.m) * p.lda), 1));
  const auto b = to_bf16(random_floats(static_cast<size_t>((c.tb ? c.n : c.k) * p.ldb), 2));
  std::vector<float> c_cpu = random_floats(static_cast<size_t>(c.m * p.ldc), 3);
  auto da = to_device(a);
  auto db = to_device(b);
  auto dc = to_device(c_cpu);
  gemm_params pc = p;
  pc.a = a.data();
  pc.b = b.data();
  pc.c = c_cpu.data();
  run_cpu(pc);
  gemm_params pg = p;
  pg.a = da.data();
  pg.b = db.data();
  pg.c = dc.data();
  run_cuda(pg);
  device_synchronize();
  expect_match(dc.download(), c_cpu, 1e-5 + 1e-6 * static_cast<double>(c.k), 1e-4, "C");
}

TEST_P(GemmBf16Cuda, MatchesCpu) {
  HYSERVE_REQUIRE_CUDA();
  check_gemm_bf16(GetParam());
}

// kernels.linear_wgmma: the calls it takes (9..256 rows, the weight [n, k], alpha 1) on the
// warpgroup-MMA kernel, split-K or not, into C or added to it; the others as before. Same
// tolerances: both sum the same bf16 products in f32.
TEST_P(GemmBf16Cuda, WarpgroupMmaMatchesCpu) {
  HYSERVE_REQUIRE_CUDA();
  kernel_paths paths;
  paths.linear_wgmma = true;
  const paths_scope scope(paths);
  check_gemm_bf16(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Grid, GemmBf16Cuda,
                         testing::Values(gemm_case{1, 4096 + 32, 4096, false, true, 1.0f, 0.0f, 0},  // decode linear
                                         gemm_case{64, 4096 + 32, 512, false, true, 1.0f, 0.0f, 0},
                                         gemm_case{37, 19, 23, false, false, 0.5f, 1.0f, 3},
                                         gemm_case{33, 65, 17, true, false, 1.0f, 0.0f, 1},
                                         gemm_case{7, 13, 5, true, true, 2.0f, 0.5f, 0},
                                         gemm_case{1, 1, 1, false, true, 1.0f, 0.0f, 0},
                                         // the warpgroup-MMA kernel's calls: 9, 17, 40, 100, 256 rows (8 to 256 a
                                         // tile), split-K (long k, few weight tiles) or not, a partial last k
                                         // block (k 1000), padded strides, into C and added to it
                                         gemm_case{9, 4096, 4096, false, true, 1.0f, 0.0f, 0},
                                         gemm_case{17, 1000, 1000, false, true, 1.0f, 1.0f, 8},
                                         gemm_case{40, 2048, 8192, false, true, 1.0f, 1.0f, 0},
                                         gemm_case{100, 384, 64, false, true, 1.0f, 0.0f, 0},
                                         gemm_case{256, 1536, 3072, false, true, 1.0f, 0.0f, 8},
                                         gemm_case{129, 16768, 512, false, true, 1.0f, 0.0f, 0}),
                         [](const testing::TestParamInfo<gemm_case>& param_info) {
                           const auto& c = param_info.param;
                           return "Cuda_bf16_m" + std::to_string(c.m) + "_n" + std::to_string(c.n) + "_k" +
                                  std::to_string(c.k) + (c.ta ? "_ta" : "") + (c.tb ? "_tb" : "") +
                                  (c.beta != 0.0f ? "_accumulate" : "") + (c.pad ? "_padded" : "");
                         });

// ---------------------------------------------------------------------------------------------
// embedding, bf16 table

class EmbeddingBf16Cuda : public testing::TestWithParam<std::vector<int>> {};  // n_tokens, hidden, start, end

TEST_P(EmbeddingBf16Cuda, MatchesCpuExactly) {
  HYSERVE_REQUIRE_CUDA();
  const int n_tokens = GetParam()[0], hidden = GetParam()[1], start = GetParam()[2], end = GetParam()[3];
  const auto table = to_bf16(random_floats(static_cast<size_t>(end - start) * hidden, 5, -4.0f, 4.0f));
  std::vector<int32_t> ids(static_cast<size_t>(n_tokens));
  for (int t = 0; t < n_tokens; ++t) ids[t] = (t * 7919) % (end + 40);  // some ids of other shards
  std::vector<float> out(static_cast<size_t>(n_tokens) * hidden, poison());
  auto dids = to_device(ids);
  auto dtable = to_device(table);
  device_array<float> dout(out.size());
  dout.fill_bytes(0xff);
  embedding_params p;
  p.n_tokens = n_tokens;
  p.hidden = hidden;
  p.vocab_start = start;
  p.vocab_end = end;
  p.table_dtype = dtype::kBF16;
  embedding_params pc = p;
  pc.ids = ids.data();
  pc.table = table.data();
  pc.out = out.data();
  run_cpu(pc);
  embedding_params pg = p;
  pg.ids = dids.data();
  pg.table = dtable.data();
  pg.out = dout.data();
  run_cuda(pg);
  device_synchronize();
  expect_match(dout.download(), out, 0.0, 0.0, "out");
}

INSTANTIATE_TEST_SUITE_P(Grid, EmbeddingBf16Cuda,
                         testing::Values(std::vector<int>{1, 4096, 0, 1000}, std::vector<int>{37, 4096 + 32, 500, 1500},
                                         std::vector<int>{64, 4099, 0, 777}, std::vector<int>{5, 64, 100, 200}),
                         [](const testing::TestParamInfo<std::vector<int>>& param_info) {
                           return "Cuda_bf16_" + cuda_test::join(param_info.param);
                         });

// ---------------------------------------------------------------------------------------------
// kv_write into a bf16 cache

class KvWriteBf16Cuda : public testing::TestWithParam<std::vector<int>> {};  // kv_heads, head_dim, pad

TEST_P(KvWriteBf16Cuda, MatchesCpuExactly) {
  HYSERVE_REQUIRE_CUDA();
  const int64_t kvh = GetParam()[0], D = GetParam()[1], pad = GetParam()[2];
  const int64_t row = kvh * D, stride = row + pad, n = 19, slots = 40;
  const auto k = random_floats(static_cast<size_t>(n * stride), 11, -8.0f, 8.0f);
  const auto v = random_floats(static_cast<size_t>(n * stride), 12, -8.0f, 8.0f);
  std::vector<int32_t> locs(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) locs[t] = t % 5 == 3 ? -1 : static_cast<int32_t>((t * 7) % slots);
  std::vector<uint16_t> kc(static_cast<size_t>(slots * row), 0xffff), vc(kc);
  auto dk = to_device(k), dv = to_device(v);
  auto dlocs = to_device(locs);
  device_array<uint16_t> dkc(kc.size()), dvc(vc.size());
  dkc.fill_bytes(0xff);
  dvc.fill_bytes(0xff);
  kv_write_params p;
  p.n_tokens = n;
  p.kv_heads = kvh;
  p.head_dim = D;
  p.k_stride = p.v_stride = stride;
  p.kv_dtype = dtype::kBF16;
  kv_write_params pc = p;
  pc.k = k.data();
  pc.v = v.data();
  pc.locs = locs.data();
  pc.k_cache = kc.data();
  pc.v_cache = vc.data();
  run_cpu(pc);
  kv_write_params pg = p;
  pg.k = dk.data();
  pg.v = dv.data();
  pg.locs = dlocs.data();
  pg.k_cache = dkc.data();
  pg.v_cache = dvc.data();
  run_cuda(pg);
  device_synchronize();
  expect_equal(dkc.download(), kc, "k_cache");
  expect_equal(dvc.download(), vc, "v_cache");
}

INSTANTIATE_TEST_SUITE_P(Grid, KvWriteBf16Cuda,
                         testing::Values(std::vector<int>{8, 128, 0}, std::vector<int>{2, 64, 0},
                                         std::vector<int>{1, 16, 4}, std::vector<int>{3, 20, 3},  // scalar path
                                         std::vector<int>{2, 16, 8}),
                         [](const testing::TestParamInfo<std::vector<int>>& param_info) {
                           return "Cuda_bf16_" + cuda_test::join(param_info.param);
                         });

// ---------------------------------------------------------------------------------------------
// paged attention over a bf16 cache

struct attn_case {
  std::string label;
  int kv_heads, gqa, head_dim, page_size;
  std::vector<int> q_lens;    // per row; 0 = a row without queries
  std::vector<int> seq_lens;  // per row, including the new tokens
};

class PagedAttentionBf16Cuda : public testing::TestWithParam<attn_case> {};

TEST_P(PagedAttentionBf16Cuda, MatchesCpu) {
  HYSERVE_REQUIRE_CUDA();
  const attn_case& c = GetParam();
  const int64_t batch = static_cast<int64_t>(c.q_lens.size());
  const int64_t kvh = c.kv_heads, qh = c.kv_heads * c.gqa, D = c.head_dim, ps = c.page_size;
  std::vector<int32_t> qsl{0};
  for (int ql : c.q_lens) qsl.push_back(qsl.back() + ql);
  const int64_t n_tokens = std::max<int32_t>(qsl.back(), 1);
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
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < (c.seq_lens[b] + ps - 1) / ps; ++i) page_table[b * pt_stride + i] = perm[next++];

  const int64_t qs = qh * D;
  const auto q = random_floats(static_cast<size_t>(n_tokens * qs), 91);
  const auto kc = to_bf16(random_floats(static_cast<size_t>(n_pages * ps * kvh * D), 92));
  const auto vc = to_bf16(random_floats(static_cast<size_t>(n_pages * ps * kvh * D), 93));
  std::vector<float> out(static_cast<size_t>(n_tokens * qs), poison());
  const std::vector<int32_t> seq_lens(c.seq_lens.begin(), c.seq_lens.end());
  auto dq = to_device(q);
  auto dkc = to_device(kc), dvc = to_device(vc);
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
  p.kv_dtype = dtype::kBF16;
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
  // Both decode kernels of a bf16 cache (CUDA-core, tensor-core; head_dim 256 on the tensor-core
  // kernel with kernels.attn_decode_mma_hd256), same tolerance; the slices' partials and the
  // combine kernel (kernels.attn_decode_cluster off; the cluster merge below). The tensor-core
  // kernel also with kernels.attn_decode_early_loads (a warp's first tile loaded in two parts:
  // the keys before this step's, then this step's): the same bits as without.
  {
    kernel_paths no_cluster;
    no_cluster.attn_decode_cluster = -1;
    no_cluster.attn_decode_mma_hd256 = true;  // head_dim 256 on the tensor-core kernel too
    std::vector<float> mma_out;
    for (const bool early : {false, true}) {
      no_cluster.attn_decode_early_loads = early;
      const paths_scope scope(no_cluster);
      for (const attn_decode_path path : {attn_decode_path::kSimt, attn_decode_path::kMma}) {
        if (early && path == attn_decode_path::kSimt) continue;
        set_attn_decode_path(path);
        dout.fill_bytes(0xff);
        run_cuda(pg);
        device_synchronize();
        const std::vector<float> got = dout.download();
        expect_match(got, out, 2e-5, 1e-4,
                     path == attn_decode_path::kSimt ? "out (simt)" : early ? "out (mma, early loads)" : "out (mma)");
        if (path == attn_decode_path::kMma && !early) mma_out = got;
        if (path == attn_decode_path::kMma && early) {
          size_t differ = 0;
          for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &mma_out[i], sizeof(float)) != 0 ? 1 : 0;
          EXPECT_EQ(differ, 0u) << "attn_decode_early_loads against without: elements whose bits differ";
        }
      }
    }
  }
  // kernels.attn_decode_cluster: both decode kernels' slices merged inside a thread-block cluster
  // (no combine kernel; its own merge order): the same tolerance, twice in a row, and with the
  // host's max_q_len promise where the rows allow it (verify-shaped rows all on the decode kernel).
  {
    kernel_paths cluster;
    cluster.attn_decode_cluster = 1 << 20;
    cluster.attn_decode_mma_hd256 = true;
    const int most = *std::max_element(c.q_lens.begin(), c.q_lens.end());
    // The default cluster size, with and without early loads (the same bits: mma_bits, by
    // promise); clusters of 4 (kernels.attn_decode_cluster_size).
    std::map<int, std::vector<float>> mma_bits;
    for (const auto& [early, size] : {std::pair{false, 0}, std::pair{true, 0}, std::pair{false, 4}}) {
      cluster.attn_decode_early_loads = early;
      cluster.attn_decode_cluster_size = size;
      const paths_scope scope(cluster);
      for (const attn_decode_path path : {attn_decode_path::kSimt, attn_decode_path::kMma}) {
        if (early && path == attn_decode_path::kSimt) continue;
        set_attn_decode_path(path);
        for (const int promise : {0, 0, most}) {
          if (promise > 16) continue;
          pg.max_q_len = promise;
          dout.fill_bytes(0xff);
          run_cuda(pg);
          device_synchronize();
          const std::vector<float> got = dout.download();
          expect_match(got, out, 2e-5, 1e-4,
                       std::string(path == attn_decode_path::kMma ? "out (mma" : "out (simt") +
                           (early ? ", early loads" : "") + ", cluster merge" +
                           (size > 0 ? " of " + std::to_string(size) : "") + ", max_q_len " + std::to_string(promise) + ")");
          if (path != attn_decode_path::kMma || size != 0) continue;
          if (!early) {
            mma_bits[promise] = got;
            continue;
          }
          size_t differ = 0;
          for (size_t i = 0; i < got.size(); ++i)
            differ += std::memcmp(&got[i], &mma_bits[promise][i], sizeof(float)) != 0 ? 1 : 0;
          EXPECT_EQ(differ, 0u) << "cluster merge, max_q_len " << promise
                                << ": attn_decode_early_loads against without, elements whose bits differ";
        }
      }
    }
    pg.max_q_len = 0;
  }
  set_attn_decode_path(attn_decode_path::kDefault);
  // A bfloat16 model's attention (bf16_products): the extend kernel's q and softmax weights
  // rounded to one bf16 term each (relative error up to 2^-9 a product, f32 sums): the bf16
  // pipeline's tolerance (5e-3 abs + 2e-2 rel, a few elements past it, relative L2 <= 1e-2);
  // the decode rows stay on their kernels' f32-level products.
  pg.bf16_products = true;
  dout.fill_bytes(0xff);
  run_cuda(pg);
  device_synchronize();
  const std::vector<float> products = dout.download();
  cuda_test::expect_match_bf16_pipeline(products, out, 5e-3, 2e-2, "out (bf16 products)");
  // kernels.attn_extend_fill false (the extend kernel on the shared slice count instead of about
  // 8 blocks an SM): a row's tiles and their arithmetic do not depend on the tile stride, so the
  // same bits; and the f32-level products (a float32 model) on that grid within the CUDA-core
  // tolerance.
  kernel_paths fill;
  fill.attn_extend_fill = false;
  const paths_scope scope(fill);
  dout.fill_bytes(0xff);
  run_cuda(pg);
  device_synchronize();
  const std::vector<float> filled = dout.download();
  size_t differ = 0;
  for (size_t i = 0; i < filled.size(); ++i) differ += std::memcmp(&filled[i], &products[i], sizeof(float)) != 0 ? 1 : 0;
  EXPECT_EQ(differ, 0u) << "attn_extend_fill false against the default grid: elements whose bits differ";
  pg.bf16_products = false;
  dout.fill_bytes(0xff);
  run_cuda(pg);
  device_synchronize();
  expect_match(dout.download(), out, 2e-5, 1e-4, "out (f32-level products, attn_extend_fill false)");
}

attn_case decode_case(std::string label, int bs, int kv_heads, int gqa, int hd, int ps, int lo, int hi) {
  attn_case c{std::move(label), kv_heads, gqa, hd, ps, {}, {}};
  std::mt19937 gen(static_cast<uint32_t>(bs * 131 + hd));
  std::uniform_int_distribution<int> dist(lo, hi);
  for (int b = 0; b < bs; ++b) {
    c.q_lens.push_back(1);
    c.seq_lens.push_back(b == 0 ? hi : dist(gen));
  }
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    Grid, PagedAttentionBf16Cuda,
    testing::Values(
        // Production shape: 32 q / 8 kv heads, head_dim 128, page 16.
        decode_case("decode", 4, 8, 4, 128, 16, 1, 4096),    // split-KV, 16-byte bf16 loads
        decode_case("decode", 96, 8, 4, 128, 16, 1, 700),    // many rows
        attn_case{"extend_prefix", 8, 4, 128, 16, {5, 37, 1, 0}, {21, 100, 300, 9}},
        attn_case{"mixed", 8, 4, 128, 16, {1, 17, 1}, {257, 17, 33}},
        // The tensor-core extend kernel (head_dim 64, 128 and 256, any GQA): several 64-row query
        // tiles and 64-key tiles, a prefix, partial last tiles, page size 1, beside decode rows.
        attn_case{"prefill_long", 8, 4, 128, 16, {300}, {300}},
        attn_case{"extend_prefix_long", 2, 8, 64, 1, {150, 1, 40}, {1150, 600, 40}},
        attn_case{"extend_gqa1", 4, 1, 128, 16, {70, 0, 33}, {200, 5, 33}},
        attn_case{"extend_gqa2", 4, 2, 64, 16, {65, 18, 1}, {65, 100, 9}},
        // GQA 6 (Falcon-H1-7B's 12 / 2 heads): extend rows on the tensor cores beside decode rows
        // (the decode kernel), in the same call.
        attn_case{"extend_gqa6", 2, 6, 128, 16, {40, 1, 7, 1}, {300, 90, 7, 1000}},
        // Head_dim 256 (Qwen3-Next's 16 / 2 heads): the extend kernel's 32-key tiles, a prefix,
        // several query tiles, beside decode rows.
        attn_case{"extend_hd256", 2, 8, 256, 16, {70, 1, 33, 0}, {300, 90, 33, 5}},
        // A chain verify of Qwen3-Next's gated attention (rows of 5 queries, head_dim 256, GQA 8):
        // with the host's promise (max_q_len 5, as the model now gives it) every row on the
        // decode kernel, its slices merged in a cluster.
        attn_case{"verify_hd256", 2, 8, 256, 16, {5, 5, 5}, {700, 64, 5}},
        // Other GQA ratios of the decode kernel (8: 8-byte bf16 loads; 3, 5, 6, 7: heads padded to
        // the MMA's 8) and the generic branch (12).
        decode_case("decode", 3, 2, 1, 64, 16, 1, 513), decode_case("decode", 3, 2, 2, 32, 16, 1, 333),
        decode_case("decode", 5, 1, 8, 128, 16, 1, 1000), decode_case("decode", 5, 2, 8, 256, 16, 1, 300),
        decode_case("decode", 4, 2, 3, 64, 16, 1, 900), decode_case("decode", 3, 2, 6, 128, 16, 1, 1500),
        decode_case("decode", 2, 4, 7, 128, 16, 1, 600), decode_case("decode", 2, 1, 5, 64, 16, 1, 400),
        decode_case("decode", 2, 1, 12, 128, 16, 1, 300),
        // Odd sizes: head_dim 16 (the fixtures), page sizes 1 and 3, 32K context.
        attn_case{"extend", 2, 2, 16, 3, {7, 1, 4}, {7, 19, 30}},
        decode_case("decode", 2, 1, 4, 16, 1, 1, 77),
        decode_case("decode_32k", 1, 8, 4, 128, 16, 32768, 32768)),
    [](const testing::TestParamInfo<attn_case>& param_info) {
      const auto& c = param_info.param;
      return "Cuda_bf16_" + c.label + "_kvheads" + std::to_string(c.kv_heads) + "_gqa" + std::to_string(c.gqa) +
             "_hd" + std::to_string(c.head_dim) + "_page" + std::to_string(c.page_size) + "_rows" +
             std::to_string(c.q_lens.size());
    });

// Unsupported cache / weight types are errors naming the field, before any launch.
TEST(Bf16CudaValidation, UnsupportedTypesNameTheField) {
  HYSERVE_REQUIRE_CUDA();
  device_array<float> buf(4096);
  device_array<int32_t> ibuf(64);
  gemm_params g;
  g.a = g.c = buf.data();
  g.b = buf.data();
  g.m = g.n = g.k = 4;
  g.lda = g.ldb = g.ldc = 4;
  g.b_dtype = dtype::kF16;
  cuda_test::expect_invalid([&] { run_cuda(g); }, "b_dtype");
  kv_write_params w;
  w.k = w.v = buf.data();
  w.k_cache = w.v_cache = buf.data();
  w.locs = ibuf.data();
  w.n_tokens = 1;
  w.kv_heads = 1;
  w.head_dim = 16;
  w.k_stride = w.v_stride = 16;
  w.kv_dtype = dtype::kF16;
  cuda_test::expect_invalid([&] { run_cuda(w); }, "kv_dtype");
  embedding_params e;
  e.ids = ibuf.data();
  e.table = buf.data();
  e.out = buf.data();
  e.n_tokens = 1;
  e.hidden = 4;
  e.vocab_end = 4;
  e.table_dtype = dtype::kI32;
  cuda_test::expect_invalid([&] { run_cuda(e); }, "table_dtype");
}

}  // namespace
}  // namespace hyserve::kernels

#else  // no CUDA backend in this build

TEST(CudaBf16Ops, BackendNotBuilt) { GTEST_SKIP() << "CUDA backend not built"; }

#endif
