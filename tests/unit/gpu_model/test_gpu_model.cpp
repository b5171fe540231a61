// The model on CUDA in float32 (device: cuda): the fixtures against their Hugging Face
// references, and one synthetic step against the CPU. Every test needs a CUDA device and skips
// without one, except the start-up error of device: cuda on a machine without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "cpu_cuda_steps.h"
#include "fixture.h"
#include "hyserve/common/config.h"
#include "hyserve/common/error.h"
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

constexpr float kLogitTol = 1e-3f;  // max abs vs the reference full_logits (float32 on CUDA)

#define HYSERVE_REQUIRE_CUDA() \
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

service_config fixture_config(const std::string& fixture, device_kind device) {
  service_config cfg;
  cfg.model.path = test::fixture_dir(fixture);
  cfg.device = device;
  cfg.cache.page_size = 16;
  cfg.cache.max_requests = 8;
  cfg.cache.max_context = 256;
  return cfg;
}

// One fixture (prompts, greedy ids, teacher-forced logits) checked on CUDA.
class GpuFixture : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    HYSERVE_REQUIRE_CUDA();
    prompts_ = test::load_reference_prompts(GetParam());
    ref_ = std::make_unique<safetensors_file>(
        safetensors_file::open(test::fixture_dir(GetParam()) + "/reference.safetensors"));
    if (GetParam() == "qwen3next-tiny" && !kernels::has_cuda<kernels::gdn_chunk_scan_params>())
      GTEST_SKIP() << "Gated DeltaNet has no CUDA op in this build (see GdnWithoutCudaOpIsAClearError)";
    eng_ = std::make_unique<engine>(fixture_config(GetParam(), device_kind::kCuda));
    vocab_ = eng_->config().vocab_size;
  }

  std::vector<int32_t> full_sequence(size_t i) const {
    std::vector<int32_t> s = prompts_[i].input_ids;
    s.insert(s.end(), prompts_[i].greedy_ids.begin(), prompts_[i].greedy_ids.end());
    return s;
  }
  const float* ref_row(size_t i, int64_t t) const {
    return static_cast<const float*>(ref_->data("full_logits." + std::to_string(i))) + t * vocab_;
  }

  std::vector<test::reference_prompt> prompts_;
  std::unique_ptr<safetensors_file> ref_;
  std::unique_ptr<engine> eng_;
  int64_t vocab_ = 0;
};

TEST_P(GpuFixture, TeacherForcedLogitsMatchReference) {
  forward_options opts;
  opts.all_logits = true;
  for (size_t i = 0; i < prompts_.size(); ++i) {
    const std::vector<int32_t> seq = full_sequence(i);
    const int32_t req = eng_->open_request();
    const host_tensor logits = eng_->step(forward_mode::kExtend, {step_row{req, seq}}, opts);
    eng_->close_request(req);
    ASSERT_EQ(logits.device(), device_kind::kCpu);
    ASSERT_EQ(logits.shape(), shape_t({static_cast<int64_t>(seq.size()), vocab_}));
    EXPECT_LE(test::max_abs_diff(logits.as<float>(), ref_row(i, 0), logits.numel()), kLogitTol) << "prompt " << i;
  }
}

TEST_P(GpuFixture, GreedyGenerationReproducesReference) {
  for (size_t i = 0; i < prompts_.size(); ++i) {
    const auto& p = prompts_[i];
    EXPECT_EQ(eng_->generate_greedy(p.input_ids, static_cast<int32_t>(p.greedy_ids.size())), p.greedy_ids)
        << "prompt " << i;
  }
}

