#pragma once
// Shared layer builders for hybrid architectures: norms, projections, the Mamba2 mixer,
// attention over the paged KV cache, and the SwiGLU MLP. Activations are contiguous f32
// [num_tokens, features] host tensors; tensor-parallel partial sums are reduced through the
// collective (null = tp 1).
#include <cstdint>
#include <vector>

#include "hyserve/common/tensor.h"
#include "hyserve/worker/collective.h"
#include "hyserve/worker/forward_batch.h"
#include "hyserve/worker/hybrid_metadata.h"
#include "hyserve/worker/memory_pools.h"

namespace hyserve::worker::layers {

// y = x · wᵀ: x [T, in], w [out, in] → [T, out].
host_tensor linear(const host_tensor& x, const host_tensor& w);
// a += b (same shape).
void add_inplace(host_tensor& a, const host_tensor& b);
host_tensor rmsnorm(const host_tensor& x, const host_tensor& weight, float eps);
// Sums a row-parallel partial result over the tp group.
void reduce_partial(host_tensor& x, collective* comm);

// Vocab-parallel embedding: table holds rows [vocab_start, vocab_start + rows) → [T, hidden].
host_tensor embed(const std::vector<int32_t>& ids, const host_tensor& table, int64_t vocab_start, collective* comm);
// Vocab-parallel lm_head: x [R, hidden] · w_localᵀ, gathered to [R, vocab].
host_tensor lm_head(const host_tensor& x, const host_tensor& w_local, collective* comm);

// Tokens of the batch gathered into one list, in query_start_loc order.
std::vector<int32_t> batch_token_ids(const forward_batch& batch);

struct mlp_weights {
  host_tensor gate;  // [inter_local, hidden]
  host_tensor up;    // [inter_local, hidden]
  host_tensor down;  // [hidden, inter_local]
};
host_tensor mlp_forward(const mlp_weights& w, const host_tensor& x, collective* comm);

// KV bookkeeping of one step, shared by every attention layer.
struct attention_step {
  std::vector<int32_t> locs;        // [num_tokens] flat KV location of each token; -1 = padding
  std::vector<int32_t> page_table;  // [bs, page_table_stride] page of each block of each row
  int64_t page_table_stride = 0;
  std::vector<int32_t> seq_lens;    // [bs]
  int32_t page_size = 0;
};
attention_step build_attention_step(const forward_batch& batch, const hybrid_metadata& meta,
                                    const req_to_token_pool& req_to_token, int32_t page_size);

struct attention_weights {
  host_tensor q;  // [q_heads_local·head_dim, hidden]
  host_tensor k;  // [kv_heads_local·head_dim, hidden]
  host_tensor v;  // [kv_heads_local·head_dim, hidden]
  host_tensor o;  // [hidden, q_heads_local·head_dim]
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0, rotary_dim = 0;  // local head counts
  float rope_theta = 10000.0f;
};
host_tensor attention_forward(const attention_weights& w, const host_tensor& x, const hybrid_metadata& meta,
                              const attention_step& step, kv_layer_cache& cache, collective* comm);

struct mamba2_weights {
  host_tensor in_proj;   // [di_local + conv_local + heads_local, hidden]: z | x | B | C | dt
  host_tensor conv_w;    // [conv_local, K]
  host_tensor conv_b;    // [conv_local]; empty = no bias
  host_tensor dt_bias;   // [heads_local]
  host_tensor A_log;     // [heads_local]
  host_tensor D;         // [heads_local]
  host_tensor norm;      // [di_local]
  host_tensor out_proj;  // [hidden, di_local]
  int64_t heads = 0, head_dim = 0, d_state = 0, groups = 0;  // local counts
  int64_t conv_width = 0, chunk_size = 256;
  int64_t norm_group_size = 0;    // local channels per gated-norm group
  int64_t norm_group_global = 0;  // channels per group over all ranks (> local: sum-of-squares all-reduce)
  float dt_min = 0.0f, dt_max = 3.4e38f, eps = 1e-5f;

  int64_t d_inner() const { return heads * head_dim; }
  int64_t conv_dim() const { return d_inner() + 2 * groups * d_state; }
};
host_tensor mamba2_forward(const mamba2_weights& w, const host_tensor& x, const hybrid_metadata& meta,
                           mamba_layer_state& state, collective* comm);

}  // namespace hyserve::worker::layers
