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
  tensor q;       // [q_heads·head_dim, hidden]: the query half of each head's q_proj rows
  tensor gate;    // [q_heads·head_dim, hidden]: the gate half
  tensor k;       // [kv_heads·head_dim, hidden]
  tensor v;       // [kv_heads·head_dim, hidden]
  tensor o;       // [hidden, q_heads·head_dim]
  tensor q_norm;  // [head_dim], as a plain RMSNorm weight (zero-centred 1 + w folded in)
  tensor k_norm;  // [head_dim], likewise
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0, rotary_dim = 0;  // local head counts
  float rope_theta = 10000.0f;
  float eps = 1e-6f;
};

// Rank tp.rank's shard of the Hugging Face Qwen3NextAttention under `prefix` (".../self_attn.").
// q_proj rows are [query (head_dim) | gate (head_dim)] per head; q_norm/k_norm are zero-centred.
gated_attention_weights load_gated_attention(const weight_source& ws, const std::string& prefix, const model_config& mc,
                                             tp_placement tp);

// x [T, hidden] → [T, hidden], reduced over tp. Writes the batch's K/V into the cache.
// Projections in weight_type (model.dtype); q_norm and k_norm stay f32.
void place(gated_attention_weights& w, device_kind device, dtype weight_type = dtype::kF32);
// residual: see block_output (layers.h).
tensor gated_attention_forward(const gated_attention_weights& w, const tensor& x, const step_inputs& in,
                               kv_layer_cache& cache, collective* comm, const exec_context& ctx,
                               tensor* residual = nullptr);

}  // namespace hyserve::worker::layers
