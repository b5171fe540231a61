#include "hyserve/common/model_config.h"

#include <boost/json.hpp>
#include <cfloat>
#include <cmath>
#include <limits>
#include <optional>
#include <string_view>

#include "hyserve/common/error.h"
#include "hyserve/common/json.h"

namespace hyserve {

namespace {

namespace json = boost::json;

// Shortest round-trip decimal form of a float for messages.
std::string fmt_float(double v) { return json::serialize(json::value(v)); }

// Typed access to the fields of one config.json; every error names the file and the field.
class hf_reader {
 public:
  hf_reader(std::string path, const json::object& obj) : path_(std::move(path)), obj_(obj) {}

  [[noreturn]] void fail(std::string_view field, const std::string& what) const {
    throw config_error(path_ + ": " + std::string(field) + ": " + what);
  }

  // Absent and null both count as "not given" (transformers writes null for unset options).
  const json::value* find(std::string_view field) const {
    const json::value* v = obj_.if_contains(field);
    return (v && !v->is_null()) ? v : nullptr;
  }

  const json::value& require(std::string_view field) const {
    const json::value* v = find(field);
    if (!v) fail(field, "missing required field");
    return *v;
  }

  int64_t to_int(std::string_view field, const json::value& v) const {
    if (v.is_int64()) return v.get_int64();
    if (v.is_uint64() && v.get_uint64() <= static_cast<uint64_t>(INT64_MAX))
      return static_cast<int64_t>(v.get_uint64());
    fail(field, "expected an integer, got " + json_excerpt(v));
  }

  // A number, or transformers 5's {"__float__": "Infinity" | "-Infinity" | "NaN"} for values
  // plain JSON cannot hold.
  double to_double(std::string_view field, const json::value& v) const {
    if (v.is_double()) return v.get_double();
    if (v.is_int64()) return static_cast<double>(v.get_int64());
    if (v.is_uint64()) return static_cast<double>(v.get_uint64());
    if (v.is_object()) {
      const json::value* f = v.get_object().if_contains("__float__");
      if (f && f->is_string() && v.get_object().size() == 1) {
        const std::string_view s(f->get_string());
        if (s == "Infinity" || s == "inf") return std::numeric_limits<double>::infinity();
        if (s == "-Infinity" || s == "-inf") return -std::numeric_limits<double>::infinity();
        if (s == "NaN" || s == "nan") return std::numeric_limits<double>::quiet_NaN();
      }
    }
    fail(field, "expected a number, got " + json_excerpt(v));
  }

  // A finite float field (sizes such as eps or rope theta are never infinite).
  float to_finite_float(std::string_view field, const json::value& v) const {
    const double d = to_double(field, v);
    if (!std::isfinite(d) || std::fabs(d) > static_cast<double>(FLT_MAX))
      fail(field, "expected a finite number, got " + json_excerpt(v));
    return static_cast<float>(d);
  }

  bool to_bool(std::string_view field, const json::value& v) const {
    if (v.is_bool()) return v.get_bool();
    fail(field, "expected a boolean, got " + json_excerpt(v));
  }

  int64_t get_int(std::string_view field) const { return to_int(field, require(field)); }
  int64_t get_int(std::string_view field, int64_t def) const {
    const json::value* v = find(field);
    return v ? to_int(field, *v) : def;
  }
  float get_float(std::string_view field, float def) const {
    const json::value* v = find(field);
    return v ? to_finite_float(field, *v) : def;
  }
  bool get_bool(std::string_view field, bool def) const {
    const json::value* v = find(field);
    return v ? to_bool(field, *v) : def;
  }
  std::optional<std::string> get_string(std::string_view field) const {
    const json::value* v = find(field);
    if (!v) return std::nullopt;
    if (!v->is_string()) fail(field, "expected a string, got " + json_excerpt(*v));
    return std::string(v->get_string());
  }

  // Token ids: null/absent → -1; a list (several eos tokens) → its first entry.
  int32_t get_token_id(std::string_view field) const {
    const json::value* v = find(field);
    if (!v) return -1;
    if (v->is_array()) {
      if (v->get_array().empty()) return -1;
      v = &v->get_array()[0];
    }
    const int64_t id = to_int(field, *v);
    if (id < -1 || id > INT32_MAX) fail(field, "token id out of range, got " + std::to_string(id));
    return static_cast<int32_t>(id);
  }

  const json::object& object() const { return obj_; }

