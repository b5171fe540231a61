// Backend ops, dense and row-wise: gemm, embedding, swiglu, argmax, rmsnorm, gated rmsnorm,
// rope, kv_write — each CUDA op against its CPU op.
// Tolerances (fp32): gemm |Δ| <= 1e-5 + 1e-6·k + 1e-4·|want| (blocked sums of k products of
// magnitude ~1); norms 1e-5 + 1e-4·|want| (reductions in a different order); rope 1e-5 +
// 1e-4·|want| (device cosf/sinf are within 2 ulp); swiglu 1e-6 + 1e-5·|want| (expf);
// embedding, argmax and kv_write exact.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "hyserve/kernels/device.h"

#if defined(HYSERVE_HAVE_CUDA)

#include "cuda_test_util.h"
#include "hyserve/kernels/activation.h"
#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/embedding.h"
#include "hyserve/kernels/gemm.h"
#include "hyserve/kernels/norm.h"
#include "hyserve/kernels/rope.h"
#include "hyserve/kernels/sampling.h"

namespace hyserve::kernels {
namespace {

using cuda_test::expect_equal;
using cuda_test::expect_match;
using cuda_test::poison;
using cuda_test::random_floats;
using cuda_test::to_device;

// ---------------------------------------------------------------------------------------------
// gemm

struct gemm_case {
  int m, n, k;
  bool ta, tb;
  float alpha, beta;
  int pad;  // added to every leading dimension
};

std::string gemm_name(const testing::TestParamInfo<gemm_case>& info) {
  const auto& c = info.param;
  std::string s = "Cuda_f32_m" + std::to_string(c.m) + "_n" + std::to_string(c.n) + "_k" + std::to_string(c.k) +
                  (c.ta ? "_ta" : "") + (c.tb ? "_tb" : "");
  if (c.beta != 0.0f) s += "_accumulate";
  if (c.pad) s += "_padded";
  return s;
}

class GemmCuda : public testing::TestWithParam<gemm_case> {};

TEST_P(GemmCuda, MatchesCpu) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const gemm_case& c = GetParam();
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
  const auto a = random_floats(static_cast<size_t>((c.ta ? c.k : c.m) * p.lda), 1);
  const auto b = random_floats(static_cast<size_t>((c.tb ? c.n : c.k) * p.ldb), 2);
  std::vector<float> c_cpu = random_floats(static_cast<size_t>(c.m * p.ldc), 3);
  auto da = to_device(a), db = to_device(b), dc = to_device(c_cpu);

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
  expect_match(dc.download(), c_cpu, 1e-5 + 1e-6 * c.k, 1e-4, "C");
}

INSTANTIATE_TEST_SUITE_P(Grid, GemmCuda,
                         testing::Values(gemm_case{1, 4096 + 32, 4096, false, true, 1.0f, 0.0f, 0},  // decode linear
                                         gemm_case{64, 4096 + 32, 512, false, true, 1.0f, 0.0f, 0},
                                         gemm_case{37, 19, 23, false, false, 0.5f, 1.0f, 3},
                                         gemm_case{33, 65, 17, true, false, 1.0f, 0.0f, 1},
                                         gemm_case{128, 256, 64, true, true, 2.0f, 0.5f, 0}),
                         gemm_name);

// ---------------------------------------------------------------------------------------------
// embedding

struct embedding_case {
  int n_tokens, hidden, vocab_start, vocab_end;
};

class EmbeddingCuda : public testing::TestWithParam<embedding_case> {};

TEST_P(EmbeddingCuda, MatchesCpuExactly) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const embedding_case& c = GetParam();
  const int rows = c.vocab_end - c.vocab_start;
  const auto table = random_floats(static_cast<size_t>(rows) * c.hidden, 5);
  std::vector<int32_t> ids(static_cast<size_t>(c.n_tokens));
  for (int t = 0; t < c.n_tokens; ++t) ids[t] = (t * 7919) % (c.vocab_end + 40);  // some ids of other shards
  std::vector<float> out(static_cast<size_t>(c.n_tokens) * c.hidden, poison());
  auto dids = to_device(ids);
  auto dtable = to_device(table);
  device_array<float> dout(out.size());
  dout.fill_bytes(0xff);

