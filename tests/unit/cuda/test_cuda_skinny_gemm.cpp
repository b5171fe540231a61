// The skinny bf16 GEMM of the CUDA gemm op (decode linear layers: m ≤ 8 rows, bf16 weight
// [n, k] with trans_b) against the CPU op on the same data. A is NOT bf16-exact here: the skinny
// kernel multiplies f32 A like the CPU op, so only the summation order differs:
// |Δ| <= 1e-5 + 1e-6·k + 1e-5·|want|. Covers m 1..8, n not a multiple of the rows per warp,
// k of the production shapes, padded strides, alpha/beta accumulation; that row r of an m-row
// call is bitwise the row computed by a 1-row call (a batch-1 verify of up to 7 drafts and a
// decode step agree exactly); and the fused SwiGLU projection (swiglu_linear) on the same
// kernel. Each for both skinny paths (CUDA-core FMA and tensor-core MMA); and that the context's
// kernels.skinny selects them through kernels::run. Skips without a device.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "hyserve/kernels/device.h"

#if defined(HYSERVE_HAVE_CUDA)

#include "cuda/gemm_paths.h"
#include "cuda_test_util.h"
#include "hyserve/common/dtype.h"
#include "hyserve/kernels/gemm.h"
#include "hyserve/kernels/run.h"

