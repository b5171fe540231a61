#include "layers.h"

#include <cmath>
#include <cstring>
#include <string>

#include "hyserve/common/error.h"
#include "hyserve/kernels/activation.h"
#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/causal_conv1d.h"
#include "hyserve/kernels/embedding.h"
#include "hyserve/kernels/gemm.h"
#include "hyserve/kernels/norm.h"
#include "hyserve/kernels/rope.h"
#include "hyserve/kernels/ssm.h"

namespace hyserve::worker::layers {

host_tensor linear(const host_tensor& x, const host_tensor& w) {
  const int64_t rows = x.shape()[0], in = x.shape()[1], out = w.shape()[0];
  HYSERVE_CHECK(w.shape()[1] == in, "linear: input width " + std::to_string(in) + " vs weight " + w.shape().str());
  host_tensor y = host_tensor::f32({rows, out});
  if (rows > 0) kernels::linear_cpu(x.as<float>(), w.as<float>(), y.as<float>(), rows, out, in);
  return y;
}

void add_inplace(host_tensor& a, const host_tensor& b) {
  HYSERVE_CHECK(a.numel() == b.numel(), "add_inplace: shape mismatch");
  float* pa = a.as<float>();
  const float* pb = b.as<float>();
  for (int64_t i = 0; i < a.numel(); ++i) pa[i] += pb[i];
}

host_tensor rmsnorm(const host_tensor& x, const host_tensor& weight, float eps) {
  host_tensor y(dtype::kF32, x.shape());
  kernels::rmsnorm_params p;
  p.x = x.as<float>();
  p.weight = weight.as<float>();
  p.out = y.as<float>();
  p.rows = x.shape()[0];
  p.cols = x.shape()[1];
  p.x_stride = p.out_stride = p.cols;
  p.eps = eps;
  if (p.rows > 0) kernels::run_cpu(p);
  return y;
}

void reduce_partial(host_tensor& x, collective* comm) {
  if (comm && comm->size() > 1) comm->all_reduce_sum(x.as<float>(), x.numel());
}

host_tensor embed(const std::vector<int32_t>& ids, const host_tensor& table, int64_t vocab_start, collective* comm) {
  const int64_t hidden = table.shape()[1];
  host_tensor out = host_tensor::f32({static_cast<int64_t>(ids.size()), hidden});
  kernels::embedding_params p;
  p.ids = ids.data();
  p.table = table.as<float>();
  p.out = out.as<float>();
  p.n_tokens = static_cast<int64_t>(ids.size());
  p.hidden = hidden;
  p.vocab_start = vocab_start;
  p.vocab_end = vocab_start + table.shape()[0];
  if (p.n_tokens > 0) kernels::run_cpu(p);
  reduce_partial(out, comm);
  return out;
}

host_tensor lm_head(const host_tensor& x, const host_tensor& w_local, collective* comm) {
  host_tensor local = linear(x, w_local);  // [R, vocab_local]
  if (!comm || comm->size() == 1) return local;
  const int64_t rows = local.shape()[0], vl = local.shape()[1], tp = comm->size();
  host_tensor gathered = host_tensor::f32({tp, rows, vl});
  comm->all_gather(local.as<float>(), gathered.as<float>(), local.numel());
  host_tensor out = host_tensor::f32({rows, vl * tp});  // [R, vocab], rank r's columns at r·vl
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

host_tensor mlp_forward(const mlp_weights& w, const host_tensor& x, collective* comm) {
  host_tensor gate = linear(x, w.gate);
  host_tensor up = linear(x, w.up);
  kernels::swiglu_params p;
  p.gate = gate.as<float>();
  p.up = up.as<float>();
  p.out = gate.as<float>();
  p.rows = gate.shape()[0];
  p.cols = gate.shape()[1];
  p.gate_stride = p.up_stride = p.out_stride = p.cols;
  if (p.rows > 0) kernels::run_cpu(p);
  host_tensor out = linear(gate, w.down);
  reduce_partial(out, comm);
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
      const int32_t pos = meta.positions[static_cast<size_t>(t)];
      s.locs[static_cast<size_t>(t)] = table[pos];
    }
  }
  return s;
}

