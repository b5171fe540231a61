// moe_experts on CUDA against the CPU op over experts {4, 64, 512} × top_k {1, 2, 8, 10} ×
// tokens {1, 7, 64, 2048} (hidden 128, inter 64), f32 and bf16 weights, with router ties
// (logits on an integer grid) and experts that get no token (the upper half of the experts
// never wins); plus the Qwen3-Next shape (hidden 2048, inter 512, 512 experts, top 10) at 1,
// 64 and 512 tokens, sigmoid scoring, accumulate, and bitwise repeatability. The grid reaches
// every GEMM path of bf16 weights: the GEMV (tokens · top_k <= 64), the mma.sync small tiles
// (fewer than 16 rows an expert) and the large mma.sync tiles (more); calls of up to 8 tokens and
// 1024 experts route, scan and scatter in one block (moe_prepare_kernel), others in three kernels.
// Routing: ids identical, weights within 1e-6 + 1e-5·|cpu|. Outputs: with S = max |cpu out|,
//   f32 weights: |gpu − cpu| <= 2e-4·S + 1e-3·|cpu| (operands split into two bf16 terms);
//   bf16 weights: |gpu − cpu| <= 1e-2·S + 1e-2·|cpu| (x is bf16-exact; the SwiGLU activations
//   are rounded to bf16 between the two GEMMs, the CPU op keeps them f32).
// Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "hyserve/kernels/device.h"

#if defined(HYSERVE_HAVE_CUDA)

#include "cuda_test_util.h"
#include "hyserve/common/dtype.h"
#include "hyserve/kernels/moe.h"
#include "hyserve/kernels/paths.h"