namespace hyserve::kernels {
namespace {

using cuda_test::expect_match;
using cuda_test::random_floats;

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Puts the skinny path choices back to their defaults when a test ends (a failed assertion too).
struct path_reset {
  path_reset() = default;
  path_reset(const path_reset&) = delete;
  path_reset& operator=(const path_reset&) = delete;
  ~path_reset() {
    set_skinny_path(skinny_path::kDefault);
    set_skinny_rows(0);
  }
};

struct skinny_case {
  int64_t m, n, k;
  int64_t pad;  // extra elements per row of a and b (a multiple of 8: the skinny path applies)
  float alpha, beta;
};

class SkinnyGemmCuda : public testing::TestWithParam<skinny_case> {};

TEST_P(SkinnyGemmCuda, MatchesCpuWithF32A) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const path_reset reset;
  const skinny_case& c = GetParam();
  gemm_params p;
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  p.trans_b = true;
  p.alpha = c.alpha;
  p.beta = c.beta;
  p.lda = c.k + c.pad;
  p.ldb = c.k + c.pad;
  p.ldc = c.n + 1;
  p.b_dtype = dtype::kBF16;
  const std::vector<float> a = random_floats(static_cast<size_t>(c.m * p.lda), 11);
  const std::vector<float> bf = random_floats(static_cast<size_t>(c.n * p.ldb), 12);
  std::vector<uint16_t> b(bf.size());
  for (size_t i = 0; i < bf.size(); ++i) b[i] = f32_to_bf16(bf[i]);
  std::vector<float> want = random_floats(static_cast<size_t>(c.m * p.ldc), 13);
  const std::vector<float> c0 = want;  // C before the call (beta accumulates onto it)
  device_array<float> da(a);
  device_array<uint16_t> db(b);
  gemm_params pc = p;
  pc.a = a.data();
  pc.b = b.data();
  pc.c = want.data();
  run_cpu(pc);
  for (const skinny_path path : {skinny_path::kFma, skinny_path::kMma}) {
    SCOPED_TRACE(path == skinny_path::kMma ? "tensor-core path" : "FMA path");
    device_array<float> dcp(c0);
    gemm_params pg = p;
    pg.a = da.data();
    pg.b = db.data();
    pg.c = dcp.data();
    set_skinny_path(path);
    run_cuda(pg);
    device_synchronize();
    expect_match(dcp.download(), want, 1e-5 + 1e-6 * static_cast<double>(c.k), 1e-5, "C");
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, SkinnyGemmCuda,
                         testing::Values(skinny_case{1, 4096, 4096, 0, 1.0f, 0.0f},    // o_proj / out_proj
                                         skinny_case{1, 4096, 14336, 0, 1.0f, 0.0f},   // MLP down
                                         skinny_case{1, 14336, 4096, 0, 1.0f, 0.0f},   // MLP gate / up
                                         skinny_case{2, 1025, 4096, 8, 1.0f, 0.0f},    // odd n, padded
                                         skinny_case{3, 333, 512, 16, 1.0f, 0.0f},     // padded strides
                                         skinny_case{4, 7, 8, 0, 2.0f, 0.5f},          // accumulate
                                         skinny_case{4, 1, 4096, 0, 1.0f, 0.0f},       // one output column
                                         skinny_case{5, 1025, 4096, 8, 1.0f, 0.0f},    // verify: 1 + 4 drafts
                                         skinny_case{6, 333, 512, 16, 2.0f, 0.5f},
                                         skinny_case{7, 4096, 4096, 0, 1.0f, 0.0f},
                                         skinny_case{8, 14336, 4096, 0, 1.0f, 0.0f},   // 1 + 7 drafts
                                         skinny_case{1, 128256, 64, 0, 1.0f, 0.0f},    // lm_head-wide n
                                         skinny_case{5, 16768, 512, 0, 1.0f, 0.0f}),   // 2 row tiles per block
                         [](const testing::TestParamInfo<skinny_case>& param_info) {
                           const auto& c = param_info.param;
                           return "m" + std::to_string(c.m) + "_n" + std::to_string(c.n) + "_k" + std::to_string(c.k) +
                                  (c.pad ? "_padded" : "") + (c.beta != 0.0f ? "_accumulate" : "");
                         });

// Row r of an m-row skinny call equals, bit for bit, the same row computed alone (m = 1): each
// row's arithmetic is independent of the rows beside it. Both for the gemm op (with alpha/beta
// accumulation) and the fused swiglu_linear op.
struct invariance_case {
  int64_t n, k;
};

class SkinnyRowInvarianceCuda : public testing::TestWithParam<invariance_case> {};

TEST_P(SkinnyRowInvarianceCuda, RowOfMRowCallEqualsOneRowCall) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const path_reset reset;
  const invariance_case& c = GetParam();
  constexpr int64_t kMaxM = 8;
  const std::vector<float> a = random_floats(static_cast<size_t>(kMaxM * c.k), 31);
  const std::vector<float> bf = random_floats(static_cast<size_t>(c.n * c.k), 32, -0.1f, 0.1f);
  const std::vector<float> uf = random_floats(static_cast<size_t>(c.n * c.k), 33, -0.1f, 0.1f);
  const std::vector<float> c0 = random_floats(static_cast<size_t>(kMaxM * c.n), 34);
  std::vector<uint16_t> b(bf.size()), u(uf.size());
  for (size_t i = 0; i < bf.size(); ++i) {
    b[i] = f32_to_bf16(bf[i]);
    u[i] = f32_to_bf16(uf[i]);
  }
  device_array<float> da(a);
  device_array<uint16_t> db(b), du(u);
  // One-row results of every row: gemm (alpha 1.5, beta 0.5 over c0) and swiglu_linear.
  std::vector<std::vector<float>> gemm_one(kMaxM), swiglu_one(kMaxM);
  auto gemm_call = [&](int64_t row, int64_t m) {
    device_array<float> dc(std::vector<float>(c0.begin() + row * c.n, c0.begin() + (row + m) * c.n));
    gemm_params p;
    p.m = m;
    p.n = c.n;
    p.k = c.k;
    p.trans_b = true;
    p.alpha = 1.5f;
    p.beta = 0.5f;
    p.lda = p.ldb = c.k;
    p.ldc = c.n;
    p.b_dtype = dtype::kBF16;
    p.a = da.data() + row * c.k;
    p.b = db.data();
    p.c = dc.data();
    run_cuda(p);
    device_synchronize();
    return dc.download();
  };
  auto swiglu_call = [&](int64_t row, int64_t m) {
    device_array<float> dout(static_cast<size_t>(m * c.n));
    swiglu_linear_params p;
    p.m = m;
    p.n = c.n;
    p.k = c.k;
    p.x_stride = p.w_stride = c.k;
    p.out_stride = c.n;
    p.w_dtype = dtype::kBF16;
    p.x = da.data() + row * c.k;
    p.gate_w = db.data();
    p.up_w = du.data();
    p.out = dout.data();
    run_cuda(p);
    device_synchronize();
    return dout.download();
  };
  for (const skinny_path path : {skinny_path::kFma, skinny_path::kMma}) {
    SCOPED_TRACE(path == skinny_path::kMma ? "tensor-core path" : "FMA path");
    set_skinny_path(path);
    for (int64_t r = 0; r < kMaxM; ++r) {
      gemm_one[static_cast<size_t>(r)] = gemm_call(r, 1);
      swiglu_one[static_cast<size_t>(r)] = swiglu_call(r, 1);
    }
    // Every choice of the rows of B a warp streams (the kernel's own, 2, 4, 8) gives the same bits
    // (the tensor-core path has no such choice: once).
    for (const int cap : path == skinny_path::kMma ? std::vector<int>{0} : std::vector<int>{0, 2, 4, 8}) {
      for (int64_t m = 2; m <= kMaxM; ++m) {
        set_skinny_rows(cap);
        const std::vector<float> g = gemm_call(0, m), s = swiglu_call(0, m);
        set_skinny_rows(0);
        for (int64_t r = 0; r < m; ++r)
          for (int64_t j = 0; j < c.n; ++j) {
            const size_t i = static_cast<size_t>(r * c.n + j);
            ASSERT_EQ(f32_bits(g[i]), f32_bits(gemm_one[static_cast<size_t>(r)][static_cast<size_t>(j)]))
                << "gemm m " << m << " row " << r << " col " << j << " (rows per warp " << cap << "): " << g[i]
                << " vs " << gemm_one[static_cast<size_t>(r)][static_cast<size_t>(j)];
            ASSERT_EQ(f32_bits(s[i]), f32_bits(swiglu_one[static_cast<size_t>(r)][static_cast<size_t>(j)]))
                << "swiglu m " << m << " row " << r << " col " << j << " (rows per warp " << cap << ")";
          }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, SkinnyRowInvarianceCuda,
                         testing::Values(invariance_case{1025, 4096}, invariance_case{333, 512},
                                         invariance_case{4096, 14336},
                                         // Tensor-core path: 896 tiles (4 warps per block) and
                                         // 2 row tiles per block.
                                         invariance_case{14336, 1024}, invariance_case{16768, 512}),
                         [](const testing::TestParamInfo<invariance_case>& param_info) {
                           return "n" + std::to_string(param_info.param.n) + "_k" + std::to_string(param_info.param.k);
                         });

// swiglu_linear on CUDA against the CPU op: the fused skinny kernel (bf16, m ≤ 8, f32 x) and the
// fallback (m > 8: bf16-exact x, so the rounding of x inside the tensor-core GEMM is exact; f32
// weights: cuBLAS). Tolerance as above, on silu(g)·u.
struct swiglu_case {
  int64_t m, n, k;
  bool bf16;
};

class SwigluLinearCuda : public testing::TestWithParam<swiglu_case> {};

TEST_P(SwigluLinearCuda, MatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const path_reset reset;
  const swiglu_case& c = GetParam();
  std::vector<float> x = random_floats(static_cast<size_t>(c.m * c.k), 21);
  if (c.m > 8)
    for (float& v : x) v = bf16_to_f32(f32_to_bf16(v));
  const std::vector<float> g = random_floats(static_cast<size_t>(c.n * c.k), 22, -0.1f, 0.1f);
  const std::vector<float> u = random_floats(static_cast<size_t>(c.n * c.k), 23, -0.1f, 0.1f);
  std::vector<uint16_t> g16(g.size()), u16(u.size());
  for (size_t i = 0; i < g.size(); ++i) {
    g16[i] = f32_to_bf16(g[i]);
    u16[i] = f32_to_bf16(u[i]);
  }
  swiglu_linear_params p;
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  p.x_stride = p.w_stride = c.k;
  p.out_stride = c.n;
  p.w_dtype = c.bf16 ? dtype::kBF16 : dtype::kF32;
  std::vector<float> want(static_cast<size_t>(c.m * c.n));
  swiglu_linear_params pc = p;
  pc.x = x.data();
  pc.gate_w = c.bf16 ? static_cast<const void*>(g16.data()) : g.data();
  pc.up_w = c.bf16 ? static_cast<const void*>(u16.data()) : u.data();
  pc.out = want.data();
  run_cpu(pc);
  device_array<float> dx(x), dg(g), du(u), dout(want.size());
  device_array<uint16_t> dg16(g16), du16(u16);
  dout.fill_bytes(0xff);
  swiglu_linear_params pg = p;
  pg.x = dx.data();
  pg.gate_w = c.bf16 ? static_cast<const void*>(dg16.data()) : dg.data();
  pg.up_w = c.bf16 ? static_cast<const void*>(du16.data()) : du.data();
  pg.out = dout.data();
  for (const skinny_path path : {skinny_path::kFma, skinny_path::kMma}) {
    SCOPED_TRACE(path == skinny_path::kMma ? "tensor-core path" : "FMA path");
    dout.fill_bytes(0xff);
    set_skinny_path(path);
    run_cuda(pg);
    device_synchronize();
    expect_match(dout.download(), want, 1e-5 + 1e-6 * static_cast<double>(c.k), 1e-4, "out");
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, SwigluLinearCuda,
                         testing::Values(swiglu_case{1, 14336, 4096, true},  // Bamba-9B MLP, decode
                                         swiglu_case{3, 333, 512, true}, swiglu_case{4, 1, 64, true},
                                         swiglu_case{8, 130, 256, true},     // 1 + 7 drafts: still fused
                                         swiglu_case{9, 130, 256, true},     // fallback: two GEMMs + swiglu
                                         swiglu_case{2, 77, 96, false}),     // f32 weights: cuBLAS
                         [](const testing::TestParamInfo<swiglu_case>& param_info) {
                           const auto& c = param_info.param;
                           return "m" + std::to_string(c.m) + "_n" + std::to_string(c.n) + "_k" + std::to_string(c.k) +
                                  (c.bf16 ? "_bf16" : "_f32");
                         });

// kernels.skinny reaches the kernel through kernels::run: the context's paths pick the same
// kernel as set_skinny_path (bitwise the same C), and the default context the FMA path.
TEST(SkinnyGemmPathsCuda, ContextPathsSelectTheKernel) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const path_reset reset;
  gemm_params p;
  p.m = 4;
  p.n = 1025;
  p.k = 4096;
  p.trans_b = true;
  p.lda = p.ldb = p.k;
  p.ldc = p.n;
  p.b_dtype = dtype::kBF16;
  const std::vector<float> bf = random_floats(static_cast<size_t>(p.n * p.ldb), 22);
  std::vector<uint16_t> b(bf.size());
  for (size_t i = 0; i < bf.size(); ++i) b[i] = f32_to_bf16(bf[i]);
  device_array<float> da(random_floats(static_cast<size_t>(p.m * p.lda), 21));
  device_array<uint16_t> db(b);
  auto c_of = [&](const std::function<void(const gemm_params&)>& call) {
    device_array<float> dc(std::vector<float>(static_cast<size_t>(p.m * p.ldc), 0.0f));
    gemm_params pg = p;
    pg.a = da.data();
    pg.b = db.data();
    pg.c = dc.data();
    call(pg);
    device_synchronize();
    return dc.download();
  };
  auto with_setter = [&](skinny_path path) {
    return c_of([&](const gemm_params& pg) {
      set_skinny_path(path);
      run_cuda(pg);
      set_skinny_path(skinny_path::kDefault);
    });
  };
  auto with_context = [&](kernel_paths::skinny_kind kind) {
    exec_context ctx;
    ctx.device = device_kind::kCuda;
    ctx.paths.skinny = kind;
    return c_of([&](const gemm_params& pg) { run(pg, ctx); });
  };
  const std::vector<float> fma = with_setter(skinny_path::kFma), mma = with_setter(skinny_path::kMma);
  // The two paths sum in different orders: over k = 4096 some output differs in its last bits.
  ASSERT_NE(fma, mma);
  EXPECT_EQ(with_context(kernel_paths::skinny_kind::kMma), mma);
  EXPECT_EQ(with_context(kernel_paths::skinny_kind::kFma), fma);
  EXPECT_EQ(with_context(kernel_paths::skinny_kind::kDefault), fma);
}

}  // namespace
}  // namespace hyserve::kernels

#endif  // HYSERVE_HAVE_CUDA
