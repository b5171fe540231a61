// determinism: batch_invariant on the CUDA kernels (kernel_paths::batch_invariant): a row's
// result is the same bits whatever the number and content of the other rows of its call.
//   - gemm: row r of an m-row call == the row computed alone, m = 2..70, 300 and 1100, for bf16
//     weights on the tensor-core kernel (groups of 8 rows, activations rounded to bf16), and for
//     f32 weights, trans_a, a non-transposed B and unaligned bf16 rows on the CUDA-core kernel,
//     and for bf16 weights on cuBLASLt with split-K 1 (kernels.invariant_gemm: cublaslt) and on
//     the warpgroup-MMA kernel (kernels.invariant_gemm: wgmma);
//     the values within 1e-5 + 1e-6·k abs, 1e-5 rel of the CPU op on bf16-exact activations.
//   - swiglu_linear: the same for the fused projection, m up to 300, on each backend.
//   Calls of 256 rows and more run the tiled kernel, fewer the skinny one: the rows alone (m = 1)
//   against m = 300 and 1100 check that the two sum in the same order.
//   - paged attention: a decode row alone == the same row among 1..199 other decode rows of other
//     lengths, bf16 cache (tensor-core decode kernel) and f32 cache (CUDA-core one), GQA 4, and
//     GQA 3 (a group size padded to the decode kernel's 8 heads); a chain-verify row alone == among others; a
//     verify row in a step of its own == the row beside prefill chunks (short_q_max); and a
//     prefill chunk's tokens (the tensor-core extend kernel) == the same tokens in two chunks and
//     among other rows.
//   - tree verify attention: every draft node == the decode query at its position (its prefix and
//     ancestors as a row of its own), bf16 (tensor-core and CUDA-core kernels) and f32 caches.
// Skips without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "hyserve/kernels/device.h"

#if defined(HYSERVE_HAVE_CUDA)

#include "cuda/gemm_paths.h"
#include "cuda_test_util.h"
#include "hyserve/common/dtype.h"
#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/gemm.h"
#include "hyserve/kernels/paths.h"
#include "tree_decode_rows.h"

