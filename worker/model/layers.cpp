#include "layers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "hyserve/common/error.h"
#include "hyserve/kernels/activation.h"
#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/causal_conv1d.h"
#include "hyserve/kernels/embedding.h"
#include "hyserve/kernels/gemm.h"
#include "hyserve/kernels/graph.h"
#include "hyserve/kernels/norm.h"
#include "hyserve/kernels/rope.h"
#include "hyserve/kernels/row_ops.h"
#include "hyserve/kernels/run.h"
#include "hyserve/kernels/ssm.h"
#include "recurrent_mixer.h"
#include "step_pack.h"

namespace hyserve::worker::layers {

void profile(const exec_context& ctx, const char* label, double bytes) {
  if (ctx.device == device_kind::kCuda && kernels::profile_active()) kernels::profile_mark(label, bytes, ctx.stream);
}

void place(tensor& t, device_kind device) {
  if (t.device() != device) t = tensor::copy_of(t, device);
}

void place_weight(tensor& t, device_kind device, dtype type) {
  if (!t.empty() && t.type() != type) {
    HYSERVE_CHECK(t.type() == dtype::kF32 && t.device() == device_kind::kCpu && type == dtype::kBF16,
                  "place_weight: converts f32 host weights to bf16 only (got " + std::string(dtype_name(t.type())) +
                      " to " + std::string(dtype_name(type)) + ")");
    tensor converted(type, t.shape());
    const float* src = t.as<float>();
    auto* dst = converted.as<uint16_t>();
    const int64_t n = t.numel();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
    t = std::move(converted);
  }
  place(t, device);
}

namespace {

// y (= or +=) norm(x) · wᵀ through the rmsnorm_linear op (norm null: plain; the gemm op on the
// CPU and for shapes the decode kernel does not take).
kernels::rmsnorm_linear_params linear_params(const tensor& x, const tensor& w, const tensor* norm, float eps, float* y,
                                             float beta) {
  kernels::rmsnorm_linear_params p;
  p.x = x.as<float>();
  p.norm_weight = norm ? norm->as<float>() : nullptr;
  p.eps = eps;
  p.w = w.data();
  p.w_dtype = w.type();
  p.out = y;
  p.m = x.shape()[0];
  p.n = w.shape()[0];
  p.k = x.shape()[1];
  p.x_stride = p.w_stride = p.k;
  p.out_stride = p.n;
  p.beta = beta;
  return p;
}

}  // namespace

tensor linear(const tensor& x, const tensor& w, const exec_context& ctx) {
  return norm_linear(x, nullptr, 0.0f, w, ctx);
}

tensor norm_linear(const tensor& x, const tensor* norm, float eps, const tensor& w, const exec_context& ctx,
                   bool relu2, tensor* normed) {
  const int64_t rows = x.shape()[0], in = x.shape()[1], out = w.shape()[0];
  HYSERVE_CHECK(w.shape()[1] == in, "linear: input width " + std::to_string(in) + " vs weight " + w.shape().str());
  HYSERVE_CHECK(normed == nullptr || norm != nullptr, "norm_linear: normed rows asked for without a norm");
  tensor y = tensor::f32({rows, out}, ctx.device);
  if (normed != nullptr) *normed = tensor::f32({rows, in}, ctx.device);
  if (rows == 0 || out == 0) {
    if (normed != nullptr && rows > 0) *normed = rmsnorm(x, *norm, eps, ctx);
    return y;
  }
  kernels::rmsnorm_linear_params p = linear_params(x, w, norm, eps, y.as<float>(), 0.0f);
  p.relu2 = relu2;
  p.normed_out = normed != nullptr ? normed->as<float>() : nullptr;
  kernels::run(p, ctx);
  return y;
}

tensor block_output(const tensor& x, const tensor& w, collective* comm, const exec_context& ctx, tensor* residual) {
  if (residual && (!comm || comm->size() == 1)) {
    // residual += x · wᵀ in the GEMM's epilogue (beta = 1): no output tensor, no add kernel.
    const int64_t rows = x.shape()[0], in = x.shape()[1], out = w.shape()[0];
    HYSERVE_CHECK(w.shape()[1] == in && residual->shape()[0] == rows && residual->numel() == rows * out,
                  "block_output: " + x.shape().str() + " · " + w.shape().str() + " into " + residual->shape().str());
    if (rows == 0 || out == 0) return tensor();
    kernels::run(linear_params(x, w, nullptr, 0.0f, residual->as<float>(), 1.0f), ctx);
    return tensor();
  }
  tensor y = linear(x, w, ctx);
  reduce_partial(y, comm);
  if (!residual) return y;
  add_inplace(*residual, y, ctx);
  return tensor();
}

tensor gated_block_output(const kernels::gated_rmsnorm_params& norm, const tensor& y, const tensor& w,
                          collective* comm, const exec_context& ctx, tensor* residual) {
  HYSERVE_CHECK(norm.x == y.as<float>() && norm.out == norm.x && norm.rows == y.shape()[0] &&
                    norm.cols == y.shape()[1] && norm.x_stride == norm.cols && norm.out_stride == norm.cols &&
                    norm.sumsq_in == nullptr && norm.sumsq_out == nullptr,
                "gated_block_output: the norm must be one phase, in place on y");
  // One op where its fused kernel may take the rows (kernels.norm_linear_gate, a few rows), so
  // that a long prefill does not stage a normed copy of y beside it.
  const int64_t rows = y.shape()[0];
  if (residual && (!comm || comm->size() == 1) && ctx.paths.norm_linear_gate && rows <= kernels::kNormLinearFusedMaxRows) {
    const int64_t out = w.shape()[0];
    HYSERVE_CHECK(w.shape()[1] == norm.cols && residual->shape()[0] == rows && residual->numel() == rows * out,
                  "gated_block_output: " + y.shape().str() + " · " + w.shape().str() + " into " + residual->shape().str());
    if (rows == 0 || out == 0) return tensor();
    kernels::rmsnorm_linear_params p = linear_params(y, w, nullptr, norm.eps, residual->as<float>(), 1.0f);
    p.norm_weight = norm.weight;
    p.gate = norm.gate;
    p.gate_stride = norm.gate_stride;
    p.norm_group = norm.group_size;
    p.norm_before_gate = norm.norm_before_gate;
    kernels::run(p, ctx);
    return tensor();
  }
  if (norm.rows > 0) kernels::run(norm, ctx);
  return block_output(y, w, comm, ctx, residual);
}

void add_inplace(tensor& a, const tensor& b, const exec_context& ctx) {
  HYSERVE_CHECK(a.numel() == b.numel(), "add_inplace: shape mismatch");
  if (a.numel() == 0) return;
  kernels::row_add_params p;
  p.x = b.as<float>();
  p.out = a.as<float>();
  p.rows = a.shape()[0];
  p.cols = a.numel() / p.rows;
  p.x_stride = p.out_stride = p.cols;
  kernels::run(p, ctx);
}

tensor rmsnorm(const tensor& x, const tensor& weight, float eps, const exec_context& ctx) {
  tensor y(dtype::kF32, x.shape(), ctx.device);
  kernels::rmsnorm_params p;
  p.x = x.as<float>();
  p.weight = weight.as<float>();
  p.out = y.as<float>();
  p.rows = x.shape()[0];
  p.cols = x.shape()[1];
  p.x_stride = p.out_stride = p.cols;
  p.eps = eps;
  if (p.rows > 0) kernels::run(p, ctx);
  return y;
}

void reduce_partial(tensor& x, collective* comm) {
  if (comm && comm->size() > 1) comm->all_reduce_sum(x.as<float>(), x.numel());
}

tensor gather_rows(const tensor& x, const tensor& rows, const exec_context& ctx) {
  return gather_rows(x, rows.as<int32_t>(), rows.numel(), ctx);
}

tensor gather_rows(const tensor& x, const int32_t* rows, int64_t n, const exec_context& ctx) {
  const int64_t cols = x.shape()[1];
  tensor out = tensor::f32({n, cols}, ctx.device);
  if (n == 0 || cols == 0) return out;
  // The embedding lookup is a row gather: x plays the table of rows [0, T).
  kernels::embedding_params p;
  p.ids = rows;
  p.table = x.as<float>();
  p.out = out.as<float>();
  p.n_tokens = n;
  p.hidden = cols;
  p.vocab_start = 0;
  p.vocab_end = x.shape()[0];
  kernels::run(p, ctx);
  return out;
}

tensor upload_i32(const std::vector<int32_t>& v, const exec_context& ctx) {
  return tensor::from_host(v.data(), dtype::kI32, static_cast<int64_t>(v.size()), ctx.device);
}

tensor embed(const tensor& ids, const tensor& table, int64_t vocab_start, collective* comm, const exec_context& ctx) {
  return embed(ids.as<int32_t>(), ids.numel(), table, vocab_start, comm, ctx);
}

tensor embed(const int32_t* ids, int64_t n, const tensor& table, int64_t vocab_start, collective* comm,
             const exec_context& ctx) {
  const int64_t hidden = table.shape()[1];
  tensor out = tensor::f32({n, hidden}, ctx.device);
  kernels::embedding_params p;
  p.ids = ids;
  p.table = table.data();
  p.table_dtype = table.type();
  p.out = out.as<float>();
  p.n_tokens = n;
  p.hidden = hidden;
  p.vocab_start = vocab_start;
  p.vocab_end = vocab_start + table.shape()[0];
  if (p.n_tokens > 0) kernels::run(p, ctx);
  reduce_partial(out, comm);
  return out;
}

tensor lm_head(const tensor& x, const tensor& w_local, collective* comm, const exec_context& ctx) {
  return logits_to_host(linear(x, w_local, ctx), comm, ctx);  // [R, vocab_local] → host [R, vocab]
}

tensor logits_to_host(const tensor& local, collective* comm, const exec_context& ctx) {
  if (!comm || comm->size() == 1) return local.to_host();
  const int64_t rows = local.shape()[0], vl = local.shape()[1], tp = comm->size();
  tensor gathered_dev = tensor::f32({tp, rows, vl}, ctx.device);
  comm->all_gather(local.as<float>(), gathered_dev.as<float>(), local.numel());
  const tensor gathered = gathered_dev.to_host();
  tensor out = tensor::f32({rows, vl * tp});  // [R, vocab], rank r's columns at r·vl
  for (int64_t r = 0; r < tp; ++r)
    for (int64_t i = 0; i < rows; ++i)
      std::memcpy(out.as<float>() + i * vl * tp + r * vl, gathered.as<float>() + (r * rows + i) * vl,
                  static_cast<size_t>(vl) * sizeof(float));
  return out;
}

std::vector<int32_t> batch_token_ids(const forward_batch& batch) {
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(batch.num_tokens()));
  for (const auto& row : batch.rows) ids.insert(ids.end(), row.tokens.begin(), row.tokens.end());
  return ids;
}