 private:
  std::string path_;
  const json::object& obj_;
};

constexpr std::string_view kSupportedArchs =
    "BambaForCausalLM, Qwen3NextForCausalLM, NemotronHForCausalLM, GraniteMoeHybridForCausalLM, FalconH1ForCausalLM";

// Fields every architecture reads the same way.
void read_common(const hf_reader& r, model_config& c, int64_t default_max_positions) {
  c.vocab_size = r.get_int("vocab_size");
  c.hidden_size = r.get_int("hidden_size");
  c.num_layers = r.get_int("num_hidden_layers");
  c.rms_norm_eps = r.get_float("rms_norm_eps", 1e-5f);
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  c.max_position_embeddings = r.get_int("max_position_embeddings", default_max_positions);
  c.bos_token_id = r.get_token_id("bos_token_id");
  c.eos_token_id = r.get_token_id("eos_token_id");
  c.pad_token_id = r.get_token_id("pad_token_id");

  if (const auto act = r.get_string("hidden_act"); act && *act != "silu")
    r.fail("hidden_act", "unsupported activation '" + *act + "' (supported: silu)");
  if (c.num_layers < 1 || c.num_layers > (1 << 20))
    r.fail("num_hidden_layers", "must be in [1, 1048576], got " + std::to_string(c.num_layers));
}

// Attention heads and the rotary embedding. transformers 5 nests rope settings in
// rope_parameters; older files keep them at the top level.
void read_attention(const hf_reader& r, model_config& c, float default_partial_rotary) {
  c.num_attention_heads = r.get_int("num_attention_heads");
  c.num_kv_heads = r.get_int("num_key_value_heads", c.num_attention_heads);
  if (r.find("head_dim")) {
    c.head_dim = r.get_int("head_dim");
  } else {
    if (c.num_attention_heads <= 0)
      r.fail("num_attention_heads", "must be positive, got " + std::to_string(c.num_attention_heads));
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  c.partial_rotary_factor = r.get_float("partial_rotary_factor", default_partial_rotary);
  c.rope_theta = r.get_float("rope_theta", 10000.0f);
  if (const json::value* rp = r.find("rope_parameters")) {
    if (!rp->is_object()) r.fail("rope_parameters", "expected an object, got " + json_excerpt(*rp));
    const hf_reader sub(std::string(), rp->get_object());
    const auto nested = [&](std::string_view field) {
      const json::value* v = sub.find(field);
      return v ? std::optional<float>(r.to_finite_float("rope_parameters." + std::string(field), *v)) : std::nullopt;
    };
    if (const auto v = nested("partial_rotary_factor")) c.partial_rotary_factor = *v;
    if (const auto v = nested("rope_theta")) c.rope_theta = *v;
    if (const json::value* t = sub.find("rope_type")) {
      if (!t->is_string() || t->get_string() != "default")
        r.fail("rope_parameters.rope_type", "unsupported rope type " + json_excerpt(*t) + " (supported: default)");
    }
  }
  if (const json::value* rs = r.find("rope_scaling")) {
    // Older files: rope_scaling {type|rope_type: ...}; only the plain rotary embedding is supported.
    const json::value* t = nullptr;
    if (rs->is_object()) {
      t = rs->get_object().if_contains("rope_type");
      if (!t) t = rs->get_object().if_contains("type");
    }
    if (!t || !t->is_string() || t->get_string() != "default")
      r.fail("rope_scaling", "unsupported rope scaling " + json_excerpt(*rs) + " (supported: default)");
  }
  c.attention_bias = r.get_bool("attention_bias", false);
}

// time_step_limit [min, max]: ±Infinity clamps to ±FLT_MAX (the kernels clamp in f32); NaN
// would silently disable the clamp, so it is rejected.
void read_time_step_limit(const hf_reader& r, model_config& c) {
  c.time_step_min = 0.0f;
  c.time_step_max = FLT_MAX;
  if (const json::value* tl = r.find("time_step_limit")) {
    if (!tl->is_array() || tl->get_array().size() != 2)
      r.fail("time_step_limit", "expected [min, max], got " + json_excerpt(*tl));
    float bounds[2];
    for (size_t i = 0; i < 2; ++i) {
      const std::string field = "time_step_limit[" + std::to_string(i) + "]";
      const double d = r.to_double(field, tl->get_array()[i]);
      if (std::isnan(d)) r.fail(field, "NaN is not a valid bound");
      bounds[i] =
          static_cast<float>(std::fmax(-static_cast<double>(FLT_MAX), std::fmin(d, static_cast<double>(FLT_MAX))));
    }
    c.time_step_min = bounds[0];
    c.time_step_max = bounds[1];
  }
}

// An activation field that must name SiLU (absent: the architecture's default, SiLU).
void require_silu(const hf_reader& r, std::string_view field) {
  if (const auto act = r.get_string(field); act && *act != "silu")
    r.fail(field, "unsupported activation '" + *act + "' (supported: silu)");
}

// A list of exactly n finite numbers.
std::vector<float> get_float_list(const hf_reader& r, std::string_view field, size_t n) {
  const json::value* v = r.find(field);
  if (!v) return {};
  if (!v->is_array() || v->get_array().size() != n)
    r.fail(field, "expected a list of " + std::to_string(n) + " numbers, got " + json_excerpt(*v));
  std::vector<float> out;
  for (size_t i = 0; i < n; ++i)
    out.push_back(r.to_finite_float(std::string(field) + "[" + std::to_string(i) + "]", v->get_array()[i]));
  return out;
}

// A bias option the models do not implement: absent or false.
void reject_true(const hf_reader& r, std::string_view field) {
  if (r.get_bool(field, false)) r.fail(field, "true is not supported (supported: false)");
}

void read_bamba(const hf_reader& r, model_config& c) {
  c.arch = model_arch::kBamba;
  read_common(r, c, 262144);

  // Layer kinds: attention at attn_layer_indices, Mamba2 everywhere else (null → no attention).
  c.layer_kinds.assign(static_cast<size_t>(c.num_layers), layer_kind::kMamba2);
  if (const json::value* idx = r.find("attn_layer_indices")) {
    if (!idx->is_array()) r.fail("attn_layer_indices", "expected an array of layer indices, got " + json_excerpt(*idx));
    for (const json::value& e : idx->get_array()) {
      const int64_t i = r.to_int("attn_layer_indices", e);
      if (i < 0 || i >= c.num_layers)
        r.fail("attn_layer_indices",
               "index " + std::to_string(i) + " out of range for " + std::to_string(c.num_layers) + " layers");
      if (c.layer_kinds[static_cast<size_t>(i)] == layer_kind::kAttention)
        r.fail("attn_layer_indices", "index " + std::to_string(i) + " listed twice");
      c.layer_kinds[static_cast<size_t>(i)] = layer_kind::kAttention;
    }
  }

  // Bamba applies rotary embeddings to half of each head unless told otherwise (the
  // transformers BambaConfig default).
  read_attention(r, c, 0.5f);

  c.intermediate_size = r.get_int("intermediate_size");
  c.mlp_bias = r.get_bool("mlp_bias", false);

  c.mamba_n_heads = r.get_int("mamba_n_heads");
  c.mamba_d_head = r.get_int("mamba_d_head");
  c.mamba_d_state = r.get_int("mamba_d_state");
  c.mamba_n_groups = r.get_int("mamba_n_groups", 1);
  c.mamba_d_conv = r.get_int("mamba_d_conv", 4);
  c.mamba_expand = r.get_int("mamba_expand", 2);
  c.mamba_chunk_size = r.get_int("mamba_chunk_size", 256);
  c.mamba_conv_bias = r.get_bool("mamba_conv_bias", true);
  c.mamba_proj_bias = r.get_bool("mamba_proj_bias", false);

  read_time_step_limit(r, c);
}

// Qwen3-Next: Gated DeltaNet ("linear_attention") and gated attention ("full_attention")
// layers, each followed by a sparse MoE block (or the dense MLP on mlp_only_layers).
void read_qwen3_next(const hf_reader& r, model_config& c) {
  c.arch = model_arch::kQwen3Next;
  read_common(r, c, 32768);
  c.rms_norm_eps = r.get_float("rms_norm_eps", 1e-6f);

  // layer_types[i] names the mixer; absent → transformers' default of full attention every
  // full_attention_interval-th layer.
  c.layer_kinds.assign(static_cast<size_t>(c.num_layers), layer_kind::kGatedDeltaNet);
  if (const json::value* lt = r.find("layer_types")) {
    if (!lt->is_array()) r.fail("layer_types", "expected an array of strings, got " + json_excerpt(*lt));
    const json::array& a = lt->get_array();
    if (static_cast<int64_t>(a.size()) != c.num_layers)
      r.fail("layer_types",
             "has " + std::to_string(a.size()) + " entries for num_hidden_layers = " + std::to_string(c.num_layers));
    for (size_t i = 0; i < a.size(); ++i) {
      const std::string field = "layer_types[" + std::to_string(i) + "]";
      if (!a[i].is_string()) r.fail(field, "expected a string, got " + json_excerpt(a[i]));
      const std::string_view t(a[i].get_string());
      if (t == "linear_attention") {
        c.layer_kinds[i] = layer_kind::kGatedDeltaNet;
      } else if (t == "full_attention") {
        c.layer_kinds[i] = layer_kind::kAttention;
      } else {
        r.fail(field, "unknown layer type '" + std::string(t) + "' (supported: linear_attention, full_attention)");
      }
    }
  } else {
    const int64_t interval = r.get_int("full_attention_interval", 4);
    if (interval < 1) r.fail("full_attention_interval", "must be >= 1, got " + std::to_string(interval));
    for (int64_t i = 0; i < c.num_layers; ++i)
      if ((i + 1) % interval == 0) c.layer_kinds[static_cast<size_t>(i)] = layer_kind::kAttention;
  }

  read_attention(r, c, 0.25f);
  c.head_dim = r.get_int("head_dim");  // transformers' default (256) is model-specific: required

  c.linear_num_key_heads = r.get_int("linear_num_key_heads");
  c.linear_num_value_heads = r.get_int("linear_num_value_heads");
  c.linear_key_head_dim = r.get_int("linear_key_head_dim");
  c.linear_value_head_dim = r.get_int("linear_value_head_dim");
  c.linear_conv_kernel_dim = r.get_int("linear_conv_kernel_dim", 4);

  c.num_experts = r.get_int("num_experts");
  if (c.num_experts > 0) {
    c.num_experts_per_tok = r.get_int("num_experts_per_tok");
    c.moe_intermediate_size = r.get_int("moe_intermediate_size");
    c.shared_expert_intermediate_size = r.get_int("shared_expert_intermediate_size", 0);
  }
  c.norm_topk_prob = r.get_bool("norm_topk_prob", true);
  c.decoder_sparse_step = r.get_int("decoder_sparse_step", 1);
  if (const json::value* mo = r.find("mlp_only_layers")) {
    if (!mo->is_array()) r.fail("mlp_only_layers", "expected an array of layer indices, got " + json_excerpt(*mo));
    for (const json::value& e : mo->get_array()) {
      const int64_t i = r.to_int("mlp_only_layers", e);
      if (i < 0 || i >= c.num_layers)
        r.fail("mlp_only_layers",
               "index " + std::to_string(i) + " out of range for " + std::to_string(c.num_layers) + " layers");
      c.mlp_only_layers.push_back(i);
    }
  }
  // The dense MLP (mlp_only_layers, or every layer without experts).
  c.intermediate_size = r.get_int("intermediate_size", 0);
}


// Layer kinds from a list of names (layers_block_type / layer_types); `kinds` maps each accepted
// name to its kind, `unsupported` names kinds the architecture has but hyserve does not run.
void read_layer_names(const hf_reader& r, std::string_view field, const json::value& v,
                      const std::vector<std::pair<std::string_view, layer_kind>>& kinds,
                      const std::vector<std::string_view>& unsupported, model_config& c) {
  if (!v.is_array()) r.fail(field, "expected an array of strings, got " + json_excerpt(v));
  const json::array& a = v.get_array();
  std::string supported;
  for (const auto& [name, kind] : kinds) supported += (supported.empty() ? "" : ", ") + std::string(name);
  c.layer_kinds.clear();
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string f = std::string(field) + "[" + std::to_string(i) + "]";
    if (!a[i].is_string()) r.fail(f, "expected a string, got " + json_excerpt(a[i]));
    const std::string_view t(a[i].get_string());
    bool found = false;
    for (const auto& [name, kind] : kinds)
      if (t == name) {
        c.layer_kinds.push_back(kind);
        found = true;
        break;
      }
    if (found) continue;
    for (std::string_view u : unsupported)
      if (t == u) r.fail(f, "layer type '" + std::string(t) + "' is not supported (supported: " + supported + ")");
    r.fail(f, "unknown layer type '" + std::string(t) + "' (supported: " + supported + ")");
  }
}

// Nemotron-H: a stack of single-block layers, each `norm → mixer → residual add`, the mixer a
// Mamba2 mixer, attention without positional embedding, or a relu² MLP (up → relu² → down).
void read_nemotron_h(const hf_reader& r, model_config& c) {
  c.arch = model_arch::kNemotronH;
  c.vocab_size = r.get_int("vocab_size");
  c.hidden_size = r.get_int("hidden_size");
  c.rms_norm_eps = r.get_float("layer_norm_epsilon", 1e-5f);
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  c.max_position_embeddings = r.get_int("max_position_embeddings", 4096);
  c.bos_token_id = r.get_token_id("bos_token_id");
  c.eos_token_id = r.get_token_id("eos_token_id");
  c.pad_token_id = r.get_token_id("pad_token_id");

  // Layer kinds: layers_block_type (transformers 5) or hybrid_override_pattern (M * - E).
  const std::vector<std::pair<std::string_view, layer_kind>> kinds = {{"mamba", layer_kind::kMamba2},
                                                                      {"linear_attention", layer_kind::kMamba2},
                                                                      {"attention", layer_kind::kAttention},
                                                                      {"full_attention", layer_kind::kAttention},
                                                                      {"mlp", layer_kind::kMlp}};
  if (const json::value* lt = r.find("layers_block_type")) {
    read_layer_names(r, "layers_block_type", *lt, kinds, {"moe"}, c);
  } else if (const auto pat = r.get_string("hybrid_override_pattern")) {
    for (size_t i = 0; i < pat->size(); ++i) {
      const char ch = (*pat)[i];
      if (ch == 'M') c.layer_kinds.push_back(layer_kind::kMamba2);
      else if (ch == '*') c.layer_kinds.push_back(layer_kind::kAttention);
      else if (ch == '-') c.layer_kinds.push_back(layer_kind::kMlp);
      else if (ch == 'E')
        r.fail("hybrid_override_pattern", "layer " + std::to_string(i) + ": 'E' (MoE) is not supported (supported: M, *, -)");
      else
        r.fail("hybrid_override_pattern",
               "layer " + std::to_string(i) + ": unknown layer symbol '" + std::string(1, ch) + "' (supported: M, *, -)");
    }
  } else {
    r.fail("layers_block_type", "missing required field (or hybrid_override_pattern)");
  }
  c.num_layers = static_cast<int64_t>(c.layer_kinds.size());
  if (c.num_layers < 1 || c.num_layers > (1 << 20))
    r.fail("layers_block_type", "must have [1, 1048576] layers, got " + std::to_string(c.num_layers));
  if (r.find("num_hidden_layers") && r.get_int("num_hidden_layers") != c.num_layers)
    r.fail("num_hidden_layers", "is " + std::to_string(r.get_int("num_hidden_layers")) + " but the layer pattern has " +
                                    std::to_string(c.num_layers) + " layers");

  // Attention: no rotary embedding.
  c.num_attention_heads = r.get_int("num_attention_heads");
  c.num_kv_heads = r.get_int("num_key_value_heads", c.num_attention_heads);
  if (c.num_attention_heads <= 0)
    r.fail("num_attention_heads", "must be positive, got " + std::to_string(c.num_attention_heads));
  c.head_dim = r.get_int("head_dim", c.hidden_size / c.num_attention_heads);
  c.use_rope = false;
  c.partial_rotary_factor = 1.0f;
  reject_true(r, "attention_bias");

  c.intermediate_size = r.get_int("intermediate_size");
  reject_true(r, "mlp_bias");
  c.mlp_act = mlp_activation::kRelu2;
  if (const auto act = r.get_string("mlp_hidden_act"); act && *act != "relu2")
    r.fail("mlp_hidden_act", "unsupported activation '" + *act + "' (supported: relu2)");
  require_silu(r, "mamba_hidden_act");

  c.mamba_n_heads = r.get_int("mamba_num_heads");
  c.mamba_d_head = r.get_int("mamba_head_dim");
  c.mamba_d_state = r.get_int("ssm_state_size");
  c.mamba_n_groups = r.get_int("n_groups", 1);
  c.mamba_d_conv = r.get_int("conv_kernel", 4);
  c.mamba_expand = r.get_int("expand", 2);
  c.mamba_chunk_size = r.get_int("chunk_size", 256);
  c.mamba_conv_bias = r.get_bool("use_conv_bias", true);
  reject_true(r, "mamba_proj_bias");
  reject_true(r, "use_bias");
  read_time_step_limit(r, c);
  if (r.get_int("num_nextn_predict_layers", 0) != 0)
    r.fail("num_nextn_predict_layers", "multi-token prediction layers are not supported (supported: 0)");
}

// The Mamba2 fields Bamba, Granite-4.0-H and Falcon-H1 share (mamba_* names).
void read_mamba_fields(const hf_reader& r, model_config& c) {
  c.mamba_n_heads = r.get_int("mamba_n_heads");
  c.mamba_d_head = r.get_int("mamba_d_head");
  c.mamba_d_state = r.get_int("mamba_d_state");
  c.mamba_n_groups = r.get_int("mamba_n_groups", 1);
  c.mamba_d_conv = r.get_int("mamba_d_conv", 4);
  c.mamba_expand = r.get_int("mamba_expand", 2);
  c.mamba_chunk_size = r.get_int("mamba_chunk_size", 256);
  c.mamba_conv_bias = r.get_bool("mamba_conv_bias", true);
  c.mamba_proj_bias = r.get_bool("mamba_proj_bias", false);
  if (c.mamba_proj_bias) r.fail("mamba_proj_bias", "true is not supported (supported: false)");
  read_time_step_limit(r, c);
}

// Granite-4.0-H: Mamba2 and attention layers (layer_types), each followed by a top-k MoE block
// plus a shared SwiGLU MLP; muP multipliers on the embedding, the residual branches, the
// attention scores and the logits.
void read_granite_moe_hybrid(const hf_reader& r, model_config& c) {
  c.arch = model_arch::kGraniteMoeHybrid;
  read_common(r, c, 4096);
  c.rms_norm_eps = r.get_float("rms_norm_eps", 1e-6f);
  const json::value* lt = r.find("layer_types");
  if (!lt) r.fail("layer_types", "missing required field");
  read_layer_names(r, "layer_types", *lt,
                   {{"mamba", layer_kind::kMamba2},
                    {"linear_attention", layer_kind::kMamba2},
                    {"attention", layer_kind::kAttention},
                    {"full_attention", layer_kind::kAttention}},
                   {}, c);
  if (static_cast<int64_t>(c.layer_kinds.size()) != c.num_layers)
    r.fail("layer_types", "has " + std::to_string(c.layer_kinds.size()) +
                              " entries for num_hidden_layers = " + std::to_string(c.num_layers));

  read_attention(r, c, 1.0f);
  const auto pe = r.get_string("position_embedding_type").value_or("rope");
  if (pe == "nope") c.use_rope = false;
  else if (pe != "rope") r.fail("position_embedding_type", "unsupported value '" + pe + "' (supported: rope, nope)");
  c.attention_multiplier = r.get_float("attention_multiplier", 1.0f);
  c.embedding_multiplier = r.get_float("embedding_multiplier", 1.0f);
  c.residual_multiplier = r.get_float("residual_multiplier", 1.0f);
  const float logits_scaling = r.get_float("logits_scaling", 1.0f);
  if (!(logits_scaling > 0.0f)) r.fail("logits_scaling", "must be positive, got " + fmt_float(logits_scaling));
  c.logits_multiplier = 1.0f / logits_scaling;

  read_mamba_fields(r, c);

  // Experts: intermediate_size is each expert's width; the shared MLP has its own.
  c.num_experts = r.get_int("num_local_experts", 0);
  c.intermediate_size = r.get_int("intermediate_size");
  if (c.num_experts > 0) {
    c.num_experts_per_tok = r.get_int("num_experts_per_tok");
    c.moe_intermediate_size = c.intermediate_size;
  }
  c.norm_topk_prob = true;  // softmax over the top-k router logits
  c.decoder_sparse_step = 1;
  c.shared_expert_intermediate_size = r.get_int("shared_intermediate_size", 0);
}

// Falcon-H1: every layer runs attention and a Mamba2 mixer side by side on the normed input
// (their outputs summed into the residual), then a SwiGLU MLP; muP multipliers throughout.
void read_falcon_h1(const hf_reader& r, model_config& c) {
  c.arch = model_arch::kFalconH1;
  read_common(r, c, 8192);
  c.layer_kinds.assign(static_cast<size_t>(c.num_layers), layer_kind::kParallelHybrid);
  read_attention(r, c, 1.0f);
  c.intermediate_size = r.get_int("intermediate_size");
  reject_true(r, "mlp_bias");
  reject_true(r, "projectors_bias");
  read_mamba_fields(r, c);
  if (r.find("mamba_d_ssm")) {
    const int64_t d_ssm = r.get_int("mamba_d_ssm");
    if (d_ssm != c.mamba_n_heads * c.mamba_d_head)
      r.fail("mamba_d_ssm", "must equal mamba_n_heads x mamba_d_head = " +
                                std::to_string(c.mamba_n_heads * c.mamba_d_head) + ", got " + std::to_string(d_ssm));
  } else if (c.mamba_expand * c.hidden_size != c.mamba_n_heads * c.mamba_d_head) {
    r.fail("mamba_n_heads", "mamba_n_heads x mamba_d_head must equal mamba_expand x hidden_size = " +
                                std::to_string(c.mamba_expand * c.hidden_size) + " (or give mamba_d_ssm)");
  }
  c.mamba_rms_norm = r.get_bool("mamba_rms_norm", false);
  c.mamba_norm_before_gate = r.get_bool("mamba_norm_before_gate", true);

  c.embedding_multiplier = r.get_float("embedding_multiplier", 1.0f);
  c.logits_multiplier = r.get_float("lm_head_multiplier", 1.0f);
  c.attention_in_multiplier = r.get_float("attention_in_multiplier", 1.0f);
  c.attention_out_multiplier = r.get_float("attention_out_multiplier", 1.0f);
  c.key_multiplier = r.get_float("key_multiplier", 1.0f);
  c.ssm_in_multiplier = r.get_float("ssm_in_multiplier", 1.0f);
  c.ssm_out_multiplier = r.get_float("ssm_out_multiplier", 1.0f);
  c.ssm_multipliers = get_float_list(r, "ssm_multipliers", 5);
  const std::vector<float> mlp = get_float_list(r, "mlp_multipliers", 2);
  if (!mlp.empty()) {
    c.mlp_gate_multiplier = mlp[0];
    c.mlp_down_multiplier = mlp[1];
  }
}

[[noreturn]] void invalid(const std::string& field, const std::string& what) {
  throw config_error(field + ": " + what);
}

void require_positive(const char* field, int64_t v) {
  if (v <= 0) invalid(field, "must be positive, got " + std::to_string(v));
}

// The Mamba2 sizes; check_expand: the inner width is mamba_expand x hidden_size (Bamba, Granite).
void validate_mamba2(const model_config& c, bool check_expand) {
  require_positive("mamba_n_heads", c.mamba_n_heads);
  require_positive("mamba_d_head", c.mamba_d_head);
  require_positive("mamba_d_state", c.mamba_d_state);
  require_positive("mamba_n_groups", c.mamba_n_groups);
  require_positive("mamba_d_conv", c.mamba_d_conv);
  require_positive("mamba_expand", c.mamba_expand);
  require_positive("mamba_chunk_size", c.mamba_chunk_size);
  if (c.mamba_n_heads % c.mamba_n_groups != 0)
    invalid("mamba_n_heads", "must be a multiple of mamba_n_groups (" + std::to_string(c.mamba_n_groups) + "), got " +
                                 std::to_string(c.mamba_n_heads));
  if (check_expand && c.mamba_expand * c.hidden_size != c.mamba_n_heads * c.mamba_d_head)
    throw config_error("inconsistent dimensions: mamba_expand x hidden_size = " + std::to_string(c.mamba_expand) +
                       " x " + std::to_string(c.hidden_size) + " = " + std::to_string(c.mamba_expand * c.hidden_size) +
                       ", but mamba_n_heads x mamba_d_head = " + std::to_string(c.mamba_n_heads) + " x " +
                       std::to_string(c.mamba_d_head) + " = " + std::to_string(c.mamba_n_heads * c.mamba_d_head));
  if (std::isnan(c.time_step_min) || std::isnan(c.time_step_max) || c.time_step_min < 0.0f ||
      c.time_step_min > c.time_step_max)
    invalid("time_step_limit", "must satisfy 0 <= min <= max, got [" + fmt_float(c.time_step_min) + ", " +
                                   fmt_float(c.time_step_max) + "]");
}

void validate_bamba(const model_config& c) {
  require_positive("intermediate_size", c.intermediate_size);
  validate_mamba2(c, true);
}

void validate_experts(const model_config& c) {
  if (c.num_experts < 0) invalid("num_experts", "must be >= 0, got " + std::to_string(c.num_experts));
  if (c.num_experts > 0) {
    if (c.num_experts_per_tok < 1 || c.num_experts_per_tok > c.num_experts)
      invalid("num_experts_per_tok", "must be in [1, num_experts = " + std::to_string(c.num_experts) + "], got " +
                                         std::to_string(c.num_experts_per_tok));
    require_positive("moe_intermediate_size", c.moe_intermediate_size);
  }
  if (c.shared_expert_intermediate_size < 0)
    invalid("shared_expert_intermediate_size", "must be >= 0, got " + std::to_string(c.shared_expert_intermediate_size));
}

void validate_qwen3_next(const model_config& c) {
  require_positive("linear_num_key_heads", c.linear_num_key_heads);
  require_positive("linear_num_value_heads", c.linear_num_value_heads);
  require_positive("linear_key_head_dim", c.linear_key_head_dim);
  require_positive("linear_value_head_dim", c.linear_value_head_dim);
  require_positive("linear_conv_kernel_dim", c.linear_conv_kernel_dim);
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0)
    invalid("linear_num_value_heads", "must be a multiple of linear_num_key_heads (" +
                                          std::to_string(c.linear_num_key_heads) + "), got " +
                                          std::to_string(c.linear_num_value_heads));

