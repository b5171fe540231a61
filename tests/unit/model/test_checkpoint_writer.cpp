// hyserve-write-checkpoint's library: a tiny synthetic Bamba written as a checkpoint directory
// (one file or shards) loads as the same model: config.json reads back as the synthetic sizes,
// and the logits of the checkpoint model equal the synthetic model's bit for bit, in float32
// and in bfloat16.
#include <gtest/gtest.h>

#include <filesystem>

#include "checkpoint/writer.h"
#include "checkpoint_roundtrip.h"
#include "hyserve/common/config.h"
#include "hyserve/common/error.h"
#include "hyserve/common/model_config.h"

namespace hyserve {
namespace {

namespace fs = std::filesystem;
using test::expect_checkpoint_logits_equal;
using test::kTinyBambaYaml;

using CheckpointWriter = test::temp_dir_test;

TEST_F(CheckpointWriter, ConfigJsonReadsBackAsTheSyntheticSizes) {
  const service_config cfg = load_config_string(kTinyBambaYaml);
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
  const service_config cfg = load_config_string(kTinyBambaYaml);
  tools::checkpoint_write_options opts;
  opts.type = dtype::kF32;
  tools::write_synthetic_checkpoint(*cfg.model.synthetic, dir_.string(), opts);
  expect_checkpoint_logits_equal(cfg, dir_);
}

TEST_F(CheckpointWriter, Bfloat16CheckpointGivesTheSyntheticBfloat16Logits) {
  service_config cfg = load_config_string(kTinyBambaYaml);
  cfg.model.weight_dtype = dtype::kBF16;
  tools::write_synthetic_checkpoint(*cfg.model.synthetic, dir_.string());  // bf16 by default
  expect_checkpoint_logits_equal(cfg, dir_);
}

TEST_F(CheckpointWriter, ShardedCheckpointGivesTheSyntheticLogits) {
  const service_config cfg = load_config_string(kTinyBambaYaml);
  tools::checkpoint_write_options opts;
  opts.type = dtype::kF32;
  opts.max_shard_bytes = 200000;  // the tiny model is ~0.6 MB in f32
  const auto r = tools::write_synthetic_checkpoint(*cfg.model.synthetic, dir_.string(), opts);
  EXPECT_GT(r.files, 1);
  EXPECT_TRUE(fs::exists(dir_ / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir_ / "model.safetensors"));
  expect_checkpoint_logits_equal(cfg, dir_);
}

TEST_F(CheckpointWriter, OnlyBambaIsWritten) {
  model_config mc;
  mc.arch = model_arch::kQwen3Next;
  EXPECT_THROW(tools::bamba_checkpoint_tensors(mc), config_error);
}

}  // namespace
}  // namespace hyserve
