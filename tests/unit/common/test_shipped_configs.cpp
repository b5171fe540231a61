// Every YAML file under configs/ loads and validates (the files launch/serve.sh and the
// benchmarks take), and the GPU configs say what they promise.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "hyserve/common/config.h"

namespace hyserve {
namespace {

std::vector<std::filesystem::path> shipped_configs() {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(HYSERVE_SOURCE_DIR) / "configs"))
    if (e.path().extension() == ".yaml") out.push_back(e.path());
  return out;
}

// A config serving a checkpoint that hyserve-write-checkpoint writes on demand outside the
// repository (bamba-9b-checkpoint-cuda.yaml: `path: /tmp/...`) is checked, until it exists, as a
// copy serving the bamba-tiny fixture instead; other configs as they are.
std::string on_demand_checkpoint_as_fixture(const std::filesystem::path& config) {
  std::ifstream in(config);
  std::stringstream text;
  text << in.rdbuf();
  static const std::regex path_line(R"(\n  path: (/[^\s]+)\n)");
  std::smatch m;
  const std::string yaml = text.str();
  if (!std::regex_search(yaml, m, path_line) || std::filesystem::exists(m[1].str())) return config.string();
  const std::filesystem::path copy = std::filesystem::temp_directory_path() / ("hyserve-" + config.filename().string());
  std::ofstream(copy) << std::regex_replace(yaml, path_line, "\n  path: " + std::string(HYSERVE_SOURCE_DIR) +
                                                                 "/tests/fixtures/bamba-tiny\n");
  return copy.string();
}

// The configs load from the repository root (tools run from there) and, below, from elsewhere.
class ShippedConfigs : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = std::filesystem::current_path();
    std::filesystem::current_path(HYSERVE_SOURCE_DIR);
  }
  void TearDown() override { std::filesystem::current_path(saved_); }

 private:
  std::filesystem::path saved_;
};

TEST_F(ShippedConfigs, EveryConfigLoads) {
  const std::vector<std::filesystem::path> files = shipped_configs();
  EXPECT_GE(files.size(), 4u);
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    EXPECT_NO_THROW({
      const service_config c = load_config_file(on_demand_checkpoint_as_fixture(f));
      (void)resolve_model_config(c);
    });
  }
  // From any other directory as well (launch/serve.sh works from anywhere): relative paths in a
  // shipped config resolve against configs/, not against the repository root.
  std::filesystem::current_path("/");
  for (const auto& f : files) {
    SCOPED_TRACE(f.string() + " from /");
    EXPECT_NO_THROW({
      const service_config c = load_config_file(on_demand_checkpoint_as_fixture(f));
      (void)resolve_model_config(c);
    });
  }
}

TEST_F(ShippedConfigs, GpuConfigsRunBf16OnCuda) {
  for (const char* name : {"configs/cuda.yaml", "configs/bamba-9b-synthetic-cuda.yaml"}) {
    SCOPED_TRACE(name);
    const service_config c = load_config_file(std::string(HYSERVE_SOURCE_DIR) + "/" + name);
    EXPECT_EQ(c.device, device_kind::kCuda);
    EXPECT_EQ(c.model.weight_dtype, dtype::kBF16);
    EXPECT_EQ(c.cache.kv_dtype, dtype::kBF16);
  }
  // The benchmark model: Bamba-9B-shaped.
  const service_config big = load_config_file(std::string(HYSERVE_SOURCE_DIR) + "/configs/bamba-9b-synthetic-cuda.yaml");
  const model_config m = resolve_model_config(big);
  EXPECT_EQ(m.hidden_size, 4096);
  EXPECT_EQ(m.num_layers, 32);
  EXPECT_EQ(m.num_layers_of(layer_kind::kAttention), 3);
  EXPECT_EQ(m.layer_kinds[9], layer_kind::kAttention);
  EXPECT_EQ(m.layer_kinds[18], layer_kind::kAttention);
  EXPECT_EQ(m.layer_kinds[27], layer_kind::kAttention);
  EXPECT_EQ(m.mamba_n_heads, 128);
  EXPECT_EQ(m.mamba_d_head, 64);
  EXPECT_EQ(m.mamba_d_state, 128);
  EXPECT_EQ(m.intermediate_size, 14336);
  EXPECT_EQ(m.vocab_size, 128256);
}

