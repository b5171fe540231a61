#include "checkpoint/writer.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>

#include "hyserve/common/error.h"
#include "model/weights.h"

namespace hyserve::tools {

namespace fs = std::filesystem;

std::vector<checkpoint_tensor> bamba_checkpoint_tensors(const model_config& mc) {
  if (mc.arch != model_arch::kBamba)
    throw config_error(
        "hyserve-write-checkpoint: only the Bamba architecture is supported (model.synthetic.arch: bamba)");
  const int64_t H = mc.hidden_size, V = mc.vocab_size, I = mc.intermediate_size;
  const int64_t di = mc.mamba_intermediate(), conv = mc.mamba_conv_dim(), nh = mc.mamba_n_heads;
  const int64_t q = mc.num_attention_heads * mc.head_dim, kv = mc.num_kv_heads * mc.head_dim;
  std::vector<checkpoint_tensor> out;
  const auto add = [&](std::string name, shape_t shape, bool linear) {
    out.push_back(checkpoint_tensor{std::move(name), shape, linear});
  };
  add("model.embed_tokens.weight", {V, H}, true);
  for (int64_t i = 0; i < mc.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {H}, false);
    add(p + "pre_ff_layernorm.weight", {H}, false);
    add(p + "feed_forward.gate_proj.weight", {I, H}, true);
    add(p + "feed_forward.up_proj.weight", {I, H}, true);
    add(p + "feed_forward.down_proj.weight", {H, I}, true);
    if (mc.layer_kinds[static_cast<size_t>(i)] == layer_kind::kAttention) {
      add(p + "self_attn.q_proj.weight", {q, H}, true);
      add(p + "self_attn.k_proj.weight", {kv, H}, true);
      add(p + "self_attn.v_proj.weight", {kv, H}, true);
      add(p + "self_attn.o_proj.weight", {H, q}, true);
    } else {
      add(p + "mamba.in_proj.weight", {mc.mamba_in_proj_dim(), H}, true);
      add(p + "mamba.conv1d.weight", {conv, 1, mc.mamba_d_conv}, false);
      if (mc.mamba_conv_bias) add(p + "mamba.conv1d.bias", {conv}, false);
      add(p + "mamba.dt_bias", {nh}, false);
      add(p + "mamba.A_log", {nh}, false);
      add(p + "mamba.D", {nh}, false);
      add(p + "mamba.norm.weight", {di}, false);
      add(p + "mamba.out_proj.weight", {H, di}, true);
    }
  }
  add("model.final_layernorm.weight", {H}, false);
  if (!mc.tie_word_embeddings) add("lm_head.weight", {V, H}, true);
  return out;
}

