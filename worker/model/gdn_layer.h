#pragma once
// Gated DeltaNet mixer (Qwen3-Next "linear_attention"):
//   in_proj → q | k | v | z | b | a;  causal conv1d + SiLU over q | k | v (the slot's window);
//   gated delta rule over value heads (kernels/gdn.h, state [HV, V, K] in the slot);
//   per-head RMSNorm of the output · weight, times silu(z);  out_proj (row-parallel).
// Tensor parallelism splits whole key-head groups (one key head and the HV/HK value heads that
// read it), so every rank's heads are self-contained and only out_proj reduces.
#include <cstdint>
#include <string>

#include "hyserve/common/config.h"
#include "hyserve/common/model_config.h"
#include "hyserve/common/tensor.h"
#include "hyserve/kernels/gdn.h"
#include "hyserve/worker/collective.h"
#include "hyserve/worker/hybrid_metadata.h"
#include "hyserve/worker/memory_pools.h"
#include "hyserve/worker/model.h"
#include "layers.h"
#include "weights.h"

namespace hyserve::worker::layers {

struct gdn_weights {
  // [conv_dim + value_dim + 2·heads_v, hidden] (local): q | k | v | z | b | a, each block in
  // head order. The checkpoint interleaves them per key-head group; loading de-interleaves.
  tensor in_proj;
  tensor conv_w;                // [conv_dim, K]: q | k | v channels
  tensor conv_b;                // [conv_dim]; empty = no bias
  tensor dt_bias;               // [heads_v]
  tensor A_log;                 // [heads_v]
  tensor norm;                  // [value_dim]: the checkpoint's [head_v_dim] weight once per local head
  tensor out_proj;              // [hidden, value_dim]
  int64_t heads_k = 0, heads_v = 0;  // local counts
  int64_t head_k_dim = 0, head_v_dim = 0;
  int64_t conv_width = 0;
  int64_t chunk_size = model_config::kGdnChunkSize;
  float eps = 1e-6f;
  // The chunked prefill's CUDA kernel (kernels/gdn.h), chosen by the model from model.dtype or
  // model.gdn_prefill (gdn_prefill_for).
  kernels::gdn_prefill_kernel prefill_kernel = kernels::gdn_prefill_kernel::kDefault;

  int64_t key_dim() const { return heads_k * head_k_dim; }
  int64_t value_dim() const { return heads_v * head_v_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

// The prefill kernel for model.gdn_prefill: auto follows the weight type (bf16: the bf16 path;
// f32: tc, fp32-level accuracy); a named path is taken as is.
kernels::gdn_prefill_kernel gdn_prefill_for(gdn_prefill_choice choice, dtype weight_type);

// Rank tp.rank's shard of the Hugging Face Qwen3NextGatedDeltaNet under `prefix`
// (".../linear_attn."). Throws config_error when the key heads do not split over tp.
gdn_weights load_gdn(const weight_source& ws, const std::string& prefix, const model_config& mc, tp_placement tp);

// x [T, hidden] → [T, hidden] (reduced over tp). Reads and writes the conv window and the
// recurrent state of the batch's slots; Extend/Mixed/DraftExtend run the chunked scan, Decode
// the single-token update.
// in_proj and out_proj in weight_type (model.dtype); conv, norm, dt_bias and A_log stay f32.
void place(gdn_weights& w, device_kind device, dtype weight_type = dtype::kF32);
// steps: per-step states for TargetVerify / Draft (the persistent state is then only read).
// residual: see block_output (layers.h). norm set: x is the block's input and its RMSNorm
// (norm, eps) runs inside in_proj (the rmsnorm_linear op); x may then be *residual itself.
tensor gdn_forward(const gdn_weights& w, const tensor& x, const step_inputs& in, mamba_layer_state& state,
                   collective* comm, const exec_context& ctx, mamba_layer_state* steps = nullptr,
                   tensor* residual = nullptr, const tensor* norm = nullptr, float eps = 0.0f);

}  // namespace hyserve::worker::layers
