#include <gtest/gtest.h>

#include <boost/json.hpp>
#include <cfloat>
#include <fstream>
#include <functional>
#include <sstream>

#include "common_test_support.h"
#include "hyserve/common/error.h"
#include "hyserve/common/model_config.h"

namespace hyserve {
namespace {

namespace json = boost::json;

std::string fixture_config_path() { return test::fixture_dir() + "/config.json"; }

json::object fixture_config_json() {
  std::ifstream in(fixture_config_path());
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str()).as_object();
}

// Writes the bamba-tiny config.json after `edit` into `dir` and returns its path.
std::string write_edited(const test::scratch_dir& dir, const std::function<void(json::object&)>& edit) {
  json::object o = fixture_config_json();
  edit(o);
  const std::string p = dir.file("config.json");
  test::write_file(p, json::serialize(o));
  return p;
}

TEST(ModelConfig, ReadsBambaTinyFixture) {
  const model_config c = read_hf_config(fixture_config_path());
  EXPECT_EQ(c.arch, model_arch::kBamba);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_layers, 4);
  ASSERT_EQ(c.layer_kinds.size(), 4u);
  EXPECT_EQ(c.layer_kinds[0], layer_kind::kMamba2);
  EXPECT_EQ(c.layer_kinds[1], layer_kind::kAttention);
  EXPECT_EQ(c.layer_kinds[2], layer_kind::kMamba2);
  EXPECT_EQ(c.layer_kinds[3], layer_kind::kMamba2);
  EXPECT_EQ(c.num_layers_of(layer_kind::kAttention), 1);
  EXPECT_EQ(c.num_layers_of(layer_kind::kMamba2), 3);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.max_position_embeddings, 512);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_EQ(c.pad_token_id, 0);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_FLOAT_EQ(c.partial_rotary_factor, 0.5f);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.rotary_dim(), 8);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.intermediate_size, 128);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_EQ(c.mamba_n_heads, 4);
  EXPECT_EQ(c.mamba_d_head, 32);
  EXPECT_EQ(c.mamba_d_state, 16);
  EXPECT_EQ(c.mamba_n_groups, 1);
  EXPECT_EQ(c.mamba_d_conv, 4);
  EXPECT_EQ(c.mamba_expand, 2);
  EXPECT_EQ(c.mamba_chunk_size, 16);
  EXPECT_TRUE(c.mamba_conv_bias);
  EXPECT_FALSE(c.mamba_proj_bias);
  EXPECT_EQ(c.time_step_min, 0.0f);
  EXPECT_EQ(c.time_step_max, FLT_MAX);  // {"__float__": "Infinity"}
  EXPECT_GT(c.time_step_max, 3.0e38f);
  // Derived sizes agree with the checkpoint's tensors (in_proj [292, 64], conv1d [160, 1, 4]).
  EXPECT_EQ(c.mamba_intermediate(), 128);
  EXPECT_EQ(c.mamba_conv_dim(), 160);
  EXPECT_EQ(c.mamba_in_proj_dim(), 292);
}

TEST(ModelConfig, RejectsUnsupportedArchitecture) {
  // The head of a Jamba config.json: a different hybrid family, not supported.
  test::scratch_dir dir;
  const std::string p = dir.file("config.json");
  test::write_file(p, R"({"architectures": ["JambaForCausalLM"], "model_type": "jamba",
                          "hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 512})");
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p,
                    "unsupported architecture 'JambaForCausalLM' (supported: BambaForCausalLM, "
                    "Qwen3NextForCausalLM, NemotronHForCausalLM, GraniteMoeHybridForCausalLM, FalconH1ForCausalLM)");
}

std::string family_config_path(const std::string& fixture) {
  return std::string(HYSERVE_SOURCE_DIR) + "/tests/fixtures/" + fixture + "/config.json";
}