namespace {

// Shortest text that reads back as the same float.
std::string float_text(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

std::string bool_text(bool v) { return v ? "true" : "false"; }

std::string token_text(int32_t id) { return id < 0 ? "null" : std::to_string(id); }

std::string shape_json(const shape_t& s) {
  std::string out = "[";
  for (int i = 0; i < s.ndim; ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

const char* safetensors_dtype(dtype t) { return t == dtype::kBF16 ? "BF16" : "F32"; }

}  // namespace

std::string bamba_hf_config_json(const model_config& mc) {
  std::ostringstream o;
  std::string attn;
  for (int64_t i = 0; i < mc.num_layers; ++i)
    if (mc.layer_kinds[static_cast<size_t>(i)] == layer_kind::kAttention)
      attn += (attn.empty() ? "" : ", ") + std::to_string(i);
  o << "{\n"
    << "  \"architectures\": [\"BambaForCausalLM\"],\n"
    << "  \"model_type\": \"bamba\",\n"
    << "  \"vocab_size\": " << mc.vocab_size << ",\n"
    << "  \"hidden_size\": " << mc.hidden_size << ",\n"
    << "  \"num_hidden_layers\": " << mc.num_layers << ",\n"
    << "  \"attn_layer_indices\": [" << attn << "],\n"
    << "  \"num_attention_heads\": " << mc.num_attention_heads << ",\n"
    << "  \"num_key_value_heads\": " << mc.num_kv_heads << ",\n"
    << "  \"head_dim\": " << mc.head_dim << ",\n"
    << "  \"partial_rotary_factor\": " << float_text(mc.partial_rotary_factor) << ",\n"
    << "  \"rope_theta\": " << float_text(mc.rope_theta) << ",\n"
    << "  \"attention_bias\": " << bool_text(mc.attention_bias) << ",\n"
    << "  \"intermediate_size\": " << mc.intermediate_size << ",\n"
    << "  \"mlp_bias\": " << bool_text(mc.mlp_bias) << ",\n"
    << "  \"hidden_act\": \"silu\",\n"
    << "  \"mamba_n_heads\": " << mc.mamba_n_heads << ",\n"
    << "  \"mamba_d_head\": " << mc.mamba_d_head << ",\n"
    << "  \"mamba_d_state\": " << mc.mamba_d_state << ",\n"
    << "  \"mamba_n_groups\": " << mc.mamba_n_groups << ",\n"
    << "  \"mamba_d_conv\": " << mc.mamba_d_conv << ",\n"
    << "  \"mamba_expand\": " << mc.mamba_expand << ",\n"
    << "  \"mamba_chunk_size\": " << mc.mamba_chunk_size << ",\n"
    << "  \"mamba_conv_bias\": " << bool_text(mc.mamba_conv_bias) << ",\n"
    << "  \"mamba_proj_bias\": " << bool_text(mc.mamba_proj_bias) << ",\n"
    << "  \"rms_norm_eps\": " << float_text(mc.rms_norm_eps) << ",\n"
    << "  \"tie_word_embeddings\": " << bool_text(mc.tie_word_embeddings) << ",\n"
    << "  \"max_position_embeddings\": " << mc.max_position_embeddings << ",\n"
    << "  \"bos_token_id\": " << token_text(mc.bos_token_id) << ",\n"
    << "  \"eos_token_id\": " << token_text(mc.eos_token_id) << ",\n"
    << "  \"pad_token_id\": " << token_text(mc.pad_token_id) << "\n"
    << "}\n";
  return o.str();
}

namespace {

struct planned_tensor {
  checkpoint_tensor t;
  dtype type = dtype::kF32;
  uint64_t bytes = 0;
};

class file_writer {
 public:
  explicit file_writer(std::string path) : path_(std::move(path)), f_(std::fopen(path_.c_str(), "wb")) {
    if (!f_) throw error(path_ + ": cannot open for writing");
  }
  ~file_writer() {
    if (f_) std::fclose(f_);
  }
  file_writer(const file_writer&) = delete;
  file_writer& operator=(const file_writer&) = delete;
  void write(const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f_) != n) throw error(path_ + ": write failed (disk full?)");
  }
  void close() {
    std::FILE* f = f_;
    f_ = nullptr;
    if (std::fclose(f) != 0) throw error(path_ + ": close failed (disk full?)");
  }

 private:
  std::string path_;
  std::FILE* f_;
};

class progress_line {
 public:
  progress_line(bool on, uint64_t total) : on_(on), total_(total) {}
  void add(uint64_t bytes, const std::string& file) {
    done_ += bytes;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (!on_ || s - last_ < 2.0) return;
    last_ = s;
    std::fprintf(stderr, "hyserve-write-checkpoint: %.1f/%.1f GB written (%s), %.1f s\n", done_ * 1e-9,
                 total_ * 1e-9, file.c_str(), s);
  }

 private:
  bool on_;
  uint64_t total_, done_ = 0;
  double last_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// One safetensors file: header, then each tensor generated and written a block of rows at a time.
void write_safetensors(const std::string& path, const std::vector<const planned_tensor*>& tensors,
                       const worker::weight_source& ws, progress_line& progress) {
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
  uint64_t at = 0;
  for (const planned_tensor* p : tensors) {
    header += ",\"" + p->t.name + "\":{\"dtype\":\"" + safetensors_dtype(p->type) + "\",\"shape\":" +
              shape_json(p->t.shape) + ",\"data_offsets\":[" + std::to_string(at) + "," +
              std::to_string(at + p->bytes) + "]}";
    at += p->bytes;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  file_writer out(path);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
  out.write(len, 8);
  out.write(header.data(), header.size());

  constexpr int64_t kBlockElems = int64_t{1} << 24;  // 64 MB of f32 per block
  std::vector<uint16_t> bf16;
  const std::string file = fs::path(path).filename().string();
  for (const planned_tensor* p : tensors) {
    const shape_t& s = p->t.shape;
    const int64_t rows = s[0], row_elems = rows ? s.numel() / rows : 0;
    const int64_t step = std::max<int64_t>(1, kBlockElems / std::max<int64_t>(row_elems, 1));
    for (int64_t r = 0; r < rows; r += step) {
      const int64_t e = std::min(rows, r + step);
      const host_tensor block = ws.load_slice(p->t.name, s, 0, r, e);
      const auto n = static_cast<size_t>(block.numel());
      if (p->type == dtype::kBF16) {
        bf16.resize(n);
        const float* f = block.as<float>();
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) bf16[static_cast<size_t>(i)] = f32_to_bf16(f[i]);
        out.write(bf16.data(), n * sizeof(uint16_t));
      } else {
        out.write(block.data(), n * sizeof(float));
      }
      progress.add(n * dtype_size(p->type), file);
    }
  }
  out.close();
}

void write_text(const fs::path& path, const std::string& text) {
  file_writer out(path.string());
  out.write(text.data(), text.size());
  out.close();
}

}  // namespace

checkpoint_write_result write_synthetic_checkpoint(const synthetic_model_config& syn, const std::string& out_dir,
                                                   const checkpoint_write_options& opts) {
  if (opts.type != dtype::kF32 && opts.type != dtype::kBF16)
    throw config_error("--dtype: " + std::string(dtype_name(opts.type)) + " is not supported (float32, bfloat16)");
  const model_config& mc = syn.arch;
  mc.validate();
  std::vector<planned_tensor> plan;
  uint64_t total = 0;
  for (checkpoint_tensor& t : bamba_checkpoint_tensors(mc)) {
    planned_tensor p;
    p.type = t.in_weight_dtype ? opts.type : dtype::kF32;
    p.bytes = static_cast<uint64_t>(t.shape.numel()) * dtype_size(p.type);
    p.t = std::move(t);
    total += p.bytes;
    plan.push_back(std::move(p));
  }
  // Shards in order, each up to max_shard_bytes (a larger tensor gets a file of its own).
  std::vector<std::vector<const planned_tensor*>> shards(1);
  uint64_t in_shard = 0;
  for (const planned_tensor& p : plan) {
    if (!shards.back().empty() && in_shard + p.bytes > opts.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&p);
    in_shard += p.bytes;
  }

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (!fs::is_directory(out_dir, ec)) throw error(out_dir + ": cannot create the output directory");
  const fs::path dir(out_dir);
  write_text(dir / "config.json", bamba_hf_config_json(mc));

  const auto ws = worker::make_synthetic_weights(syn.seed, syn.residual_scale);
  progress_line progress(opts.progress, total);
  const size_t n = shards.size();
  const fs::path index = dir / "model.safetensors.index.json";
  if (n == 1) {
    fs::remove(index, ec);  // a stale index would take precedence over model.safetensors
    write_safetensors((dir / "model.safetensors").string(), shards[0], *ws, progress);
  } else {
    std::string map;
    for (size_t k = 0; k < n; ++k) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, n);
      write_safetensors((dir / name).string(), shards[k], *ws, progress);
      for (const planned_tensor* p : shards[k])
        map += std::string(map.empty() ? "" : ",\n") + "    \"" + p->t.name + "\": \"" + name + "\"";
    }
    write_text(index, "{\n  \"metadata\": {\"total_size\": " + std::to_string(total) +
                          "},\n  \"weight_map\": {\n" + map + "\n  }\n}\n");
  }
  return checkpoint_write_result{static_cast<int>(n), static_cast<int64_t>(plan.size()), total};
}

}  // namespace hyserve::tools