namespace hyserve::kernels {
namespace {

struct moe_shape {
  int64_t T, H, I, E, k;
  bool bf16 = true;
  moe_scoring scoring = moe_scoring::kSoftmax;
  bool norm = true;
  bool ties = true;
  bool accumulate = false;
};

std::string name(const moe_shape& s) {
  return "T " + std::to_string(s.T) + " H " + std::to_string(s.H) + " I " + std::to_string(s.I) + " E " +
         std::to_string(s.E) + " k " + std::to_string(s.k) + (s.bf16 ? " bf16" : " f32") +
         (s.scoring == moe_scoring::kSoftmax ? " softmax" : " sigmoid") + (s.norm ? " norm" : " raw") +
         (s.ties ? " ties" : "") + (s.accumulate ? " accumulate" : "");
}

void check_moe(const moe_shape& s, uint32_t seed, uint32_t weight_seed) {
  const std::string what = name(s);
  const size_t TH = static_cast<size_t>(s.T * s.H);
  const std::vector<float> x = cuda_test::round_bf16(cuda_test::random_floats(TH, seed, -1, 1));
  std::vector<float> logits = cuda_test::random_floats(static_cast<size_t>(s.T * s.E), seed + 1, -3, 3);
  if (s.ties)
    for (float& v : logits) v = std::round(v);
  if (s.E >= 2 * s.k)  // the upper half of the experts gets no token
    for (int64_t t = 0; t < s.T; ++t)
      for (int64_t e = s.E / 2; e < s.E; ++e) logits[static_cast<size_t>(t * s.E + e)] = -30.0f;
  // The experts' weights depend only on the shape and weight_seed; the last set is kept, so the
  // cases of one shape (512 experts of 2048 × 512: 1.6 G values) generate it once.
  struct weights {
    int64_t E = 0, I = 0, H = 0;
    uint32_t seed = 0;
    std::vector<float> gate_up, down;
  };
  static weights cached;
  if (cached.E != s.E || cached.I != s.I || cached.H != s.H || cached.seed != weight_seed || cached.gate_up.empty()) {
    const float ws = 1.0f / std::sqrt(static_cast<float>(s.H));
    cached = weights{};
    cached.gate_up =
        cuda_test::random_floats(static_cast<size_t>(s.E * 2 * s.I * s.H), weight_seed, -2 * ws, 2 * ws);
    cached.down = cuda_test::random_floats(static_cast<size_t>(s.E * s.H * s.I), weight_seed + 1,
                                           -2.0f / std::sqrt(static_cast<float>(s.I)),
                                           2.0f / std::sqrt(static_cast<float>(s.I)));
    cached.E = s.E;
    cached.I = s.I;
    cached.H = s.H;
    cached.seed = weight_seed;
  }
  const std::vector<float>& gate_up = cached.gate_up;
  const std::vector<float>& down = cached.down;
  std::vector<uint16_t> gate_up16, down16;
  if (s.bf16) {
    gate_up16.reserve(gate_up.size());
    down16.reserve(down.size());
    for (float v : gate_up) gate_up16.push_back(f32_to_bf16(v));
    for (float v : down) down16.push_back(f32_to_bf16(v));
  }
  const std::vector<float> out0 = s.accumulate ? cuda_test::random_floats(TH, seed + 4) : std::vector<float>(TH, cuda_test::poison());

  moe_experts_params p;
  p.tokens = s.T;
  p.hidden = s.H;
  p.inter = s.I;
  p.experts = s.E;
  p.top_k = s.k;
  p.x_stride = p.out_stride = s.H;
  p.logits_stride = s.E;
  p.scoring = s.scoring;
  p.norm_topk_prob = s.norm;
  p.accumulate = s.accumulate;
  p.w_dtype = s.bf16 ? dtype::kBF16 : dtype::kF32;

  std::vector<float> want = out0;
  std::vector<int32_t> want_ids(static_cast<size_t>(s.T * s.k));
  std::vector<float> want_w(static_cast<size_t>(s.T * s.k));
  p.x = x.data();
  p.router_logits = logits.data();
  p.gate_up = s.bf16 ? static_cast<const void*>(gate_up16.data()) : gate_up.data();
  p.down = s.bf16 ? static_cast<const void*>(down16.data()) : down.data();
  p.out = want.data();
  p.topk_ids = want_ids.data();
  p.topk_weights = want_w.data();
  run_cpu(p);

  device_array<float> d_x(x), d_logits(logits), d_out(out0);
  device_array<float> d_gu32, d_down32;
  device_array<uint16_t> d_gu16, d_down16;
  if (s.bf16) {
    d_gu16 = device_array<uint16_t>(gate_up16);
    d_down16 = device_array<uint16_t>(down16);
  } else {
    d_gu32 = device_array<float>(gate_up);
    d_down32 = device_array<float>(down);
  }
  device_array<int32_t> d_ids(want_ids.size());
  device_array<float> d_w(want_w.size());
  d_ids.fill_bytes(0xff);
  d_w.fill_bytes(0xff);
  p.x = d_x.data();
  p.router_logits = d_logits.data();
  p.gate_up = s.bf16 ? static_cast<const void*>(d_gu16.data()) : d_gu32.data();
  p.down = s.bf16 ? static_cast<const void*>(d_down16.data()) : d_down32.data();
  p.out = d_out.data();
  p.topk_ids = d_ids.data();
  p.topk_weights = d_w.data();
  run_cuda(p);
  device_synchronize();
  const std::vector<float> got = d_out.download();
  cuda_test::expect_equal(d_ids.download(), want_ids, what + " ids");
  cuda_test::expect_match(d_w.download(), want_w, 1e-6, 1e-5, what + " weights");
  double scale = 0;
  for (float v : want) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  if (s.bf16)
    cuda_test::expect_match(got, want, 1e-2 * scale, 1e-2, what + " out");
  else
    cuda_test::expect_match(got, want, 2e-4 * scale, 1e-3, what + " out");

  if (!s.accumulate) {  // the same call again: bitwise the same result
    d_out.fill_bytes(0xff);
    run_cuda(p);
    device_synchronize();
    const std::vector<float> again = d_out.download();
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &again[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << what << " repeat";
  }
}

TEST(CudaMoe, MatchesCpuOverGrid) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 100;
  for (int64_t E : {4, 64, 512})
    for (int64_t k : {1, 2, 8, 10})
      for (int64_t T : {1, 7, 64, 2048})
        for (bool bf16 : {true, false}) {
          if (k > E) continue;
          moe_shape s{T, 128, 64, E, k, bf16};
          seed += 7;
          check_moe(s, seed, seed + 2);
        }
}

TEST(CudaMoe, MatchesCpuScoringAndAccumulate) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 900;
  for (const moe_shape& shape : {moe_shape{33, 64, 32, 16, 4, true, moe_scoring::kSigmoid, true},
                                 moe_shape{33, 64, 32, 16, 4, false, moe_scoring::kSigmoid, false},
                                 moe_shape{33, 64, 32, 16, 4, true, moe_scoring::kSoftmax, false},
                                 moe_shape{40, 64, 32, 16, 2, false, moe_scoring::kSoftmax, true, false, true},
                                 moe_shape{300, 64, 32, 8, 2, true, moe_scoring::kSoftmax, true, false, true},
                                 // Over 512 experts: the router's shared-memory path (moe_route.cuh).
                                 moe_shape{7, 64, 32, 1000, 10, true},
                                 moe_shape{1, 64, 32, 1000, 10, false, moe_scoring::kSigmoid, false}}) {
    check_moe(shape, seed, seed + 2);
    ++seed;
  }
}

TEST(CudaMoe, MatchesCpuAtQwen3NextShape) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 1000;
  // One set of weights (generating 1.6 G values dominates this test's time) for every case.
  for (int64_t T : {1, 64, 512})
    check_moe({T, 2048, 512, 512, 10, true, moe_scoring::kSoftmax, true, false}, seed++, 2000);
  check_moe({64, 2048, 512, 512, 10, false, moe_scoring::kSoftmax, true, false}, seed++, 2000);
}

