// bf16 mode on CUDA (model.dtype: bfloat16, cache.kv_dtype: bfloat16; the Mamba2 state stays
// float32 because the CUDA SSM kernels take f32 state): the argmax of every teacher-forced
// position whose reference top-2 margin exceeds 0.05 equals the float32 reference argmax.
// Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "cpu_cuda_steps.h"
#include "fixture.h"
#include "hyserve/common/config.h"
#include "hyserve/common/safetensors.h"
#include "hyserve/kernels/device.h"
#include "hyserve/kernels/gdn.h"
#include "hyserve/kernels/run.h"
#include "hyserve/worker/engine.h"

namespace hyserve {
namespace {

using worker::engine;
using worker::forward_mode;
using worker::forward_options;
using worker::step_row;

constexpr double kMargin = 0.05;
// Qwen3-Next flips three positions of prompt 2 under bf16 weights on the CPU as well (see
// tests/unit/model/test_bf16_mode.cpp); the same allowance applies here.
constexpr int kQwen3NextKnownFlips = 3;

int64_t argmax(const float* row, int64_t n) { return std::max_element(row, row + n) - row; }

double margin(const float* row, int64_t n) {
  const int64_t best = argmax(row, n);
  float second = -3.4e38f;
  for (int64_t j = 0; j < n; ++j)
    if (j != best) second = std::max(second, row[j]);
  return static_cast<double>(row[best]) - static_cast<double>(second);
}

class GpuBf16Fixture : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuBf16Fixture, MatchesReferenceArgmaxWhereMarginExceeds005) {
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string fixture = GetParam();
  if (fixture == "qwen3next-tiny" && !kernels::has_cuda<kernels::gdn_chunk_scan_params>())
    GTEST_SKIP() << "Gated DeltaNet has no CUDA op in this build";
  service_config cfg;
  cfg.model.path = test::fixture_dir(fixture);
  cfg.model.weight_dtype = dtype::kBF16;
  cfg.device = device_kind::kCuda;
  cfg.cache.kv_dtype = dtype::kBF16;
  cfg.cache.page_size = 16;
  cfg.cache.max_requests = 8;
  cfg.cache.max_context = 256;
  engine eng(cfg);
  EXPECT_EQ(eng.pools().kv->type(), dtype::kBF16);

  const auto prompts = test::load_reference_prompts(fixture);
  const safetensors_file ref = safetensors_file::open(test::fixture_dir(fixture) + "/reference.safetensors");
  const int64_t vocab = eng.config().vocab_size;
  forward_options opts;
  opts.all_logits = true;
  int checked = 0, mismatches = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> seq = prompts[i].input_ids;
    seq.insert(seq.end(), prompts[i].greedy_ids.begin(), prompts[i].greedy_ids.end());
    const int32_t req = eng.open_request();
    const host_tensor logits = eng.step(forward_mode::kExtend, {step_row{req, seq}}, opts);
    eng.close_request(req);
    ASSERT_EQ(logits.shape(), shape_t({static_cast<int64_t>(seq.size()), vocab}));
    const auto* want = static_cast<const float*>(ref.data("full_logits." + std::to_string(i)));
    for (int64_t t = 0; t < static_cast<int64_t>(seq.size()); ++t) {
      const float* w = want + t * vocab;
      if (margin(w, vocab) <= kMargin) continue;
      ++checked;
      const int64_t got = argmax(logits.as<float>() + t * vocab, vocab);
      if (got != argmax(w, vocab)) {
        ++mismatches;
        std::cout << fixture << " prompt " << i << " position " << t << ": argmax " << got << ", reference "
                  << argmax(w, vocab) << " (reference margin " << margin(w, vocab) << ")\n";
      }
    }
  }
  // Granite-4.0-H divides its logits by logits_scaling: 13 of its teacher-forced positions have
  // a margin above 0.05 (the others at least 20).
  EXPECT_GT(checked, fixture == "granite4h-tiny" ? 10 : 20);
  EXPECT_LE(mismatches, fixture == "qwen3next-tiny" ? kQwen3NextKnownFlips : 0) << fixture << ": " << checked
                                                                                   << " positions checked";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuBf16Fixture, ::testing::Values("bamba-tiny", "qwen3next-tiny", "bamba-groups", "nemotronh-tiny",
                                           "granite4h-tiny", "falconh1-tiny"),
                         [](const ::testing::TestParamInfo<std::string>& fixture) {
                           std::string s = fixture.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return "Cuda_bf16_" + s;
                         });

// The wide-head tensor-core paths of a bfloat16 model end to end: a synthetic Bamba whose
// Mamba2 heads are Falcon-H1's (head_dim 128, d_state 256: the prefill scan on the sequential bf16
// kernel, ssd_chunk_scan_params::bf16_operands) and whose attention heads are Qwen3-Next's
// (head_dim 256: prefill on the tensor-core extend kernel's 32-key tiles), on CUDA against the
// same bf16 model on the CPU (f32 activations throughout): an Extend of a 150- and a 70-token
// prompt (several 64-token scan chunks and query tiles), then a Decode step. Each logits row within
// 5% of its range, and the argmax equal wherever the CPU's top-2 margin exceeds 10% of the range
// (the CUDA GEMMs also round their activations to bf16, the CPU's do not; a wrong kernel is far
// outside either).
TEST(GpuBf16Model, WideHeadsPrefillMatchesCpu) {
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string yaml =
      "model:\n  synthetic: {arch: bamba, vocab_size: 256, hidden_size: 128, num_layers: 2, "
      "attn_layer_indices: [1], num_attention_heads: 2, num_kv_heads: 1, head_dim: 256, intermediate_size: 256, "
      "mamba_n_heads: 2, mamba_d_head: 128, mamba_d_state: 256, mamba_n_groups: 1, mamba_d_conv: 4, "
      "mamba_chunk_size: 64, seed: 5}\n  dtype: bfloat16\n"
      "cache: {page_size: 16, max_requests: 4, max_context: 256, kv_dtype: bfloat16}\n";
  std::vector<int32_t> a(150), b(70);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<int32_t>((i * 37 + 11) % 256);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<int32_t>((i * 53 + 7) % 256);
  const test::cpu_cuda_logits steps = test::cpu_and_cuda_steps(load_config_string(yaml), a, b, 3, 4);
  const std::vector<host_tensor>& out_cpu = steps.cpu;
  const std::vector<host_tensor>& out_gpu = steps.cuda;
  int checked = 0;
  for (size_t s = 0; s < out_cpu.size(); ++s) {
    ASSERT_EQ(out_cpu[s].shape(), out_gpu[s].shape()) << "step " << s;
    const int64_t vocab = out_cpu[s].shape()[1];
    for (int64_t r = 0; r < out_cpu[s].shape()[0]; ++r) {
      const float* want = out_cpu[s].as<float>() + r * vocab;
      const float* got = out_gpu[s].as<float>() + r * vocab;
      const auto [lo, hi] = std::minmax_element(want, want + vocab);
      const double range = static_cast<double>(*hi) - static_cast<double>(*lo);
      double worst = 0.0;
      for (int64_t j = 0; j < vocab; ++j) worst = std::max(worst, std::abs(static_cast<double>(got[j]) - want[j]));
      ASSERT_LE(worst, 0.05 * range) << "step " << s << " row " << r;
      if (margin(want, vocab) > 0.1 * range) {
        ++checked;
        EXPECT_EQ(argmax(got, vocab), argmax(want, vocab)) << "step " << s << " row " << r;
      }
    }
  }
  EXPECT_GT(checked, 10);
}

}  // namespace
}  // namespace hyserve