  if (c.num_experts < 0) invalid("num_experts", "must be >= 0, got " + std::to_string(c.num_experts));
  if (c.num_experts > 0) {
    if (c.num_experts_per_tok < 1 || c.num_experts_per_tok > c.num_experts)
      invalid("num_experts_per_tok", "must be in [1, num_experts = " + std::to_string(c.num_experts) + "], got " +
                                         std::to_string(c.num_experts_per_tok));
    require_positive("moe_intermediate_size", c.moe_intermediate_size);
    if (c.shared_expert_intermediate_size < 0)
      invalid("shared_expert_intermediate_size",
              "must be >= 0, got " + std::to_string(c.shared_expert_intermediate_size));
    require_positive("decoder_sparse_step", c.decoder_sparse_step);
  }
  for (int64_t i : c.mlp_only_layers)
    if (i < 0 || i >= c.num_layers)
      invalid("mlp_only_layers",
              "index " + std::to_string(i) + " out of range for " + std::to_string(c.num_layers) + " layers");
  // The dense MLP size matters only where some layer uses it.
  for (int64_t i = 0; i < c.num_layers; ++i)
    if (!c.is_moe_layer(i)) {
      require_positive("intermediate_size", c.intermediate_size);
      break;
    }
}

}  // namespace

const char* const kSupportedArchitectures = kSupportedArchs.data();