// The 9B-class benchmark configs of the other families: bf16 on CUDA, shaped like their
// published checkpoints (configs/shapes/*.json).
TEST_F(ShippedConfigs, FamilyBenchmarkConfigsHaveTheirCheckpointShapes) {
  struct expect {
    const char* file;
    model_arch arch;
    int64_t hidden, layers, attention_layers, recurrent_layers, vocab;
  };
  for (const expect& e : {expect{"configs/nemotron-h-8b-synthetic-cuda.yaml", model_arch::kNemotronH, 4096, 52, 4, 24, 131072},
                          expect{"configs/granite-4.0-h-tiny-synthetic-cuda.yaml", model_arch::kGraniteMoeHybrid, 1536, 40,
                                 4, 36, 100352},
                          expect{"configs/falcon-h1-7b-synthetic-cuda.yaml", model_arch::kFalconH1, 3072, 44, 44, 44,
                                 130048}}) {
    SCOPED_TRACE(e.file);
    const service_config c = load_config_file(e.file);
    EXPECT_EQ(c.device, device_kind::kCuda);
    EXPECT_EQ(c.model.weight_dtype, dtype::kBF16);
    EXPECT_EQ(c.cache.kv_dtype, dtype::kBF16);
    const model_config m = resolve_model_config(c);
    EXPECT_EQ(m.arch, e.arch);
    EXPECT_EQ(m.hidden_size, e.hidden);
    EXPECT_EQ(m.num_layers, e.layers);
    EXPECT_EQ(m.num_attention_layers(), e.attention_layers);
    EXPECT_EQ(m.num_recurrent_layers(), e.recurrent_layers);
    EXPECT_EQ(m.vocab_size, e.vocab);
  }
}

// The MoE benchmark configs: real layer and expert shapes (Qwen3-Next-80B-A3B with fewer layers:
// 32 for one 141 GB GPU, 16 for one 80 GB GPU; Granite-4.0-H-Small), bf16 on CUDA.
TEST_F(ShippedConfigs, MoeBenchmarkConfigsHaveTheirExpertShapes) {
  struct expect {
    const char* file;
    model_arch arch;
    int64_t hidden, layers, attention_layers, recurrent_layers, vocab, experts, top_k, expert_width, shared_width;
  };
  for (const expect& e :
       {expect{"configs/qwen3-next-80b-a3b-synthetic-cuda.yaml", model_arch::kQwen3Next, 2048, 32, 8, 24, 151936, 512,
               10, 512, 512},
        expect{"configs/qwen3-next-80b-a3b-16l-synthetic-cuda.yaml", model_arch::kQwen3Next, 2048, 16, 4, 12, 151936,
               512, 10, 512, 512},
        expect{"configs/granite-4.0-h-small-synthetic-cuda.yaml", model_arch::kGraniteMoeHybrid, 4096, 40, 4, 36, 100352,
               72, 10, 768, 8192}}) {
    SCOPED_TRACE(e.file);
    const service_config c = load_config_file(e.file);
    EXPECT_EQ(c.device, device_kind::kCuda);
    EXPECT_EQ(c.model.weight_dtype, dtype::kBF16);
    const model_config m = resolve_model_config(c);
    EXPECT_EQ(m.arch, e.arch);
    EXPECT_EQ(m.hidden_size, e.hidden);
    EXPECT_EQ(m.num_layers, e.layers);
    EXPECT_EQ(m.num_attention_layers(), e.attention_layers);
    EXPECT_EQ(m.num_recurrent_layers(), e.recurrent_layers);
    EXPECT_EQ(m.vocab_size, e.vocab);
    EXPECT_EQ(m.num_experts, e.experts);
    EXPECT_EQ(m.num_experts_per_tok, e.top_k);
    EXPECT_EQ(m.moe_intermediate_size, e.expert_width);
    EXPECT_EQ(m.shared_expert_intermediate_size, e.shared_width);
  }
}

}  // namespace
}  // namespace hyserve
