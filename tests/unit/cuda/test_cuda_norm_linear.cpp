// The rmsnorm_linear op on CUDA (the decode linear layer with its input RMSNorm fused in: one
// kernel for bf16 weights and m <= 4) against the CPU op (the rmsnorm op, then the gemm or
// swiglu_linear op) on the same data. The kernel multiplies f32 activations like the CPU op;
// only summation orders differ: |Δ| <= 1e-5 + 1e-6·k + 1e-5·|want| (gemm), 1e-4 relative for the
// swiglu product. Also: the fused kernel equals the unfused CUDA ops (the rmsnorm op into a
// scratch block, then the skinny gemm / swiglu_linear op) bit for bit, so decode through either
// path (and an m-row verify step) gives the same logits; with normed_out set (every case with
// the norm) the normed rows written there equal the rmsnorm op's bit for bit and the CPU op's
// within 1e-6 + 1e-6·|want|. Covers the norm on and off, beta 0/1
// (the residual epilogue), swiglu, the squared-ReLU epilogue, m 1..4, odd n, padded strides, k of the production shapes
// (4096; 8192 without the norm at m > 1), and the unfused fallback (f32 weights, m > 4); every
// case again with kernels.norm_linear_wide on, with kernels.norm_linear_rows: 4, and with
// kernels.norm_linear_spread. Skips without a device.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "hyserve/kernels/device.h"

#if defined(HYSERVE_HAVE_CUDA)

#include "cuda_test_util.h"
#include "hyserve/common/dtype.h"
#include "hyserve/kernels/activation.h"
#include "hyserve/kernels/gemm.h"
#include "hyserve/kernels/norm.h"
#include "hyserve/kernels/paths.h"

