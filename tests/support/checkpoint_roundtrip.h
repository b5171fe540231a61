#pragma once
// A synthetic model against the same model written as a checkpoint (hyserve-write-checkpoint's
// library): a tiny Bamba, a temporary directory per test, and the comparison of every
// position's logits over an extend and a decode step, bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "hyserve/common/config.h"
#include "hyserve/worker/engine.h"

namespace hyserve::test {

// Attention with head_dim 32, Mamba2 with 2 groups, a chunk size below the prompt.
inline const char* const kTinyBambaYaml =
    "model:\n  synthetic: {arch: bamba, vocab_size: 256, hidden_size: 64, num_layers: 4, "
    "attn_layer_indices: [1, 3], num_attention_heads: 4, num_kv_heads: 2, head_dim: 32, intermediate_size: 128, "
    "mamba_n_heads: 4, mamba_d_head: 32, mamba_d_state: 16, mamba_n_groups: 2, mamba_d_conv: 4, "
    "mamba_chunk_size: 8, residual_scale: 0.5, seed: 11}\n"
    "cache: {page_size: 16, max_requests: 4, max_context: 128}\n";

// A fresh directory under the system's temporary directory, removed at the end of the test.
class temp_dir_test : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("hyserve-ckpt-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

// Extend of two rows, then a decode step; every position's logits.
inline std::vector<host_tensor> run_two_steps(const service_config& cfg) {
  worker::engine e(cfg);
  worker::forward_options opts;
  opts.all_logits = true;
  const std::vector<int32_t> a = {5, 17, 3, 250, 9, 9, 41, 7, 100, 2, 66, 31, 8, 12, 19, 200, 1, 4, 77};
  const std::vector<int32_t> b = {8, 1, 2, 3};
  const int32_t ra = e.open_request(), rb = e.open_request();
  std::vector<host_tensor> out;
  out.push_back(e.step(worker::forward_mode::kExtend, {{ra, a}, {rb, b}}, opts));
  out.push_back(e.step(worker::forward_mode::kDecode, {{ra, {11}}, {rb, {12}}}, opts));
  return out;
}

// The model of `synthetic` served from checkpoint directory `dir` (same device and dtypes) gives
// the synthetic model's logits bit for bit.
inline void expect_checkpoint_logits_equal(const service_config& synthetic, const std::filesystem::path& dir) {
  service_config from_ckpt = synthetic;
  from_ckpt.model.synthetic.reset();
  from_ckpt.model.path = dir.string();
  const std::vector<host_tensor> want = run_two_steps(synthetic), got = run_two_steps(from_ckpt);
  ASSERT_EQ(want.size(), got.size());
  for (size_t s = 0; s < want.size(); ++s) {
    ASSERT_EQ(want[s].shape(), got[s].shape()) << "step " << s;
    EXPECT_EQ(std::memcmp(want[s].data(), got[s].data(), want[s].nbytes()), 0) << "step " << s;
  }
}

}  // namespace hyserve::test
