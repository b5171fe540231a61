#pragma once
// Gated attention (Qwen3-Next "full_attention"): q_proj yields a query and an output gate per
// head; queries and keys get a per-head RMSNorm before the partial rotary embedding; attention
// runs over the paged KV cache; the output is multiplied by sigmoid(gate) before o_proj
// (row-parallel). Heads split over tp like layers::attention_forward.
#include <cstdint>
#include <string>

#include "hyserve/common/model_config.h"
#include "hyserve/common/tensor.h"
#include "hyserve/worker/collective.h"
#include "hyserve/worker/hybrid_metadata.h"
#include "hyserve/worker/memory_pools.h"
#include "hyserve/worker/model.h"
#include "layers.h"
#include "weights.h"

namespace hyserve::worker::layers {

struct gated_attention_weights {
  // q | k | v | gate stacked: [(2·q_heads + 2·kv_heads)·head_dim, hidden], one projection (one
  // launch, one weight stream, the block's input norm fused in) whose output row is
  // q | k | v | gate: the query and gate halves of each head's q_proj rows, k_proj, v_proj.
  tensor qkvg;
  tensor o;        // [hidden, q_heads·head_dim]
  tensor qk_norm;  // [q_heads + kv_heads, head_dim]: q_norm per query head, then k_norm per key
                   // head, as plain RMSNorm weights (zero-centred 1 + w folded in)
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0, rotary_dim = 0;  // local head counts
  float rope_theta = 10000.0f;
  float eps = 1e-6f;
  // A bfloat16 model: the prefill attention's products in bf16 (paged_attention_params::bf16_products).
  bool bf16_products = false;
};

// Rank tp.rank's shard of the Hugging Face Qwen3NextAttention under `prefix` (".../self_attn.").
// q_proj rows are [query (head_dim) | gate (head_dim)] per head; q_norm/k_norm are zero-centred.
gated_attention_weights load_gated_attention(const weight_source& ws, const std::string& prefix, const model_config& mc,
                                             tp_placement tp);

// Projections in weight_type (model.dtype); qk_norm stays f32.
void place(gated_attention_weights& w, device_kind device, dtype weight_type = dtype::kF32);
// x [T, hidden] → [T, hidden], reduced over tp. Writes the batch's K/V into the cache. The
// projection reads rmsnorm(x; norm, eps) (the block's input norm fused into it); x may be
// *residual itself. residual: see block_output (layers.h).
tensor gated_attention_forward(const gated_attention_weights& w, const tensor& x, const step_inputs& in,
                               kv_layer_cache& cache, collective* comm, const exec_context& ctx, tensor* residual,
                               const tensor& norm, float eps);

}  // namespace hyserve::worker::layers
