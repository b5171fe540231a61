#pragma once
// Host-side checks of the dense ops (embedding, activations, RoPE, KV write, paged attention,
// norms, GEMMs, row ops, arg-max), shared by the CPU and CUDA backends: each backend calls the op's check first,
// then adds only what is its own (the CPU op reads values in host memory; the CUDA op checks
// grid limits, alignment and compiled sizes).
#include <limits>
#include <string>

#include "dtype_dispatch.h"
#include "hyserve/kernels/activation.h"
#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/embedding.h"
#include "hyserve/kernels/gemm.h"
#include "hyserve/kernels/norm.h"
#include "hyserve/kernels/rope.h"
#include "hyserve/kernels/row_ops.h"
#include "hyserve/kernels/sampling.h"
#include "validate.h"

namespace hyserve::kernels::cpu_detail {

inline void check_embedding(const embedding_params& p, const char* op) {
  require_ptrs(op, {{p.ids, "ids"}, {p.table, "table"}, {p.out, "out"}});
  require_sizes(op, {{p.n_tokens, "n_tokens"}, {p.hidden, "hidden"}});
  require_non_negative(p.vocab_start, op, "vocab_start");
  if (p.vocab_end <= p.vocab_start) fail(op, "vocab_end", p.vocab_end, "must be > vocab_start");
  require_storage(p.table_dtype, op, "table_dtype");
}

inline void check_swiglu(const swiglu_params& p, const char* op) {
  require_ptrs(op, {{p.gate, "gate"}, {p.up, "up"}, {p.out, "out"}});
  require_sizes(op, {{p.rows, "rows"}, {p.cols, "cols"}});
  require_strides(p.cols, op, {{p.gate_stride, "gate_stride"}, {p.up_stride, "up_stride"},
                               {p.out_stride, "out_stride"}});
}

inline void check_relu2(const relu2_params& p, const char* op) {
  require_ptr(p.x, op, "x");
  require_sizes(op, {{p.rows, "rows"}, {p.cols, "cols"}});
  require_stride(p.stride, p.cols, op, "stride");
}

inline void check_rope(const rope_params& p, const char* op) {
  require_ptrs(op, {{p.q, "q"}, {p.positions, "positions"}});
  require_sizes(op, {{p.n_tokens, "n_tokens"}, {p.n_q_heads, "n_q_heads"}});
  require_non_negative(p.n_kv_heads, op, "n_kv_heads");
  if (p.n_kv_heads > 0) require_ptr(p.k, op, "k");
  require_sizes(op, {{p.head_dim, "head_dim"}, {p.rotary_dim, "rotary_dim"}});
  if (p.rotary_dim % 2 != 0) fail(op, "rotary_dim", p.rotary_dim, "must be even");
  if (p.rotary_dim > p.head_dim) {
    fail(op, "rotary_dim", p.rotary_dim, ("must be <= head_dim = " + std::to_string(p.head_dim)).c_str());
  }
  require_stride(p.q_stride, p.n_q_heads * p.head_dim, op, "q_stride");
  if (p.n_kv_heads > 0) require_stride(p.k_stride, p.n_kv_heads * p.head_dim, op, "k_stride");
  if (!(p.theta > 0.0f)) fail(op, "theta", p.theta, "must be > 0");
}

inline void check_kv_write(const kv_write_params& p, const char* op) {
  require_ptrs(op, {{p.k, "k"}, {p.v, "v"}, {p.locs, "locs"}, {p.k_cache, "k_cache"}, {p.v_cache, "v_cache"}});
  require_sizes(op, {{p.n_tokens, "n_tokens"}, {p.kv_heads, "kv_heads"}, {p.head_dim, "head_dim"}});
  const int64_t row = p.kv_heads * p.head_dim;
  require_strides(row, op, {{p.k_stride, "k_stride"}, {p.v_stride, "v_stride"}});
  require_storage(p.kv_dtype, op, "kv_dtype");
  if (p.rope.rotary_dim == 0) return;
  // The rotary embedding before the write: of these very k rows.
  check_rope(p.rope, op);
  if (p.rope.k != p.k) fail(op, "rope.k", "another pointer", "must be k (the rows the cache takes, rotated in place)");
  if (p.rope.n_tokens != p.n_tokens) fail(op, "rope.n_tokens", p.rope.n_tokens, "must be n_tokens");
  if (p.rope.n_kv_heads != p.kv_heads) fail(op, "rope.n_kv_heads", p.rope.n_kv_heads, "must be kv_heads");
  if (p.rope.head_dim != p.head_dim) fail(op, "rope.head_dim", p.rope.head_dim, "must be head_dim");
  if (p.rope.k_stride != p.k_stride) fail(op, "rope.k_stride", p.rope.k_stride, "must be k_stride");
}

// The values of query_start_loc, seq_lens and the page table are checked by the CPU op only
// (on the CUDA backend they live on the device).
inline void check_paged_attention(const paged_attention_params& p, const char* op) {
  require_ptrs(op, {{p.q, "q"}, {p.k_cache, "k_cache"}, {p.v_cache, "v_cache"}, {p.out, "out"},
                    {p.query_start_loc, "query_start_loc"}, {p.seq_lens, "seq_lens"}, {p.page_table, "page_table"}});
  require_sizes(op, {{p.batch, "batch"}, {p.q_heads, "q_heads"}, {p.kv_heads, "kv_heads"}, {p.head_dim, "head_dim"},
                     {p.page_size, "page_size"}});
  if (p.q_heads % p.kv_heads != 0) {
    fail(op, "kv_heads", p.kv_heads, ("must divide q_heads = " + std::to_string(p.q_heads)).c_str());
  }
  require_strides(p.q_heads * p.head_dim, op, {{p.q_stride, "q_stride"}, {p.out_stride, "out_stride"}});
  require_storage(p.kv_dtype, op, "kv_dtype");
}

inline void check_rmsnorm(const rmsnorm_params& p, const char* op) {
  require_ptrs(op, {{p.x, "x"}, {p.weight, "weight"}, {p.out, "out"}});
  require_sizes(op, {{p.rows, "rows"}, {p.cols, "cols"}, {p.groups, "groups"}});
  require_strides(p.groups * p.cols, op, {{p.x_stride, "x_stride"}, {p.out_stride, "out_stride"}});
  if (p.weight_stride != 0 && p.weight_stride < p.cols) fail(op, "weight_stride", p.weight_stride, "must be 0 or >= cols");
  if (!(p.eps >= 0.0f)) fail(op, "eps", p.eps, "must be >= 0");
}

inline void check_gated_rmsnorm(const gated_rmsnorm_params& p, const char* op) {
  require_ptrs(op, {{p.x, "x"}, {p.gate, "gate"}});
  require_sizes(op, {{p.rows, "rows"}, {p.cols, "cols"}, {p.group_size, "group_size"}});
  if (p.cols % p.group_size != 0) {
    fail(op, "group_size", p.group_size, ("must divide cols = " + std::to_string(p.cols)).c_str());
  }
  require_strides(p.cols, op, {{p.x_stride, "x_stride"}, {p.gate_stride, "gate_stride"}});
  if (p.sumsq_out != nullptr && p.sumsq_in != nullptr) {
    fail(op, "sumsq_in", "non-null", "phase 1 (sumsq_out) and phase 2 (sumsq_in) are exclusive");
  }
  if (p.sumsq_out == nullptr) {
    require_ptrs(op, {{p.weight, "weight"}, {p.out, "out"}});
    require_stride(p.out_stride, p.cols, op, "out_stride");
    if (!(p.eps >= 0.0f)) fail(op, "eps", p.eps, "must be >= 0");
  }
  require_non_negative(p.group_count, op, "group_count");
}

// Both backends hand the sizes to int-sized BLAS-style interfaces.
inline void check_gemm(const gemm_params& p, const char* op) {
  require_ptrs(op, {{p.a, "a"}, {p.b, "b"}, {p.c, "c"}});
  require_sizes(op, {{p.m, "m"}, {p.n, "n"}, {p.k, "k"}});
  // Row-major: the stored row of op(A) has k columns, of A^T (trans_a) m columns.
  require_stride(p.lda, p.trans_a ? p.m : p.k, op, "lda");
  require_stride(p.ldb, p.trans_b ? p.k : p.n, op, "ldb");
  require_stride(p.ldc, p.n, op, "ldc");
  require_storage(p.b_dtype, op, "b_dtype");
  constexpr int64_t kMaxBlas = 0x7fffffff;
  if (p.m > kMaxBlas) fail(op, "m", p.m, "exceeds the BLAS int range");
  if (p.n > kMaxBlas) fail(op, "n", p.n, "exceeds the BLAS int range");
  if (p.k > kMaxBlas) fail(op, "k", p.k, "exceeds the BLAS int range");
  if (p.lda > kMaxBlas) fail(op, "lda", p.lda, "exceeds the BLAS int range");
  if (p.ldb > kMaxBlas) fail(op, "ldb", p.ldb, "exceeds the BLAS int range");
  if (p.ldc > kMaxBlas) fail(op, "ldc", p.ldc, "exceeds the BLAS int range");
}

inline void check_swiglu_linear(const swiglu_linear_params& p, const char* op) {
  require_ptrs(op, {{p.x, "x"}, {p.gate_w, "gate_w"}, {p.up_w, "up_w"}, {p.out, "out"}});
  require_non_negative(p.m, op, "m");
  require_sizes(op, {{p.n, "n"}, {p.k, "k"}});
  require_strides(p.k, op, {{p.x_stride, "x_stride"}, {p.w_stride, "w_stride"}});
  require_stride(p.out_stride, p.n, op, "out_stride");
  require_storage(p.w_dtype, op, "w_dtype");
}

// Tree-masked paged attention (TargetVerify with tree drafts): the paged attention's fields
// and the tree's parents.
inline void check_paged_attention_tree(const paged_attention_tree_params& p, const char* op) {
  check_paged_attention(p, op);
  require_ptr(p.retrieve_parent, op, "retrieve_parent");
  require_positive(p.tree_nodes, op, "tree_nodes");
}

// The values of out_rows are checked by the CPU op only.
inline void check_row_add(const row_add_params& p, const char* op) {
  require_ptrs(op, {{p.x, "x"}, {p.out, "out"}});
  require_counts(op, {{p.rows, "rows"}, {p.cols, "cols"}});
  require_strides(p.cols, op, {{p.x_stride, "x_stride"}, {p.out_stride, "out_stride"}});
  if (p.gate_logits) require_positive(p.gate_stride, op, "gate_stride");
}

inline void check_moe_route(const moe_route_params& p, const char* op) {
  require_ptrs(op, {{p.logits, "logits"}, {p.weights, "weights"}});
  require_non_negative(p.tokens, op, "tokens");
  require_sizes(op, {{p.experts, "experts"}, {p.top_k, "top_k"}});
  if (p.top_k > p.experts) fail(op, "top_k", p.top_k, "exceeds experts");
  require_stride(p.logits_stride, p.experts, op, "logits_stride");
  require_stride(p.weights_stride, p.tokens, op, "weights_stride");
}

inline void check_sigmoid_mul(const sigmoid_mul_params& p, const char* op) {
  require_ptrs(op, {{p.x, "x"}, {p.gate, "gate"}, {p.out, "out"}});
  require_counts(op, {{p.rows, "rows"}, {p.cols, "cols"}});
  require_strides(p.cols, op, {{p.x_stride, "x_stride"}, {p.gate_stride, "gate_stride"}, {p.out_stride, "out_stride"}});
}

inline void check_argmax(const argmax_params& p, const char* op) {
  require_ptrs(op, {{p.logits, "logits"}, {p.out, "out"}});
  require_sizes(op, {{p.rows, "rows"}, {p.vocab, "vocab"}});
  require_stride(p.stride, p.vocab, op, "stride");
  if (p.vocab > std::numeric_limits<int32_t>::max()) fail(op, "vocab", p.vocab, "exceeds the int32 id range");
}

}  // namespace hyserve::kernels::cpu_detail
