// The skinny bf16 GEMM of the CUDA gemm op (decode linear layers: m ≤ 4 rows, bf16 weight
// [n, k] with trans_b) against the CPU op on the same data. A is NOT bf16-exact here: the skinny
// kernel multiplies f32 A like the CPU op, so only the summation order differs:
// |Δ| <= 1e-5 + 1e-6·k + 1e-5·|want|. Covers m 1..4, n not a multiple of the rows per warp,
// k of the production shapes, padded strides, alpha/beta accumulation. Skips without a device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "hyserve/common/dtype.h"
#include "hyserve/kernels/gemm.h"

namespace hyserve::kernels {
namespace {

using cuda_test::expect_match;
using cuda_test::random_floats;

struct skinny_case {
  int64_t m, n, k;
  int64_t pad;  // extra elements per row of a and b (a multiple of 8: the skinny path applies)
  float alpha, beta;
};

class SkinnyGemmCuda : public testing::TestWithParam<skinny_case> {};

TEST_P(SkinnyGemmCuda, MatchesCpuWithF32A) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
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
  device_array<float> da(a), dc(want);
  device_array<uint16_t> db(b);
  gemm_params pc = p;
  pc.a = a.data();
  pc.b = b.data();
  pc.c = want.data();
  run_cpu(pc);
  gemm_params pg = p;
  pg.a = da.data();
  pg.b = db.data();
  pg.c = dc.data();
  run_cuda(pg);
  device_synchronize();
  expect_match(dc.download(), want, 1e-5 + 1e-6 * static_cast<double>(c.k), 1e-5, "C");
}

INSTANTIATE_TEST_SUITE_P(Grid, SkinnyGemmCuda,
                         testing::Values(skinny_case{1, 4096, 4096, 0, 1.0f, 0.0f},    // o_proj / out_proj
                                         skinny_case{1, 4096, 14336, 0, 1.0f, 0.0f},   // MLP down
                                         skinny_case{1, 14336, 4096, 0, 1.0f, 0.0f},   // MLP gate / up
                                         skinny_case{2, 1025, 4096, 8, 1.0f, 0.0f},    // odd n, padded
                                         skinny_case{3, 333, 512, 16, 1.0f, 0.0f},     // padded strides
                                         skinny_case{4, 7, 8, 0, 2.0f, 0.5f},          // accumulate
                                         skinny_case{4, 1, 4096, 0, 1.0f, 0.0f},       // one output column
                                         skinny_case{1, 128256, 64, 0, 1.0f, 0.0f}),   // lm_head-wide n
                         [](const testing::TestParamInfo<skinny_case>& info) {
                           const auto& c = info.param;
                           return "m" + std::to_string(c.m) + "_n" + std::to_string(c.n) + "_k" + std::to_string(c.k) +
                                  (c.pad ? "_padded" : "") + (c.beta != 0.0f ? "_accumulate" : "");
                         });

}  // namespace
}  // namespace hyserve::kernels