void place(mlp_weights& w, device_kind device, dtype weight_type) {
  for (tensor* t : {&w.gate, &w.up, &w.down}) place_weight(*t, device, weight_type);
}

tensor swiglu_linear(const mlp_weights& w, const tensor& x, const exec_context& ctx, const tensor* norm, float eps) {
  const int64_t rows = x.shape()[0], in = x.shape()[1], inter = w.gate.shape()[0];
  HYSERVE_CHECK(w.gate.shape()[1] == in && w.up.shape() == w.gate.shape() && w.up.type() == w.gate.type(),
                "swiglu_linear: gate " + w.gate.shape().str() + ", up " + w.up.shape().str() + ", input width " +
                    std::to_string(in));
  tensor act = tensor::f32({rows, inter}, ctx.device);
  if (rows == 0 || inter == 0) return act;
  kernels::rmsnorm_linear_params p = linear_params(x, w.gate, norm, eps, act.as<float>(), 0.0f);
  p.up_w = w.up.data();
  kernels::run(p, ctx);
  return act;
}

tensor mlp_forward(const mlp_weights& w, const tensor& x, collective* comm, const exec_context& ctx, tensor* residual,
                   const tensor* norm, float eps) {
  if (w.gate.empty()) {  // relu² MLP: relu2(xn · upᵀ) in one op (the decode kernel's epilogue)
    tensor act = norm_linear(x, norm, eps, w.up, ctx, /*relu2=*/true);
    profile(ctx, "mlp.up", nbytes(w.up) + nbytes(x) + nbytes(act));
    tensor out = block_output(act, w.down, comm, ctx, residual);
    profile(ctx, "mlp.down", nbytes(w.down) + nbytes(act) + 2 * (residual ? nbytes(*residual) : 0.0));
    return out;
  }
  const tensor gate = swiglu_linear(w, x, ctx, norm, eps);  // silu(xn · gateᵀ) ⊙ (xn · upᵀ)
  profile(ctx, "mlp.gate_up", nbytes(w.gate) + nbytes(w.up) + nbytes(x) + nbytes(gate));
  tensor out = block_output(gate, w.down, comm, ctx, residual);
  profile(ctx, "mlp.down", nbytes(w.down) + nbytes(gate) + 2 * (residual ? nbytes(*residual) : 0.0));
  return out;
}

