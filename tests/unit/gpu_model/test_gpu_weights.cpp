// Weights placed on the device directly (weight_source::load_to_device): synthetic weights
// generated on the GPU equal the host generator's bit for bit (whole tensors, slices of every
// dimension, fused row ranges; f32 and bf16 storage), checkpoint tensors streamed to the GPU
// equal the host path (same type and converting), and a model served from a checkpoint on CUDA
// gives the synthetic model's logits exactly; weight_loader::stack_cols on the device (a 2D copy)
// equals the host's. Every test needs a CUDA device and skips without.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/writer.h"
#include "checkpoint_roundtrip.h"
#include "hyserve/common/config.h"
#include "hyserve/kernels/device.h"
#include "model/weight_loader.h"
#include "model/weights.h"

namespace hyserve::worker {
namespace {

#define HYSERVE_REQUIRE_CUDA() \
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

struct selection_case {
  const char* what;
  weight_selection sel;
};

const shape_t kFull({37, 6, 50});
const selection_case kSelections[] = {
    {"whole", {}},
    {"dim 0 slice", {0, {{5, 29}}}},
    {"dim 1 slice", {1, {{2, 5}}}},
    {"dim 2 slice", {2, {{10, 35}}}},
    {"row ranges", {0, {{0, 3}, {10, 10}, {12, 20}, {30, 37}}}},
};

// The host path of a selection: what weight_loader does without a device path.
host_tensor host_selection(const weight_source& ws, const std::string& name, const shape_t& full,
                           const weight_selection& sel) {
  if (sel.ranges.empty()) return ws.load(name, full);
  if (sel.ranges.size() == 1) return ws.load_slice(name, full, sel.dim, sel.ranges[0].first, sel.ranges[0].second);
  return ws.load_row_ranges(name, full, sel.ranges);
}

// host (f32) in `type`: the bytes the device tensor must hold.
std::vector<uint8_t> host_bytes(const host_tensor& host, dtype type) {
  std::vector<uint8_t> out(static_cast<size_t>(host.numel()) * dtype_size(type));
  const float* f = host.as<float>();
  for (int64_t i = 0; i < host.numel(); ++i) {
    if (type == dtype::kF32) {
      std::memcpy(out.data() + 4 * i, f + i, 4);
    } else {
      const uint16_t h = f32_to_bf16(f[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// The selection through load_to_device into a `type` tensor equals the host path's bytes.
void expect_device_equals_host(const weight_source& ws, const std::string& name, const shape_t& full,
                               const weight_selection& sel, dtype type, const kernels::exec_context& ctx) {
  tensor dev(type, selected_shape(name, full, sel), device_kind::kCuda);
  ASSERT_TRUE(ws.load_to_device(name, full, sel, dev, ctx));
  kernels::stream_synchronize(ctx.stream);
  const host_tensor got = dev.to_host();
  const std::vector<uint8_t> want = host_bytes(host_selection(ws, name, full, sel), type);
  ASSERT_EQ(got.nbytes(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0);
}

TEST(GpuWeights, SyntheticOnTheDeviceEqualsTheHostGenerator) {
  HYSERVE_REQUIRE_CUDA();
  const kernels::exec_context ctx = kernels::open_device(device_kind::kCuda, 0);
  const auto ws = make_synthetic_weights(7, 0.37);
  for (const std::string name :
       {"model.layers.0.mamba.in_proj.weight", "model.layers.1.self_attn.o_proj.weight",
        "model.layers.2.feed_forward.down_proj.weight", "model.layers.0.input_layernorm.weight",
        "model.layers.0.mamba.norm.weight", "model.layers.0.mamba.D", "model.layers.0.mamba.conv1d.weight",
        "model.layers.0.mamba.conv1d.bias", "model.embed_tokens.weight"})
    for (const dtype type : {dtype::kF32, dtype::kBF16})
      for (const selection_case& c : kSelections) {
        SCOPED_TRACE(name + ", " + c.what + ", " + std::string(dtype_name(type)));
        expect_device_equals_host(*ws, name, kFull, c.sel, type, ctx);
      }
}

TEST(GpuWeights, SyntheticLeavesALogAndDtBiasToTheHost) {
  HYSERVE_REQUIRE_CUDA();
  const kernels::exec_context ctx = kernels::open_device(device_kind::kCuda, 0);
  const auto ws = make_synthetic_weights(7);
  for (const std::string name : {"model.layers.0.mamba.A_log", "model.layers.0.mamba.dt_bias"}) {
    tensor dev(dtype::kF32, kFull, device_kind::kCuda);
    EXPECT_FALSE(ws->load_to_device(name, kFull, {}, dev, ctx)) << name;
  }
}

TEST(GpuWeights, StackColsOnTheDeviceEqualsTheHost) {
  HYSERVE_REQUIRE_CUDA();
  const kernels::exec_context dev_ctx = kernels::open_device(device_kind::kCuda, 0);
  const kernels::exec_context host_ctx;
  const auto ws = make_synthetic_weights(7);
  for (const dtype type : {dtype::kF32, dtype::kBF16}) {
    SCOPED_TRACE(std::string(dtype_name(type)));
    std::vector<tensor> stacked;
    for (const kernels::exec_context* ctx : {&host_ctx, &dev_ctx}) {
      weight_loader ld(*ws, *ctx);
      std::vector<tensor> parts;
      parts.push_back(ld.load("model.layers.0.mamba.out_proj.weight", shape_t({37, 24}), type));
      parts.push_back(ld.load("model.layers.0.self_attn.o_proj.weight", shape_t({37, 8}), type));
      stacked.push_back(ld.stack_cols(std::move(parts)));
    }
    kernels::stream_synchronize(dev_ctx.stream);
    const host_tensor got = stacked[1].to_host();
    ASSERT_EQ(stacked[1].shape()[1], 32);
    ASSERT_EQ(got.nbytes(), stacked[0].nbytes());
    EXPECT_EQ(std::memcmp(got.data(), stacked[0].data(), got.nbytes()), 0);
  }
}

using GpuCheckpoint = test::temp_dir_test;

// Checkpoint tensors through the streaming path equal the host path, from f32 and from bf16 files,
// into f32 and bf16 weights: whole tensors, slices of dimension 0 and 1, fused row ranges.
TEST_F(GpuCheckpoint, StreamedTensorsEqualTheHostPath) {
  HYSERVE_REQUIRE_CUDA();
  const kernels::exec_context ctx = kernels::open_device(device_kind::kCuda, 0);
  const service_config cfg = load_config_string(test::kTinyBambaYaml);
  for (const dtype file_type : {dtype::kF32, dtype::kBF16}) {
    SCOPED_TRACE(std::string("file ") + std::string(dtype_name(file_type)));
    tools::checkpoint_write_options opts;
    opts.type = file_type;
    tools::write_synthetic_checkpoint(*cfg.model.synthetic, dir_.string(), opts);
    const auto ws = make_checkpoint_weights(dir_.string());
    const model_config& mc = cfg.model.synthetic->arch;
    const struct {
      std::string name;
      shape_t full;
      weight_selection sel;
    } cases[] = {
        {"model.embed_tokens.weight", {mc.vocab_size, mc.hidden_size}, {}},
        {"model.embed_tokens.weight", {mc.vocab_size, mc.hidden_size}, {0, {{64, 192}}}},
        {"model.layers.0.feed_forward.down_proj.weight", {mc.hidden_size, mc.intermediate_size}, {1, {{32, 96}}}},
        {"model.layers.0.mamba.in_proj.weight", {mc.mamba_in_proj_dim(), mc.hidden_size},
         {0, {{0, 64}, {128, 160}, {300, mc.mamba_in_proj_dim()}}}},
        {"model.layers.0.mamba.conv1d.weight", {mc.mamba_conv_dim(), 1, mc.mamba_d_conv}, {0, {{0, 64}, {128, 160}}}},
        {"model.layers.0.mamba.dt_bias", {mc.mamba_n_heads}, {0, {{2, 4}}}},
    };
    for (const auto& c : cases)
      for (const dtype type : {dtype::kF32, dtype::kBF16}) {
        SCOPED_TRACE(c.name + " → " + std::string(dtype_name(type)));
        expect_device_equals_host(*ws, c.name, c.full, c.sel, type, ctx);
      }
  }
}

TEST_F(GpuCheckpoint, CheckpointModelGivesTheSyntheticLogitsOnCuda) {
  HYSERVE_REQUIRE_CUDA();
  for (const dtype type : {dtype::kF32, dtype::kBF16}) {
    SCOPED_TRACE(std::string(dtype_name(type)));
    service_config synthetic = load_config_string(test::kTinyBambaYaml);
    synthetic.device = device_kind::kCuda;
    synthetic.model.weight_dtype = type;
    tools::checkpoint_write_options opts;
    opts.type = type;
    tools::write_synthetic_checkpoint(*synthetic.model.synthetic, dir_.string(), opts);
    test::expect_checkpoint_logits_equal(synthetic, dir_);
  }
}

}  // namespace
}  // namespace hyserve::worker
