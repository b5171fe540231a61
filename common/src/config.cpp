#include "hyserve/common/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <set>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "hyserve/common/error.h"
#include "hyserve/common/json.h"
#include "yaml_reader.h"

namespace hyserve {

namespace {

constexpr const char* kStringSource = "<string>";

using namespace config_detail;

void read_synthetic(const yaml_reader& r, const YAML::Node& node, synthetic_model_config& out) {
  const std::string base = "model.synthetic";
  // The shapes of a published checkpoint: its Hugging Face config.json (any supported
  // architecture), with seeded random weights.
  if (is_map(node) && node["hf_config"]) {
    r.check_keys(node, base, {"hf_config", "residual_scale", "seed"});
    std::string file = r.get_string(node["hf_config"], base + ".hf_config");
    // A relative path as for model.path: beside the config file first (a config works from any
    // directory), then the current directory.
    if (!file.empty() && !r.file().empty() && std::filesystem::path(file).is_relative()) {
      namespace fs = std::filesystem;
      std::error_code ec;
      const fs::path beside = fs::absolute(fs::path(r.file()), ec).parent_path() / file;
      if (fs::is_regular_file(beside, ec)) file = beside.lexically_normal().string();
    }
    try {
      out.arch = read_hf_config(file);
    } catch (const config_error& e) {
      r.fail(node["hf_config"], base + ".hf_config", e.what());
    }
    if_present(node, "seed", [&](const YAML::Node& n) { out.seed = r.get_uint64(n, base + ".seed"); });
    if_present(node, "residual_scale", [&](const YAML::Node& n) {
      out.residual_scale = r.get_double(n, base + ".residual_scale");
      if (!(out.residual_scale > 0.0) || out.residual_scale > 1e3)
        r.fail(n, base + ".residual_scale", "must be in (0, 1000], got " + std::to_string(out.residual_scale));
    });
    return;
  }
  r.check_keys(node, base,
               {"arch",
                "vocab_size",
                "hidden_size",
                "num_layers",
                "attn_layer_indices",
                "num_attention_heads",
                "num_kv_heads",
                "head_dim",
                "intermediate_size",
                "mamba_n_heads",
                "mamba_d_head",
                "mamba_d_state",
                "mamba_n_groups",
                "mamba_d_conv",
                "mamba_chunk_size",
                "partial_rotary_factor",
                "rope_theta",
                "rms_norm_eps",
                "tie_word_embeddings",
                "residual_scale",
                "seed",
                "hf_config"});
  const auto path = [&](const char* key) { return base + "." + key; };
  const auto int_or = [&](const char* key, int64_t def) {
    int64_t v = def;
    if_present(node, key, [&](const YAML::Node& n) {
      v = r.get_int64(n, path(key));
      if (v <= 0) r.fail(n, path(key), "must be >= 1, got " + std::to_string(v));
    });
    return v;
  };

  model_config& c = out.arch;
  // Defaults without a size given are the shape of the bamba-tiny test checkpoint.
  if_present(node, "arch", [&](const YAML::Node& n) { r.get_enum(n, path("arch"), "arch", {"bamba"}); });
  c.arch = model_arch::kBamba;
  c.vocab_size = int_or("vocab_size", 512);
  c.hidden_size = int_or("hidden_size", 64);
  c.num_layers = int_or("num_layers", 4);
  if (c.num_layers > (1 << 20))
    r.fail(node["num_layers"], path("num_layers"), "too many layers, got " + std::to_string(c.num_layers));
  c.num_attention_heads = int_or("num_attention_heads", 4);
  c.num_kv_heads = int_or("num_kv_heads", std::min<int64_t>(2, c.num_attention_heads));
  c.head_dim = int_or("head_dim", std::max<int64_t>(1, c.hidden_size / c.num_attention_heads));
  c.intermediate_size = int_or("intermediate_size", 2 * c.hidden_size);
  c.mamba_n_heads = int_or("mamba_n_heads", 4);
  c.mamba_d_head = int_or("mamba_d_head", std::max<int64_t>(1, 2 * c.hidden_size / c.mamba_n_heads));
  c.mamba_d_state = int_or("mamba_d_state", 16);
  c.mamba_n_groups = int_or("mamba_n_groups", 1);
  c.mamba_d_conv = int_or("mamba_d_conv", 4);
  c.mamba_chunk_size = int_or("mamba_chunk_size", 256);
  c.partial_rotary_factor = 0.5f;
  if_present(node, "partial_rotary_factor",
             [&](const YAML::Node& n) { c.partial_rotary_factor = r.get_float(n, path("partial_rotary_factor")); });
  c.rope_theta = 10000.0f;
  if_present(node, "rope_theta", [&](const YAML::Node& n) { c.rope_theta = r.get_float(n, path("rope_theta")); });
  c.rms_norm_eps = 1e-5f;
  if_present(node, "rms_norm_eps", [&](const YAML::Node& n) { c.rms_norm_eps = r.get_float(n, path("rms_norm_eps")); });
  c.tie_word_embeddings = false;
  if_present(node, "tie_word_embeddings",
             [&](const YAML::Node& n) { c.tie_word_embeddings = r.get_bool(n, path("tie_word_embeddings")); });
  if_present(node, "seed", [&](const YAML::Node& n) { out.seed = r.get_uint64(n, path("seed")); });
  if_present(node, "residual_scale", [&](const YAML::Node& n) {
    out.residual_scale = r.get_double(n, path("residual_scale"));
    if (!(out.residual_scale > 0.0) || out.residual_scale > 1e3)
      r.fail(n, path("residual_scale"), "must be in (0, 1000], got " + std::to_string(out.residual_scale));
  });

  // Attention layers: the listed indices; by default layer 1 (as in bamba-tiny) when there is one.
  c.layer_kinds.assign(static_cast<size_t>(c.num_layers), layer_kind::kMamba2);
  if (is_map(node) && node["attn_layer_indices"]) {
    const YAML::Node idx = node["attn_layer_indices"];
    const std::string p = path("attn_layer_indices");
    if (!idx.IsSequence() && !idx.IsNull())
      r.fail(idx, p, "expected a sequence of layer indices, got " + r.describe(idx));
    for (size_t k = 0; idx.IsSequence() && k < idx.size(); ++k) {
      const YAML::Node e = idx[k];
      const int64_t i = r.get_int64(e, p);
      if (i < 0 || i >= c.num_layers)
        r.fail(e, p, "index out of range [0, " + std::to_string(c.num_layers) + "), got " + std::to_string(i));
      if (c.layer_kinds[static_cast<size_t>(i)] == layer_kind::kAttention)
        r.fail(e, p, "index listed twice, got " + std::to_string(i));
      c.layer_kinds[static_cast<size_t>(i)] = layer_kind::kAttention;
    }
  } else if (c.num_layers > 1) {
    c.layer_kinds[1] = layer_kind::kAttention;
  }

  // Fixed for synthetic models: HF Bamba defaults and the tokenizer ids of the test checkpoint.
  c.max_position_embeddings = 262144;
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  c.pad_token_id = 0;
  if (c.vocab_size <= 2) c.bos_token_id = c.eos_token_id = c.pad_token_id = -1;
  c.attention_bias = false;
  c.mlp_bias = false;
  c.mamba_conv_bias = true;
  c.mamba_proj_bias = false;
  c.time_step_min = 0.0f;
  c.time_step_max = FLT_MAX;

  // mamba_expand is derived: the Mamba2 inner width must be a whole multiple of hidden_size.
  const int64_t inner = c.mamba_n_heads * c.mamba_d_head;
  if (inner % c.hidden_size != 0)
    r.fail(node, base,
           "inconsistent dimensions: mamba_n_heads x mamba_d_head = " + std::to_string(inner) +
               " is not a multiple of hidden_size = " + std::to_string(c.hidden_size));
  c.mamba_expand = inner / c.hidden_size;
  try {
    c.validate();
  } catch (const config_error& e) {
    r.fail(node, base, e.what());
  }
}

void read_model(const yaml_reader& r, const YAML::Node& node, model_section& m) {
  const auto keys = r.check_keys(node, "model", {"path", "synthetic", "dtype", "tokenizer", "gdn_prefill"});
  if (keys.count("path") + keys.count("synthetic") != 1)
    r.fail(node, "model", "exactly one of path or synthetic must be given");
  if (keys.count("path")) {
    m.path = r.get_string(node["path"], "model.path");
    if (m.path.empty()) r.fail(node["path"], "model.path", "must not be empty");
  }
  if (keys.count("synthetic")) {
    synthetic_model_config s;
    read_synthetic(r, node["synthetic"], s);
    m.synthetic = std::move(s);
  }
  if_present(node, "dtype", [&](const YAML::Node& n) {
    const size_t i = r.get_enum(n, "model.dtype", "dtype", {"float32", "bfloat16", "float16"});
    m.weight_dtype = i == 0 ? dtype::kF32 : i == 1 ? dtype::kBF16 : dtype::kF16;
  });
  if_present(node, "gdn_prefill", [&](const YAML::Node& n) {
    m.gdn_prefill = static_cast<gdn_prefill_choice>(
        r.get_enum(n, "model.gdn_prefill", "GDN prefill kernel", {"auto", "recurrent", "tc", "tf32", "bf16"}));
  });
  if_present(node, "tokenizer", [&](const YAML::Node& n) {
    m.tokenizer = r.get_string(n, "model.tokenizer");
    if (m.tokenizer.empty()) r.fail(n, "model.tokenizer", "must not be empty");
  });
}

void read_chat(const yaml_reader& r, const YAML::Node& node, chat_section& c) {
  r.check_keys(node, "chat", {"template", "generation_prompt", "bos", "eos", "stop"});
  if_present(node, "template", [&](const YAML::Node& n) { c.message_template = r.get_string(n, "chat.template"); });
  if (c.message_template.find("{content}") == std::string::npos)
    r.fail(is_map(node) && node["template"] ? node["template"] : node, "chat.template",
           "must contain the {content} placeholder, got '" + c.message_template + "'");
  if_present(node, "generation_prompt",
             [&](const YAML::Node& n) { c.generation_prompt = r.get_string(n, "chat.generation_prompt"); });
  if_present(node, "bos", [&](const YAML::Node& n) { c.bos = r.get_string(n, "chat.bos"); });
  if_present(node, "eos", [&](const YAML::Node& n) { c.eos = r.get_string(n, "chat.eos"); });
  if_present(node, "stop", [&](const YAML::Node& n) {
    if (n.IsScalar()) {
      c.stop.push_back(n.Scalar());
    } else if (n.IsSequence()) {
      for (size_t k = 0; k < n.size(); ++k) c.stop.push_back(r.get_string(n[k], "chat.stop"));
    } else if (!n.IsNull()) {
      r.fail(n, "chat.stop", "expected a string or a sequence of strings, got " + r.describe(n));
    }
    for (const std::string& s : c.stop)
      if (s.empty()) r.fail(n, "chat.stop", "stop strings must not be empty");
  });
}

// `kernels`: one key per kernel path choice (kernel_paths.h); `default` everywhere is the
// kernels' own choice. Integer keys take `default` or a value in their range.
void read_kernels(const yaml_reader& r, const YAML::Node& node, kernel_paths& k) {
  r.check_keys(node, "kernels",
               {"attn_decode", "attn_decode_cluster", "attn_decode_cluster_size", "attn_decode_early_loads", "attn_decode_max_slices", "attn_decode_mma_hd256", "attn_decode_waves", "attn_extend_fill", "gdn_cluster", "gdn_decode",
                "gdn_max_tokens", "gdn_prefill", "invariant_gemm", "linear_wgmma", "moe_decode", "moe_decode_ring_kb", "moe_tile_order", "moe_wgmma", "moe_wgmma_early_release", "moe_wgmma_persistent", "moe_wgmma_rows", "moe_wgmma_tile_handoff", "moe_wgmma_tma_x", "norm_linear",
                "norm_linear_blocks_per_sm", "norm_linear_gate", "norm_linear_rows", "norm_linear_spread", "norm_linear_wide", "pdl", "skinny", "smem_carveout",
                "sparse_select", "ssd_max_tokens", "ssd_scan", "ssd_seq_bf16", "ssd_seq_slice", "ssm_update_unroll"});
  const auto path = [](const char* key) { return std::string("kernels.") + key; };
  // "default" (0) or an integer in [lo, hi].
  // With `off` allowed: "off" is -1.
  const auto bounded = [&](const YAML::Node& n, const char* key, int32_t lo, int32_t hi, bool off = false) -> int32_t {
    const std::string& s = r.scalar(n, path(key), off ? "default, off or an integer" : "default or an integer");
    if (s == "default") return 0;
    if (off && s == "off") return -1;
    const std::string range =
        std::string(off ? "default, off" : "default") + " or an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    int64_t v = 0;
    const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || v < lo || v > hi)
      r.fail(n, path(key), "must be " + range + ", got '" + s + "'");
    return static_cast<int32_t>(v);
  };
  // An enumerated key: the index of its value in `names` is the enumerator (kDefault first).
  const auto named = [&](const char* key, auto& field, std::initializer_list<std::string_view> names) {
    if_present(node, key, [&](const YAML::Node& n) {
      field = static_cast<std::remove_reference_t<decltype(field)>>(r.get_enum(n, path(key), "path", names));
    });
  };
  const auto integer = [&](const char* key, int32_t& field, int32_t lo, int32_t hi, bool off = false) {
    if_present(node, key, [&](const YAML::Node& n) { field = bounded(n, key, lo, hi, off); });
  };
  const auto flag = [&](const char* key, bool& field) {
    if_present(node, key, [&](const YAML::Node& n) { field = r.get_bool(n, path(key)); });
  };
  named("attn_decode", k.attn_decode, {"default", "simt", "mma"});
  integer("attn_decode_waves", k.attn_decode_waves, 1, 8);
  integer("attn_decode_max_slices", k.attn_decode_max_slices, 1, 256);
  flag("attn_decode_mma_hd256", k.attn_decode_mma_hd256);
  flag("attn_decode_early_loads", k.attn_decode_early_loads);
  integer("attn_decode_cluster", k.attn_decode_cluster, 16, 1 << 20, /*off=*/true);
  integer("attn_decode_cluster_size", k.attn_decode_cluster_size, 2, 8);
  flag("attn_extend_fill", k.attn_extend_fill);
  if_present(node, "gdn_cluster", [&](const YAML::Node& n) {
    static constexpr int32_t kSizes[] = {0, 1, 2, 4};
    k.gdn_cluster = kSizes[r.get_enum(n, path("gdn_cluster"), "cluster size", {"default", "1", "2", "4"})];
  });
  named("gdn_decode", k.gdn_decode, {"default", "grid", "persistent", "persistent8", "tiles8"});
  integer("gdn_max_tokens", k.gdn_max_tokens, 1, 1 << 30);
  named("gdn_prefill", k.gdn_prefill, {"default", "recurrent", "tc", "tf32", "bf16"});
  named("invariant_gemm", k.invariant_gemm, {"default", "kernels", "cublaslt", "wgmma"});
  flag("linear_wgmma", k.linear_wgmma);
  flag("moe_wgmma", k.moe_wgmma);
  flag("moe_wgmma_persistent", k.moe_wgmma_persistent);
  flag("moe_wgmma_tma_x", k.moe_wgmma_tma_x);
  flag("moe_wgmma_early_release", k.moe_wgmma_early_release);
  flag("moe_wgmma_tile_handoff", k.moe_wgmma_tile_handoff);
  flag("ssd_seq_bf16", k.ssd_seq_bf16);
  named("moe_decode", k.moe_decode, {"default", "fused", "single", "split"});
  named("moe_tile_order", k.moe_tile_order, {"default", "rows", "outputs"});
  if_present(node, "moe_wgmma_rows", [&](const YAML::Node& n) {
    static constexpr int32_t kRows[] = {0, 128, 192};
    k.moe_wgmma_rows = kRows[r.get_enum(n, path("moe_wgmma_rows"), "row count", {"default", "128", "192"})];
  });
  flag("norm_linear", k.norm_linear);
  integer("norm_linear_blocks_per_sm", k.norm_linear_blocks_per_sm, 1, 8);
  integer("smem_carveout", k.smem_carveout, 1, 100);
  integer("moe_decode_ring_kb", k.moe_decode_ring_kb, 32, 200);
  flag("norm_linear_gate", k.norm_linear_gate);
  flag("norm_linear_spread", k.norm_linear_spread);
  flag("norm_linear_wide", k.norm_linear_wide);
  flag("pdl", k.pdl);
  named("skinny", k.skinny, {"default", "fma", "mma"});
  named("sparse_select", k.sparse_select, {"default", "v1", "v2"});
  integer("ssd_max_tokens", k.ssd_max_tokens, 1, 1 << 30);
  named("ssd_scan", k.ssd_scan,
        {"default", "sequential", "parallel", "parallel_single", "parallel_fast", "parallel_pair", "parallel_quad",
         "parallel_y", "parallel_quad_y", "parallel_oct_y"});
  if_present(node, "ssd_seq_slice", [&](const YAML::Node& n) {
    static constexpr int32_t kSlices[] = {0, 16, 32};
    k.ssd_seq_slice = kSlices[r.get_enum(n, path("ssd_seq_slice"), "slice", {"default", "16", "32"})];
  });
  if_present(node, "norm_linear_rows", [&](const YAML::Node& n) {
    static constexpr int32_t kRows[] = {0, 2, 4};
    k.norm_linear_rows = kRows[r.get_enum(n, path("norm_linear_rows"), "row count", {"default", "2", "4"})];
  });
  if_present(node, "ssm_update_unroll", [&](const YAML::Node& n) {
    static constexpr int32_t kUnroll[] = {0, 4, 8};
    k.ssm_update_unroll = kUnroll[r.get_enum(n, path("ssm_update_unroll"), "unroll", {"default", "4", "8"})];
  });
}

service_config parse_config(const std::string& text, const std::string& file) {
  const yaml_reader r(file);
  const std::string where = file.empty() ? std::string(kStringSource) : file;
  YAML::Node loaded;
  try {
    loaded = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw config_error(where + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1) +
                       ": YAML syntax error: " + e.msg);
  } catch (const YAML::Exception& e) {
    throw config_error(where + ": YAML error: " + e.what());
  }