attention_step build_attention_step(const forward_batch& batch, const hybrid_metadata& meta,
                                    const req_to_token_pool& req_to_token, int32_t page_size) {
  attention_step s;
  s.page_size = page_size;
  s.seq_lens = meta.seq_lens;
  const size_t bs = static_cast<size_t>(meta.batch_size);
  int32_t max_len = 0;
  for (size_t b = 0; b < bs; ++b) max_len = std::max(max_len, meta.seq_lens[b]);
  s.page_table_stride = std::max<int64_t>(1, (max_len + page_size - 1) / page_size);
  s.page_table.assign(bs * static_cast<size_t>(s.page_table_stride), 0);
  s.locs.assign(static_cast<size_t>(meta.num_tokens), -1);
  for (size_t b = 0; b < bs; ++b) {
    const batch_row& row = batch.rows[b];
    if (row.req_slot < 0 || meta.mamba_slots[b] < 0) continue;  // padding row
    const int32_t* table = req_to_token.row(row.req_slot);
    const int32_t n_pages = (meta.seq_lens[b] + page_size - 1) / page_size;
    for (int32_t i = 0; i < n_pages; ++i) {
      const int32_t loc = table[i * page_size];
      if (loc < 0)
        throw invalid_argument_error("row " + std::to_string(b) + ": no KV location for position " +
                                     std::to_string(i * page_size));
      s.page_table[b * static_cast<size_t>(s.page_table_stride) + static_cast<size_t>(i)] = loc / page_size;
    }
    for (int32_t t = meta.query_start_loc[b]; t < meta.query_start_loc[b + 1]; ++t) {
      // Tree drafts: node k's KV goes to position prefix + k (siblings share a RoPE position);
      // the commit moves the accepted path's entries to their depths.
      const bool tree_row = meta.is_tree && static_cast<int32_t>(b) < meta.verify_rows;
      const int32_t pos = tree_row ? meta.prefix_lens[b] + (t - meta.query_start_loc[b])
                                   : meta.positions[static_cast<size_t>(t)];
      s.locs[static_cast<size_t>(t)] = table[pos];
    }
  }
  return s;
}