namespace hyserve::kernels {
namespace {

using cuda_test::expect_match;
using cuda_test::random_floats;
using cuda_test::to_bf16;

kernel_paths invariant_paths() {
  kernel_paths k;
  k.batch_invariant = true;
  return k;
}

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// Values a bf16 holds exactly: the batch-invariant tensor-core GEMM rounds its activations to
// bf16, so with these the CPU op sees the same operands.
std::vector<float> bf16_exact(std::vector<float> v) {
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

// While it lives, the row-invariant bf16 GEMMs run on `backend` (set_invariant_gemm_backend).
class invariant_backend_scope {
 public:
  explicit invariant_backend_scope(invariant_gemm_backend backend) : saved_(current_invariant_gemm_backend()) {
    set_invariant_gemm_backend(backend);
  }
  ~invariant_backend_scope() { set_invariant_gemm_backend(saved_); }
  invariant_backend_scope(const invariant_backend_scope&) = delete;
  invariant_backend_scope& operator=(const invariant_backend_scope&) = delete;

 private:
  invariant_gemm_backend saved_;
};

// alpha 1.5, beta 0.5 unless unit_scale (alpha 1, beta 1: the residual added in the epilogue,
// which the cuBLASLt path takes).
struct gemm_layout {
  std::string label;
  dtype b_dtype;
  bool trans_a, trans_b;
  int64_t n, k;
  invariant_gemm_backend backend = invariant_gemm_backend::kKernels;
  bool unit_scale = false;
};

class InvariantGemmCuda : public testing::TestWithParam<gemm_layout> {};

// C's row `at` of an m-row product whose other rows are random; `row` is that row of A.
TEST_P(InvariantGemmCuda, RowOfAnyCallEqualsTheRowAlone) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const gemm_layout& c = GetParam();
  const kernel_paths paths = invariant_paths();
  const paths_scope scope(paths);
  const invariant_backend_scope backend(c.backend);
  const int64_t n = c.n, k = c.k;
  const std::vector<float> wf = random_floats(static_cast<size_t>(n * k), 61, -0.1f, 0.1f);
  std::vector<uint16_t> wh(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) wh[i] = f32_to_bf16(wf[i]);
  // B as stored: [n, k] (trans_b) or its transpose [k, n].
  std::vector<float> bf(wf.size());
  std::vector<uint16_t> bh(wh.size());
  for (int64_t j = 0; j < n; ++j)
    for (int64_t l = 0; l < k; ++l) {
      const size_t src = static_cast<size_t>(j * k + l), dst = c.trans_b ? src : static_cast<size_t>(l * n + j);
      bf[dst] = wf[src];
      bh[dst] = wh[src];
    }
  const bool bf16 = c.b_dtype == dtype::kBF16;
  device_array<float> dbf(bf);
  device_array<uint16_t> dbh(bh);
  const std::vector<float> row = bf16_exact(random_floats(static_cast<size_t>(k), 62));
  const std::vector<float> c_init = random_floats(static_cast<size_t>(n), 63);  // beta accumulates onto it

  // Runs an m-row product with `row` at index at; returns all of C and,
  // through want, the CPU op's C.
  auto product = [&](int64_t m, int64_t at, uint32_t seed, std::vector<float>* want) {
    std::vector<float> a = bf16_exact(random_floats(static_cast<size_t>(m * k), seed));
    std::copy(row.begin(), row.end(), a.begin() + at * k);
    std::vector<float> stored = a;
    if (c.trans_a)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t l = 0; l < k; ++l) stored[static_cast<size_t>(l * m + i)] = a[static_cast<size_t>(i * k + l)];
    std::vector<float> c0(static_cast<size_t>(m * n));
    for (int64_t i = 0; i < m; ++i) std::copy(c_init.begin(), c_init.end(), c0.begin() + i * n);
    gemm_params p;
    p.m = m;
    p.n = n;
    p.k = k;
    p.trans_a = c.trans_a;
    p.trans_b = c.trans_b;
    p.lda = c.trans_a ? m : k;
    p.ldb = c.trans_b ? k : n;
    p.ldc = n;
    p.alpha = c.unit_scale ? 1.0f : 1.5f;
    p.beta = c.unit_scale ? 1.0f : 0.5f;
    p.b_dtype = c.b_dtype;
    if (want != nullptr) {
      *want = c0;
      gemm_params pc = p;
      pc.a = stored.data();
      pc.b = bf16 ? static_cast<const void*>(bh.data()) : static_cast<const void*>(bf.data());
      pc.c = want->data();
      run_cpu(pc);
    }
    device_array<float> da(stored), dc(c0);
    p.a = da.data();
    p.b = bf16 ? static_cast<const void*>(dbh.data()) : static_cast<const void*>(dbf.data());
    p.c = dc.data();
    run_cuda(p);
    device_synchronize();
    return dc.download();
  };