  // Read through a const node: a non-const operator[] may insert the keys it looks up.
  const YAML::Node root = loaded;
  service_config cfg;
  cfg.source = where;
  try {
    if (!root.IsMap()) {
      if (root.IsNull()) r.fail(root, "model", "exactly one of path or synthetic must be given");
      r.fail(root, "(top level)", "expected a mapping of sections, got " + r.describe(root));
    }
    r.check_keys(root, "",
                 {"model", "device", "cuda_graphs", "parallel", "cache", "scheduler", "sparsity", "speculative", "server",
                  "worker", "chat", "kernels", "determinism"});

    if (!root["model"]) r.fail(root, "model", "exactly one of path or synthetic must be given");
    read_model(r, root["model"], cfg.model);

    if_present(root, "device", [&](const YAML::Node& n) {
      cfg.device = r.get_enum(n, "device", "device", {"cpu", "cuda"}) == 0 ? device_kind::kCpu : device_kind::kCuda;
    });
    if_present(root, "cuda_graphs", [&](const YAML::Node& n) {
      cfg.cuda_graphs = r.get_bool(n, "cuda_graphs");
      if (*cfg.cuda_graphs && cfg.device != device_kind::kCuda)
        r.fail(n, "cuda_graphs", "true needs device: cuda");
    });

    const YAML::Node par = root["parallel"];
    r.check_keys(par, "parallel", {"tp", "dp", "device_collective"});
    if_present(par, "device_collective", [&](const YAML::Node& n) {
      cfg.parallel.device_collective = r.get_enum(n, "parallel.device_collective", "collective", {"nccl", "host"}) == 0
                                           ? device_collective_kind::kNccl
                                           : device_collective_kind::kHost;
    });
    if_present(par, "tp", [&](const YAML::Node& n) { cfg.parallel.tp = r.get_int32_min(n, "parallel.tp", 1); });
    if_present(par, "dp", [&](const YAML::Node& n) { cfg.parallel.dp = r.get_int32_min(n, "parallel.dp", 1); });

    const YAML::Node cache = root["cache"];
    r.check_keys(cache, "cache",
                 {"page_size", "max_requests", "max_context", "num_pages", "gpu_memory_fraction", "kv_dtype",
                  "ssm_state_dtype", "prefix"});
    // Cache element types: "cache.kv_dtype: unknown dtype 'x' (known: float32, bfloat16)".
    auto cache_dtype = [&](const YAML::Node& n, const std::string& path) {
      return r.get_enum(n, path, "dtype", {"float32", "bfloat16"}) == 0 ? dtype::kF32 : dtype::kBF16;
    };
    if_present(cache, "kv_dtype", [&](const YAML::Node& n) { cfg.cache.kv_dtype = cache_dtype(n, "cache.kv_dtype"); });
    if_present(cache, "ssm_state_dtype",
               [&](const YAML::Node& n) { cfg.cache.ssm_state_dtype = cache_dtype(n, "cache.ssm_state_dtype"); });
    if_present(cache, "page_size", [&](const YAML::Node& n) {
      const int32_t v = r.get_int32(n, "cache.page_size");
      if (v < 1 || (v & (v - 1)) != 0) r.fail(n, "cache.page_size", "must be a power of two, got " + std::to_string(v));
      cfg.cache.page_size = v;
    });
    if_present(cache, "max_requests",
               [&](const YAML::Node& n) { cfg.cache.max_requests = r.get_int32_min(n, "cache.max_requests", 1); });
    if_present(cache, "max_context",
               [&](const YAML::Node& n) { cfg.cache.max_context = r.get_int32_min(n, "cache.max_context", 1); });
    if_present(cache, "num_pages",
               [&](const YAML::Node& n) { cfg.cache.num_pages = r.get_int32_min(n, "cache.num_pages", 0); });
    if_present(cache, "gpu_memory_fraction", [&](const YAML::Node& n) {
      const double v = r.get_double(n, "cache.gpu_memory_fraction");
      if (!(v > 0.0) || v > 1.0) r.fail(n, "cache.gpu_memory_fraction", "must be in (0, 1], got " + n.Scalar());
      cfg.cache.gpu_memory_fraction = v;
    });
    if_present(cache, "prefix", [&](const YAML::Node& pc) {
      r.check_keys(pc, "cache.prefix", {"enabled", "state_interval", "state_slots"});
      prefix_cache_section& s = cfg.cache.prefix;
      if_present(pc, "enabled", [&](const YAML::Node& n) {
        s.enabled = r.get_bool(n, "cache.prefix.enabled");
        s.enabled_given = true;
      });
      if_present(pc, "state_slots",
                 [&](const YAML::Node& n) { s.state_slots = r.get_int32_min(n, "cache.prefix.state_slots", 1); });
      if_present(pc, "state_interval", [&](const YAML::Node& n) {
        const int32_t v = r.get_int32_min(n, "cache.prefix.state_interval", 0);
        if (v % cfg.cache.page_size != 0)
          r.fail(n, "cache.prefix.state_interval",
                 "must be a multiple of cache.page_size (" + std::to_string(cfg.cache.page_size) + "), got " +
                     std::to_string(v));
        s.state_interval = v;
      });
    });

    const YAML::Node sched = root["scheduler"];
    r.check_keys(sched, "scheduler", {"max_batch_tokens", "max_running", "chunked_prefill", "max_queue", "overlap",
                                           "overlap_steps", "step_trace"});
    if_present(sched, "step_trace", [&](const YAML::Node& n) { cfg.scheduler.step_trace = r.get_string(n, "scheduler.step_trace"); });
    if_present(sched, "overlap", [&](const YAML::Node& n) { cfg.scheduler.overlap = r.get_bool(n, "scheduler.overlap"); });
    // Default: 3 steps in flight on a GPU (a step of a fraction of a millisecond then never
    // waits for the coordinator's round trip), 2 on the CPU (steps are long; fewer wasted rows).
    if (cfg.device == device_kind::kCuda) cfg.scheduler.overlap_steps = 3;
    if_present(sched, "overlap_steps", [&](const YAML::Node& n) {
      const int32_t v = r.get_int32_min(n, "scheduler.overlap_steps", 2);
      if (v > 4) r.fail(n, "scheduler.overlap_steps", "must be in [2, 4], got " + n.Scalar());
      cfg.scheduler.overlap_steps = v;
    });
    if_present(sched, "max_batch_tokens", [&](const YAML::Node& n) {
      cfg.scheduler.max_batch_tokens = r.get_int32_min(n, "scheduler.max_batch_tokens", 1);
    });
    if_present(sched, "max_running", [&](const YAML::Node& n) {
      cfg.scheduler.max_running = r.get_int32_min(n, "scheduler.max_running", 1);
    });
    if_present(sched, "chunked_prefill", [&](const YAML::Node& n) {
      cfg.scheduler.chunked_prefill = r.get_int32_min(n, "scheduler.chunked_prefill", 1);
    });
    if_present(sched, "max_queue",
               [&](const YAML::Node& n) { cfg.scheduler.max_queue = r.get_int32_min(n, "scheduler.max_queue", 1); });

    const YAML::Node sp = root["sparsity"];
    r.check_keys(sp, "sparsity", {"algorithm", "page_budget", "sink_pages", "recent_pages", "min_seq_len"});
    if_present(sp, "algorithm", [&](const YAML::Node& n) {
      cfg.sparsity.algorithm = r.get_enum(n, "sparsity.algorithm", "algorithm", {"none", "quest"}) == 0
                                   ? sparsity_algorithm::kNone
                                   : sparsity_algorithm::kQuest;
    });
    if_present(sp, "page_budget",
               [&](const YAML::Node& n) { cfg.sparsity.page_budget = r.get_int32_min(n, "sparsity.page_budget", 1); });
    if_present(sp, "sink_pages",
               [&](const YAML::Node& n) { cfg.sparsity.sink_pages = r.get_int32_min(n, "sparsity.sink_pages", 0); });
    if_present(sp, "recent_pages", [&](const YAML::Node& n) {
      cfg.sparsity.recent_pages = r.get_int32_min(n, "sparsity.recent_pages", 0);
    });
    if_present(sp, "min_seq_len",
               [&](const YAML::Node& n) { cfg.sparsity.min_seq_len = r.get_int32_min(n, "sparsity.min_seq_len", 0); });
    // The budget must leave room for at least one selected page besides the sink and recent ones.
    const int64_t min_budget =
        static_cast<int64_t>(cfg.sparsity.sink_pages) + static_cast<int64_t>(cfg.sparsity.recent_pages) + 1;
    if (cfg.sparsity.page_budget < min_budget)
      r.fail(is_map(sp) && sp["page_budget"] ? sp["page_budget"] : root, "sparsity.page_budget",
             "must be >= sink_pages + recent_pages + 1 = " + std::to_string(min_budget) + ", got " +
                 std::to_string(cfg.sparsity.page_budget));

    const YAML::Node spec = root["speculative"];
    r.check_keys(spec, "speculative",
                 {"algorithm", "num_draft_tokens", "ngram", "draft_model", "min_accept_rate", "cost_check", "max_batch"});
    if_present(spec, "cost_check",
               [&](const YAML::Node& n) { cfg.speculative.cost_check = r.get_bool(n, "speculative.cost_check"); });
    if_present(spec, "algorithm", [&](const YAML::Node& n) {
      const size_t i = r.get_enum(n, "speculative.algorithm", "algorithm", {"none", "ngram", "draft_model"});
      cfg.speculative.algorithm = i == 0   ? speculative_algorithm::kNone
                                  : i == 1 ? speculative_algorithm::kNgram
                                           : speculative_algorithm::kDraftModel;
    });
    if_present(spec, "num_draft_tokens", [&](const YAML::Node& n) {
      cfg.speculative.num_draft_tokens = r.get_int32_min(n, "speculative.num_draft_tokens", 1);
      if (cfg.speculative.num_draft_tokens > 64)
        r.fail(n, "speculative.num_draft_tokens",
               "must be <= 64, got " + std::to_string(cfg.speculative.num_draft_tokens));
    });
    if_present(spec, "max_batch", [&](const YAML::Node& n) {
      cfg.speculative.max_batch = r.get_int32_min(n, "speculative.max_batch", 1);
    });
    if_present(spec, "min_accept_rate", [&](const YAML::Node& n) {
      const double v = r.get_double(n, "speculative.min_accept_rate");
      if (!(v >= 0.0 && v <= 1.0)) r.fail(n, "speculative.min_accept_rate", "must be in [0, 1], got " + std::to_string(v));
      cfg.speculative.min_accept_rate = v;
    });
    if_present(spec, "ngram", [&](const YAML::Node& ng) {
      r.check_keys(ng, "speculative.ngram", {"min_match", "max_match", "max_tree_width"});
      ngram_spec_section& s = cfg.speculative.ngram;
      if_present(ng, "min_match", [&](const YAML::Node& n) { s.min_match = r.get_int32_min(n, "speculative.ngram.min_match", 1); });
      if_present(ng, "max_match", [&](const YAML::Node& n) { s.max_match = r.get_int32_min(n, "speculative.ngram.max_match", 1); });
      if_present(ng, "max_tree_width", [&](const YAML::Node& n) {
        s.max_tree_width = r.get_int32_min(n, "speculative.ngram.max_tree_width", 1);
      });
      if (s.max_match < s.min_match)
        r.fail(ng["max_match"] ? ng["max_match"] : ng, "speculative.ngram.max_match",
               "must be >= min_match = " + std::to_string(s.min_match) + ", got " + std::to_string(s.max_match));
    });
    if_present(spec, "draft_model", [&](const YAML::Node& dm) {
      const auto keys = r.check_keys(dm, "speculative.draft_model", {"path", "synthetic", "max_tree_width"});
      if (keys.count("max_tree_width"))
        cfg.speculative.draft_model.max_tree_width =
            r.get_int32_min(dm["max_tree_width"], "speculative.draft_model.max_tree_width", 1);
      if (keys.count("path") + keys.count("synthetic") != 1)
        r.fail(dm, "speculative.draft_model", "exactly one of path or synthetic must be given");
      if (keys.count("path")) {
        cfg.speculative.draft_model.path = r.get_string(dm["path"], "speculative.draft_model.path");
        if (cfg.speculative.draft_model.path.empty())
          r.fail(dm["path"], "speculative.draft_model.path", "must not be empty");
      } else {
        const YAML::Node syn = dm["synthetic"];
        r.check_keys(syn, "speculative.draft_model.synthetic", {"num_layers"});
        if (!is_map(syn) || !syn["num_layers"])
          r.fail(syn, "speculative.draft_model.synthetic", "needs num_layers (the target's first N layers)");
        cfg.speculative.draft_model.synthetic_num_layers =
            r.get_int32_min(syn["num_layers"], "speculative.draft_model.synthetic.num_layers", 1);
      }
    });
    if (cfg.speculative.algorithm == speculative_algorithm::kDraftModel && cfg.speculative.draft_model.path.empty() &&
        cfg.speculative.draft_model.synthetic_num_layers == 0)
      r.fail(is_map(spec) ? spec : root, "speculative.draft_model",
             "is required when speculative.algorithm is draft_model (path or synthetic)");
    cfg.cache.spec_step_cols = speculative_step_cols(cfg.speculative);
    cfg.cache.spec_step_rows = cfg.speculative.max_batch;

    const YAML::Node srv = root["server"];
    r.check_keys(srv, "server",
                 {"host", "port", "api_key", "max_body_bytes", "threads", "drain_timeout_s", "strict_fields"});
    if_present(srv, "host", [&](const YAML::Node& n) {
      cfg.server.host = r.get_string(n, "server.host");
      if (cfg.server.host.empty()) r.fail(n, "server.host", "must not be empty");
    });
    if_present(srv, "port", [&](const YAML::Node& n) {
      const int32_t v = r.get_int32(n, "server.port");
      // 0 asks the system for a free port; the coordinator logs the one it got.
      if (v < 0 || v > 65535) r.fail(n, "server.port", "must be in 0..65535, got " + std::to_string(v));
      cfg.server.port = v;
    });
    if_present(srv, "api_key", [&](const YAML::Node& n) { cfg.server.api_key = r.get_string(n, "server.api_key"); });
    if_present(srv, "max_body_bytes", [&](const YAML::Node& n) {
      cfg.server.max_body_bytes = r.get_int64_min(n, "server.max_body_bytes", 1);
    });
    if_present(srv, "threads",
               [&](const YAML::Node& n) { cfg.server.threads = r.get_int32_min(n, "server.threads", 1); });
    if_present(srv, "drain_timeout_s", [&](const YAML::Node& n) {
      cfg.server.drain_timeout_s = r.get_seconds(n, "server.drain_timeout_s", /*allow_zero=*/true);
    });
    if_present(srv, "strict_fields",
               [&](const YAML::Node& n) { cfg.server.strict_fields = r.get_bool(n, "server.strict_fields"); });

    read_kernels(r, root["kernels"], cfg.kernels);
    if_present(root, "determinism", [&](const YAML::Node& n) {
      cfg.kernels.batch_invariant = r.get_enum(n, "determinism", "mode", {"fast", "batch_invariant"}) == 1;
      if (!cfg.kernels.batch_invariant) return;
      // The choices a batch-invariant run cannot honour: the FMA skinny kernel sums in another
      // order than the row-invariant GEMM of more rows, and a GDN prefill of more tokens than its
      // tensor-core workspace holds falls back to the recurrent kernel (another order) for the
      // whole call; raise the workspace to the step's token budget instead.
      if (cfg.kernels.skinny == kernel_paths::skinny_kind::kFma)
        r.fail(root["kernels"]["skinny"], "kernels.skinny",
               "fma is not row-invariant across row counts; determinism: batch_invariant runs mma (leave it default)");
      const int32_t gdn_default = 16384;
      if (cfg.kernels.gdn_max_tokens == 0) {
        cfg.kernels.gdn_max_tokens = std::max(gdn_default, cfg.scheduler.max_batch_tokens);
      } else if (cfg.kernels.gdn_max_tokens < cfg.scheduler.max_batch_tokens) {
        r.fail(root["kernels"]["gdn_max_tokens"], "kernels.gdn_max_tokens",
               "must be >= scheduler.max_batch_tokens = " + std::to_string(cfg.scheduler.max_batch_tokens) +
                   " with determinism: batch_invariant (a larger step would change the GDN prefill's kernel), got " +
                   std::to_string(cfg.kernels.gdn_max_tokens));
      }
      // A cached prompt resumes only at multiples of state_interval, which must divide the
      // prefill chunk (check_invariant_prefix). A bfloat16 SSM state is rounded wherever a prompt
      // is cut, so a cached prompt may resume only where an uncached one is cut: the interval is
      // then the prefill chunk (another explicit value is refused); a float32 state resumes at
      // the largest divisor of the chunk that divides the SSM kernels' 256.
      if (cfg.cache.prefix.state_interval == 0) {
        const int32_t chunk = std::min(cfg.scheduler.chunked_prefill, cfg.scheduler.max_batch_tokens);
        cfg.cache.prefix.state_interval = cfg.cache.ssm_state_dtype != dtype::kF32 ? chunk : std::gcd(256, chunk);
      }
    });

    if (root["chat"]) {
      chat_section chat;
      read_chat(r, root["chat"], chat);
      cfg.chat = std::move(chat);
    }

    const YAML::Node wk = root["worker"];
    r.check_keys(wk, "worker",
                 {"step_timeout_s", "startup_timeout_s", "fault_grace_s", "fail_at_step", "fail_rank", "fault"});
    if_present(wk, "step_timeout_s", [&](const YAML::Node& n) {
      cfg.worker.step_timeout_s = r.get_seconds(n, "worker.step_timeout_s", /*allow_zero=*/false);
    });
    if_present(wk, "startup_timeout_s", [&](const YAML::Node& n) {
      cfg.worker.startup_timeout_s = r.get_seconds(n, "worker.startup_timeout_s", /*allow_zero=*/false);
    });
    if_present(wk, "fault_grace_s", [&](const YAML::Node& n) {
      cfg.worker.fault_grace_s = r.get_seconds(n, "worker.fault_grace_s", /*allow_zero=*/true);
    });
    if_present(wk, "fail_at_step",
               [&](const YAML::Node& n) { cfg.worker.fail_at_step = r.get_int64_min(n, "worker.fail_at_step", -1); });
    if_present(wk, "fail_rank", [&](const YAML::Node& n) {
      cfg.worker.fail_rank = r.get_int32_min(n, "worker.fail_rank", 0);
      if (cfg.worker.fail_rank >= cfg.parallel.tp)
        r.fail(n, "worker.fail_rank",
               "must be < parallel.tp = " + std::to_string(cfg.parallel.tp) + ", got " +
                   std::to_string(cfg.worker.fail_rank));
    });
    if_present(wk, "fault", [&](const YAML::Node& n) {
      static constexpr worker_fault kFaults[] = {worker_fault::kThrow, worker_fault::kHang, worker_fault::kStop,
                                                 worker_fault::kCoordinatorStall};
      cfg.worker.fault =
          kFaults[r.get_enum(n, "worker.fault", "fault", {"throw", "hang", "stop", "coordinator_stall"})];
    });
  } catch (const YAML::Exception& e) {
    throw config_error(where + ": YAML error: " + e.what());
  }
  return cfg;
}