void bind_step(step_inputs& in, const step_layout& l, const hybrid_metadata& meta, int32_t* base, int32_t page_size) {
  in.mode = meta.mode;
  in.batch_size = l.batch;
  in.num_tokens = l.tokens;
  in.n_logit_rows = l.logit_rows;
  auto at = [&](int64_t offset, int64_t n) { return device_array{n > 0 ? base + offset : nullptr}; };
  in.query_start_loc = at(l.query_start_loc, l.batch + 1);
  in.mamba_slots = at(l.mamba_slots, l.batch);
  in.has_initial_state = at(l.has_initial_state, (l.batch + 3) / 4);
  in.positions = at(l.positions, l.tokens);
  in.token_ids = at(l.token_ids, l.tokens);
  in.logit_rows = at(l.logit_token_rows, l.logit_rows);
  if (l.attention) {
    in.locs = at(l.locs, l.tokens);
    in.page_table = at(l.page_table, l.batch * l.page_table_stride);
    in.seq_lens = at(l.seq_lens, l.batch);
    in.page_table_stride = l.page_table_stride;
    in.page_size = page_size;
    for (size_t b = 0; b + 1 < meta.query_start_loc.size(); ++b) {
      const int64_t q = meta.query_start_loc[b + 1] - meta.query_start_loc[b];
      if (q <= kernels::kMaxDecodeQueries) in.short_q_max = std::max(in.short_q_max, q);
    }
  }
  if (l.sampling) {
    in.sampling = true;
    in.sample_settings = at(l.sample_settings_at, l.logit_rows * 8);
    in.feed_slots = at(l.feed_slots_at, l.logit_rows);
  }
  switch (meta.mode) {
    case forward_mode::kTargetVerify:
      in.spec_tokens_per_row = meta.draft_len;
      in.spec_steps = meta.draft_len;
      in.spec_tree = meta.is_tree;
      if (meta.is_tree) in.retrieve_parent = at(l.retrieve_parent, l.parent_entries);
      in.spec_rows = meta.verify_rows;
      if (l.extend_slots) {
        in.extend_slots = at(l.extend_slots_at, l.batch);
        in.spec_extend = true;
      }
      break;
    case forward_mode::kDraft:
      in.spec_rows = meta.batch_size;
      in.spec_tokens_per_row = 1;
      in.spec_steps = meta.draft_len;
      in.first_step = at(l.first_step_at, l.batch);
      in.spec_first_step = true;
      break;
    case forward_mode::kMixed:
      if (l.extend_slots) {
        in.extend_slots = at(l.extend_slots_at, l.batch);
        in.mixed_decode_rows = meta.mixed_decode_rows;
      }
      break;
    case forward_mode::kExtend:
    case forward_mode::kDecode:
    case forward_mode::kIdle:
    case forward_mode::kDraftExtend:
      break;
  }
}

step_inputs upload_step(const hybrid_metadata& meta, const attention_step* step, const std::vector<int32_t>& ids,
                        const exec_context& ctx, const step_sampling* sampling) {
  const step_layout l = layout_of(meta, step, sampling != nullptr);
  std::vector<int32_t> host(static_cast<size_t>(l.total));
  pack_step(l, meta, step, ids, host.data(), sampling);
  step_inputs in;
  in.storage = tensor::from_host(host.data(), dtype::kI32, l.total, ctx.device);
  bind_step(in, l, meta, in.storage.as<int32_t>(), step ? step->page_size : 0);
  return in;
}