  embedding_params p;
  p.n_tokens = c.n_tokens;
  p.hidden = c.hidden;
  p.vocab_start = c.vocab_start;
  p.vocab_end = c.vocab_end;
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

INSTANTIATE_TEST_SUITE_P(Grid, EmbeddingCuda,
                         testing::Values(embedding_case{1, 4096, 0, 1000}, embedding_case{37, 4096 + 32, 500, 1500},
                                         embedding_case{64, 4099, 0, 777}, embedding_case{5, 64, 100, 200}),
                         [](const testing::TestParamInfo<embedding_case>& tp) {
                           const auto& c = tp.param;
                           return "Cuda_f32_tokens" + std::to_string(c.n_tokens) + "_hidden" +
                                  std::to_string(c.hidden) + "_vocab" + std::to_string(c.vocab_start) + "to" +
                                  std::to_string(c.vocab_end);
                         });

// ---------------------------------------------------------------------------------------------
// swiglu

struct rows_case {
  int rows, cols, pad;  // pad: extra elements per row stride (breaks the vector path when odd)
};

std::string rows_name(const testing::TestParamInfo<rows_case>& info) {
  const auto& c = info.param;
  return "Cuda_f32_rows" + std::to_string(c.rows) + "_cols" + std::to_string(c.cols) +
         (c.pad ? "_stride" + std::to_string(c.cols + c.pad) : "");
}

class SwigluCuda : public testing::TestWithParam<rows_case> {};

TEST_P(SwigluCuda, MatchesCpu) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const rows_case& c = GetParam();
  const int64_t stride = c.cols + c.pad;
  auto gate = random_floats(static_cast<size_t>(c.rows * stride), 11, -8.0f, 8.0f);
  gate[0] = -100.0f;  // silu saturates: e^100 overflows to inf, the result is -0
  const auto up = random_floats(static_cast<size_t>(c.rows * stride), 12);
  std::vector<float> out(static_cast<size_t>(c.rows * stride), poison());
  auto dgate = to_device(gate), dup = to_device(up);
  device_array<float> dout(out.size());
  dout.fill_bytes(0xff);
  swiglu_params p;
  p.rows = c.rows;
  p.cols = c.cols;
  p.gate_stride = p.up_stride = p.out_stride = stride;
  swiglu_params pc = p;
  pc.gate = gate.data();
  pc.up = up.data();
  pc.out = out.data();
  run_cpu(pc);
  swiglu_params pg = p;
  pg.gate = dgate.data();
  pg.up = dup.data();
  pg.out = dout.data();
  run_cuda(pg);
  device_synchronize();
  expect_match(dout.download(), out, 1e-6, 1e-5, "out");
}

INSTANTIATE_TEST_SUITE_P(Grid, SwigluCuda,
                         testing::Values(rows_case{1, 14336, 0}, rows_case{64, 4096 + 32, 0}, rows_case{3, 13, 0},
                                         rows_case{7, 1000, 3}, rows_case{256, 512, 0}),
                         rows_name);

// relu² (Nemotron-H MLP), in place, against the CPU op; negatives and zeros included.
class Relu2Cuda : public testing::TestWithParam<rows_case> {};

TEST_P(Relu2Cuda, MatchesCpu) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const rows_case& c = GetParam();
  const int64_t stride = c.cols + c.pad;
  auto x = random_floats(static_cast<size_t>(c.rows * stride), 13, -4.0f, 4.0f);
  x[0] = 0.0f;
  auto dx = to_device(x);
  relu2_params p;
  p.rows = c.rows;
  p.cols = c.cols;
  p.stride = stride;
  relu2_params pc = p;
  pc.x = x.data();
  run_cpu(pc);
  relu2_params pg = p;
  pg.x = dx.data();
  run_cuda(pg);
  device_synchronize();
  expect_match(dx.download(), x, 0.0, 0.0, "x");
}