// Writes a fixture's config.json after `edit` into `dir` and returns its path.
std::string write_edited_family(const test::scratch_dir& dir, const std::string& fixture,
                                const std::function<void(json::object&)>& edit) {
  std::ifstream in(family_config_path(fixture));
  std::stringstream ss;
  ss << in.rdbuf();
  json::object o = json::parse(ss.str()).as_object();
  edit(o);
  const std::string p = dir.file("config.json");
  test::write_file(p, json::serialize(o));
  return p;
}

TEST(ModelConfig, ReadsNemotronHTinyFixture) {
  const model_config c = read_hf_config(family_config_path("nemotronh-tiny"));
  EXPECT_EQ(c.arch, model_arch::kNemotronH);
  ASSERT_EQ(c.num_layers, 6);
  const std::vector<layer_kind> kinds = {layer_kind::kMamba2, layer_kind::kAttention, layer_kind::kMamba2,
                                         layer_kind::kMlp,    layer_kind::kMamba2,    layer_kind::kMlp};
  EXPECT_EQ(c.layer_kinds, kinds);
  EXPECT_EQ(c.num_attention_layers(), 1);
  EXPECT_EQ(c.num_recurrent_layers(), 3);
  EXPECT_FALSE(c.use_rope);
  EXPECT_EQ(c.mlp_act, mlp_activation::kRelu2);
  EXPECT_EQ(c.intermediate_size, 128);
  EXPECT_EQ(c.mamba_n_heads, 8);
  EXPECT_EQ(c.mamba_d_head, 16);
  EXPECT_EQ(c.mamba_d_state, 16);
  EXPECT_EQ(c.mamba_n_groups, 4);
  EXPECT_EQ(c.mamba_chunk_size, 16);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.time_step_max, FLT_MAX);
}

TEST(ModelConfig, NemotronHLayerPatternsAndUnsupportedKinds) {
  test::scratch_dir dir;
  // The older form: hybrid_override_pattern.
  const std::string p = write_edited_family(dir, "nemotronh-tiny", [](json::object& o) {
    o.erase("layers_block_type");
    o["hybrid_override_pattern"] = "M*-M";
  });
  const model_config c = read_hf_config(p);
  EXPECT_EQ(c.layer_kinds, (std::vector<layer_kind>{layer_kind::kMamba2, layer_kind::kAttention, layer_kind::kMlp,
                                                    layer_kind::kMamba2}));
  const std::string moe = write_edited_family(dir, "nemotronh-tiny", [](json::object& o) {
    o["layers_block_type"] = json::array{"linear_attention", "moe"};
  });
  EXPECT_ERROR_WITH((void)read_hf_config(moe), config_error, "layers_block_type[1]",
                    "layer type 'moe' is not supported (supported: mamba, linear_attention, attention, "
                    "full_attention, mlp)");
  const std::string e = write_edited_family(dir, "nemotronh-tiny", [](json::object& o) {
    o.erase("layers_block_type");
    o["hybrid_override_pattern"] = "M*E";
  });
  EXPECT_ERROR_WITH((void)read_hf_config(e), config_error, "hybrid_override_pattern", "'E' (MoE) is not supported");
  const std::string act = write_edited_family(dir, "nemotronh-tiny", [](json::object& o) { o["mlp_hidden_act"] = "gelu"; });
  EXPECT_ERROR_WITH((void)read_hf_config(act), config_error, "mlp_hidden_act", "(supported: relu2)");
  const std::string n = write_edited_family(dir, "nemotronh-tiny", [](json::object& o) { o["num_hidden_layers"] = 5; });
  EXPECT_ERROR_WITH((void)read_hf_config(n), config_error, "num_hidden_layers", "the layer pattern has 6 layers");
}