void run_attention(const kernels::paged_attention_params& a, const step_inputs& in, const exec_context& ctx) {
  if (in.mode == forward_mode::kTargetVerify && in.spec_tree) {
    // Extend rows riding in the step attend causally: every row runs causal attention first,
    // then the verify rows (the first spec_rows) are overwritten with tree-masked attention.
    if (in.spec_extend) kernels::run(a, ctx);
    kernels::paged_attention_tree_params t;
    static_cast<kernels::paged_attention_params&>(t) = a;
    t.batch = in.spec_rows;
    t.retrieve_parent = in.retrieve_parent.as<int32_t>();
    t.tree_nodes = in.spec_tokens_per_row;
    kernels::run(t, ctx);
    return;
  }
  kernels::run(a, ctx);
}

namespace {

// Tokens of KV the step's decode attention reads per layer (whole pages; the profile's bytes).
double attention_context(const step_inputs& in) {
  return static_cast<double>(in.sparse.stats.pages_read) * static_cast<double>(in.page_size);
}

}  // namespace

void place(attention_weights& w, device_kind device, dtype weight_type) {
  for (tensor* t : {&w.qkv, &w.o}) place_weight(*t, device, weight_type);
  w.bf16_products = weight_type == dtype::kBF16;
}

void rope_write_kv(f32_rows q, f32_rows k, f32_rows v, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                   int64_t rotary_dim, float theta, const step_inputs& in, kv_layer_cache& cache,
                   const exec_context& ctx) {
  kernels::kv_write_params kw;
  kw.k = k.data;
  kw.v = v.data;
  kw.locs = in.locs.as<int32_t>();
  kw.k_cache = cache.k.data();
  kw.v_cache = cache.v.data();
  kw.kv_dtype = cache.k.type();
  kw.n_tokens = k.rows;
  kw.kv_heads = kv_heads;
  kw.head_dim = head_dim;
  kw.k_stride = k.stride;
  kw.v_stride = v.stride;
  if (rotary_dim > 0) {
    kernels::rope_params& r = kw.rope;
    r.q = q.data;
    r.k = k.data;
    r.positions = in.positions.as<int32_t>();
    r.n_tokens = q.rows;
    r.n_q_heads = q_heads;
    r.n_kv_heads = kv_heads;
    r.head_dim = head_dim;
    r.rotary_dim = rotary_dim;
    r.q_stride = q.stride;
    r.k_stride = k.stride;
    r.theta = theta;
  }
  kernels::run(kw, ctx);
  update_page_summaries(cache, k, kv_heads, head_dim, in, ctx);
}

kernels::paged_attention_params paged_attention_of(f32_rows q, f32_rows out, int64_t q_heads, int64_t kv_heads,
                                                   int64_t head_dim, const kv_layer_cache& cache,
                                                   const step_inputs& in, collective* comm, const exec_context& ctx) {
  kernels::paged_attention_params a;
  a.q = q.data;
  a.k_cache = cache.k.data();
  a.v_cache = cache.v.data();
  a.kv_dtype = cache.k.type();
  a.out = out.data;
  a.query_start_loc = in.query_start_loc.as<int32_t>();
  const attention_pages pages = select_attention_pages(q, q_heads, kv_heads, head_dim, cache, in, comm, ctx);
  a.seq_lens = pages.seq_lens;
  a.page_table = pages.page_table;
  a.batch = in.batch_size;
  a.q_heads = q_heads;
  a.kv_heads = kv_heads;
  a.head_dim = head_dim;
  a.page_size = in.page_size;
  a.page_table_stride = pages.page_table_stride;
  a.q_stride = q.stride;
  a.out_stride = out.stride;
  a.short_q_max = in.short_q_max;
  // The promise of queries per row (the CUDA op then serves every row on its decode kernel and
  // launches no extend kernel): one in a decode step, D in a chain verify of D tokens a row.
  if ((in.mode == forward_mode::kDecode || in.mode == forward_mode::kDraft) && q.rows == in.batch_size) {
    a.max_q_len = 1;
  } else if (in.mode == forward_mode::kTargetVerify && !in.spec_tree && !in.spec_extend) {
    a.max_q_len = in.spec_tokens_per_row;
  }
  return a;
}

tensor attention_forward(const attention_weights& w, const tensor& x, const step_inputs& in, kv_layer_cache& cache,
                         collective* comm, const exec_context& ctx, tensor* residual, const tensor* norm, float eps) {
  const tensor qkv = norm_linear(x, norm, eps, w.qkv, ctx);  // [T, (qh + 2·kvh)·hd]: q | k | v
  profile(ctx, "attn.qkv_proj", nbytes(w.qkv) + nbytes(x) + nbytes(qkv) + (norm ? nbytes(*norm) : 0.0));
  return attention_mix(w, rows_of(qkv), in, cache, comm, ctx, residual);
}