INSTANTIATE_TEST_SUITE_P(Grid, Relu2Cuda,
                         testing::Values(rows_case{1, 14336, 0}, rows_case{3, 13, 0}, rows_case{7, 1000, 3}),
                         rows_name);

// ---------------------------------------------------------------------------------------------
// argmax

class ArgmaxCuda : public testing::TestWithParam<rows_case> {};

TEST_P(ArgmaxCuda, MatchesCpuExactly) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const rows_case& c = GetParam();
  const int64_t stride = c.cols + c.pad;
  auto logits = random_floats(static_cast<size_t>(c.rows * stride), 21, -10.0f, 10.0f);
  for (int r = 0; r < c.rows; ++r) {
    float* row = logits.data() + r * stride;
    if (r % 3 == 1 && c.cols > 2) {  // tie between two positions: the lower index wins
      row[c.cols - 1] = 50.0f;
      row[c.cols / 2] = 50.0f;
    }
    if (r % 3 == 2) {  // no value above -inf: index 0
      for (int v = 0; v < c.cols; ++v) row[v] = -std::numeric_limits<float>::infinity();
    }
  }
  auto dl = to_device(logits);
  device_array<int32_t> dout(static_cast<size_t>(c.rows));
  dout.fill_bytes(0xff);
  std::vector<int32_t> out(static_cast<size_t>(c.rows), -1);
  argmax_params p;
  p.rows = c.rows;
  p.vocab = c.cols;
  p.stride = stride;
  argmax_params pc = p;
  pc.logits = logits.data();
  pc.out = out.data();
  run_cpu(pc);
  argmax_params pg = p;
  pg.logits = dl.data();
  pg.out = dout.data();
  run_cuda(pg);
  device_synchronize();
  expect_equal(dout.download(), out, "argmax");
}

INSTANTIATE_TEST_SUITE_P(Grid, ArgmaxCuda,
                         testing::Values(rows_case{1, 152064, 0}, rows_case{64, 152064, 0}, rows_case{7, 4099, 5},
                                         rows_case{3, 1, 0}, rows_case{256, 32000, 0}),
                         rows_name);

// ---------------------------------------------------------------------------------------------
// rmsnorm

struct norm_case {
  int rows, cols, pad;
  bool in_place;
};

class RmsnormCuda : public testing::TestWithParam<norm_case> {};

TEST_P(RmsnormCuda, MatchesCpu) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const norm_case& c = GetParam();
  const int64_t stride = c.cols + c.pad;
  std::vector<float> x = random_floats(static_cast<size_t>(c.rows * stride), 31, -3.0f, 3.0f);
  const auto w = random_floats(static_cast<size_t>(c.cols), 32, 0.5f, 1.5f);
  std::vector<float> out(x.size(), poison());
  auto dx = to_device(x), dw = to_device(w);
  device_array<float> dout(out.size());
  dout.fill_bytes(0xff);
  rmsnorm_params p;
  p.rows = c.rows;
  p.cols = c.cols;
  p.x_stride = p.out_stride = stride;
  p.eps = 1e-5f;
  rmsnorm_params pc = p;
  pc.x = x.data();
  pc.weight = w.data();
  pc.out = c.in_place ? x.data() : out.data();
  run_cpu(pc);
  rmsnorm_params pg = p;
  pg.x = dx.data();
  pg.weight = dw.data();
  pg.out = c.in_place ? dx.data() : dout.data();
  run_cuda(pg);
  device_synchronize();
  if (c.in_place)
    expect_match(dx.download(), x, 1e-5, 1e-4, "x (in place)");
  else
    expect_match(dout.download(), out, 1e-5, 1e-4, "out");
}