TEST(ModelConfig, ReadsGraniteMoeHybridTinyFixture) {
  const model_config c = read_hf_config(family_config_path("granite4h-tiny"));
  EXPECT_EQ(c.arch, model_arch::kGraniteMoeHybrid);
  EXPECT_EQ(c.layer_kinds, (std::vector<layer_kind>{layer_kind::kMamba2, layer_kind::kAttention,
                                                    layer_kind::kMamba2, layer_kind::kMamba2}));
  EXPECT_FALSE(c.use_rope);  // position_embedding_type: nope
  EXPECT_FLOAT_EQ(c.attention_multiplier, 0.0625f);
  EXPECT_FLOAT_EQ(c.embedding_multiplier, 12.0f);
  EXPECT_FLOAT_EQ(c.residual_multiplier, 0.22f);
  EXPECT_FLOAT_EQ(c.logits_multiplier, 1.0f / 8.0f);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.num_experts, 4);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe_intermediate_size, 32);
  EXPECT_EQ(c.shared_expert_intermediate_size, 64);
  EXPECT_EQ(c.mamba_n_groups, 1);
  EXPECT_EQ(c.pad_token_id, -1);
  test::scratch_dir dir;
  const std::string pe = write_edited_family(dir, "granite4h-tiny", [](json::object& o) {
    o["position_embedding_type"] = "alibi";
  });
  EXPECT_ERROR_WITH((void)read_hf_config(pe), config_error, "position_embedding_type", "(supported: rope, nope)");
  const std::string lt = write_edited_family(dir, "granite4h-tiny", [](json::object& o) {
    o["layer_types"] = json::array{"mamba", "attention", "mamba", "conv"};
  });
  EXPECT_ERROR_WITH((void)read_hf_config(lt), config_error, "layer_types[3]", "unknown layer type 'conv'");
}

TEST(ModelConfig, ReadsFalconH1TinyFixture) {
  const model_config c = read_hf_config(family_config_path("falconh1-tiny"));
  EXPECT_EQ(c.arch, model_arch::kFalconH1);
  EXPECT_EQ(c.num_layers, 4);
  EXPECT_EQ(c.num_layers_of(layer_kind::kParallelHybrid), 4);
  EXPECT_EQ(c.num_attention_layers(), 4);
  EXPECT_EQ(c.num_recurrent_layers(), 4);
  EXPECT_TRUE(c.use_rope);
  EXPECT_EQ(c.rotary_dim(), 16);
  EXPECT_TRUE(c.mamba_rms_norm);
  EXPECT_TRUE(c.mamba_norm_before_gate);
  EXPECT_EQ(c.mamba_n_groups, 2);
  EXPECT_EQ(c.ssm_multipliers, (std::vector<float>{1.0f, 1.1f, 0.9f, 1.2f, 0.8f}));
  EXPECT_FLOAT_EQ(c.mlp_gate_multiplier, 1.5f);
  EXPECT_FLOAT_EQ(c.mlp_down_multiplier, 0.7f);
  EXPECT_FLOAT_EQ(c.key_multiplier, 0.8f);
  EXPECT_FLOAT_EQ(c.logits_multiplier, 0.5f);
  test::scratch_dir dir;
  const std::string m = write_edited_family(dir, "falconh1-tiny", [](json::object& o) {
    o["ssm_multipliers"] = json::array{1.0, 2.0};
  });
  EXPECT_ERROR_WITH((void)read_hf_config(m), config_error, "ssm_multipliers", "expected a list of 5 numbers");
  const std::string d = write_edited_family(dir, "falconh1-tiny", [](json::object& o) { o["mamba_d_ssm"] = 96; });
  EXPECT_ERROR_WITH((void)read_hf_config(d), config_error, "mamba_d_ssm", "must equal mamba_n_heads x mamba_d_head = 128");
  const std::string b = write_edited_family(dir, "falconh1-tiny", [](json::object& o) { o["projectors_bias"] = true; });
  EXPECT_ERROR_WITH((void)read_hf_config(b), config_error, "projectors_bias", "(supported: false)");
}

TEST(ModelConfig, ReadsBambaGroupsFixture) {
  const model_config c = read_hf_config(family_config_path("bamba-groups"));
  EXPECT_EQ(c.arch, model_arch::kBamba);
  EXPECT_EQ(c.mamba_n_groups, 4);
  EXPECT_EQ(c.mamba_conv_dim(), 128 + 2 * 4 * 16);
}