tensor attention_mix(const attention_weights& w, f32_rows qkv, const step_inputs& in, kv_layer_cache& cache,
                     collective* comm, const exec_context& ctx, tensor* residual) {
  tensor attn = tensor::f32({qkv.rows, w.q_heads * w.head_dim}, ctx.device);
  attention_heads(w, qkv, in, cache, comm, ctx, rows_of(attn));
  tensor out = block_output(attn, w.o, comm, ctx, residual);
  profile(ctx, "attn.o_proj", nbytes(w.o) + nbytes(attn) + 2 * (residual ? nbytes(*residual) : 0.0));
  return out;
}

void attention_heads(const attention_weights& w, f32_rows qkv, const step_inputs& in, kv_layer_cache& cache,
                     collective* comm, const exec_context& ctx, f32_rows out) {
  const int64_t T = qkv.rows, ld = qkv.stride;
  const int64_t qw = w.q_heads * w.head_dim, kw = w.kv_heads * w.head_dim;
  HYSERVE_CHECK(ld >= qw + 2 * kw, "attention: q | k | v rows of stride " + std::to_string(ld) + " for " +
                                       std::to_string(qw + 2 * kw) + " columns");
  HYSERVE_CHECK(out.rows == T && out.stride >= qw, "attention: output rows of stride " + std::to_string(out.stride) +
                                                       " for " + std::to_string(qw) + " columns");
  if (T == 0) return;
  const f32_rows q{qkv.data, T, ld}, k{q.data + qw, T, ld}, v{k.data + kw, T, ld};
  rope_write_kv(q, k, v, w.q_heads, w.kv_heads, w.head_dim, w.rotary_dim, w.rope_theta, in, cache, ctx);
  profile(ctx, w.rotary_dim > 0 ? "attn.rope+kv_write" : "attn.kv_write",
          sizeof(float) * static_cast<double>(T * (4 * kw + (w.rotary_dim > 0 ? 2 * (qw + kw) : 0))));
  kernels::paged_attention_params a = paged_attention_of(q, out, w.q_heads, w.kv_heads, w.head_dim, cache, in, comm, ctx);
  a.bf16_products = w.bf16_products;
  a.scale = w.scale > 0.0f ? w.scale : 1.0f / std::sqrt(static_cast<float>(w.head_dim));
  run_attention(a, in, ctx);
  profile_attention(ctx, in, T, qw, kw, cache);
}

void profile_attention(const exec_context& ctx, const step_inputs& in, int64_t T, int64_t qw, int64_t kw,
                       const kv_layer_cache& cache) {
  // The KV of every row's context once (the host's lengths: the profile runs eagerly).
  const bool extend = in.mode == forward_mode::kExtend || in.mode == forward_mode::kMixed;
  profile(ctx, extend ? "attn.extend" : "attn.decode",
          2.0 * sizeof(float) * static_cast<double>(T * qw) +
              2.0 * static_cast<double>(kw) * static_cast<double>(dtype_size(cache.k.type())) * attention_context(in));
}

namespace {

// The SSM state slots in the state cache's element type. The Mamba2 kernels take bf16 state
// through ssm_common_params::state_dtype (with void* state pointers); a kernels header without
// that field takes f32 state only, and make_state_pools refuses cache.ssm_state_dtype: bfloat16
// in that build.
template <class P>
void set_ssm_state(P& p, tensor& ssm) {
  if constexpr (requires { p.state_dtype; }) {
    p.ssm_states = ssm.data();
    p.state_dtype = ssm.type();
  } else {
    HYSERVE_CHECK(ssm.type() == dtype::kF32, "Mamba2 mixer: this build's SSM kernels take f32 state only");
    p.ssm_states = ssm.as<float>();
  }
}

void fill_ssm_common(kernels::ssm_common_params& p, const mamba2_weights& w, const tensor& proj, const tensor& xbc,
                     float* y, mamba_layer_state& state, const step_inputs& in) {
  const int64_t di = w.d_inner(), conv = w.conv_dim(), in_w = proj.shape()[1];
  p.x = xbc.as<float>();
  p.dt = proj.as<float>() + di + conv;
  p.dt_bias = w.dt_bias.as<float>();
  p.A_log = w.A_log.as<float>();
  p.B = xbc.as<float>() + di;
  p.C = xbc.as<float>() + di + w.groups * w.d_state;
  p.D = w.D.as<float>();
  p.y = y;
  set_ssm_state(p, state.ssm);
  p.state_indices = in.mamba_slots.as<int32_t>();
  p.batch = in.batch_size;
  p.heads = w.heads;
  p.head_dim = w.head_dim;
  p.d_state = w.d_state;
  p.n_groups = w.groups;
  p.x_stride = conv;
  p.dt_stride = in_w;
  p.bc_stride = conv;
  p.y_stride = di;
  p.dt_min = w.dt_min;
  p.dt_max = w.dt_max;
  p.dt_softplus = true;
}

}  // namespace