// groups (per-head norms, a weight per head): Qwen3-Next's q | k heads of a stacked projection
// row (16 + 2 heads of 256, row stride 2·16·256 + 4·256), and a small unaligned case.
TEST(RmsnormCudaGroups, MatchesCpu) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  struct shape {
    int64_t rows, cols, groups, stride, weight_stride;
  };
  for (const shape s : {shape{1, 256, 18, 2 * 16 * 256 + 4 * 256, 256}, shape{5, 256, 18, 10240, 256},
                        shape{3, 33, 4, 140, 0}, shape{2, 64, 3, 200, 64}}) {
    std::vector<float> x = random_floats(static_cast<size_t>(s.rows * s.stride), 41, -3.0f, 3.0f);
    const auto w = random_floats(static_cast<size_t>(s.groups * s.cols), 42, 0.5f, 1.5f);
    auto dx = to_device(x), dw = to_device(w);
    rmsnorm_params p;
    p.rows = s.rows;
    p.cols = s.cols;
    p.groups = s.groups;
    p.weight_stride = s.weight_stride;
    p.x_stride = p.out_stride = s.stride;
    p.eps = 1e-6f;
    rmsnorm_params pc = p;
    pc.x = pc.out = x.data();
    pc.weight = w.data();
    run_cpu(pc);
    rmsnorm_params pg = p;
    pg.x = pg.out = dx.data();
    pg.weight = dw.data();
    run_cuda(pg);
    device_synchronize();
    expect_match(dx.download(), x, 1e-5, 1e-4, "x (in place), cols " + std::to_string(s.cols));
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, RmsnormCuda,
                         testing::Values(norm_case{1, 4096 + 32, 0, false}, norm_case{64, 4096, 0, false},
                                         norm_case{5, 33, 2, false}, norm_case{256, 2048, 0, true},
                                         norm_case{3, 8192, 7, true}),
                         [](const testing::TestParamInfo<norm_case>& tp) {
                           const auto& c = tp.param;
                           return "Cuda_f32_rows" + std::to_string(c.rows) + "_cols" + std::to_string(c.cols) +
                                  (c.pad ? "_padded" : "") + (c.in_place ? "_inplace" : "");
                         });

// ---------------------------------------------------------------------------------------------
// gated rmsnorm: normal, phase 1 (sumsq_out) and phase 2 (sumsq_in with the global group size),
// the norm after the gate or before it (norm_before_gate)

enum class gated_mode { kNormal, kPhase1, kPhase2 };

struct gated_case {
  int rows, cols, groups, pad;
  gated_mode mode;
  bool in_place;
  bool before_gate = false;
};

class GatedRmsnormCuda : public testing::TestWithParam<gated_case> {};

