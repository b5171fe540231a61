// hyserve-write-checkpoint's library: a tiny synthetic Bamba written as a checkpoint directory
// (one file or shards) loads as the same model: config.json reads back as the synthetic sizes,
// and the logits of the checkpoint model equal the synthetic model's bit for bit, in float32
// and in bfloat16.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "checkpoint/writer.h"
#include "hyserve/common/config.h"
#include "hyserve/common/error.h"
#include "hyserve/common/model_config.h"
#include "hyserve/worker/engine.h"

namespace hyserve {
namespace {

namespace fs = std::filesystem;
using worker::engine;
using worker::forward_mode;
using worker::forward_options;

const char* const kTinyBamba =
    "model:\n  synthetic: {arch: bamba, vocab_size: 256, hidden_size: 64, num_layers: 4, "
    "attn_layer_indices: [1, 3], num_attention_heads: 4, num_kv_heads: 2, head_dim: 32, intermediate_size: 128, "
    "mamba_n_heads: 4, mamba_d_head: 32, mamba_d_state: 16, mamba_n_groups: 2, mamba_d_conv: 4, "
    "mamba_chunk_size: 8, residual_scale: 0.5, seed: 11}\n"
    "cache: {page_size: 16, max_requests: 4, max_context: 128}\n";

// A fresh directory under the system's temporary directory, removed at the end of the test.
class CheckpointWriter : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("hyserve-ckpt-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// Extend of two rows, then a decode step; every position's logits.
std::vector<host_tensor> run_steps(const service_config& cfg) {
  engine e(cfg);
  forward_options opts;
  opts.all_logits = true;
  const std::vector<int32_t> a = {5, 17, 3, 250, 9, 9, 41, 7, 100, 2, 66, 31, 8, 12, 19, 200, 1, 4, 77};
  const std::vector<int32_t> b = {8, 1, 2, 3};
  const int32_t ra = e.open_request(), rb = e.open_request();
  std::vector<host_tensor> out;
  out.push_back(e.step(forward_mode::kExtend, {{ra, a}, {rb, b}}, opts));
  out.push_back(e.step(forward_mode::kDecode, {{ra, {11}}, {rb, {12}}}, opts));
  return out;
}

void expect_same_logits(const service_config& synthetic, const fs::path& dir) {
  service_config from_ckpt = synthetic;
  from_ckpt.model.synthetic.reset();
  from_ckpt.model.path = dir.string();
  const std::vector<host_tensor> want = run_steps(synthetic), got = run_steps(from_ckpt);
  ASSERT_EQ(want.size(), got.size());
  for (size_t s = 0; s < want.size(); ++s) {
    ASSERT_EQ(want[s].shape(), got[s].shape()) << "step " << s;
    EXPECT_EQ(std::memcmp(want[s].data(), got[s].data(), want[s].nbytes()), 0) << "step " << s;
  }
}

TEST_F(CheckpointWriter, ConfigJsonReadsBackAsTheSyntheticSizes) {
  const service_config cfg = load_config_string(kTinyBamba);
  const auto r = tools::write_synthetic_checkpoint(*cfg.model.synthetic, dir_.string());
  EXPECT_EQ(r.files, 1);
  EXPECT_TRUE(fs::exists(dir_ / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir_ / "model.safetensors.index.json"));
  const model_config& want = cfg.model.synthetic->arch;
  const model_config got = read_hf_config((dir_ / "config.json").string());
  EXPECT_EQ(got.arch, want.arch);
  EXPECT_EQ(got.layer_kinds, want.layer_kinds);
  EXPECT_EQ(got.vocab_size, want.vocab_size);
  EXPECT_EQ(got.hidden_size, want.hidden_size);
  EXPECT_EQ(got.head_dim, want.head_dim);
  EXPECT_EQ(got.num_kv_heads, want.num_kv_heads);
  EXPECT_EQ(got.intermediate_size, want.intermediate_size);
  EXPECT_EQ(got.mamba_n_groups, want.mamba_n_groups);
  EXPECT_EQ(got.mamba_chunk_size, want.mamba_chunk_size);
  EXPECT_EQ(got.mamba_expand, want.mamba_expand);
  EXPECT_EQ(got.rms_norm_eps, want.rms_norm_eps);
  EXPECT_EQ(got.rope_theta, want.rope_theta);
  EXPECT_EQ(got.partial_rotary_factor, want.partial_rotary_factor);
  EXPECT_EQ(got.time_step_max, want.time_step_max);
  EXPECT_EQ(got.eos_token_id, want.eos_token_id);
}

TEST_F(CheckpointWriter, Float32CheckpointGivesTheSyntheticLogits) {
  const service_config cfg = load_config_string(kTinyBamba);
  tools::checkpoint_write_options opts;
  opts.type = dtype::kF32;
  tools::write_synthetic_checkpoint(*cfg.model.synthetic, dir_.string(), opts);
  expect_same_logits(cfg, dir_);
}

TEST_F(CheckpointWriter, Bfloat16CheckpointGivesTheSyntheticBfloat16Logits) {
  service_config cfg = load_config_string(kTinyBamba);
  cfg.model.weight_dtype = dtype::kBF16;
  tools::write_synthetic_checkpoint(*cfg.model.synthetic, dir_.string());  // bf16 by default
  expect_same_logits(cfg, dir_);
}

TEST_F(CheckpointWriter, ShardedCheckpointGivesTheSyntheticLogits) {
  const service_config cfg = load_config_string(kTinyBamba);
  tools::checkpoint_write_options opts;
  opts.type = dtype::kF32;
  opts.max_shard_bytes = 200000;  // the tiny model is ~0.6 MB in f32
  const auto r = tools::write_synthetic_checkpoint(*cfg.model.synthetic, dir_.string(), opts);
  EXPECT_GT(r.files, 1);
  EXPECT_TRUE(fs::exists(dir_ / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir_ / "model.safetensors"));
  expect_same_logits(cfg, dir_);
}

TEST_F(CheckpointWriter, OnlyBambaIsWritten) {
  model_config mc;
  mc.arch = model_arch::kQwen3Next;
  EXPECT_THROW(tools::bamba_checkpoint_tensors(mc), config_error);
}

}  // namespace
}  // namespace hyserve