  std::vector<float> want_alone;
  const std::vector<float> alone = product(1, 0, 70u, &want_alone);
  expect_match(alone, want_alone, 1e-5 + 1e-6 * static_cast<double>(k), 1e-5, c.label + " m 1");
  std::vector<int64_t> ms;
  for (int64_t m = 2; m <= 70; ++m) ms.push_back(m);
  ms.push_back(300);
  ms.push_back(1100);
  for (const int64_t m : ms) {
    const int64_t at = (m * 7 + 3) % m;
    std::vector<float> want;
    const bool check_values = m == 5 || m == 9 || m == 70 || m == 1100;
    const std::vector<float> got = product(m, at, 71u + static_cast<uint32_t>(m), check_values ? &want : nullptr);
    ASSERT_TRUE(same_bits(got.data() + at * n, alone.data(), static_cast<size_t>(n)))
        << c.label << ": m " << m << " row " << at << " differs from the row alone";
    // The values: the CPU op over the same bf16 weights and activations (bf16-exact here, as
    // the tensor-core kernel rounds them; only the summation order differs).
    if (check_values) expect_match(got, want, 1e-5 + 1e-6 * static_cast<double>(k), 1e-5, c.label + " m " + std::to_string(m));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, InvariantGemmCuda,
    testing::Values(gemm_layout{"bf16_tensor_core", dtype::kBF16, false, true, 1025, 4096},
                    gemm_layout{"bf16_tensor_core_wide", dtype::kBF16, false, true, 16768, 512},
                    gemm_layout{"bf16_unaligned_k", dtype::kBF16, false, true, 37, 203},
                    gemm_layout{"bf16_trans_a", dtype::kBF16, true, true, 64, 256},
                    gemm_layout{"bf16_b_kn", dtype::kBF16, false, false, 48, 96},
                    gemm_layout{"f32", dtype::kF32, false, true, 333, 512},
                    gemm_layout{"f32_trans_a_b_kn", dtype::kF32, true, false, 37, 203},
                    // cuBLASLt with split-K 1 (kernels.invariant_gemm: cublaslt): 16-byte rows take
                    // it for every m; n 1025 and other scalings stay on the kernels for every m.
                    gemm_layout{"bf16_cublaslt", dtype::kBF16, false, true, 4096, 2048,
                                invariant_gemm_backend::kCublasLt, true},
                    gemm_layout{"bf16_cublaslt_wide", dtype::kBF16, false, true, 16768, 512,
                                invariant_gemm_backend::kCublasLt, true},
                    gemm_layout{"bf16_cublaslt_n1025", dtype::kBF16, false, true, 1025, 4096,
                                invariant_gemm_backend::kCublasLt, true},
                    gemm_layout{"bf16_cublaslt_scaled", dtype::kBF16, false, true, 4096, 2048,
                                invariant_gemm_backend::kCublasLt, false},
                    // The warpgroup-MMA kernel (kernels.invariant_gemm: wgmma): k in splits by the
                    // weight's shape (4096 × 2048: several, added by the reduction up to 256 rows and
                    // inside the blocks at 300 and 1100; 16768 × 512: one); n 1025 and other
                    // scalings stay on the kernels.
                    gemm_layout{"bf16_wgmma", dtype::kBF16, false, true, 4096, 2048, invariant_gemm_backend::kWgmma,
                                true},
                    gemm_layout{"bf16_wgmma_wide", dtype::kBF16, false, true, 16768, 512,
                                invariant_gemm_backend::kWgmma, true},
                    gemm_layout{"bf16_wgmma_deep", dtype::kBF16, false, true, 1024, 14336,
                                invariant_gemm_backend::kWgmma, true},
                    gemm_layout{"bf16_wgmma_n1025", dtype::kBF16, false, true, 1025, 4096,
                                invariant_gemm_backend::kWgmma, true},
                    gemm_layout{"bf16_wgmma_scaled", dtype::kBF16, false, true, 4096, 2048,
                                invariant_gemm_backend::kWgmma, false}),
    [](const testing::TestParamInfo<gemm_layout>& param_info) { return param_info.param.label; });


// The fused SwiGLU projection on each backend (kernels, cuBLASLt with split-K 1, warpgroup MMAs).
class InvariantSwigluLinearCuda : public testing::TestWithParam<invariant_gemm_backend> {};

TEST_P(InvariantSwigluLinearCuda, RowOfAnyCallEqualsTheRowAlone) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const kernel_paths paths = invariant_paths();
  const paths_scope scope(paths);
  const invariant_backend_scope backend(GetParam());
  const int64_t n = 1000, k = 1024, max_m = 300;  // 300: the tiled kernel (>= 256 rows)
  std::vector<uint16_t> g(static_cast<size_t>(n * k)), u(g.size());
  const std::vector<float> gf = random_floats(g.size(), 91, -0.1f, 0.1f), uf = random_floats(u.size(), 92, -0.1f, 0.1f);
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = f32_to_bf16(gf[i]);
    u[i] = f32_to_bf16(uf[i]);
  }
  device_array<uint16_t> dg(g), du(u);
  const std::vector<float> x = bf16_exact(random_floats(static_cast<size_t>(max_m * k), 93));
  device_array<float> dx(x);
  auto call = [&](int64_t first, int64_t m) {
    device_array<float> dout(static_cast<size_t>(m * n));
    swiglu_linear_params p;
    p.m = m;
    p.n = n;
    p.k = k;
    p.x_stride = p.w_stride = k;
    p.out_stride = n;
    p.w_dtype = dtype::kBF16;
    p.x = dx.data() + first * k;
    p.gate_w = dg.data();
    p.up_w = du.data();
    p.out = dout.data();
    run_cuda(p);
    device_synchronize();
    return dout.download();
  };
  const std::vector<float> all = call(0, max_m);
  std::vector<float> want(all.size());
  swiglu_linear_params pc;
  pc.m = max_m;
  pc.n = n;
  pc.k = k;
  pc.x_stride = pc.w_stride = k;
  pc.out_stride = n;
  pc.w_dtype = dtype::kBF16;
  pc.x = x.data();
  pc.gate_w = g.data();
  pc.up_w = u.data();
  pc.out = want.data();
  run_cpu(pc);
  expect_match(all, want, 1e-5 + 1e-6 * static_cast<double>(k), 1e-4, "swiglu_linear m 300");
  for (const int64_t m : {1, 7, 9, 16, 17, 33, 70, 256}) {
    const std::vector<float> part = call(0, m);
    for (int64_t r = 0; r < m; r += 3)
      ASSERT_TRUE(same_bits(part.data() + r * n, all.data() + r * n, static_cast<size_t>(n)))
          << "m " << m << " row " << r << " differs from the same row of the 300-row call";
  }
  for (int64_t r = 0; r < max_m; r += 5) {
    const std::vector<float> one = call(r, 1);
    ASSERT_TRUE(same_bits(one.data(), all.data() + r * n, static_cast<size_t>(n))) << "row " << r << " alone";
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, InvariantSwigluLinearCuda,
                         testing::Values(invariant_gemm_backend::kKernels, invariant_gemm_backend::kCublasLt,
                                         invariant_gemm_backend::kWgmma),
                         [](const testing::TestParamInfo<invariant_gemm_backend>& param_info) {
                           switch (param_info.param) {
                             case invariant_gemm_backend::kKernels: return "kernels";
                             case invariant_gemm_backend::kCublasLt: return "cublaslt";
                             default: return "wgmma";
                           }
                         });

// ---- paged attention ----

// A paged KV cache (bf16 and f32 copies of the same random values) of 2 × pages_per_row pages, and
// calls of rows (q_len, seq_len) over it. The target row at index `at` reads pages 0.. and takes
// q_target as its queries; the other rows read the second half of the pool in a scrambled order
// and random queries. Returns the target's output rows.
struct attention_pool {
  int64_t kv_heads, q_heads, head_dim = 128, page_size = 16, pages_per_row;
  device_array<float> kf, vf;
  device_array<uint16_t> kh, vh;

