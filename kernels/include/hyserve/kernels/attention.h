#pragma once
// Paged KV cache and attention.
// KV cache per layer: [num_pages, page_size, kv_heads, head_dim]; a flat location
// loc = page * page_size + offset addresses one token. page_table[b, i] is the page holding
// tokens [i·page_size, (i+1)·page_size) of row b.
//
// Element types: the K/V cache is kv_dtype, f32 or bf16 (anything else is rejected naming the
// field); k, v, q and out are f32. Writing a bf16 cache rounds to nearest even; attention
// widens cached elements to f32 and accumulates (scores, softmax, P·V) in f32.
#include <cstdint>

#include "hyserve/common/dtype.h"
#include "hyserve/kernels/rope.h"

namespace hyserve::kernels {

// Writes new K/V rows into the cache at flat locations. With rope.rotary_dim > 0 the rotary
// embedding is applied first, in place, to rope.q and to k (rope.k must be k, rope.n_tokens
// n_tokens), exactly as run(rope) would, and the cache takes the rotated k: on CUDA one kernel
// for both, the bits of the two ops one after the other.
struct kv_write_params {
  const float* __restrict__ k = nullptr;  // [n_tokens, kv_heads, head_dim], row stride k_stride
  const float* __restrict__ v = nullptr;  // [n_tokens, kv_heads, head_dim], row stride v_stride
  const int32_t* __restrict__ locs = nullptr;  // [n_tokens]; -1 = skip (padding)
  void* k_cache = nullptr;  // kv_dtype [num_pages · page_size, kv_heads, head_dim]
  void* v_cache = nullptr;
  int64_t n_tokens = 0;
  int64_t kv_heads = 0, head_dim = 0;
  int64_t k_stride = 0, v_stride = 0;
  dtype kv_dtype = dtype::kF32;  // f32 or bf16
  rope_params rope;              // rotary_dim 0 (the default): none
};

void run_cpu(const kv_write_params& p);
void run_cuda(const kv_write_params& p, void* stream = nullptr);

// Causal attention for packed query rows against the paged cache (which already holds the new
// tokens). Row b has q_len = qsl[b+1]-qsl[b] queries at positions seq_lens[b]-q_len .. seq_lens[b]-1;
// query at position t attends keys 0..t. Decode is the case q_len = 1. GQA: query head h reads
// kv head h / (q_heads / kv_heads).
struct paged_attention_params {
  const float* __restrict__ q = nullptr;  // [n_tokens, q_heads, head_dim], row stride q_stride
  const void* __restrict__ k_cache = nullptr;  // kv_dtype
  const void* __restrict__ v_cache = nullptr;
  float* __restrict__ out = nullptr;      // [n_tokens, q_heads, head_dim], row stride out_stride
  const int32_t* __restrict__ query_start_loc = nullptr;  // [batch + 1]
  const int32_t* __restrict__ seq_lens = nullptr;         // [batch] total length incl. new tokens
  const int32_t* __restrict__ page_table = nullptr;       // [batch, page_table_stride]
  int64_t batch = 0;
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;
  int64_t page_size = 0;
  int64_t page_table_stride = 0;
  int64_t q_stride = 0, out_stride = 0;
  float scale = 1.0f;
  dtype kv_dtype = dtype::kF32;  // element type of k_cache / v_cache: f32 or bf16
  // Optional host-side promise: every row has at most max_q_len queries (0 = no promise). With
  // 1..16 (a decode step; a chain verify step of up to 15 drafts) the CUDA op serves every query
  // on its split-KV decode kernel, query j of a row of q_len as a decode query over the first
  // seq_len − q_len + 1 + j keys, and launches no extend kernel (whose one block per kv head
  // would walk a short row's whole context). Ignored by the CPU op and the tree op.
  int64_t max_q_len = 0;
  // Optional (read by the CUDA op under determinism: batch_invariant): the most queries of any
  // row that has at most kMaxDecodeQueries of them (0 = not given). Every such row is then served
  // by the decode kernel as with the promise above, whatever the other rows hold, so a verify
  // row or a short prefill chunk takes the same kernel in a step of its own and beside longer
  // rows. Ignored by the CPU op.
  int64_t short_q_max = 0;
  // A bfloat16 model's attention: the CUDA op's tensor-core extend kernel (rows of more than one
  // query over a bf16 cache) may round q and the softmax weights to bf16 for its products (one
  // MMA each, as flash attention does), the model's own accuracy class, instead of carrying them
  // as two bf16 terms (f32-level products). Row sums, the running max and the output stay f32.
  // The decode kernels and the CPU op compute as before either way.
  bool bf16_products = false;
};

// The most queries per row the CUDA decode kernel serves (max_q_len, short_q_max).
inline constexpr int64_t kMaxDecodeQueries = 16;

void run_cpu(const paged_attention_params& p);
void run_cuda(const paged_attention_params& p, void* stream = nullptr);

// Tree-masked attention of a TargetVerify batch with tree drafts. Every row has exactly
// tree_nodes queries, the draft nodes 0..D-1 (D = tree_nodes), whose keys are cached at
// positions prefix .. prefix + D-1 in node order (prefix = seq_lens[b] - D). Node k attends to
// the prefix, its ancestors and itself (retrieve_parent[b, k]; -1 = the root's parent). With
// chain parents (k-1) this is causal attention over the row. The cache is kv_dtype (f32 or bf16),
// widened to f32 as in paged attention.
struct paged_attention_tree_params : paged_attention_params {
  const int32_t* __restrict__ retrieve_parent = nullptr;  // [batch, tree_nodes]
  int64_t tree_nodes = 0;
};

void run_cpu(const paged_attention_tree_params& p);
void run_cuda(const paged_attention_tree_params& p, void* stream = nullptr);

}  // namespace hyserve::kernels