namespace hyserve::kernels {
namespace {

using cuda_test::expect_match;
using cuda_test::random_floats;

struct nl_case {
  int64_t m, n, k;
  int64_t pad;  // extra elements per row of x and w (a multiple of 8)
  bool norm, swiglu;
  float beta;
  bool bf16 = true;
  bool relu2 = false;  // the squared-ReLU epilogue (Nemotron-H's MLP up projection)
};

std::string name_of(const testing::TestParamInfo<nl_case>& i) {
  const nl_case& c = i.param;
  return "m" + std::to_string(c.m) + "_n" + std::to_string(c.n) + "_k" + std::to_string(c.k) + "_pad" +
         std::to_string(c.pad) + (c.norm ? "_norm" : "") + (c.swiglu ? "_swiglu" : "") + (c.beta != 0 ? "_acc" : "") +
         (c.bf16 ? "" : "_f32") + (c.relu2 ? "_relu2" : "");
}

class NormLinearCuda : public testing::TestWithParam<nl_case> {};

void check_case(const nl_case& c) {
  rmsnorm_linear_params p;
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  p.x_stride = c.k + c.pad;
  p.w_stride = c.k + c.pad;
  p.out_stride = c.n + 3;
  p.eps = 1e-5f;
  p.beta = c.beta;
  p.relu2 = c.relu2;
  p.w_dtype = c.bf16 ? dtype::kBF16 : dtype::kF32;
  const std::vector<float> x = random_floats(static_cast<size_t>(c.m * p.x_stride), 21, -2.0f, 2.0f);
  const std::vector<float> g = random_floats(static_cast<size_t>(c.k), 22, 0.5f, 1.5f);
  std::vector<float> w0 = random_floats(static_cast<size_t>(c.n * p.w_stride), 23, -0.05f, 0.05f);
  std::vector<float> w1 = random_floats(static_cast<size_t>(c.n * p.w_stride), 24, -0.05f, 0.05f);
  std::vector<uint16_t> b0(w0.size()), b1(w1.size());
  for (size_t i = 0; i < w0.size(); ++i) {
    b0[i] = f32_to_bf16(w0[i]);
    b1[i] = f32_to_bf16(w1[i]);
  }
  const std::vector<float> out0 = random_floats(static_cast<size_t>(c.m * p.out_stride), 25);

  // CPU reference.
  std::vector<float> want = out0;
  rmsnorm_linear_params pc = p;
  pc.x = x.data();
  pc.norm_weight = c.norm ? g.data() : nullptr;
  pc.w = c.bf16 ? static_cast<const void*>(b0.data()) : w0.data();
  pc.up_w = c.swiglu ? (c.bf16 ? static_cast<const void*>(b1.data()) : w1.data()) : nullptr;
  pc.out = want.data();
  // normed_out (with the norm): the normed rows themselves, for the layer's other consumers.
  std::vector<float> want_xn(static_cast<size_t>(c.m * c.k), cuda_test::poison());
  pc.normed_out = c.norm ? want_xn.data() : nullptr;
  run_cpu(pc);

  device_array<float> dx(x), dg(g), dout(out0), dunf(out0);
  device_array<uint16_t> db0(b0), db1(b1);
  device_array<float> dw0(w0), dw1(w1);
  rmsnorm_linear_params pg = p;
  pg.x = dx.data();
  pg.norm_weight = c.norm ? dg.data() : nullptr;
  pg.w = c.bf16 ? static_cast<const void*>(db0.data()) : dw0.data();
  pg.up_w = c.swiglu ? (c.bf16 ? static_cast<const void*>(db1.data()) : dw1.data()) : nullptr;
  pg.out = dout.data();
  device_array<float> dxn(std::vector<float>(static_cast<size_t>(c.m * c.k), cuda_test::poison()));
  pg.normed_out = c.norm ? dxn.data() : nullptr;
  run_cuda(pg);
  device_synchronize();
  const std::vector<float> got = dout.download();
  const std::vector<float> got_xn = dxn.download();
  if (c.norm) expect_match(got_xn, want_xn, 1e-6, 1e-6, "normed_out");
  if (c.bf16) {
    expect_match(got, want, 1e-5 + 1e-6 * static_cast<double>(c.k), c.swiglu || c.relu2 ? 1e-4 : 1e-5, "out");
  } else {
    // f32 weights: cuBLAS SGEMM (fp32, no TF32) after the rmsnorm op.
    expect_match(got, want, 1e-4 + 1e-6 * static_cast<double>(c.k), 1e-4, "out");
  }

  // The unfused CUDA ops on the same data: bitwise equal.
  if (!c.bf16) return;
  device_array<float> xn(std::vector<float>(static_cast<size_t>(c.m * c.k), 0.0f));
  const float* a = dx.data();
  int64_t lda = p.x_stride;
  if (c.norm) {
    rmsnorm_params r;
    r.x = dx.data();
    r.weight = dg.data();
    r.out = xn.data();
    r.rows = c.m;
    r.cols = c.k;
    r.x_stride = p.x_stride;
    r.out_stride = c.k;
    r.eps = p.eps;
    run_cuda(r);
    a = xn.data();
    lda = c.k;
  }
  if (c.swiglu) {
    swiglu_linear_params s;
    s.x = a;
    s.gate_w = db0.data();
    s.up_w = db1.data();
    s.w_dtype = dtype::kBF16;
    s.out = dunf.data();
    s.m = c.m;
    s.n = c.n;
    s.k = c.k;
    s.x_stride = lda;
    s.w_stride = p.w_stride;
    s.out_stride = p.out_stride;
    run_cuda(s);
  } else {
    gemm_params q;
    q.a = a;
    q.b = db0.data();
    q.b_dtype = dtype::kBF16;
    q.c = dunf.data();
    q.m = c.m;
    q.n = c.n;
    q.k = c.k;
    q.lda = lda;
    q.ldb = p.w_stride;
    q.ldc = p.out_stride;
    q.trans_b = true;
    q.beta = c.beta;
    run_cuda(q);
    if (c.relu2) {
      relu2_params r;
      r.x = dunf.data();
      r.rows = c.m;
      r.cols = c.n;
      r.stride = p.out_stride;
      run_cuda(r);
    }
  }
  device_synchronize();
  const std::vector<float> unfused = dunf.download();
  ASSERT_EQ(unfused.size(), got.size());
  int64_t diff = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &unfused[i], sizeof(float)) != 0) ++diff;
  EXPECT_EQ(diff, 0) << "elements of the fused kernel's output that differ from the unfused CUDA ops";
  if (c.norm) {  // normed_out is the rmsnorm op's output bit for bit
    const std::vector<float> op_xn = xn.download();
    int64_t xdiff = 0;
    for (size_t i = 0; i < op_xn.size(); ++i)
      if (std::memcmp(&got_xn[i], &op_xn[i], sizeof(float)) != 0) ++xdiff;
    EXPECT_EQ(xdiff, 0) << "elements of normed_out that differ from the rmsnorm op";
  }
}

// check_case with the kernel paths `set` turns on (for the test's scope).
template <class Set>
void check_case_with(const nl_case& c, Set set) {
  kernel_paths paths;
  set(paths);
  const paths_scope scope(paths);
  check_case(c);
}

TEST_P(NormLinearCuda, MatchesCpuAndUnfusedCuda) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  check_case(GetParam());
}