void place(mamba2_weights& w, device_kind device, dtype weight_type) {
  for (tensor* t : {&w.in_proj, &w.out_proj}) place_weight(*t, device, weight_type);
  for (tensor* t : {&w.conv_w, &w.conv_b, &w.dt_bias, &w.A_log, &w.D, &w.norm}) place(*t, device);
}

tensor mamba2_forward(const mamba2_weights& w, const tensor& x, const step_inputs& in, mamba_layer_state& state,
                      collective* comm, const exec_context& ctx, mamba_layer_state* steps, tensor* residual,
                      const tensor* norm, float eps) {
  const int64_t T = x.shape()[0], hidden = x.shape()[1];
  if (T == 0) return tensor::f32({0, hidden}, ctx.device);
  const tensor proj = norm_linear(x, norm, eps, w.in_proj, ctx);  // [T, di + conv + heads]: z | xBC | dt
  profile(ctx, "mamba.in_proj", nbytes(w.in_proj) + nbytes(x) + nbytes(proj));
  return mamba2_mix(w, proj, in, state, comm, ctx, steps, residual);
}

tensor mamba2_mix(const mamba2_weights& w, const tensor& proj, const step_inputs& in, mamba_layer_state& state,
                  collective* comm, const exec_context& ctx, mamba_layer_state* steps, tensor* residual) {
  const int64_t T = proj.shape()[0], hidden = w.out_proj.shape()[0];
  if (T == 0) return tensor::f32({0, hidden}, ctx.device);
  tensor y = tensor::f32({T, w.d_inner()}, ctx.device);
  kernels::gated_rmsnorm_params norm;
  if (!mamba2_mix_gated(w, proj, in, state, comm, ctx, steps, rows_of(y), &norm))
    return tensor::f32({0, hidden}, ctx.device);
  // The output norm, where it is the gated norm op, runs inside out_proj's op.
  tensor out = norm.rows > 0 ? gated_block_output(norm, y, w.out_proj, comm, ctx, residual)
                             : block_output(y, w.out_proj, comm, ctx, residual);
  profile(ctx, "mamba.out_proj", nbytes(w.out_proj) + nbytes(y) + 2 * (residual ? nbytes(*residual) : 0.0));
  return out;
}