host_tensor attention_forward(const attention_weights& w, const host_tensor& x, const hybrid_metadata& meta,
                              const attention_step& step, kv_layer_cache& cache, collective* comm) {
  const int64_t T = x.shape()[0];
  host_tensor q = linear(x, w.q);  // [T, qh·hd]
  host_tensor k = linear(x, w.k);  // [T, kvh·hd]
  host_tensor v = linear(x, w.v);
  if (T > 0) {
    kernels::rope_params r;
    r.q = q.as<float>();
    r.k = k.as<float>();
    r.positions = meta.positions.data();
    r.n_tokens = T;
    r.n_q_heads = w.q_heads;
    r.n_kv_heads = w.kv_heads;
    r.head_dim = w.head_dim;
    r.rotary_dim = w.rotary_dim;
    r.q_stride = w.q_heads * w.head_dim;
    r.k_stride = w.kv_heads * w.head_dim;
    r.theta = w.rope_theta;
    kernels::run_cpu(r);

    kernels::kv_write_params kw;
    kw.k = k.as<float>();
    kw.v = v.as<float>();
    kw.locs = step.locs.data();
    kw.k_cache = cache.k.as<float>();
    kw.v_cache = cache.v.as<float>();
    kw.n_tokens = T;
    kw.kv_heads = w.kv_heads;
    kw.head_dim = w.head_dim;
    kw.k_stride = kw.v_stride = w.kv_heads * w.head_dim;
    kernels::run_cpu(kw);
  }
  host_tensor attn = host_tensor::f32({T, w.q_heads * w.head_dim});
  if (T > 0) {
    kernels::paged_attention_params a;
    a.q = q.as<float>();
    a.k_cache = cache.k.as<float>();
    a.v_cache = cache.v.as<float>();
    a.out = attn.as<float>();
    a.query_start_loc = meta.query_start_loc.data();
    a.seq_lens = step.seq_lens.data();
    a.page_table = step.page_table.data();
    a.batch = meta.batch_size;
    a.q_heads = w.q_heads;
    a.kv_heads = w.kv_heads;
    a.head_dim = w.head_dim;
    a.page_size = step.page_size;
    a.page_table_stride = step.page_table_stride;
    a.q_stride = a.out_stride = w.q_heads * w.head_dim;
    a.scale = 1.0f / std::sqrt(static_cast<float>(w.head_dim));
    kernels::run_cpu(a);
  }
  host_tensor out = linear(attn, w.o);
  reduce_partial(out, comm);
  return out;
}