// model.tokenizer: a file, or a directory holding tokenizer.json; relative paths as for
// model.path. Unset: <model.path>/tokenizer.json when the checkpoint ships one.
void resolve_tokenizer_path(service_config& cfg, const std::string& config_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (cfg.model.tokenizer.empty()) {
    if (!cfg.model.path.empty()) {
      const fs::path p = fs::path(cfg.model.path) / "tokenizer.json";
      if (fs::is_regular_file(p, ec)) cfg.model.tokenizer = p.string();
    }
  } else {
    const fs::path given(cfg.model.tokenizer);
    std::vector<fs::path> candidates;
    if (given.is_absolute()) {
      candidates.push_back(given);
    } else {
      candidates.push_back(fs::absolute(fs::path(config_path), ec).parent_path() / given);
      candidates.push_back(fs::absolute(given, ec));
    }
    const auto found =
        std::find_if(candidates.begin(), candidates.end(), [&](const fs::path& p) { return fs::exists(p, ec); });
    if (found == candidates.end())
      throw config_error(config_path + ": model.tokenizer: '" + cfg.model.tokenizer + "' not found" +
                         (given.is_absolute() ? std::string()
                                              : " (looked in " +
                                                    fs::absolute(fs::path(config_path), ec).parent_path().string() +
                                                    " and in the current directory)"));
    fs::path file = *found;
    if (fs::is_directory(file, ec)) {
      file /= "tokenizer.json";
      if (!fs::is_regular_file(file, ec))
        throw config_error(config_path + ": model.tokenizer: directory '" + cfg.model.tokenizer +
                           "' has no tokenizer.json");
    }
    cfg.model.tokenizer = file.lexically_normal().string();
  }
  if (cfg.chat && cfg.model.tokenizer.empty())
    throw config_error(config_path + ": chat: needs a tokenizer (set model.tokenizer, or use a model directory "
                       "with a tokenizer.json)");
}

}  // namespace