TEST_P(GatedRmsnormCuda, MatchesCpu) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const gated_case& c = GetParam();
  const int64_t stride = c.cols + c.pad;
  const int64_t gs = c.cols / c.groups;
  std::vector<float> x = random_floats(static_cast<size_t>(c.rows * stride), 41, -3.0f, 3.0f);
  const auto z = random_floats(static_cast<size_t>(c.rows * stride), 42, -4.0f, 4.0f);
  const auto w = random_floats(static_cast<size_t>(c.cols), 43, 0.5f, 1.5f);
  const auto ss_in = random_floats(static_cast<size_t>(c.rows * c.groups), 44, 10.0f, 1000.0f);
  std::vector<float> out(x.size(), poison());
  std::vector<float> ss_out(static_cast<size_t>(c.rows * c.groups), poison());
  auto dx = to_device(x), dz = to_device(z), dw = to_device(w), dss_in = to_device(ss_in);
  device_array<float> dout(out.size()), dss_out(ss_out.size());
  dout.fill_bytes(0xff);
  dss_out.fill_bytes(0xff);

  gated_rmsnorm_params p;
  p.rows = c.rows;
  p.cols = c.cols;
  p.x_stride = p.gate_stride = p.out_stride = stride;
  p.group_size = gs;
  p.eps = 1e-5f;
  p.norm_before_gate = c.before_gate;
  if (c.mode == gated_mode::kPhase2) p.group_count = 2 * gs;  // as if split over two ranks
  gated_rmsnorm_params pc = p;
  pc.x = x.data();
  pc.gate = z.data();
  pc.weight = w.data();
  pc.out = c.in_place ? x.data() : out.data();
  if (c.mode == gated_mode::kPhase1) pc.sumsq_out = ss_out.data();
  if (c.mode == gated_mode::kPhase2) pc.sumsq_in = ss_in.data();
  run_cpu(pc);
  gated_rmsnorm_params pg = p;
  pg.x = dx.data();
  pg.gate = dz.data();
  pg.weight = dw.data();
  pg.out = c.in_place ? dx.data() : dout.data();
  if (c.mode == gated_mode::kPhase1) pg.sumsq_out = dss_out.data();
  if (c.mode == gated_mode::kPhase2) pg.sumsq_in = dss_in.data();
  run_cuda(pg);
  device_synchronize();
  if (c.mode == gated_mode::kPhase1) {
    expect_match(dss_out.download(), ss_out, 1e-4, 1e-4, "sumsq_out");
    expect_match(dx.download(), x, 0.0, 0.0, "x untouched in phase 1");
  } else if (c.in_place) {
    expect_match(dx.download(), x, 1e-5, 1e-4, "x (in place)");
  } else {
    expect_match(dout.download(), out, 1e-5, 1e-4, "out");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Grid, GatedRmsnormCuda,
    testing::Values(gated_case{1, 8192, 1, 0, gated_mode::kNormal, false},   // Mamba2 decode, one group
                    gated_case{64, 8192, 8, 0, gated_mode::kNormal, false},  // 8 groups
                    gated_case{5, 4096 + 32, 1, 0, gated_mode::kNormal, true},
                    gated_case{7, 99, 3, 2, gated_mode::kNormal, false},     // odd group size, padded
                    gated_case{16, 4096, 1, 0, gated_mode::kPhase1, false},
                    gated_case{16, 4096, 4, 1, gated_mode::kPhase1, false},
                    gated_case{16, 4096, 1, 0, gated_mode::kPhase2, false},
                    gated_case{9, 4096, 2, 3, gated_mode::kPhase2, true},
                    // Register kernel: 1, 2 and 4 packs per thread, a partial last warp, in place,
                    // both phases at the decode shape; and a group too wide for it (two passes).
                    gated_case{1, 8192, 1, 4, gated_mode::kNormal, true},
                    gated_case{3, 16384, 1, 0, gated_mode::kNormal, false},
                    gated_case{2, 12288, 1, 0, gated_mode::kNormal, false},
                    gated_case{5, 8192, 32, 0, gated_mode::kNormal, false},
                    gated_case{2, 4 * 1000, 1, 0, gated_mode::kNormal, false},
                    gated_case{1, 8192, 1, 0, gated_mode::kPhase1, false},
                    gated_case{1, 8192, 1, 0, gated_mode::kPhase2, true},
                    gated_case{2, 40960, 1, 0, gated_mode::kNormal, false},
                    // Before the gate (Falcon-H1): register kernel in every mode, the two-pass
                    // kernel vectorised and scalar.
                    gated_case{4, 8192, 2, 0, gated_mode::kNormal, false, true},
                    gated_case{4, 8192, 2, 0, gated_mode::kPhase1, false, true},
                    gated_case{4, 8192, 2, 4, gated_mode::kPhase2, true, true},
                    gated_case{2, 40960, 1, 0, gated_mode::kNormal, false, true},
                    gated_case{2, 40960, 1, 0, gated_mode::kPhase2, false, true},
                    gated_case{7, 99, 3, 2, gated_mode::kNormal, false, true},
                    gated_case{7, 99, 3, 2, gated_mode::kPhase1, false, true}),
    [](const testing::TestParamInfo<gated_case>& tp) {
      const auto& c = tp.param;
      const char* mode = c.mode == gated_mode::kNormal ? "" : c.mode == gated_mode::kPhase1 ? "_phase1" : "_phase2";
      return "Cuda_f32_rows" + std::to_string(c.rows) + "_cols" + std::to_string(c.cols) + "_groups" +
             std::to_string(c.groups) + (c.pad ? "_padded" : "") + mode + (c.in_place ? "_inplace" : "") +
             (c.before_gate ? "_before_gate" : "");
    });

