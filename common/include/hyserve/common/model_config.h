#pragma once
// Architecture hyper-parameters of a hybrid model, read from a Hugging Face config.json or
// built from the YAML `model.synthetic` section. One struct for every architecture; the layer
// kinds say which mixer each layer has.
#include <cstdint>
#include <string>
#include <vector>

namespace hyserve {

enum class model_arch : uint8_t { kBamba, kQwen3Next, kNemotronH, kGraniteMoeHybrid, kFalconH1 };
// Mixer of one layer. kAttention is softmax attention over the paged KV cache; its details
// (Qwen3-Next: output gate, q/k norms) follow the architecture. kMlp is a layer whose only
// block is the MLP (Nemotron-H "-"). kParallelHybrid runs attention and a Mamba2 mixer side by
// side on the same normed input (Falcon-H1): it holds a KV cache and a recurrent state.
enum class layer_kind : uint8_t { kMamba2, kAttention, kGatedDeltaNet, kMlp, kParallelHybrid };
// The dense MLP: SwiGLU (down · (silu(gate · x) ⊙ up · x)) or, Nemotron-H, down · relu(up · x)².
enum class mlp_activation : uint8_t { kSwiGLU, kRelu2 };

struct model_config {
  model_arch arch = model_arch::kBamba;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  std::vector<layer_kind> layer_kinds;  // [num_layers]
  float rms_norm_eps = 1e-5f;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;
  int32_t bos_token_id = -1, eos_token_id = -1, pad_token_id = -1;  // -1 = none

  // Attention layers.
  int64_t num_attention_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;          // hidden_size / num_attention_heads unless given
  float partial_rotary_factor = 1.0f;
  float rope_theta = 10000.0f;
  bool attention_bias = false;
  bool use_rope = true;              // false: no positional embedding (Nemotron-H, Granite "nope")
  float attention_multiplier = 0.0f;  // softmax scale; 0 = 1/sqrt(head_dim) (Granite sets it)

  // MLP.
  int64_t intermediate_size = 0;
  bool mlp_bias = false;
  mlp_activation mlp_act = mlp_activation::kSwiGLU;

  // Scalar multipliers (muP) of Granite-4.0-H and Falcon-H1; 1 = none. The model folds them into
  // the weights they follow at load time.
  float embedding_multiplier = 1.0f;  // embeddings · m
  float logits_multiplier = 1.0f;     // logits · m (Granite: 1 / logits_scaling; Falcon: lm_head_multiplier)
  float residual_multiplier = 1.0f;   // Granite: every block's output · m before the residual add
  float attention_in_multiplier = 1.0f, attention_out_multiplier = 1.0f, key_multiplier = 1.0f;  // Falcon-H1
  float ssm_in_multiplier = 1.0f, ssm_out_multiplier = 1.0f;                                       // Falcon-H1
  std::vector<float> ssm_multipliers;  // Falcon-H1: in_proj output z | x | B | C | dt; empty = 1
  float mlp_gate_multiplier = 1.0f, mlp_down_multiplier = 1.0f;  // Falcon-H1 mlp_multipliers

  // Mamba2 layers.
  int64_t mamba_n_heads = 0;
  int64_t mamba_d_head = 0;
  int64_t mamba_d_state = 0;
  int64_t mamba_n_groups = 1;
  int64_t mamba_d_conv = 4;
  int64_t mamba_expand = 2;
  int64_t mamba_chunk_size = 256;
  // The chunk of the Gated DeltaNet prefill scans (not a checkpoint field).
  static constexpr int64_t kGdnChunkSize = 64;
  bool mamba_conv_bias = true;
  bool mamba_proj_bias = false;
  // Mamba2 output norm: gated RMSNorm (norm(y · silu(z)), the default), norm before the gate
  // (norm(y) · silu(z), Falcon-H1 mamba_norm_before_gate), or no norm (y · silu(z), Falcon-H1
  // mamba_rms_norm = false).
  bool mamba_rms_norm = true;
  bool mamba_norm_before_gate = false;
  float time_step_min = 0.0f;   // time_step_limit[0]
  float time_step_max = 3.4e38f;  // time_step_limit[1] (Infinity → FLT_MAX)

  // Gated DeltaNet layers (Qwen3-Next "linear_attention"): HK key heads of dk channels, HV
  // value heads of dv channels, HV a multiple of HK.
  int64_t linear_num_key_heads = 0;
  int64_t linear_num_value_heads = 0;
  int64_t linear_key_head_dim = 0;
  int64_t linear_value_head_dim = 0;
  int64_t linear_conv_kernel_dim = 4;

  // Sparse MoE (Qwen3-Next). Layer i is an MoE layer when num_experts > 0, i is not in
  // mlp_only_layers and (i + 1) % decoder_sparse_step == 0; other layers use the dense MLP of
  // intermediate_size.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;  // 0 = no shared expert
  bool norm_topk_prob = true;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;

  // Derived sizes.
  int64_t mamba_intermediate() const { return mamba_n_heads * mamba_d_head; }
  int64_t mamba_conv_dim() const { return mamba_intermediate() + 2 * mamba_n_groups * mamba_d_state; }
  int64_t mamba_in_proj_dim() const { return mamba_intermediate() + mamba_conv_dim() + mamba_n_heads; }
  int64_t gdn_key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int64_t gdn_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  int64_t gdn_conv_dim() const { return 2 * gdn_key_dim() + gdn_value_dim(); }  // q | k | v
  int64_t rotary_dim() const;  // head_dim · partial_rotary_factor, rounded down to even
  int64_t num_layers_of(layer_kind k) const;
  // Layers that keep a recurrent state slot (conv window + state): Mamba2, Gated DeltaNet and
  // parallel hybrid layers.
  int64_t num_recurrent_layers() const;
  // Layers that keep a KV cache: attention and parallel hybrid layers.
  int64_t num_attention_layers() const;
  bool is_moe_layer(int64_t layer) const;

  // Checks internal consistency (positive sizes, divisibility, layer count); throws
  // config_error naming the offending field.
  void validate() const;
};

// The architectures read_hf_config accepts, as named in config.json, comma separated.
extern const char* const kSupportedArchitectures;

// Reads a Hugging Face config.json (BambaForCausalLM, Qwen3NextForCausalLM, NemotronHForCausalLM,
// GraniteMoeHybridForCausalLM, FalconH1ForCausalLM). Throws config_error naming the file and
// field for a missing/ill-typed field, an unsupported architecture (listing the supported
// ones) or inconsistent dimensions. Accepts transformers 5's {"__float__": "Infinity"}.
model_config read_hf_config(const std::string& path);

}  // namespace hyserve