service_config load_config_string(const std::string& yaml_text) { return parse_config(yaml_text, std::string()); }

service_config load_config_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::string err;
  const auto text = read_text_file(path, err);
  if (!text) throw config_error(path + ": cannot read config file: " + err);
  service_config cfg = parse_config(*text, path);

  if (!cfg.model.path.empty()) {
    // Relative model paths: the config file's directory first (a config works from any
    // directory), then the current directory (older configs written against the repository root).
    const fs::path given(cfg.model.path);
    std::error_code ec;
    std::vector<fs::path> candidates;
    if (given.is_absolute()) {
      candidates.push_back(given);
    } else {
      candidates.push_back(fs::absolute(fs::path(path), ec).parent_path() / given);
      candidates.push_back(fs::absolute(given, ec));
    }
    const auto found =
        std::find_if(candidates.begin(), candidates.end(), [&](const fs::path& p) { return fs::is_directory(p, ec); });
    if (found == candidates.end())
      throw config_error(path + ": model.path: directory '" + cfg.model.path + "' not found" +
                         (given.is_absolute() ? std::string()
                                              : " (looked in " +
                                                    fs::absolute(fs::path(path), ec).parent_path().string() +
                                                    " and in the current directory)"));
    cfg.model.path = found->lexically_normal().string();
  }
  if (const fs::path given(cfg.speculative.draft_model.path); !given.empty() && !given.is_absolute()) {
    // As model.path: beside the config file first, then the current directory (left as given).
    std::error_code ec;
    const fs::path beside = fs::absolute(fs::path(path), ec).parent_path() / given;
    if (fs::is_directory(beside, ec)) cfg.speculative.draft_model.path = beside.lexically_normal().string();
  }
  resolve_tokenizer_path(cfg, path);
  return cfg;
}