std::string qwen3next_config_path() {
  return std::string(HYSERVE_SOURCE_DIR) + "/tests/fixtures/qwen3next-tiny/config.json";
}

// Writes the qwen3next-tiny config.json after `edit` into `dir` and returns its path.
std::string write_edited_qwen3next(const test::scratch_dir& dir, const std::function<void(json::object&)>& edit) {
  std::ifstream in(qwen3next_config_path());
  std::stringstream ss;
  ss << in.rdbuf();
  json::object o = json::parse(ss.str()).as_object();
  edit(o);
  const std::string p = dir.file("config.json");
  test::write_file(p, json::serialize(o));
  return p;
}

TEST(ModelConfig, ReadsQwen3NextTinyFixture) {
  const model_config c = read_hf_config(qwen3next_config_path());
  EXPECT_EQ(c.arch, model_arch::kQwen3Next);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_layers, 4);
  ASSERT_EQ(c.layer_kinds.size(), 4u);
  EXPECT_EQ(c.layer_kinds[0], layer_kind::kGatedDeltaNet);
  EXPECT_EQ(c.layer_kinds[1], layer_kind::kAttention);
  EXPECT_EQ(c.layer_kinds[2], layer_kind::kGatedDeltaNet);
  EXPECT_EQ(c.layer_kinds[3], layer_kind::kAttention);
  EXPECT_EQ(c.num_layers_of(layer_kind::kGatedDeltaNet), 2);
  EXPECT_EQ(c.num_recurrent_layers(), 2);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_EQ(c.bos_token_id, -1);  // null in the file
  EXPECT_EQ(c.eos_token_id, -1);
  EXPECT_EQ(c.pad_token_id, -1);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_FLOAT_EQ(c.partial_rotary_factor, 0.25f);
  EXPECT_EQ(c.rotary_dim(), 4);
  EXPECT_EQ(c.linear_num_key_heads, 2);
  EXPECT_EQ(c.linear_num_value_heads, 4);
  EXPECT_EQ(c.linear_key_head_dim, 16);
  EXPECT_EQ(c.linear_value_head_dim, 16);
  EXPECT_EQ(c.linear_conv_kernel_dim, 4);
  EXPECT_EQ(c.gdn_conv_dim(), 128);  // conv1d.weight [128, 1, 4]
  EXPECT_EQ(c.num_experts, 4);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe_intermediate_size, 64);
  EXPECT_EQ(c.shared_expert_intermediate_size, 64);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.decoder_sparse_step, 1);
  EXPECT_TRUE(c.mlp_only_layers.empty());
  EXPECT_EQ(c.intermediate_size, 128);
  for (int64_t i = 0; i < 4; ++i) EXPECT_TRUE(c.is_moe_layer(i)) << i;
}

TEST(ModelConfig, Qwen3NextLayerTypesAndMlpOnlyLayers) {
  test::scratch_dir dir;
  std::string p = write_edited_qwen3next(dir, [](json::object& o) {
    o.erase("layer_types");  // default: full attention every 4th layer
    o["mlp_only_layers"] = json::array{0, 2};
  });
  model_config c = read_hf_config(p);
  EXPECT_EQ(c.layer_kinds[0], layer_kind::kGatedDeltaNet);
  EXPECT_EQ(c.layer_kinds[3], layer_kind::kAttention);
  EXPECT_EQ(c.num_layers_of(layer_kind::kAttention), 1);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_FALSE(c.is_moe_layer(2));

  p = write_edited_qwen3next(dir, [](json::object& o) {
    o["layer_types"] = json::array{"linear_attention", "sliding_attention", "linear_attention", "full_attention"};
  });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "layer_types[1]",
                    "unknown layer type 'sliding_attention'");
  p = write_edited_qwen3next(dir, [](json::object& o) { o["layer_types"] = json::array{"full_attention"}; });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "layer_types", "1 entries for num_hidden_layers = 4");
  p = write_edited_qwen3next(dir, [](json::object& o) { o["linear_num_value_heads"] = 3; });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "linear_num_value_heads",
                    "multiple of linear_num_key_heads");
  p = write_edited_qwen3next(dir, [](json::object& o) { o["num_experts_per_tok"] = 5; });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "num_experts_per_tok", "[1, num_experts = 4]");
  p = write_edited_qwen3next(dir, [](json::object& o) { o.erase("linear_key_head_dim"); });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "linear_key_head_dim: missing required field");
  p = write_edited_qwen3next(dir, [](json::object& o) { o["mlp_only_layers"] = json::array{4}; });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "mlp_only_layers", "out of range");
}