namespace {

void fill_ssm_common(kernels::ssm_common_params& p, const mamba2_weights& w, const host_tensor& proj,
                     const host_tensor& xbc, host_tensor& y, mamba_layer_state& state, const hybrid_metadata& meta) {
  const int64_t di = w.d_inner(), conv = w.conv_dim(), in_w = proj.shape()[1];
  p.x = xbc.as<float>();
  p.dt = proj.as<float>() + di + conv;
  p.dt_bias = w.dt_bias.as<float>();
  p.A_log = w.A_log.as<float>();
  p.B = xbc.as<float>() + di;
  p.C = xbc.as<float>() + di + w.groups * w.d_state;
  p.D = w.D.as<float>();
  p.y = y.as<float>();
  p.ssm_states = state.ssm.as<float>();
  p.state_indices = meta.mamba_slots.data();
  p.batch = meta.batch_size;
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

host_tensor mamba2_forward(const mamba2_weights& w, const host_tensor& x, const hybrid_metadata& meta,
                           mamba_layer_state& state, collective* comm) {
  const int64_t T = x.shape()[0], hidden = x.shape()[1];
  if (T == 0) return host_tensor::f32({0, hidden});
  const int64_t di = w.d_inner(), conv = w.conv_dim();
  host_tensor proj = linear(x, w.in_proj);  // [T, di + conv + heads]: z | xBC | dt
  const int64_t in_w = proj.shape()[1];
  host_tensor xbc = host_tensor::f32({T, conv});  // after conv + SiLU
  host_tensor y = host_tensor::f32({T, di});

  bool recurrent_step = false;  // one token per row updating state in place
  switch (meta.mode) {
    case forward_mode::kExtend:
    case forward_mode::kMixed:
    case forward_mode::kDraftExtend:
      break;
    case forward_mode::kDecode:
      recurrent_step = true;
      break;
    case forward_mode::kIdle:
      return host_tensor::f32({0, hidden});
    case forward_mode::kTargetVerify:
    case forward_mode::kDraft:
      throw invalid_argument_error(std::string("Mamba2 mixer: forward mode ") +
                                   std::string(forward_mode_name(meta.mode)) +
                                   " needs the per-step state path, which this build does not have");
  }

  if (recurrent_step) {
    kernels::conv1d_update_params c;
    c.x = proj.as<float>() + di;
    c.weight = w.conv_w.as<float>();
    c.bias = w.conv_b.empty() ? nullptr : w.conv_b.as<float>();
    c.out = xbc.as<float>();
    c.state_indices = meta.mamba_slots.data();
    c.conv_states = state.conv.as<float>();
    c.batch = meta.batch_size;
    c.dim = conv;
    c.width = w.conv_width;
    c.x_stride = in_w;
    c.out_stride = conv;
    c.silu = true;
    kernels::run_cpu(c);
    kernels::selective_state_update_params s;
    fill_ssm_common(s, w, proj, xbc, y, state, meta);
    kernels::run_cpu(s);
  } else {
    kernels::conv1d_varlen_params c;
    c.x = proj.as<float>() + di;
    c.weight = w.conv_w.as<float>();
    c.bias = w.conv_b.empty() ? nullptr : w.conv_b.as<float>();
    c.out = xbc.as<float>();
    c.query_start_loc = meta.query_start_loc.data();
    c.state_indices = meta.mamba_slots.data();
    c.has_initial_state = meta.has_initial_state.data();
    c.conv_states = state.conv.as<float>();
    c.batch = meta.batch_size;
    c.dim = conv;
    c.width = w.conv_width;
    c.x_stride = in_w;
    c.out_stride = conv;
    c.silu = true;
    kernels::run_cpu(c);
    kernels::ssd_chunk_scan_params s;
    fill_ssm_common(s, w, proj, xbc, y, state, meta);
    s.query_start_loc = meta.query_start_loc.data();
    s.has_initial_state = meta.has_initial_state.data();
    s.chunk_size = w.chunk_size;
    kernels::run_cpu(s);
  }

  // Gated RMSNorm over groups; a group split across ranks reduces its sum of squares first.
  kernels::gated_rmsnorm_params g;
  g.x = y.as<float>();
  g.gate = proj.as<float>();
  g.weight = w.norm.as<float>();
  g.out = y.as<float>();
  g.rows = T;
  g.cols = di;
  g.x_stride = di;
  g.gate_stride = in_w;
  g.out_stride = di;
  g.group_size = w.norm_group_size;
  g.eps = w.eps;
  host_tensor sumsq;
  if (w.norm_group_global > w.norm_group_size && comm && comm->size() > 1) {
    sumsq = host_tensor::f32({T, di / w.norm_group_size});
    g.sumsq_out = sumsq.as<float>();
    kernels::run_cpu(g);
    comm->all_reduce_sum(sumsq.as<float>(), sumsq.numel());
    g.sumsq_out = nullptr;
    g.sumsq_in = sumsq.as<float>();
    g.group_count = w.norm_group_global;
  }
  kernels::run_cpu(g);

  host_tensor out = linear(y, w.out_proj);
  reduce_partial(out, comm);
  return out;
}

}  // namespace hyserve::worker::layers