// ---------------------------------------------------------------------------------------------
// rope

struct rope_case {
  int n_tokens, q_heads, kv_heads, head_dim, rotary_dim, pad;
};

class RopeCuda : public testing::TestWithParam<rope_case> {};

TEST_P(RopeCuda, MatchesCpu) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const rope_case& c = GetParam();
  const int64_t qs = static_cast<int64_t>(c.q_heads) * c.head_dim + c.pad;
  const int64_t ks = static_cast<int64_t>(c.kv_heads) * c.head_dim + c.pad;
  std::vector<float> q = random_floats(static_cast<size_t>(c.n_tokens * qs), 51);
  std::vector<float> k = random_floats(static_cast<size_t>(c.n_tokens * ks + 1), 52);
  std::vector<int32_t> pos(static_cast<size_t>(c.n_tokens));
  for (int t = 0; t < c.n_tokens; ++t) pos[t] = t % 2 == 0 ? t : 100000 + 37 * t;  // small and long-context positions
  auto dq = to_device(q), dk = to_device(k);
  auto dpos = to_device(pos);
  rope_params p;
  p.n_tokens = c.n_tokens;
  p.n_q_heads = c.q_heads;
  p.n_kv_heads = c.kv_heads;
  p.head_dim = c.head_dim;
  p.rotary_dim = c.rotary_dim;
  p.q_stride = qs;
  p.k_stride = ks;
  p.theta = 1e6f;
  rope_params pc = p;
  pc.q = q.data();
  pc.k = c.kv_heads > 0 ? k.data() : nullptr;
  pc.positions = pos.data();
  run_cpu(pc);
  rope_params pg = p;
  pg.q = dq.data();
  pg.k = c.kv_heads > 0 ? dk.data() : nullptr;
  pg.positions = dpos.data();
  run_cuda(pg);
  device_synchronize();
  expect_match(dq.download(), q, 1e-5, 1e-4, "q");
  expect_match(dk.download(), k, 1e-5, 1e-4, "k");
}

INSTANTIATE_TEST_SUITE_P(Grid, RopeCuda,
                         testing::Values(rope_case{1, 32, 8, 128, 128, 0}, rope_case{37, 32, 8, 128, 64, 0},
                                         rope_case{64, 4, 2, 32, 16, 3}, rope_case{5, 8, 0, 64, 64, 1},
                                         rope_case{3, 16, 16, 256, 256, 0}),
                         [](const testing::TestParamInfo<rope_case>& tp) {
                           const auto& c = tp.param;
                           return "Cuda_f32_tokens" + std::to_string(c.n_tokens) + "_qheads" +
                                  std::to_string(c.q_heads) + "_kvheads" + std::to_string(c.kv_heads) + "_hd" +
                                  std::to_string(c.head_dim) + "_rd" + std::to_string(c.rotary_dim) +
                                  (c.pad ? "_padded" : "");
                         });

// ---------------------------------------------------------------------------------------------
// kv_write

struct kv_write_case {
  int n_tokens, kv_heads, head_dim, pad;
  bool padding_rows;  // every third token has loc -1
};

class KvWriteCuda : public testing::TestWithParam<kv_write_case> {};