bool mamba2_mix_gated(const mamba2_weights& w, const tensor& proj, const step_inputs& in, mamba_layer_state& state,
                      collective* comm, const exec_context& ctx, mamba_layer_state* steps, f32_rows y_out,
                      kernels::gated_rmsnorm_params* deferred_norm) {
  if (deferred_norm != nullptr) deferred_norm->rows = 0;
  const int64_t T = proj.shape()[0];
  const int64_t di = w.d_inner(), conv = w.conv_dim();
  const int64_t in_w = proj.shape()[1];  // the row stride of z | xBC | dt
  HYSERVE_CHECK(in_w >= w.in_width(), "Mamba2 mixer: in_proj output of " + std::to_string(in_w) + " columns for " +
                                          std::to_string(w.in_width()));
  HYSERVE_CHECK(y_out.rows == T && y_out.stride >= di, "Mamba2 mixer: output rows of stride " +
                                                          std::to_string(y_out.stride) + " for " + std::to_string(di) +
                                                          " columns");
  const mixer_path path = mixer_path_of(in, steps, "Mamba2 mixer");
  if (T == 0 || path == mixer_path::kIdle) return false;
  const bool split_groups = w.rms_norm && w.norm_group_global > w.norm_group_size && comm && comm->size() > 1;
  // y · silu(z) by the swiglu op (else the gated norm, which may run in place).
  const bool swiglu_gate = !w.rms_norm || (w.norm_before_gate && !split_groups);
  tensor xbc = tensor::f32({T, conv}, ctx.device);  // after conv + SiLU
  // The scan's output: y_out itself where the gate can run in place, else its own rows.
  tensor y_own;
  if (swiglu_gate || y_out.stride != di) y_own = tensor::f32({T, di}, ctx.device);
  float* y = y_own.empty() ? y_out.data : y_own.as<float>();
  const double y_bytes = sizeof(float) * static_cast<double>(T * di);

  const mixer_conv cv{proj.as<float>() + di, in_w, xbc.as<float>(), conv, w.conv_width, &w.conv_w, &w.conv_b};
  mixer_scan scan;
  scan.prefill = [&](const device_array& slots) {
    kernels::ssd_chunk_scan_params s;
    fill_ssm_common(s, w, proj, xbc, y, state, in);
    set_prefill_rows(s, slots, in, w.chunk_size);
    s.bf16_operands = w.bf16_scan;
    kernels::run(s, ctx);
  };
  scan.update = [&](int64_t rows) {
    kernels::selective_state_update_params s;
    fill_ssm_common(s, w, proj, xbc, y, state, in);
    s.batch = rows;
    kernels::run(s, ctx);
    profile(ctx, "mamba.ssm",
            2.0 * static_cast<double>(rows * w.heads * w.head_dim * w.d_state) *
                    static_cast<double>(dtype_size(state.ssm.type())) +
                nbytes(xbc) + y_bytes);
  };
  scan.steps = [&](const int32_t* retrieve_parent, const int32_t* first_step) {
    kernels::selective_state_update_multi_params s;
    fill_ssm_common(s, w, proj, xbc, y, state, in);
    HYSERVE_CHECK(steps->ssm.type() == state.ssm.type(), "Mamba2 mixer: per-step states must have the state's type");
    s.step_states = steps->ssm.data();
    set_step_rows(s, in, retrieve_parent, first_step);
    kernels::run(s, ctx);
    // The slot's state read once per row, every token's step state written.
    const double row_tokens = static_cast<double>(in.spec_rows * in.spec_tokens_per_row);
    profile(ctx, "mamba.ssm_steps",
            (static_cast<double>(in.spec_rows) + row_tokens) * static_cast<double>(w.heads * w.head_dim * w.d_state) *
                    static_cast<double>(dtype_size(state.ssm.type())) +
                nbytes(xbc) + y_bytes);
  };
  run_recurrent_mixer(path, cv, in, state, steps, scan, {"mamba.conv", "mamba.conv_steps", "mamba.conv_prefill", "mamba.scan_prefill"}, ctx);
  if (swiglu_gate) {
    // y · silu(z), after a plain RMSNorm of each group of y when norm_before_gate (the groups
    // whole on this rank; a group split over ranks takes the gated norm below).
    tensor normed;
    if (w.rms_norm) {
      normed = tensor::f32({T, di}, ctx.device);
      const int64_t gs = w.norm_group_size;
      for (int64_t g = 0; g < di / gs; ++g) {
        kernels::rmsnorm_params n;
        n.x = y + g * gs;
        n.weight = w.norm.as<float>() + g * gs;
        n.out = normed.as<float>() + g * gs;
        n.rows = T;
        n.cols = gs;
        n.x_stride = n.out_stride = di;
        n.eps = w.eps;
        kernels::run(n, ctx);
      }
    }
    kernels::swiglu_params s;
    s.gate = proj.as<float>();
    s.up = w.rms_norm ? normed.as<float>() : y;
    s.out = y_out.data;
    s.rows = T;
    s.cols = di;
    s.gate_stride = in_w;
    s.up_stride = di;
    s.out_stride = y_out.stride;
    kernels::run(s, ctx);
    profile(ctx, "mamba.gate", 3 * y_bytes + nbytes(w.norm));
  } else {
    // Gated RMSNorm over groups, norm(y · silu(z)) or norm(y) · silu(z) with norm_before_gate; a
    // group split across ranks reduces its sum of squares first.
    kernels::gated_rmsnorm_params g;
    g.x = y;
    g.gate = proj.as<float>();
    g.weight = w.norm.as<float>();
    g.out = y_out.data;
    g.rows = T;
    g.cols = di;
    g.x_stride = di;
    g.gate_stride = in_w;
    g.out_stride = y_out.stride;
    g.group_size = w.norm_group_size;
    g.eps = w.eps;
    g.norm_before_gate = w.norm_before_gate;
    tensor sumsq;
    if (split_groups) {
      // The rank's one group (di = its local channels) writes its Σ over rows at its index in
      // [groups, T], zeros elsewhere: the all-reduce over all ranks then adds, per group, the
      // partial sums of the ranks sharing it (every rank when there is one group).
      HYSERVE_CHECK(w.norm_group_size == di, "Mamba2 mixer: a split gated-norm group must be the rank's only one");
      const int64_t groups = w.norm_groups_total;
      sumsq = tensor::f32({groups, T}, ctx.device);
      if (groups > 1) {
        if (ctx.device == device_kind::kCpu) std::memset(sumsq.data(), 0, sumsq.nbytes());
        else kernels::fill_zero_async(sumsq.data(), sumsq.nbytes(), ctx.stream);
      }
      float* own = sumsq.as<float>() + w.norm_group_index * T;
      g.sumsq_out = own;
      kernels::run(g, ctx);
      comm->all_reduce_sum(sumsq.as<float>(), sumsq.numel());
      g.sumsq_out = nullptr;
      g.sumsq_in = own;
      g.group_count = w.norm_group_global;
    } else if (deferred_norm != nullptr && y == y_out.data && y_out.stride == di) {
      *deferred_norm = g;  // in place on y_out: run by the caller, inside out_proj
      return true;
    }
    kernels::run(g, ctx);
    profile(ctx, "mamba.gated_norm", 3 * y_bytes + nbytes(w.norm));
  }
  return true;
}

}  // namespace hyserve::worker::layers
