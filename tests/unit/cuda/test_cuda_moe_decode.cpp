// The routed-experts op's fused decode path (kernels.moe_decode: fused, the default: routing in
// the up-projection kernel, the combine in the down projection's) against its four-kernel path
// (split) on the same inputs: outputs, top-k ids and weights identical bit for bit. bf16
// weights, fast mode, over tokens {1, 3, 8} × experts {4, 72, 512} × top_k {1, 2, 8, 10} (pairs
// <= 64), expert widths 64, 512, 768 and 1024 (every chunks-a-lane variant of the down kernel),
// softmax and sigmoid scoring, raw and renormalised weights, out written and accumulated, router
// ties (logits on an integer grid) and experts that get no token. The values against the CPU op
// are CudaMoe.*'s (test_cuda_moe.cpp), whose decode cases run the fused path by default, and,
// here, the CPU op's (with the shared expert: ungated and gated, every token count 1..8). One
// token also runs the default (the up and down weights through rings of bulk copies into shared
// memory; past the rings' hidden width, the one-row up kernel), pipelined (the one-row kernel
// with each warp's loads pipelined across its tasks) and single (up and down in one kernel, a
// grid barrier between them) and overlap (the down ring routing the token itself before its
// wait) against split.
// Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "hyserve/kernels/device.h"

#if defined(HYSERVE_HAVE_CUDA)

#include "cuda_test_util.h"
#include "hyserve/kernels/moe.h"
#include "hyserve/kernels/paths.h"