  attention_pool(int64_t kvh, int64_t qh, int64_t max_len, uint32_t seed)
      : kv_heads(kvh), q_heads(qh), pages_per_row((max_len + 15) / 16), kf(values(seed)), vf(values(seed + 1)),
        kh(to_bf16(values(seed))), vh(to_bf16(values(seed + 1))) {}

  std::vector<float> values(uint32_t seed) const {
    return random_floats(static_cast<size_t>(2 * pages_per_row * page_size * kv_heads * head_dim), seed);
  }

  std::vector<float> run(dtype kv_dtype, const std::vector<int32_t>& q_lens, const std::vector<int32_t>& lens,
                         int64_t at, const std::vector<float>& q_target, int64_t promise, int64_t short_max,
                         uint32_t seed) const {
    const int64_t batch = static_cast<int64_t>(lens.size()), qs = q_heads * head_dim;
    std::vector<int32_t> qsl{0}, pt(static_cast<size_t>(batch * pages_per_row));
    for (int64_t b = 0; b < batch; ++b) {
      qsl.push_back(qsl.back() + q_lens[static_cast<size_t>(b)]);
      for (int64_t i = 0; i < pages_per_row; ++i)
        pt[static_cast<size_t>(b * pages_per_row + i)] =
            static_cast<int32_t>(b == at ? i : pages_per_row + (b * 7 + i * 13) % pages_per_row);
    }
    std::vector<float> q = random_floats(static_cast<size_t>(qsl.back() * qs), seed);
    std::copy(q_target.begin(), q_target.end(), q.begin() + qsl[static_cast<size_t>(at)] * qs);
    device_array<float> dq(q), dout(q.size());
    device_array<int32_t> dqsl(qsl), dlens(lens), dpt(pt);
    const bool bf16 = kv_dtype == dtype::kBF16;
    paged_attention_params p;
    p.batch = batch;
    p.q_heads = q_heads;
    p.kv_heads = kv_heads;
    p.head_dim = head_dim;
    p.page_size = page_size;
    p.page_table_stride = pages_per_row;
    p.q_stride = p.out_stride = qs;
    p.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    p.kv_dtype = kv_dtype;
    p.k_cache = bf16 ? static_cast<const void*>(kh.data()) : static_cast<const void*>(kf.data());
    p.v_cache = bf16 ? static_cast<const void*>(vh.data()) : static_cast<const void*>(vf.data());
    p.q = dq.data();
    p.out = dout.data();
    p.query_start_loc = dqsl.data();
    p.seq_lens = dlens.data();
    p.page_table = dpt.data();
    p.max_q_len = promise;
    p.short_q_max = short_max;
    run_cuda(p);
    device_synchronize();
    const std::vector<float> out = dout.download();
    const auto first = out.begin() + qsl[static_cast<size_t>(at)] * qs;
    return std::vector<float>(first, first + static_cast<int64_t>(q_target.size()));
  }
};

struct attn_inv_case {
  std::string label;
  dtype kv_dtype;
  int kv_heads, gqa, q_len;  // q_len > 1: chain-verify rows (the host's max_q_len promise)
};

class InvariantAttentionCuda : public testing::TestWithParam<attn_inv_case> {};

// The target row (length len) alone, then at index `at` of a batch of other rows of as many
// queries and random lengths: its output must be the same bits.
TEST_P(InvariantAttentionCuda, RowAloneEqualsRowInAnyBatch) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const attn_inv_case& c = GetParam();
  const kernel_paths paths = invariant_paths();
  const paths_scope scope(paths);
  const int32_t max_len = 6000;
  const attention_pool pool(c.kv_heads, int64_t{c.kv_heads} * c.gqa, max_len, 101);
  const std::vector<float> q_target = random_floats(static_cast<size_t>(c.q_len * pool.q_heads * pool.head_dim), 103);
  std::mt19937 rng(7);
  for (const int32_t len : {c.q_len, 100, 1000, 5999}) {
    const std::vector<float> alone = pool.run(c.kv_dtype, {c.q_len}, {len}, 0, q_target, c.q_len, c.q_len, 110u);
    for (const int64_t batch : {2, 8, 33, 64, 200}) {
      std::vector<int32_t> lens(static_cast<size_t>(batch));
      const int64_t at = static_cast<int64_t>(rng() % static_cast<uint32_t>(batch));
      for (int64_t b = 0; b < batch; ++b)
        lens[static_cast<size_t>(b)] = c.q_len + static_cast<int32_t>(rng() % static_cast<uint32_t>(max_len - c.q_len));
      lens[static_cast<size_t>(at)] = len;
      const std::vector<int32_t> q_lens(static_cast<size_t>(batch), c.q_len);
      const std::vector<float> got =
          pool.run(c.kv_dtype, q_lens, lens, at, q_target, c.q_len, c.q_len, 111u + static_cast<uint32_t>(batch));
      ASSERT_TRUE(same_bits(got.data(), alone.data(), alone.size()))
          << c.label << ": len " << len << ", batch " << batch << ", row " << at << " differs from the row alone";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, InvariantAttentionCuda,
                         testing::Values(attn_inv_case{"bf16_decode", dtype::kBF16, 8, 4, 1},
                                         attn_inv_case{"f32_decode", dtype::kF32, 8, 4, 1},
                                         attn_inv_case{"bf16_verify5", dtype::kBF16, 8, 4, 5},
                                         attn_inv_case{"bf16_decode_gqa3", dtype::kBF16, 4, 3, 1}),
                         [](const testing::TestParamInfo<attn_inv_case>& param_info) { return param_info.param.label; });

// A prefill chunk's tokens (extend kernel: more than 16 queries) are the same bits whatever the
// chunking and the batch: 200 queries at positions 700..899 in one chunk alone, in two chunks
// (120 then 80 queries, the first call's row ending at 820), and among other rows.
TEST(InvariantAttentionCuda, PrefillTokensEqualTheSameTokensInAnyChunkingOrBatch) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const kernel_paths paths = invariant_paths();
  const paths_scope scope(paths);
  const int32_t len = 900, q_len = 200, first = 120;
  const attention_pool pool(8, 32, 1200, 131);
  const int64_t row = pool.q_heads * pool.head_dim;
  const std::vector<float> q_all = random_floats(static_cast<size_t>(q_len * row), 133);
  const std::vector<float> whole = pool.run(dtype::kBF16, {q_len}, {len}, 0, q_all, 0, 0, 134u);
  const std::vector<float> q_a(q_all.begin(), q_all.begin() + first * row), q_b(q_all.begin() + first * row, q_all.end());
  std::vector<float> chunked = pool.run(dtype::kBF16, {first}, {len - q_len + first}, 0, q_a, 0, 0, 135u);
  const std::vector<float> second = pool.run(dtype::kBF16, {q_len - first}, {len}, 0, q_b, 0, 0, 136u);
  chunked.insert(chunked.end(), second.begin(), second.end());
  ASSERT_EQ(chunked.size(), whole.size());
  for (int32_t tk = 0; tk < q_len; ++tk)
    ASSERT_TRUE(same_bits(chunked.data() + tk * row, whole.data() + tk * row, static_cast<size_t>(row)))
        << "token " << tk << " (position " << len - q_len + tk << ") differs between one chunk and two";
  std::mt19937 rng(13);
  for (const int64_t batch : {3, 17}) {
    std::vector<int32_t> q_lens(static_cast<size_t>(batch)), lens(static_cast<size_t>(batch));
    const int64_t at = static_cast<int64_t>(rng() % static_cast<uint32_t>(batch));
    for (int64_t b = 0; b < batch; ++b) {
      q_lens[static_cast<size_t>(b)] = b == at ? q_len : 1 + static_cast<int32_t>(rng() % 300);
      lens[static_cast<size_t>(b)] = b == at ? len : q_lens[static_cast<size_t>(b)] + static_cast<int32_t>(rng() % 800);
    }
    const std::vector<float> got = pool.run(dtype::kBF16, q_lens, lens, at, q_all, 0, 0, 137u + static_cast<uint32_t>(batch));
    ASSERT_TRUE(same_bits(got.data(), whole.data(), whole.size()))
        << "batch " << batch << ", row " << at << ": the chunk differs from the chunk alone";
  }
}

// A verify row (5 queries) in a step of its own with the host's promise (max_q_len 5) equals the
// same row inside a step that also carries prefill chunks of up to 40 queries (no promise; the
// host's short_q_max routes the rows of up to 16 queries to the decode kernel): a TargetVerify
// step carrying prefill chunks, or a short prefill chunk beside a long one.
TEST(InvariantAttentionCuda, ShortRowBesidePrefillChunksEqualsTheRowInAStepOfItsOwn) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const kernel_paths paths = invariant_paths();
  const paths_scope scope(paths);
  const int32_t max_len = 3000, target_q = 5;
  const attention_pool pool(8, 32, max_len, 121);
  const std::vector<float> q_target = random_floats(static_cast<size_t>(target_q * pool.q_heads * pool.head_dim), 123);
  std::mt19937 rng(11);
  for (const int32_t len : {target_q, 700, 2999}) {
    const std::vector<float> alone = pool.run(dtype::kBF16, {target_q}, {len}, 0, q_target, target_q, target_q, 124u);
    for (const int64_t batch : {2, 9, 40}) {
      std::vector<int32_t> q_lens(static_cast<size_t>(batch)), lens(static_cast<size_t>(batch));
      const int64_t at = static_cast<int64_t>(rng() % static_cast<uint32_t>(batch));
      int64_t short_max = 0;
      for (int64_t b = 0; b < batch; ++b) {
        // Row at + 1: a prefill chunk beyond the decode kernel's 16 queries, in every batch.
        const int32_t ql = b == at ? target_q : b == (at + 1) % batch ? 40 : 1 + static_cast<int32_t>(rng() % 40);
        q_lens[static_cast<size_t>(b)] = ql;
        lens[static_cast<size_t>(b)] = b == at ? len : ql + static_cast<int32_t>(rng() % static_cast<uint32_t>(max_len - ql));
        if (ql <= kMaxDecodeQueries) short_max = std::max<int64_t>(short_max, ql);
      }
      const std::vector<float> got =
          pool.run(dtype::kBF16, q_lens, lens, at, q_target, 0, short_max, 125u + static_cast<uint32_t>(batch));
      ASSERT_TRUE(same_bits(got.data(), alone.data(), alone.size()))
          << "len " << len << ", batch " << batch << ", row " << at << " differs from the row in a step of its own";
    }
  }
}