// kernels.norm_linear_wide: the shapes it takes (one row, no norm, k <= 4096, one wave) load a
// warp's whole task before the wait; the same checks, the same bits as the unfused ops.
TEST_P(NormLinearCuda, WideLoadsMatchCpuAndUnfusedCuda) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  check_case_with(GetParam(), [](kernel_paths& k) { k.norm_linear_wide = true; });
}

// kernels.norm_linear_rows: 4 weight rows a task (each chunk of x loaded once for four rows):
// the same checks, the same bits as the unfused ops (swiglu cases keep their two rows a task).
TEST_P(NormLinearCuda, FourRowsATaskMatchCpuAndUnfusedCuda) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  check_case_with(GetParam(), [](kernel_paths& k) { k.norm_linear_rows = 4; });
}

// kernels.norm_linear_spread: the tasks spread over a grid of the resident blocks (task t to
// block t mod grid): the same checks, the same bits as the unfused ops; again with four rows a
// task and with one block an SM.
TEST_P(NormLinearCuda, SpreadTasksMatchCpuAndUnfusedCuda) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  check_case_with(GetParam(), [](kernel_paths& k) { k.norm_linear_spread = true; });
  check_case_with(GetParam(), [](kernel_paths& k) {
    k.norm_linear_spread = true;
    k.norm_linear_rows = 4;
    k.norm_linear_blocks_per_sm = 1;
  });
}

INSTANTIATE_TEST_SUITE_P(
    Grid, NormLinearCuda,
    testing::Values(nl_case{1, 16768, 4096, 0, true, false, 0.0f},   // Mamba2 in_proj with the input norm
                    nl_case{1, 14336, 4096, 0, true, true, 0.0f},    // pre-FF norm + gate/up (swiglu)
                    nl_case{1, 4096, 8192, 0, false, false, 1.0f},   // out_proj into the residual
                    nl_case{1, 4096, 14336, 0, false, false, 1.0f},  // MLP down into the residual
                    nl_case{1, 32000, 4096, 0, true, false, 0.0f},   // final norm + lm_head
                    nl_case{2, 1025, 4096, 8, true, false, 0.0f},    // odd n, padded, two rows
                    nl_case{3, 333, 512, 16, true, true, 0.0f},      // padded strides, swiglu
                    nl_case{4, 777, 1024, 8, true, false, 0.0f},     // four rows with the norm
                    nl_case{4, 513, 8192, 0, false, false, 1.0f},    // four rows without
                    nl_case{2, 4096, 8192, 0, true, false, 0.0f},    // staging too large: unfused
                    nl_case{6, 300, 256, 0, true, true, 0.0f},       // m > 4: unfused
                    nl_case{1, 300, 256, 0, true, false, 1.0f, false},  // f32 weights: unfused
                    nl_case{1, 7, 8, 0, true, false, 0.0f},          // tiny
                    // k not a whole number of load steps (513 chunks: a partial last step after
                    // the step loaded before the wait), with and without the norm
                    nl_case{1, 2049, 4104, 0, false, false, 1.0f},
                    nl_case{2, 999, 4104, 8, true, true, 0.0f},
                    nl_case{3, 1001, 4104, 0, true, false, 0.0f},
                    // relu2(xn · upᵀ): Nemotron-H-8B's MLP up projection, a partial last step at
                    // three rows, and the unfused path (m > 4)
                    nl_case{1, 21504, 4096, 0, true, false, 0.0f, true, true},
                    nl_case{3, 1001, 4104, 0, true, false, 0.0f, true, true},
                    nl_case{6, 300, 256, 0, true, false, 0.0f, true, true},
                    // out_proj shapes of one row (kernels.norm_linear_wide takes them): Qwen3-Next's
                    // GDN and attention (4096 -> 2048), Granite-4.0-H-Tiny's Mamba2 (3072 -> 1536,
                    // padded), k = 2056 (a partial step), a tiny one
                    nl_case{1, 2048, 4096, 0, false, false, 1.0f},
                    nl_case{1, 1536, 3072, 8, false, false, 1.0f},
                    nl_case{1, 999, 2056, 0, false, false, 0.0f},
                    nl_case{1, 3, 64, 0, false, false, 0.0f}),
    name_of);

// With a gate: a mixer's gated output norm inside its out_proj (Gated DeltaNet: norm before the
// gate, a group per head; Mamba2: after the gate, one or several groups), into the residual
// (beta 1), with kernels.norm_linear_gate on and (the default) off. The fused kernel sums each
// group's squares in another order than the gated norm op,
// so: the output against the CPU op (the gated_rmsnorm op, then the gemm) within
// 1e-5 + 1e-6·k + 1e-5·|want|, normed_out within 1e-5·(1 + |want|); shapes past the fused
// kernel's limits (staging over 46 KB, groups not a multiple of 4 channels) take the unfused ops.
struct gated_case {
  int64_t m, n, k, group, gate_stride;
  bool before_gate;
};