TEST_P(KvWriteCuda, MatchesCpuExactly) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const kv_write_case& c = GetParam();
  const int64_t row = static_cast<int64_t>(c.kv_heads) * c.head_dim;
  const int64_t stride = row + c.pad;
  const int64_t n_locs = 3 * c.n_tokens + 5;
  const auto k = random_floats(static_cast<size_t>(c.n_tokens * stride), 61);
  const auto v = random_floats(static_cast<size_t>(c.n_tokens * stride), 62);
  std::vector<int32_t> locs(static_cast<size_t>(c.n_tokens));
  for (int t = 0; t < c.n_tokens; ++t) locs[t] = (c.padding_rows && t % 3 == 1) ? -1 : static_cast<int32_t>(n_locs - 1 - 3 * t);
  std::vector<float> kc(static_cast<size_t>(n_locs * row), poison()), vc = kc;
  auto dk = to_device(k), dv = to_device(v);
  auto dlocs = to_device(locs);
  device_array<float> dkc(kc.size()), dvc(vc.size());
  dkc.fill_bytes(0xff);
  dvc.fill_bytes(0xff);
  kv_write_params p;
  p.n_tokens = c.n_tokens;
  p.kv_heads = c.kv_heads;
  p.head_dim = c.head_dim;
  p.k_stride = p.v_stride = stride;
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
  expect_match(dkc.download(), kc, 0.0, 0.0, "k_cache");
  expect_match(dvc.download(), vc, 0.0, 0.0, "v_cache");
}

INSTANTIATE_TEST_SUITE_P(Grid, KvWriteCuda,
                         testing::Values(kv_write_case{1, 8, 128, 0, false}, kv_write_case{64, 8, 128, 0, true},
                                         kv_write_case{5, 2, 32, 3, true}, kv_write_case{33, 1, 64, 0, false}),
                         [](const testing::TestParamInfo<kv_write_case>& tp) {
                           const auto& c = tp.param;
                           return "Cuda_f32_tokens" + std::to_string(c.n_tokens) + "_kvheads" +
                                  std::to_string(c.kv_heads) + "_hd" + std::to_string(c.head_dim) +
                                  (c.pad ? "_padded" : "") + (c.padding_rows ? "_pad" : "");
                         });

// kv_write with the rotary embedding folded in (one kernel): the same bits as the CUDA rope op
// and then the CUDA kv_write (q and k rotated in place, the cache holding the rotated k), and the
// CPU ops' values within the rope tolerance; f32 and bf16 caches, padding rows, partial rotary.
struct rope_kv_case {
  int n_tokens, q_heads, kv_heads, head_dim, rotary_dim;
  bool bf16;
};

class KvWriteRopeCuda : public testing::TestWithParam<rope_kv_case> {};