// ---- tree verify attention ----

struct tree_inv_case {
  std::string label;
  dtype kv_dtype;
  int kv_heads, gqa, head_dim;
  bool simt;  // the CUDA-core decode kernel for a bf16 cache (kernels.attn_decode: simt)
};

class InvariantTreeAttentionCuda : public testing::TestWithParam<tree_inv_case> {};

// Each draft node of a tree verify call (3 rows, random trees of 6, 16 and 24 nodes, prefixes of
// 0 to 5000 keys that do and do not end on a page) equals the decode query at its position, in a
// decode call of one query per node (its keys copied in order into pages of its own,
// tests/support/tree_decode_rows.h): the same bits. So a speculative tree accepts exactly the
// tokens plain decoding produces.
TEST_P(InvariantTreeAttentionCuda, NodeEqualsTheDecodeQueryAtItsPosition) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const tree_inv_case& c = GetParam();
  kernel_paths paths = invariant_paths();
  if (c.simt) paths.attn_decode = kernel_paths::attn_decode_kind::kSimt;
  const paths_scope scope(paths);
  const bool bf16 = c.kv_dtype == dtype::kBF16;
  const int64_t qh = int64_t{c.kv_heads} * c.gqa, hd = c.head_dim, ps = 16, kv_row = c.kv_heads * hd;
  std::mt19937 rng(31);
  for (const int64_t Dn : {6, 16, 24}) {
    const std::vector<int32_t> seq = {static_cast<int32_t>(1000 + Dn), static_cast<int32_t>(Dn),
                                      static_cast<int32_t>(4999 + Dn)};
    const int64_t batch = static_cast<int64_t>(seq.size()), stride = (5000 + Dn + ps - 1) / ps;
    std::vector<int32_t> table(static_cast<size_t>(batch * stride));
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
    std::shuffle(table.begin(), table.end(), rng);
    const test_support::random_tree_layout trees = test_support::random_trees(batch, Dn, rng);
    const std::vector<int32_t>& qsl = trees.query_start_loc;
    const std::vector<int32_t>& parent = trees.parent;
    const size_t cache = table.size() * static_cast<size_t>(ps * kv_row);
    const std::vector<float> q = random_floats(static_cast<size_t>(batch * Dn * qh * hd), 141);
    const std::vector<float> kf = random_floats(cache, 142), vf = random_floats(cache, 143);
    const std::vector<uint16_t> kh = to_bf16(kf), vh = to_bf16(vf);
    const device_array<float> dq(q), dkf(kf), dvf(vf);
    const device_array<uint16_t> dkh(kh), dvh(vh);
    const device_array<int32_t> dqsl(qsl), dseq(seq), dtable(table), dparent(parent);
    device_array<float> tree_out(q.size()), decode_out(q.size());
    paged_attention_tree_params t;
    t.q = dq.data();
    t.query_start_loc = dqsl.data();
    t.seq_lens = dseq.data();
    t.page_table = dtable.data();
    t.batch = batch;
    t.q_heads = qh;
    t.kv_heads = c.kv_heads;
    t.head_dim = hd;
    t.page_size = ps;
    t.page_table_stride = stride;
    t.q_stride = t.out_stride = qh * hd;
    t.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    t.kv_dtype = c.kv_dtype;
    t.retrieve_parent = dparent.data();
    t.tree_nodes = Dn;
    t.k_cache = bf16 ? static_cast<const void*>(dkh.data()) : static_cast<const void*>(dkf.data());
    t.v_cache = bf16 ? static_cast<const void*>(dvh.data()) : static_cast<const void*>(dvf.data());
    t.out = tree_out.data();
    run_cuda(t);
    auto decode = [&](const auto& rows) {
      using T = typename std::decay_t<decltype(rows.k)>::value_type;
      const device_array<T> dk(rows.k), dv(rows.v);
      const device_array<int32_t> dpt(rows.page_table), dlens(rows.seq_lens), dq1(rows.query_start_loc);
      paged_attention_params d = t;
      d.batch = batch * Dn;
      d.k_cache = dk.data();
      d.v_cache = dv.data();
      d.page_table = dpt.data();
      d.page_table_stride = rows.stride;
      d.seq_lens = dlens.data();
      d.query_start_loc = dq1.data();
      d.out = decode_out.data();
      d.max_q_len = 1;
      run_cuda(d);
      device_synchronize();
    };
    if (bf16)
      decode(test_support::tree_as_decode_rows(kh, vh, table, stride, seq, parent, Dn, ps, kv_row));
    else
      decode(test_support::tree_as_decode_rows(kf, vf, table, stride, seq, parent, Dn, ps, kv_row));
    const std::vector<float> got = tree_out.download(), want = decode_out.download();
    for (int64_t n = 0; n < batch * Dn; ++n) {
      const size_t at = static_cast<size_t>(n * qh * hd);
      ASSERT_TRUE(same_bits(got.data() + at, want.data() + at, static_cast<size_t>(qh * hd)))
          << c.label << ": " << Dn << " nodes, row " << n / Dn << " node " << n % Dn
          << " differs from the decode query at its position";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, InvariantTreeAttentionCuda,
                         testing::Values(tree_inv_case{"bf16_mma_hd128", dtype::kBF16, 8, 4, 128, false},
                                         tree_inv_case{"bf16_mma_hd64_gqa8", dtype::kBF16, 2, 8, 64, false},
                                         tree_inv_case{"bf16_simt_hd128", dtype::kBF16, 8, 4, 128, true},
                                         tree_inv_case{"f32_hd128", dtype::kF32, 8, 4, 128, false},
                                         tree_inv_case{"f32_hd256_gqa1", dtype::kF32, 4, 1, 256, false}),
                         [](const testing::TestParamInfo<tree_inv_case>& param_info) {
                           return param_info.param.label;
                         });

}  // namespace
}  // namespace hyserve::kernels

#endif  // HYSERVE_HAVE_CUDA