int64_t model_config::rotary_dim() const {
  const auto d =
      static_cast<int64_t>(std::floor(static_cast<double>(head_dim) * static_cast<double>(partial_rotary_factor)));
  return d - (d % 2);
}

int64_t model_config::num_layers_of(layer_kind k) const {
  int64_t n = 0;
  for (layer_kind l : layer_kinds) n += (l == k) ? 1 : 0;
  return n;
}

int64_t model_config::num_recurrent_layers() const {
  return num_layers_of(layer_kind::kMamba2) + num_layers_of(layer_kind::kGatedDeltaNet) +
         num_layers_of(layer_kind::kParallelHybrid);
}

int64_t model_config::num_attention_layers() const {
  return num_layers_of(layer_kind::kAttention) + num_layers_of(layer_kind::kParallelHybrid);
}

bool model_config::is_moe_layer(int64_t layer) const {
  if (num_experts <= 0 || decoder_sparse_step <= 0) return false;
  for (int64_t i : mlp_only_layers)
    if (i == layer) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

void model_config::validate() const {
  require_positive("vocab_size", vocab_size);
  require_positive("hidden_size", hidden_size);
  require_positive("num_layers", num_layers);
  if (static_cast<int64_t>(layer_kinds.size()) != num_layers)
    invalid("layer_kinds",
            "has " + std::to_string(layer_kinds.size()) + " entries for " + std::to_string(num_layers) + " layers");
  if (!(rms_norm_eps > 0.0f) || !std::isfinite(rms_norm_eps))
    invalid("rms_norm_eps", "must be a positive finite number, got " + fmt_float(rms_norm_eps));
  if (max_position_embeddings < 0)
    invalid("max_position_embeddings", "must be >= 0, got " + std::to_string(max_position_embeddings));
  for (const auto& [field, id] : {std::pair{"bos_token_id", bos_token_id}, std::pair{"eos_token_id", eos_token_id},
                                  std::pair{"pad_token_id", pad_token_id}})
    if (id < -1 || id >= vocab_size)
      invalid(field, "must be -1 (none) or in [0, vocab_size = " + std::to_string(vocab_size) + "), got " +
                         std::to_string(id));

  require_positive("num_attention_heads", num_attention_heads);
  require_positive("num_kv_heads", num_kv_heads);
  require_positive("head_dim", head_dim);
  if (num_attention_heads % num_kv_heads != 0)
    invalid("num_attention_heads", "must be a multiple of num_kv_heads (" + std::to_string(num_kv_heads) + "), got " +
                                       std::to_string(num_attention_heads));
  if (use_rope && (!(partial_rotary_factor > 0.0f) || partial_rotary_factor > 1.0f))
    invalid("partial_rotary_factor", "must be in (0, 1], got " + fmt_float(partial_rotary_factor));
  if (use_rope && (!(rope_theta > 0.0f) || !std::isfinite(rope_theta)))
    invalid("rope_theta", "must be a positive finite number, got " + fmt_float(rope_theta));
  if (!(attention_multiplier >= 0.0f) || !std::isfinite(attention_multiplier))
    invalid("attention_multiplier", "must be a finite number >= 0, got " + fmt_float(attention_multiplier));
  const int64_t rd = rotary_dim();
  if (use_rope && (rd < 2 || rd > head_dim || rd % 2 != 0))
    invalid("partial_rotary_factor", "rotary dimension head_dim (" + std::to_string(head_dim) + ") x " +
                                         fmt_float(partial_rotary_factor) + " = " + std::to_string(rd) +
                                         " must be even and in [2, head_dim]");

  // Which mixers each architecture has: a layer kind of another family is a config error.
  for (size_t i = 0; i < layer_kinds.size(); ++i) {
    bool allowed = false;
    switch (layer_kinds[i]) {
      case layer_kind::kAttention:
        allowed = true;
        break;
      case layer_kind::kMamba2:
        allowed = arch == model_arch::kBamba || arch == model_arch::kNemotronH || arch == model_arch::kGraniteMoeHybrid;
        break;
      case layer_kind::kGatedDeltaNet:
        allowed = arch == model_arch::kQwen3Next;
        break;
      case layer_kind::kMlp:
        allowed = arch == model_arch::kNemotronH;
        break;
      case layer_kind::kParallelHybrid:
        allowed = arch == model_arch::kFalconH1;
        break;
    }
    if (arch == model_arch::kFalconH1 && layer_kinds[i] != layer_kind::kParallelHybrid) allowed = false;
    if (!allowed) invalid("layer_kinds[" + std::to_string(i) + "]", "this architecture has no layer of that kind");
  }

  switch (arch) {
    case model_arch::kBamba:
      validate_bamba(*this);
      break;
    case model_arch::kQwen3Next:
      validate_qwen3_next(*this);
      break;
    case model_arch::kNemotronH:
      if (num_layers_of(layer_kind::kMlp) > 0) require_positive("intermediate_size", intermediate_size);
      validate_mamba2(*this, false);
      break;
    case model_arch::kGraniteMoeHybrid:
      validate_mamba2(*this, true);
      validate_experts(*this);
      if (num_experts == 0 && shared_expert_intermediate_size == 0)
        invalid("shared_intermediate_size", "must be positive when the model has no experts");
      break;
    case model_arch::kFalconH1:
      require_positive("intermediate_size", intermediate_size);
      validate_mamba2(*this, false);
      if (!ssm_multipliers.empty() && ssm_multipliers.size() != 5)
        invalid("ssm_multipliers", "expected 5 entries, got " + std::to_string(ssm_multipliers.size()));
      break;
  }
  for (const auto& [field, m] :
       {std::pair{"embedding_multiplier", embedding_multiplier}, std::pair{"logits_multiplier", logits_multiplier},
        std::pair{"residual_multiplier", residual_multiplier}, std::pair{"attention_in_multiplier", attention_in_multiplier},
        std::pair{"attention_out_multiplier", attention_out_multiplier}, std::pair{"key_multiplier", key_multiplier},
        std::pair{"ssm_in_multiplier", ssm_in_multiplier}, std::pair{"ssm_out_multiplier", ssm_out_multiplier},
        std::pair{"mlp_gate_multiplier", mlp_gate_multiplier}, std::pair{"mlp_down_multiplier", mlp_down_multiplier}})
    if (!std::isfinite(m)) invalid(field, "must be finite, got " + fmt_float(m));
}

model_config read_hf_config(const std::string& path) {
  std::string err;
  const auto text = read_text_file(path, err);
  if (!text) throw config_error(path + ": cannot read: " + err);
  const auto doc = parse_json(*text, err);
  if (!doc) throw config_error(path + ": invalid JSON: " + err);
  if (!doc->is_object()) throw config_error(path + ": expected a JSON object, got " + json_excerpt(*doc));
  const hf_reader r(path, doc->get_object());

  // The architecture: architectures[0] when present, else model_type.
  std::string arch;
  if (const json::value* a = r.find("architectures")) {
    if (!a->is_array() || a->get_array().empty() || !a->get_array()[0].is_string())
      r.fail("architectures", "expected a non-empty array of strings, got " + json_excerpt(*a));
    arch = std::string(a->get_array()[0].get_string());
  } else if (const auto mt = r.get_string("model_type")) {
    arch = *mt == "bamba"              ? std::string("BambaForCausalLM")
           : *mt == "qwen3_next"       ? std::string("Qwen3NextForCausalLM")
           : *mt == "nemotron_h"       ? std::string("NemotronHForCausalLM")
           : *mt == "granitemoehybrid" ? std::string("GraniteMoeHybridForCausalLM")
           : *mt == "falcon_h1"        ? std::string("FalconH1ForCausalLM")
                                       : "model_type " + *mt;
  } else {
    r.fail("architectures", "missing required field (supported: " + std::string(kSupportedArchs) + ")");
  }

  model_config c;
  if (arch == "BambaForCausalLM") {
    read_bamba(r, c);
  } else if (arch == "Qwen3NextForCausalLM") {
    read_qwen3_next(r, c);
  } else if (arch == "NemotronHForCausalLM") {
    read_nemotron_h(r, c);
  } else if (arch == "GraniteMoeHybridForCausalLM") {
    read_granite_moe_hybrid(r, c);
  } else if (arch == "FalconH1ForCausalLM") {
    read_falcon_h1(r, c);
  } else {
    throw config_error(path + ": unsupported architecture '" + arch + "' (supported: " + std::string(kSupportedArchs) +
                       ")");
  }
  try {
    c.validate();
  } catch (const config_error& e) {
    throw config_error(path + ": " + e.what());
  }
  return c;
}

}  // namespace hyserve