TEST(ModelConfig, LayerKindOfAnotherArchitectureIsRejected) {
  model_config c = read_hf_config(fixture_config_path());  // Bamba
  c.layer_kinds[2] = layer_kind::kGatedDeltaNet;
  EXPECT_ERROR_WITH(c.validate(), config_error, "layer_kinds[2]", "no layer of that kind");
  model_config q = read_hf_config(qwen3next_config_path());
  q.layer_kinds[0] = layer_kind::kMamba2;
  EXPECT_ERROR_WITH(q.validate(), config_error, "layer_kinds[0]", "no layer of that kind");
}

TEST(ModelConfig, MissingRequiredField) {
  test::scratch_dir dir;
  for (const char* field : {"hidden_size", "vocab_size", "num_hidden_layers", "mamba_n_heads", "intermediate_size"}) {
    const std::string p = write_edited(dir, [&](json::object& o) { o.erase(field); });
    EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, std::string(field) + ": missing required field");
  }
  const std::string p = write_edited(dir, [](json::object& o) {
    o.erase("architectures");
    o.erase("model_type");
  });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "architectures: missing", "BambaForCausalLM");
}

TEST(ModelConfig, WrongFieldType) {
  test::scratch_dir dir;
  std::string p = write_edited(dir, [](json::object& o) { o["hidden_size"] = "64"; });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "hidden_size: expected an integer, got \"64\"");
  p = write_edited(dir, [](json::object& o) { o["num_attention_heads"] = 4.5; });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "num_attention_heads: expected an integer");
  p = write_edited(dir, [](json::object& o) { o["mlp_bias"] = 0; });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "mlp_bias: expected a boolean");
  p = write_edited(dir, [](json::object& o) { o["rms_norm_eps"] = "small"; });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "rms_norm_eps: expected a number");
  p = write_edited(dir, [](json::object& o) { o["attn_layer_indices"] = 1; });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "attn_layer_indices: expected an array");
}

TEST(ModelConfig, InconsistentDimensions) {
  test::scratch_dir dir;
  const std::string p = write_edited(dir, [](json::object& o) { o["mamba_d_head"] = 16; });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "inconsistent dimensions", "mamba_expand", "= 128",
                    "= 64");
}

TEST(ModelConfig, InvalidValuesNameTheField) {
  test::scratch_dir dir;
  std::string p = write_edited(dir, [](json::object& o) { o["num_key_value_heads"] = 3; });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "num_attention_heads", "multiple of num_kv_heads (3)");
  p = write_edited(dir, [](json::object& o) { o["mamba_n_groups"] = 3; });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "mamba_n_heads", "mamba_n_groups (3)");
  p = write_edited(dir, [](json::object& o) { o["attn_layer_indices"] = json::array{1, 4}; });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "attn_layer_indices", "index 4 out of range");
  p = write_edited(dir, [](json::object& o) { o["vocab_size"] = 0; });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "vocab_size: must be positive, got 0");
  p = write_edited(dir, [](json::object& o) { o["eos_token_id"] = 600; });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "eos_token_id", "got 600");
  p = write_edited(dir, [](json::object& o) { o["hidden_act"] = "gelu"; });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "hidden_act", "'gelu'", "silu");
  p = write_edited(dir, [](json::object& o) { o["rope_parameters"].as_object()["rope_type"] = "yarn"; });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "rope_parameters.rope_type", "yarn");
  p = write_edited(dir, [](json::object& o) { o["rope_parameters"].as_object()["partial_rotary_factor"] = 1.5; });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "partial_rotary_factor", "(0, 1]");
}