void check_invariant_prefix(const service_config& cfg, const model_config& mc) {
  if (!cfg.kernels.batch_invariant || !cfg.cache.prefix.enabled) return;
  const int64_t interval = cfg.cache.state_interval();
  const auto need = [&](int64_t chunk, const char* what) {
    if (chunk > 0 && interval % chunk != 0)
      throw config_error(cfg.source + ": cache.prefix.state_interval: " + std::to_string(interval) +
                         " (page-rounded) must be a multiple of the " + what + " " + std::to_string(chunk) +
                         " with determinism: batch_invariant (a cached prompt resumes only at multiples of it)");
  };
  if (mc.num_layers_of(layer_kind::kMamba2) + mc.num_layers_of(layer_kind::kParallelHybrid) > 0)
    need(mc.mamba_chunk_size, "model's mamba_chunk_size");
  if (mc.num_layers_of(layer_kind::kGatedDeltaNet) > 0) need(model_config::kGdnChunkSize, "Gated DeltaNet chunk");
  const int64_t chunk = std::min(cfg.scheduler.chunked_prefill, cfg.scheduler.max_batch_tokens);
  // A Mamba2 state kept in bfloat16 is rounded where each prefill call ends. An uncached prompt
  // is cut only at multiples of the prefill chunk, so a cached one may be cut, saved and resumed
  // only there too: elsewhere its state would be rounded where the uncached prompt's is not.
  if (cfg.cache.ssm_state_dtype != dtype::kF32 && interval != chunk &&
      mc.num_layers_of(layer_kind::kMamba2) + mc.num_layers_of(layer_kind::kParallelHybrid) > 0)
    throw config_error(cfg.source + ": cache.prefix.state_interval: " + std::to_string(interval) +
                       " (page-rounded) must equal min(scheduler.chunked_prefill, scheduler.max_batch_tokens) = " +
                       std::to_string(chunk) +
                       " with determinism: batch_invariant and cache.ssm_state_dtype: bfloat16 (the state is rounded "
                       "where a prefill is cut); leave it unset, or keep the state in float32");
  if (chunk % interval != 0)
    throw config_error(cfg.source + ": scheduler.chunked_prefill: min(chunked_prefill, max_batch_tokens) = " +
                       std::to_string(chunk) + " must be a multiple of cache.prefix.state_interval " +
                       std::to_string(interval) + " with determinism: batch_invariant and the prefix cache");
}

std::string settle_prefix_cache(service_config& cfg, const model_config& mc) {
  if (cfg.cache.prefix.enabled_given) {
    check_invariant_prefix(cfg, mc);
    return {};
  }
  try {
    check_invariant_prefix(cfg, mc);
  } catch (const config_error& e) {
    cfg.cache.prefix.enabled = false;
    return std::string("prefix caching is off: ") + e.what() +
           " (it is on by default where it keeps every output's bits; cache.prefix.enabled: true makes this an error)";
  }
  return {};
}

model_config resolve_model_config(const service_config& cfg) {
  if (cfg.model.synthetic) return cfg.model.synthetic->arch;
  if (cfg.model.path.empty())
    throw config_error(cfg.source + ": model: exactly one of path or synthetic must be given");
  return read_hf_config((std::filesystem::path(cfg.model.path) / "config.json").string());
}

}  // namespace hyserve