// The many-row path's grouped GEMMs (rows >= 16 · experts) both ways: kernels.moe_wgmma (the
// default: the warpgroup-MMA kernel, 192-row tiles, or 128 with kernels.moe_wgmma_rows; its
// tiles in either launch order, kernels.moe_tile_order, outputs by default; a block an SM
// taking tiles in turn, or a block a tile, kernels.moe_wgmma_persistent; the down projection's
// rows by tensor copies or gathered, kernels.moe_wgmma_tma_x; a stage given back once its own
// MMAs are done, or once the next stage's are issued, kernels.moe_wgmma_early_release; the tile's
// rows handed to the consumers by the producer, kernels.moe_wgmma_tile_handoff) and the
// mma.sync tiles; the same checks and tolerances
// against the CPU op: ragged tiles, experts without tokens, k and the expert width not multiples
// of 64 (partial k blocks, a partial tile of 64 outputs), accumulate, ties.
TEST(CudaMoe, ManyRowExpertsMatchCpuBothKernels) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  using order = kernel_paths::moe_tile_order_kind;
  struct variant {
    bool wgmma;
    order tiles;
    int rows;         // kernels.moe_wgmma_rows (0: default, 192)
    bool persistent;  // kernels.moe_wgmma_persistent (default true)
    bool tma_x;       // kernels.moe_wgmma_tma_x (default true)
    const char* label;
    bool early = true;  // kernels.moe_wgmma_early_release (default true)
    bool handoff = false;  // kernels.moe_wgmma_tile_handoff (default false)
  };
  for (const variant& v :
       {variant{true, order::kDefault, 0, true, true, "moe_wgmma (the defaults)"},
        variant{true, order::kRows, 0, true, true, "moe_wgmma, rows first"},
        variant{true, order::kDefault, 128, true, true, "moe_wgmma, 128-row tiles"},
        variant{true, order::kDefault, 0, false, true, "moe_wgmma, a block a tile"},
        variant{true, order::kDefault, 0, true, false, "moe_wgmma, gathered rows"},
        variant{true, order::kDefault, 0, false, false, "moe_wgmma, a block a tile, gathered rows"},
        variant{true, order::kRows, 128, false, false, "moe_wgmma, a block a tile, rows first, 128-row tiles, gathered rows"},
        variant{true, order::kDefault, 0, true, true, "moe_wgmma, late release", false},
        variant{true, order::kRows, 128, false, false, "moe_wgmma, late release, a block a tile, 128-row tiles, gathered rows", false},
        variant{true, order::kDefault, 0, true, false, "moe_wgmma, late release, gathered rows", false},
        variant{true, order::kDefault, 0, true, true, "moe_wgmma, tile handoff", true, true},
        variant{true, order::kRows, 128, false, false, "moe_wgmma, tile handoff, a block a tile, rows first, 128-row tiles, gathered rows", true, true},
        variant{true, order::kDefault, 0, true, false, "moe_wgmma, tile handoff, late release, gathered rows", false, true},
        variant{false, order::kDefault, 0, true, true, "mma.sync tiles"}}) {
    SCOPED_TRACE(v.label);
    kernel_paths paths;
    paths.moe_wgmma = v.wgmma;
    paths.moe_tile_order = v.tiles;
    paths.moe_wgmma_rows = v.rows;
    paths.moe_wgmma_persistent = v.persistent;
    paths.moe_wgmma_tma_x = v.tma_x;
    paths.moe_wgmma_early_release = v.early;
    paths.moe_wgmma_tile_handoff = v.handoff;
    const paths_scope scope(paths);
    uint32_t seed = 3000;
    for (const moe_shape& shape : {moe_shape{2048, 128, 64, 4, 2, true},
                                   moe_shape{2048, 128, 64, 64, 8, true},
                                   moe_shape{300, 64, 32, 8, 2, true, moe_scoring::kSoftmax, true, true, true},
                                   moe_shape{600, 200, 72, 16, 2, true, moe_scoring::kSigmoid, false},
                                   moe_shape{1024, 1024, 256, 32, 4, true}}) {
      check_moe(shape, seed, seed + 2);
      seed += 3;
    }
  }
}

TEST(CudaMoe, RejectsWhatTheKernelsDoNotTake) {
  moe_experts_params p;
  p.tokens = 1;
  p.hidden = 12;  // not a multiple of 8
  p.inter = 8;
  p.experts = 4;
  p.top_k = 2;
  float dummy[64] = {};
  p.x = p.router_logits = dummy;
  p.gate_up = p.down = dummy;
  p.out = dummy;
  p.x_stride = p.out_stride = 12;
  p.logits_stride = 4;
  cuda_test::expect_invalid([&] { run_cuda(p); }, "hidden");
  p.hidden = 8;
  p.x_stride = p.out_stride = 8;
  p.experts = 64;
  p.top_k = 33;
  p.logits_stride = 64;
  cuda_test::expect_invalid([&] { run_cuda(p); }, "top_k");
}

}  // namespace
}  // namespace hyserve::kernels

#endif  // HYSERVE_HAVE_CUDA