namespace hyserve::kernels {
namespace {

struct decode_case {
  int64_t T, H, I, E, k;
  moe_scoring scoring = moe_scoring::kSoftmax;
  bool norm = true;
  bool accumulate = false;
  int64_t Is = 0;      // the shared expert's width (0: none)
  bool gated = false;  // its sigmoid gate (Qwen3-Next) or none (Granite-4.0-H)
};

struct decode_result {
  std::vector<float> out, weights;
  std::vector<int32_t> ids;
};

// ring_kb: kernels.moe_decode_ring_kb (0: default).
decode_result run_path(moe_experts_params p, kernel_paths::moe_decode_kind kind, const std::vector<float>& out0,
                       int32_t ring_kb = 0) {
  kernel_paths paths;
  paths.moe_decode = kind;
  paths.moe_decode_ring_kb = ring_kb;
  const paths_scope scope(paths);
  device_array<float> d_out(out0);
  device_array<int32_t> d_ids(static_cast<size_t>(p.tokens * p.top_k));
  device_array<float> d_w(static_cast<size_t>(p.tokens * p.top_k));
  d_ids.fill_bytes(0xff);
  d_w.fill_bytes(0xff);
  p.out = d_out.data();
  p.topk_ids = d_ids.data();
  p.topk_weights = d_w.data();
  run_cuda(p);
  device_synchronize();
  return {d_out.download(), d_w.download(), d_ids.download()};
}

size_t bit_differences(const std::vector<float>& a, const std::vector<float>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

void check_decode(const decode_case& c, uint32_t seed) {
  const std::string what = "T " + std::to_string(c.T) + " H " + std::to_string(c.H) + " I " + std::to_string(c.I) +
                           " E " + std::to_string(c.E) + " k " + std::to_string(c.k) +
                           (c.scoring == moe_scoring::kSoftmax ? " softmax" : " sigmoid") + (c.norm ? " norm" : " raw") +
                           (c.accumulate ? " accumulate" : "") +
                           (c.Is > 0 ? " shared " + std::to_string(c.Is) + (c.gated ? " gated" : "") : "");
  const size_t TH = static_cast<size_t>(c.T * c.H);
  const std::vector<float> x = cuda_test::random_floats(TH, seed, -1, 1);  // rounded to bf16 by the kernels
  std::vector<float> logits = cuda_test::random_floats(static_cast<size_t>(c.T * c.E), seed + 1, -3, 3);
  for (float& v : logits) v = std::round(v);  // ties
  if (c.E >= 2 * c.k)  // the upper half of the experts gets no token
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t e = c.E / 2; e < c.E; ++e) logits[static_cast<size_t>(t * c.E + e)] = -30.0f;
  const float ws = 2.0f / std::sqrt(static_cast<float>(c.H)), wd = 2.0f / std::sqrt(static_cast<float>(c.I));
  const device_array<uint16_t> gate_up(
      cuda_test::to_bf16(cuda_test::random_floats(static_cast<size_t>(c.E * 2 * c.I * c.H), seed + 2, -ws, ws)));
  const device_array<uint16_t> down(
      cuda_test::to_bf16(cuda_test::random_floats(static_cast<size_t>(c.E * c.H * c.I), seed + 3, -wd, wd)));
  const float wsd = 2.0f / std::sqrt(static_cast<float>(std::max<int64_t>(c.Is, 1)));
  const std::vector<uint16_t> h_sg = cuda_test::to_bf16(cuda_test::random_floats(static_cast<size_t>(c.Is * c.H), seed + 5, -ws, ws));
  const std::vector<uint16_t> h_su = cuda_test::to_bf16(cuda_test::random_floats(static_cast<size_t>(c.Is * c.H), seed + 6, -ws, ws));
  const std::vector<uint16_t> h_sd = cuda_test::to_bf16(cuda_test::random_floats(static_cast<size_t>(c.H * c.Is), seed + 7, -wsd, wsd));
  const std::vector<uint16_t> h_sw = cuda_test::to_bf16(cuda_test::random_floats(static_cast<size_t>(c.H), seed + 8, -ws, ws));
  const device_array<uint16_t> s_gate(h_sg), s_up(h_su), s_down(h_sd), s_gate_w(h_sw);
  const device_array<float> d_x(x), d_logits(logits);
  const std::vector<float> out0 =
      c.accumulate ? cuda_test::random_floats(TH, seed + 4) : std::vector<float>(TH, cuda_test::poison());

  moe_experts_params p;
  p.x = d_x.data();
  p.router_logits = d_logits.data();
  p.gate_up = gate_up.data();
  p.down = down.data();
  p.tokens = c.T;
  p.hidden = c.H;
  p.inter = c.I;
  p.experts = c.E;
  p.top_k = c.k;
  p.x_stride = p.out_stride = c.H;
  p.logits_stride = c.E;
  p.scoring = c.scoring;
  p.norm_topk_prob = c.norm;
  p.accumulate = c.accumulate;
  p.w_dtype = dtype::kBF16;
  if (c.Is > 0) {
    p.shared_inter = c.Is;
    p.shared_gate = s_gate.data();
    p.shared_up = s_up.data();
    p.shared_down = s_down.data();
    p.shared_gate_w = c.gated ? s_gate_w.data() : nullptr;
  }
  const decode_result split = run_path(p, kernel_paths::moe_decode_kind::kSplit, out0);
  const decode_result fused = run_path(p, kernel_paths::moe_decode_kind::kFused, out0);
  cuda_test::expect_equal(fused.ids, split.ids, what + " ids");
  EXPECT_EQ(bit_differences(fused.weights, split.weights), 0u) << what << " weights";
  EXPECT_EQ(bit_differences(fused.out, split.out), 0u) << what << " out";
  if (c.T == 1) {  // the default's rings of bulk copies (fused: the general up kernel)
    const decode_result one = run_path(p, kernel_paths::moe_decode_kind::kDefault, out0);
    cuda_test::expect_equal(one.ids, split.ids, what + " default ids");
    EXPECT_EQ(bit_differences(one.weights, split.weights), 0u) << what << " default weights";
    EXPECT_EQ(bit_differences(one.out, split.out), 0u) << what << " default out";
    // kernels.moe_decode_ring_kb: rings of 2 stages (32 KB) and of the most (192 KB): the same bits.
    for (const int32_t kb : {32, 192}) {
      const decode_result ring = run_path(p, kernel_paths::moe_decode_kind::kDefault, out0, kb);
      EXPECT_EQ(bit_differences(ring.out, split.out), 0u) << what << " default out, ring " << kb << " KB";
    }
    const decode_result single = run_path(p, kernel_paths::moe_decode_kind::kSingle, out0);  // one kernel
    cuda_test::expect_equal(single.ids, split.ids, what + " single ids");
    EXPECT_EQ(bit_differences(single.weights, split.weights), 0u) << what << " single weights";
    EXPECT_EQ(bit_differences(single.out, split.out), 0u) << what << " single out";
  }
  size_t written = 0;  // not a vacuous comparison: every output written, finite
  for (float v : fused.out) written += std::isfinite(v) ? 1 : 0;
  EXPECT_EQ(written, fused.out.size()) << what << " out written";

  // The CPU op on the same data (bf16 weights widened, f32 activations): the GPU rounds x and the
  // routed SwiGLU activations to bf16, so |gpu − cpu| <= 1e-2·S + 1e-2·|cpu|, S = max |cpu|.
  if (c.H * c.E * c.I > (int64_t{1} << 24)) return;  // the large shapes: bitwise against split only
  std::vector<float> want = out0;
  moe_experts_params q = p;
  const std::vector<uint16_t> h_gu = gate_up.download(), h_down = down.download();
  q.x = x.data();
  q.router_logits = logits.data();
  q.gate_up = h_gu.data();
  q.down = h_down.data();
  q.out = want.data();
  q.topk_ids = nullptr;
  q.topk_weights = nullptr;
  if (c.Is > 0) {
    q.shared_gate = h_sg.data();
    q.shared_up = h_su.data();
    q.shared_down = h_sd.data();
    q.shared_gate_w = c.gated ? h_sw.data() : nullptr;
  }
  run_cpu(q);
  double scale = 0;
  for (float v : want) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  cuda_test::expect_match(fused.out, want, 1e-2 * scale, 1e-2, what + " against the CPU op");
}

TEST(CudaMoe, FusedDecodeIsTheSplitPathBitForBit) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 3000;
  for (int64_t E : {4, 72, 512})
    for (int64_t k : {1, 2, 8, 10})
      for (int64_t T : {1, 3, 8}) {
        if (k > E || T * k > 64) continue;
        check_decode({T, 128, 64, E, k}, seed += 5);
      }
  // Expert widths of 2, 3 and 4 chunks a lane in the down kernel; other scorings; accumulate.
  check_decode({1, 256, 512, 128, 10}, seed += 5);
  check_decode({6, 256, 768, 72, 10, moe_scoring::kSoftmax, true, true}, seed += 5);
  check_decode({8, 128, 1024, 16, 8, moe_scoring::kSigmoid, false}, seed += 5);
  check_decode({2, 136, 64, 64, 8, moe_scoring::kSigmoid, true, true}, seed += 5);
  check_decode({5, 2048, 512, 16, 10}, seed += 5);
  // With the shared expert: ungated (Granite-4.0-H) and gated (Qwen3-Next), tokens 1..8 (the
  // separate ops' 1..4-row and 5..8-row kernels), widths of 1 and 8+ chunks a lane.
  for (int64_t T : {1, 3, 5, 8})
    for (bool gated : {false, true}) {
      check_decode({T, 128, 64, 72, 8, moe_scoring::kSoftmax, true, T % 2 == 1, 256, gated}, seed += 5);
      check_decode({T, 256, 128, 16, 4, moe_scoring::kSigmoid, false, false, 2048, gated}, seed += 5);
    }
  check_decode({1, 2048, 512, 16, 10, moe_scoring::kSoftmax, true, true, 512, true}, seed += 5);  // Qwen3-Next's widths
  // One token over 512 experts at a 1024-wide hidden (half a load round a lane), and a 4096-wide
  // one (two rounds).
  check_decode({1, 1024, 64, 512, 10, moe_scoring::kSoftmax, true, false, 512, true}, seed += 5);
  check_decode({1, 4096, 64, 72, 10, moe_scoring::kSigmoid, true, true, 256, false}, seed += 5);
  // A hidden width past the up ring's (8192): the default's one-row up kernel, the down ring.
  check_decode({1, 8200, 64, 8, 2, moe_scoring::kSoftmax, true, false, 64, true}, seed += 5);
  // Over 512 experts: the router's shared-memory path (moe_route.cuh).
  check_decode({1, 128, 64, 1000, 10}, seed += 5);
  check_decode({3, 128, 64, 1000, 8, moe_scoring::kSigmoid, false}, seed += 5);
}

}  // namespace
}  // namespace hyserve::kernels

#endif  // HYSERVE_HAVE_CUDA