TEST(ModelConfig, NullTokenIdsAndOptionalFields) {
  test::scratch_dir dir;
  const std::string p = write_edited(dir, [](json::object& o) {
    o["bos_token_id"] = nullptr;
    o["pad_token_id"] = nullptr;
    o["eos_token_id"] = json::array{2, 3};
    o.erase("head_dim");
    o.erase("num_key_value_heads");
    o.erase("time_step_limit");
    o.erase("rope_parameters");
    o["rope_theta"] = 500000;  // integer-valued float field
    o["partial_rotary_factor"] = 0.25;
  });
  const model_config c = read_hf_config(p);
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_EQ(c.pad_token_id, -1);
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_EQ(c.head_dim, 16);     // hidden_size / num_attention_heads
  EXPECT_EQ(c.num_kv_heads, 4);  // defaults to num_attention_heads
  EXPECT_EQ(c.time_step_min, 0.0f);
  EXPECT_EQ(c.time_step_max, FLT_MAX);
  EXPECT_FLOAT_EQ(c.rope_theta, 500000.0f);  // top level when rope_parameters is absent
  EXPECT_EQ(c.rotary_dim(), 4);
}

TEST(ModelConfig, TimeStepLimitForms) {
  test::scratch_dir dir;
  std::string p = write_edited(dir, [](json::object& o) { o["time_step_limit"] = json::array{0.001, 100.0}; });
  model_config c = read_hf_config(p);
  EXPECT_FLOAT_EQ(c.time_step_min, 0.001f);
  EXPECT_FLOAT_EQ(c.time_step_max, 100.0f);
  p = write_edited(dir, [](json::object& o) {
    o["time_step_limit"] = json::array{json::object{{"__float__", "-Infinity"}}, 1.0};
  });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "time_step_limit", "0 <= min <= max");
  p = write_edited(dir, [](json::object& o) {
    o["time_step_limit"] = json::array{0.0, json::object{{"__float__", "NaN"}}};
  });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "time_step_limit[1]", "NaN");
  p = write_edited(dir, [](json::object& o) {
    o["time_step_limit"] = json::array{0.0, json::object{{"__float__", "Huge"}}};
  });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "time_step_limit[1]: expected a number");
  p = write_edited(dir, [](json::object& o) { o["time_step_limit"] = json::array{0.0}; });
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "time_step_limit: expected [min, max]");
}

TEST(ModelConfig, UnreadableOrMalformedFile) {
  EXPECT_ERROR_WITH((void)read_hf_config("/nonexistent/config.json"), config_error, "/nonexistent/config.json",
                    "cannot read");
  test::scratch_dir dir;
  const std::string p = dir.file("config.json");
  test::write_file(p, R"({"architectures": ["BambaForCausalLM"],)");
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "invalid JSON");
  test::write_file(p, "[1]");
  EXPECT_ERROR_WITH((void)read_hf_config(p), config_error, p, "expected a JSON object");
}

TEST(ModelConfig, RotaryDimRoundsDownToEven) {
  model_config c;
  c.head_dim = 10;
  c.partial_rotary_factor = 0.5f;
  EXPECT_EQ(c.rotary_dim(), 4);  // floor(5) → 4
  c.partial_rotary_factor = 1.0f;
  EXPECT_EQ(c.rotary_dim(), 10);
  c.head_dim = 16;
  c.partial_rotary_factor = 0.3f;
  EXPECT_EQ(c.rotary_dim(), 4);  // floor(4.8) → 4
}

TEST(ModelConfig, ValidateChecksLayerKinds) {
  model_config c = read_hf_config(fixture_config_path());
  EXPECT_NO_THROW(c.validate());
  c.layer_kinds.pop_back();
  EXPECT_ERROR_WITH(c.validate(), config_error, "layer_kinds", "3 entries for 4 layers");
  EXPECT_ERROR_WITH(model_config().validate(), config_error, "vocab_size");
}

}  // namespace
}  // namespace hyserve