class NormLinearCudaGated : public testing::TestWithParam<gated_case> {};

TEST_P(NormLinearCudaGated, MatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const gated_case& c = GetParam();
  rmsnorm_linear_params p;
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  p.x_stride = c.k;
  p.w_stride = c.k;
  p.out_stride = c.n;
  p.eps = 1e-6f;
  p.beta = 1.0f;
  p.w_dtype = dtype::kBF16;
  p.gate_stride = c.gate_stride;
  p.norm_group = c.group;
  p.norm_before_gate = c.before_gate;
  const std::vector<float> x = random_floats(static_cast<size_t>(c.m * c.k), 31, -2.0f, 2.0f);
  const std::vector<float> z = random_floats(static_cast<size_t>(c.m * c.gate_stride), 32, -3.0f, 3.0f);
  const std::vector<float> g = random_floats(static_cast<size_t>(c.k), 33, 0.5f, 1.5f);
  const std::vector<float> w = random_floats(static_cast<size_t>(c.n * c.k), 34, -0.05f, 0.05f);
  std::vector<uint16_t> b(w.size());
  for (size_t i = 0; i < w.size(); ++i) b[i] = f32_to_bf16(w[i]);
  const std::vector<float> out0 = random_floats(static_cast<size_t>(c.m * c.n), 35);

  std::vector<float> want = out0, want_xn(static_cast<size_t>(c.m * c.k), cuda_test::poison());
  rmsnorm_linear_params pc = p;
  pc.x = x.data();
  pc.gate = z.data();
  pc.norm_weight = g.data();
  pc.w = b.data();
  pc.out = want.data();
  pc.normed_out = want_xn.data();
  run_cpu(pc);

  device_array<float> dx(x), dz(z), dg(g), dout(out0);
  device_array<uint16_t> db(b);
  device_array<float> dxn(std::vector<float>(static_cast<size_t>(c.m * c.k), cuda_test::poison()));
  rmsnorm_linear_params pg = p;
  pg.x = dx.data();
  pg.gate = dz.data();
  pg.norm_weight = dg.data();
  pg.w = db.data();
  pg.out = dout.data();
  pg.normed_out = dxn.data();
  {
    kernel_paths paths;
    paths.norm_linear_gate = true;  // the fused kernel where it takes the shape (off by default)
    const paths_scope scope(paths);
    run_cuda(pg);
  }
  device_synchronize();
  expect_match(dxn.download(), want_xn, 1e-5, 1e-5, "normed_out");
  // The default (kernels.norm_linear_gate: false): the gated norm op, then the GEMM.
  device_array<float> dout2(out0);
  pg.out = dout2.data();
  pg.normed_out = nullptr;
  run_cuda(pg);
  device_synchronize();
  expect_match(dout2.download(), want, 1e-5 + 1e-6 * static_cast<double>(c.k), 1e-5, "out (apart)");
  expect_match(dout.download(), want, 1e-5 + 1e-6 * static_cast<double>(c.k), 1e-5, "out");
}

INSTANTIATE_TEST_SUITE_P(
    Grid, NormLinearCudaGated,
    testing::Values(gated_case{1, 2048, 4096, 128, 12352, true},  // Qwen3-Next GDN: 32 heads of 128, z in in_proj's row
                    gated_case{1, 4096, 8192, 0, 18560, false},   // Bamba-9B Mamba2: one group of 8192
                    gated_case{2, 1536, 3072, 3072, 7000, false},  // Granite-4.0-H-Tiny-like, two rows
                    gated_case{3, 1000, 4096, 512, 4096, false},  // 8 groups, three rows
                    gated_case{4, 777, 4096, 128, 4100, true},    // 4 × 32 groups: the staged limit
                    gated_case{2, 512, 8192, 1024, 8192, false},  // staging over 46 KB: unfused
                    gated_case{1, 100, 48, 6, 48, true},          // groups of 6: unfused
                    gated_case{6, 300, 256, 64, 256, true}),      // m > 4: unfused
    [](const testing::TestParamInfo<gated_case>& i) {
      const gated_case& c = i.param;
      return "m" + std::to_string(c.m) + "_n" + std::to_string(c.n) + "_k" + std::to_string(c.k) + "_group" +
             std::to_string(c.group) + (c.before_gate ? "_before" : "_after");
    });

}  // namespace
}  // namespace hyserve::kernels

#endif  // HYSERVE_HAVE_CUDA