TEST_P(KvWriteRopeCuda, EqualsRopeThenKvWrite) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const rope_kv_case& c = GetParam();
  const int64_t qw = static_cast<int64_t>(c.q_heads) * c.head_dim, kw = static_cast<int64_t>(c.kv_heads) * c.head_dim;
  const int64_t ld = qw + 2 * kw;  // q | k | v rows, as the fused projection leaves them
  const int64_t n_locs = 2 * c.n_tokens + 3;
  const std::vector<float> qkv = random_floats(static_cast<size_t>(c.n_tokens * ld), 71);
  std::vector<int32_t> locs(static_cast<size_t>(c.n_tokens)), pos(static_cast<size_t>(c.n_tokens));
  for (int t = 0; t < c.n_tokens; ++t) {
    locs[t] = t % 4 == 3 ? -1 : static_cast<int32_t>(n_locs - 1 - 2 * t);
    pos[t] = t % 2 == 0 ? 7 * t : 50000 + 13 * t;
  }
  const dtype cache_type = c.bf16 ? dtype::kBF16 : dtype::kF32;
  const size_t cache_bytes = static_cast<size_t>(n_locs * kw) * dtype_size(cache_type);
  auto dlocs = to_device(locs), dpos = to_device(pos);
  // arm 0: rope then kv_write; arm 1: kv_write with rope.
  std::vector<device_array<float>> rows;
  std::vector<device_array<uint8_t>> kc, vc;
  for (int arm = 0; arm < 2; ++arm) {
    rows.push_back(to_device(qkv));
    kc.emplace_back(cache_bytes);
    vc.emplace_back(cache_bytes);
    kc.back().fill_bytes(0xff);
    vc.back().fill_bytes(0xff);
  }
  auto params = [&](int arm) {
    kv_write_params p;
    p.k = rows[arm].data() + qw;
    p.v = rows[arm].data() + qw + kw;
    p.locs = dlocs.data();
    p.k_cache = kc[arm].data();
    p.v_cache = vc[arm].data();
    p.n_tokens = c.n_tokens;
    p.kv_heads = c.kv_heads;
    p.head_dim = c.head_dim;
    p.k_stride = p.v_stride = ld;
    p.kv_dtype = cache_type;
    rope_params& r = p.rope;
    r.q = rows[arm].data();
    r.k = rows[arm].data() + qw;
    r.positions = dpos.data();
    r.n_tokens = c.n_tokens;
    r.n_q_heads = c.q_heads;
    r.n_kv_heads = c.kv_heads;
    r.head_dim = c.head_dim;
    r.rotary_dim = c.rotary_dim;
    r.q_stride = r.k_stride = ld;
    r.theta = 1e6f;
    return p;
  };
  kv_write_params apart = params(0);
  run_cuda(apart.rope);
  apart.rope = rope_params{};
  run_cuda(apart);
  run_cuda(params(1));
  device_synchronize();
  expect_equal(rows[1].download(), rows[0].download(), "q | k | v rows");
  expect_equal(kc[1].download(), kc[0].download(), "k_cache");
  expect_equal(vc[1].download(), vc[0].download(), "v_cache");
  // Against the CPU ops (an f32 cache: the rotation's tolerance as RopeCuda's).
  if (c.bf16) return;
  std::vector<float> host = qkv, kh(static_cast<size_t>(n_locs * kw), poison()), vh(kh.size(), poison());
  kv_write_params pc = params(1);
  pc.k = host.data() + qw;
  pc.v = host.data() + qw + kw;
  pc.locs = locs.data();
  pc.k_cache = kh.data();
  pc.v_cache = vh.data();
  pc.rope.q = host.data();
  pc.rope.k = host.data() + qw;
  pc.rope.positions = pos.data();
  run_cpu(pc);
  std::vector<float> got_k(kh.size()), got_v(vh.size());
  const std::vector<uint8_t> kb = kc[1].download(), vb = vc[1].download();
  std::memcpy(got_k.data(), kb.data(), kb.size());
  std::memcpy(got_v.data(), vb.data(), vb.size());
  expect_match(rows[1].download(), host, 1e-5, 1e-4, "q | k | v rows");
  expect_match(got_k, kh, 1e-5, 1e-4, "k_cache");
  expect_match(got_v, vh, 0.0, 0.0, "v_cache");
}

INSTANTIATE_TEST_SUITE_P(Grid, KvWriteRopeCuda,
                         testing::Values(rope_kv_case{1, 32, 8, 128, 128, false}, rope_kv_case{13, 16, 2, 64, 32, false},
                                         rope_kv_case{9, 8, 8, 256, 64, true}, rope_kv_case{64, 32, 4, 128, 128, true}),
                         [](const testing::TestParamInfo<rope_kv_case>& tp) {
                           const auto& c = tp.param;
                           return std::string(c.bf16 ? "Cuda_bf16cache" : "Cuda_f32cache") + "_tokens" +
                                  std::to_string(c.n_tokens) + "_qheads" + std::to_string(c.q_heads) + "_kvheads" +
                                  std::to_string(c.kv_heads) + "_hd" + std::to_string(c.head_dim) + "_rd" +
                                  std::to_string(c.rotary_dim);
                         });

}  // namespace
}  // namespace hyserve::kernels

#else  // no CUDA backend in this build

TEST(CudaOps, BackendNotBuilt) { GTEST_SKIP() << "CUDA backend not built"; }

#endif