// Extend (prompt 2 only half), Decode, Mixed (prompt 2's rest with two decode rows), Decode to
// the end; every row's logits equal the reference teacher-forced row of its position.
TEST_P(GpuFixture, BatchedExtendDecodeMixedMatchReference) {
  const size_t n = prompts_.size();
  ASSERT_GE(n, 3u);
  std::vector<int32_t> req(n);
  std::vector<std::vector<int32_t>> seq(n);
  std::vector<size_t> consumed(n, 0);
  for (size_t i = 0; i < n; ++i) {
    req[i] = eng_->open_request();
    seq[i] = full_sequence(i);
  }
  auto check_rows = [&](const host_tensor& logits, const std::vector<size_t>& which, const std::string& what) {
    ASSERT_EQ(logits.shape()[0], static_cast<int64_t>(which.size())) << what;
    for (size_t r = 0; r < which.size(); ++r) {
      const size_t i = which[r];
      const int64_t pos = static_cast<int64_t>(consumed[i]) - 1;
      EXPECT_LE(test::max_abs_diff(logits.as<float>() + static_cast<int64_t>(r) * vocab_, ref_row(i, pos), vocab_),
                kLogitTol)
          << what << ": prompt " << i << " position " << pos;
    }
  };
  auto take = [&](size_t i, size_t count) {
    std::vector<int32_t> t(seq[i].begin() + static_cast<std::ptrdiff_t>(consumed[i]),
                           seq[i].begin() + static_cast<std::ptrdiff_t>(consumed[i] + count));
    consumed[i] += count;
    return t;
  };
  const size_t half = prompts_[2].input_ids.size() / 2;
  check_rows(eng_->step(forward_mode::kExtend, {{req[0], take(0, prompts_[0].input_ids.size())},
                                                {req[1], take(1, prompts_[1].input_ids.size())},
                                                {req[2], take(2, half)}}),
             {0, 1, 2}, "extend batch");
  for (int s = 0; s < 3; ++s)
    check_rows(eng_->step(forward_mode::kDecode, {{req[0], take(0, 1)}, {req[1], take(1, 1)}}), {0, 1},
               "decode batch " + std::to_string(s));
  const size_t rest = prompts_[2].input_ids.size() - half;
  check_rows(eng_->step(forward_mode::kMixed, {{req[0], take(0, 1)}, {req[2], take(2, rest)}, {req[1], take(1, 1)}}),
             {0, 2, 1}, "mixed batch");
  while (true) {
    std::vector<step_row> rows;
    std::vector<size_t> which;
    for (size_t i = 0; i < n; ++i)
      if (consumed[i] < seq[i].size()) {
        rows.push_back({req[i], take(i, 1)});
        which.push_back(i);
      }
    if (rows.empty()) break;
    check_rows(eng_->step(forward_mode::kDecode, rows), which, "decode tail");
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuFixture, ::testing::Values("bamba-tiny", "qwen3next-tiny", "bamba-groups", "nemotronh-tiny",
                                           "granite4h-tiny", "falconh1-tiny"),
                         [](const ::testing::TestParamInfo<std::string>& fixture) {
                           std::string s = fixture.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return "Cuda_f32_" + s;
                         });

// Without a CUDA Gated DeltaNet op, a Qwen3-Next step on CUDA fails loudly naming the op; it
// never falls back to the CPU.
TEST(GpuModel, GdnWithoutCudaOpIsAClearError) {
  HYSERVE_REQUIRE_CUDA();
  if (kernels::has_cuda<kernels::gdn_chunk_scan_params>()) GTEST_SKIP() << "this build has the CUDA GDN op";
  engine eng(fixture_config("qwen3next-tiny", device_kind::kCuda));
  const int32_t req = eng.open_request();
  try {
    eng.step(forward_mode::kExtend, {step_row{req, {1, 2, 3}}});
    FAIL() << "expected an error";
  } catch (const error& e) {
    EXPECT_NE(std::string(e.what()).find("gdn_chunk_scan_params has no CUDA implementation"), std::string::npos)
        << e.what();
  }
}

// One synthetic Bamba (attention with head_dim 32, Mamba2 with 2 groups, chunk size below the
// prompt) on both devices: Extend of two rows, then a Decode step; logits agree.
TEST(GpuModel, SyntheticStepCpuVsCuda_f32) {
  HYSERVE_REQUIRE_CUDA();
  const std::string yaml =
      "model:\n  synthetic: {arch: bamba, vocab_size: 256, hidden_size: 64, num_layers: 4, "
      "attn_layer_indices: [1, 3], num_attention_heads: 4, num_kv_heads: 2, head_dim: 32, intermediate_size: 128, "
      "mamba_n_heads: 4, mamba_d_head: 32, mamba_d_state: 16, mamba_n_groups: 2, mamba_d_conv: 4, "
      "mamba_chunk_size: 8, seed: 11}\n"
      "cache: {page_size: 16, max_requests: 4, max_context: 128}\n";
  const std::vector<int32_t> a = {5, 17, 3, 250, 9, 9, 41, 7, 100, 2, 66, 31, 8, 12, 19, 200, 1, 4, 77};
  const std::vector<int32_t> b = {8, 1, 2, 3};
  const test::cpu_cuda_logits steps = test::cpu_and_cuda_steps(load_config_string(yaml), a, b, 11, 12);
  const std::vector<host_tensor>& out_cpu = steps.cpu;
  const std::vector<host_tensor>& out_gpu = steps.cuda;
  for (size_t s = 0; s < out_cpu.size(); ++s) {
    ASSERT_EQ(out_cpu[s].shape(), out_gpu[s].shape()) << "step " << s;
    EXPECT_LE(test::max_abs_diff(out_cpu[s].as<float>(), out_gpu[s].as<float>(), out_cpu[s].numel()), kLogitTol)
        << "step " << s;
  }
}

// device: cuda on a machine without a CUDA device is a start-up error naming the problem.
TEST(GpuModel, CudaWithoutDeviceIsAStartupError) {
  if (kernels::cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  try {
    engine eng(fixture_config("bamba-tiny", device_kind::kCuda));
    FAIL() << "expected a configuration error";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("device: cuda"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hyserve
