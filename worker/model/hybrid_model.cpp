#include "hybrid_model.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "hyserve/common/error.h"
#include "load_util.h"

namespace hyserve::worker {

namespace {

using range = std::pair<int64_t, int64_t>;

// One scale per row of the ranges' concatenation: scales[i] over ranges[i]; empty when all are 1.
std::vector<float> range_scales(const std::vector<range>& ranges, const std::vector<float>& scales) {
  if (std::all_of(scales.begin(), scales.end(), [](float s) { return s == 1.0f; })) return {};
  std::vector<float> out;
  for (size_t i = 0; i < ranges.size(); ++i) out.insert(out.end(), static_cast<size_t>(ranges[i].second - ranges[i].first), scales[i]);
  return out;
}

std::vector<float> scalar(float s) { return s == 1.0f ? std::vector<float>{} : std::vector<float>{s}; }

}  // namespace

namespace {

// B/C groups per rank: n_groups / tp when tp divides n_groups; else one (the group that this
// rank's heads read: replicated when n_groups == 1, shared by tp / n_groups ranks when
// n_groups divides tp).
int64_t mamba_groups_local(int64_t groups, int tp) { return groups % tp == 0 ? groups / tp : 1; }

}  // namespace

int64_t block_loader::groups_local() const { return mamba_groups_local(mc_.mamba_n_groups, tp_.size); }

// in_proj and out_proj in the weight type; conv, dt_bias, A_log, D and the norm in f32.
layers::mamba2_weights block_loader::mamba2(const std::string& p, const std::vector<float>& in_scale,
                                            float in_multiplier, float out_scale) {
  layers::mamba2_weights w;
  const int64_t H = mc_.hidden_size, nh = mc_.mamba_n_heads, hd = mc_.mamba_d_head, N = mc_.mamba_d_state;
  const int64_t G = mc_.mamba_n_groups, K = mc_.mamba_d_conv;
  const int r = tp_.rank, n = tp_.size;
  const int64_t di = nh * hd, conv = di + 2 * G * N, in_dim = di + conv + nh;
  const int64_t hl = tp_split(nh, n, "mamba_n_heads");
  const int64_t dil = hl * hd;
  if (G % n != 0 && n % G != 0)
    throw config_error("tensor parallelism: mamba_n_groups = " + std::to_string(G) +
                       " must divide or be divisible by tp = " + std::to_string(n));
  const int64_t gl = groups_local();
  // First local group: the rank's share when tp divides G; else the one group of its heads
  // (group g holds heads [g·nh/G, (g+1)·nh/G), this rank heads [r·hl, (r+1)·hl)).
  const int64_t g0 = (G % n == 0) ? r * gl : r / (n / G);
  // Channel ranges of this shard inside xBC = [x (di) | B (G·N) | C (G·N)].
  const std::vector<range> xbc = {{r * dil, (r + 1) * dil},
                                  {di + g0 * N, di + (g0 + gl) * N},
                                  {di + G * N + g0 * N, di + G * N + (g0 + gl) * N}};
  std::vector<range> in_rows = {{r * dil, (r + 1) * dil}};  // z
  for (const range& c : xbc) in_rows.push_back({di + c.first, di + c.second});
  in_rows.push_back({di + conv + r * hl, di + conv + (r + 1) * hl});  // dt
  std::vector<float> scales(5, in_multiplier);
  for (size_t i = 0; i < in_scale.size() && i < 5; ++i) scales[i] *= in_scale[i];
  const dtype f32 = dtype::kF32;
  w.bf16_scan = wt_ == dtype::kBF16;
  w.in_proj = ld_.load_selection(p + "in_proj.weight", {in_dim, H}, weight_selection{0, in_rows}, wt_,
                                 range_scales(in_rows, scales));
  w.conv_w = ld_.load_row_ranges(p + "conv1d.weight", {conv, 1, K}, xbc, f32);
  w.conv_w.reshape({w.conv_w.shape()[0], K});
  if (mc_.mamba_conv_bias) w.conv_b = ld_.load_row_ranges(p + "conv1d.bias", {conv}, xbc, f32);
  w.dt_bias = ld_.load_slice(p + "dt_bias", {nh}, 0, r * hl, (r + 1) * hl, f32);
  w.A_log = ld_.load_slice(p + "A_log", {nh}, 0, r * hl, (r + 1) * hl, f32);
  w.D = ld_.load_slice(p + "D", {nh}, 0, r * hl, (r + 1) * hl, f32);
  w.rms_norm = mc_.mamba_rms_norm;
  w.norm_before_gate = mc_.mamba_norm_before_gate;
  if (w.rms_norm) w.norm = ld_.load_slice(p + "norm.weight", {di}, 0, r * dil, (r + 1) * dil, f32);
  w.out_proj = ld_.load_selection(p + "out_proj.weight", {H, di}, weight_selection{1, {{r * dil, (r + 1) * dil}}}, wt_,
                                  scalar(out_scale));
  w.heads = hl;
  w.head_dim = hd;
  w.d_state = N;
  w.groups = gl;
  w.conv_width = K;
  w.chunk_size = mc_.mamba_chunk_size;
  // Gated norm groups follow the SSM groups: di / G channels each; a group wider than this rank's
  // channels is split over tp / G ranks, which all-reduce its sum of squares (mamba2_forward).
  w.norm_group_global = di / G;
  w.norm_group_size = std::min(w.norm_group_global, dil);
  if (w.norm_group_size < w.norm_group_global) {
    w.norm_groups_total = G;
    w.norm_group_index = g0;
  }
  w.dt_min = mc_.time_step_min;
  w.dt_max = mc_.time_step_max;
  w.eps = mc_.rms_norm_eps;
  return w;
}

layers::attention_weights block_loader::attention(const std::string& p, const attention_scales& s) {
  layers::attention_weights w;
  const int64_t H = mc_.hidden_size, nh = mc_.num_attention_heads, kvh = mc_.num_kv_heads, hd = mc_.head_dim;
  const int r = tp_.rank, n = tp_.size;
  const int64_t qh = tp_split(nh, n, "num_attention_heads");
  const kv_head_range kv = tp_kv_heads(nh, kvh, r, n);
  const int64_t kv_first = kv.first, kvl = kv.count;
  auto rows = [](int64_t b, int64_t e) { return weight_selection{0, {{b, e}}}; };
  std::vector<tensor> qkv;
  qkv.push_back(
      ld_.load_selection(p + "q_proj.weight", {nh * hd, H}, rows(r * qh * hd, (r + 1) * qh * hd), wt_, scalar(s.q)));
  for (const auto& [name, scale] : {std::pair{"k_proj.weight", s.k}, std::pair{"v_proj.weight", s.v}})
    qkv.push_back(ld_.load_selection(p + name, {kvh * hd, H}, rows(kv_first * hd, (kv_first + kvl) * hd), wt_,
                                     scalar(scale)));
  w.qkv = ld_.stack_rows(std::move(qkv));
  w.o = ld_.load_selection(p + "o_proj.weight", {H, nh * hd}, weight_selection{1, {{r * qh * hd, (r + 1) * qh * hd}}},
                           wt_, scalar(s.o));
  w.q_heads = qh;
  w.kv_heads = kvl;
  w.head_dim = hd;
  w.rotary_dim = mc_.use_rope ? mc_.rotary_dim() : 0;
  w.rope_theta = mc_.rope_theta;
  w.scale = mc_.attention_multiplier;
  w.bf16_products = wt_ == dtype::kBF16;
  return w;
}

layers::mlp_weights block_loader::mlp(const std::string& p, int64_t inter, bool relu2, float gate_scale,
                                      float down_scale) {
  layers::mlp_weights w;
  const int64_t H = mc_.hidden_size;
  const int64_t il = tp_split(inter, tp_.size, "intermediate_size");
  const int64_t b = tp_.rank * il, e = b + il;
  if (!relu2)
    w.gate = ld_.load_selection(p + "gate_proj.weight", {inter, H}, weight_selection{0, {{b, e}}}, wt_,
                                scalar(gate_scale));
  w.up = ld_.load_slice(p + "up_proj.weight", {inter, H}, 0, b, e, wt_);
  w.down = ld_.load_selection(p + "down_proj.weight", {H, inter}, weight_selection{1, {{b, e}}}, wt_,
                              scalar(down_scale));
  return w;
}

hybrid_model::hybrid_model(const family_args& a, const std::string& label)
    : mc_(a.mc),
      tp_(a.tp),
      comm_(a.comm),
      ctx_(a.ctx),
      weight_type_(a.weight_type),
      sparsity_(a.sparsity),
      label_(label + ", " + std::to_string(a.mc.num_layers) + " layers") {
  const model_config& mc = a.mc;
  const tp_placement tp = a.tp;
  if (tp.size > 1 && !comm_) throw config_error(label + ": tp > 1 needs a collective");
  // A page's sparse score sums over every KV head (layers::select_attention_pages): the ranks'
  // partial scores add up to it only when each KV head, with all its query heads, is on one rank.
  if (sparsity_.algorithm != sparsity_algorithm::kNone && tp.size > 1 && mc.num_kv_heads % tp.size != 0)
    throw config_error("sparsity.algorithm with parallel.tp = " + std::to_string(tp.size) +
                       ": num_key_value_heads = " + std::to_string(mc.num_kv_heads) +
                       " must be a multiple of tp (a replicated KV head's query heads are split over ranks, and "
                       "its pages would be scored with part of them)");
  vocab_local_ = tp_split(mc.vocab_size, tp.size, "vocab_size");
}

void hybrid_model::load_globals(weight_loader& ld, const std::string& embed_name, const std::string& head_name) {
  const int r = tp_.rank;
  const int64_t H = mc_.hidden_size, V = mc_.vocab_size;
  const weight_selection rows{0, {{r * vocab_local_, (r + 1) * vocab_local_}}};
  embed_ = ld.load_selection(embed_name, {V, H}, rows, weight_type_, scalar(mc_.embedding_multiplier));
  lm_head_ = ld.load_selection(mc_.tie_word_embeddings ? embed_name : head_name, {V, H}, rows, weight_type_,
                               scalar(mc_.logits_multiplier));
}

void hybrid_model::set_final_norm(tensor norm) {
  final_norm_ = std::move(norm);
  layers::place(final_norm_, ctx_.device);
}

void hybrid_model::start(const decode_graph_options& graphs, int32_t attention_layers, int32_t state_layers,
                         const std::string& blocker) {
  step_frame frame;
  frame.label = label_;
  frame.vocab_size = mc_.vocab_size;
  frame.vocab_local = vocab_local_;
  frame.attention_layers = attention_layers > 0;
  frame.comm = comm_;
  frame.ctx = ctx_;
  frame.sparsity = &sparsity_;
  std::string why = decode_graph_blocker(ctx_, graphs, tp_.size);
  if (why.empty()) why = blocker;
  driver_ = std::make_unique<step_driver>(frame, graphs, attention_layers, state_layers, why);
}

int64_t hybrid_model::groups_local() const { return mamba_groups_local(mc_.mamba_n_groups, tp_.size); }

mamba_state_shape hybrid_model::mamba_shape() const {
  mamba_state_shape s;
  s.heads = static_cast<int32_t>(mc_.mamba_n_heads / tp_.size);
  s.head_dim = static_cast<int32_t>(mc_.mamba_d_head);
  s.d_state = static_cast<int32_t>(mc_.mamba_d_state);
  s.conv_width = static_cast<int32_t>(mc_.mamba_d_conv);
  s.conv_dim = static_cast<int32_t>(s.heads * s.head_dim + 2 * groups_local() * mc_.mamba_d_state);
  return s;
}

int32_t hybrid_model::kv_heads_local() const {
  return static_cast<int32_t>(mc_.num_kv_heads >= tp_.size ? mc_.num_kv_heads / tp_.size : 1);
}

tensor hybrid_model::forward(const forward_batch& batch, const hybrid_metadata& meta, const model_context& ctx,
                             const forward_options& opts) {
  return driver_->forward(batch, meta, ctx, opts,
                          [&](const layers::step_inputs& in, const kernels::exec_context& ex, bool all_logits,
                              std::vector<tensor>* hidden) { return body(in, ctx, ex, all_logits, hidden); });
}

// Embedding → layers → final norm → this rank's logits, on ex (no host synchronisation).
tensor hybrid_model::body(const layers::step_inputs& in, const model_context& ctx, const kernels::exec_context& ex,
                          bool all_logits, std::vector<tensor>* hidden) {
  tensor h = layers::embed(in.token_ids.as<int32_t>(), in.num_tokens, embed_, tp_.rank * vocab_local_, comm_, ex);
  layers::profile(ex, "embed", 2 * layers::nbytes(h));
  auto capture = [&](const tensor& t) {
    if (hidden) hidden->push_back(tensor::copy_of(t, device_kind::kCpu));
  };
  capture(h);
  const size_t n = layer_count();
  for (size_t i = 0; i < n; ++i) {
    layer_forward(i, h, in, ctx, ex);
    capture(h);
  }
  // Final norm and lm_head only on the rows that need logits.
  const tensor rows =
      all_logits ? std::move(h) : layers::gather_rows(h, in.logit_rows.as<int32_t>(), in.n_logit_rows, ex);
  layers::profile(ex, "final.gather", 2 * layers::nbytes(rows));
  tensor logits;
  if (hidden && all_logits) {
    tensor normed = layers::rmsnorm(rows, final_norm_, mc_.rms_norm_eps, ex);
    capture(normed);
    logits = layers::linear(normed, lm_head_, ex);
  } else {
    logits = layers::norm_linear(rows, &final_norm_, mc_.rms_norm_eps, lm_head_, ex);  // final norm fused
  }
  layers::profile(ex, "lm_head", layers::nbytes(lm_head_) + 2 * layers::nbytes(rows) + layers::nbytes(logits));
  return logits;
}

void hybrid_model::mamba2_block(layers::mamba2_weights& w, tensor& h, const tensor* norm_w, int32_t cache_index,
                                const layers::step_inputs& in, const model_context& ctx,
                                const kernels::exec_context& ex) {
  layers::mamba2_forward(w, h, in, ctx.mamba->layer(cache_index), comm_, ex,
                         ctx.mamba_steps ? &ctx.mamba_steps->layer(cache_index) : nullptr, &h, norm_w,
                         mc_.rms_norm_eps);
}

void hybrid_model::parallel_mix_on(layers::mamba2_weights& mw, layers::attention_weights& aw, const tensor& out_proj,
                                   const tensor& proj, tensor& h, int32_t cache_index, const layers::step_inputs& in,
                                   const model_context& ctx, const kernels::exec_context& ex) {
  const int64_t T = proj.shape()[0], di = mw.d_inner(), width = di + aw.q_heads * aw.head_dim;
  tensor mixed = tensor::f32({T, width}, ex.device);  // mamba y | attention heads
  const layers::f32_rows rows{mixed.as<float>(), T, width};
  if (!layers::mamba2_mix_gated(mw, proj, in, ctx.mamba->layer(cache_index), comm_, ex,
                                ctx.mamba_steps ? &ctx.mamba_steps->layer(cache_index) : nullptr, rows))
    return;  // no rows, or the idle mode: nothing to add
  layers::attention_heads(aw, layers::f32_rows{proj.as<float>() + mw.in_width(), T, proj.shape()[1]}, in,
                          ctx.kv->layer(cache_index), comm_, ex, layers::f32_rows{rows.data + di, T, width});
  layers::block_output(mixed, out_proj, comm_, ex, &h);
  layers::profile(ex, "out_proj+o_proj", layers::nbytes(out_proj) + layers::nbytes(mixed) + 2 * layers::nbytes(h));
}

void hybrid_model::attention_on(layers::attention_weights& w, tensor& h, const tensor& input_norm, int32_t cache_index,
                                const layers::step_inputs& in, const model_context& ctx,
                                const kernels::exec_context& ex) {
  layers::attention_forward(w, h, in, ctx.kv->layer(cache_index), comm_, ex, &h, &input_norm, mc_.rms_norm_eps);
}

hybrid_model::mixer hybrid_model::load_mixer(block_loader& blocks, int64_t layer, const mixer_source& src,
                                             const std::string& otherwise) {
  mixer m;
  m.kind = mc_.layer_kinds[static_cast<size_t>(layer)];
  switch (m.kind) {
    case layer_kind::kMamba2:
      m.mamba = blocks.mamba2(src.mamba_prefix, src.mamba_in_scale, src.mamba_in_multiplier, src.mamba_out_scale);
      m.cache_index = n_state_++;
      return m;
    case layer_kind::kAttention:
      m.attn = blocks.attention(src.attention_prefix, src.attention);
      m.cache_index = n_attention_++;
      return m;
    case layer_kind::kGatedDeltaNet:
    case layer_kind::kMlp:
    case layer_kind::kParallelHybrid:
      break;
  }
  throw config_error(label_ + ": layer " + std::to_string(layer) + " " + otherwise);
}

void hybrid_model::mixer_forward(mixer& m, tensor& h, const tensor& input_norm, const layers::step_inputs& in,
                                 const model_context& ctx, const kernels::exec_context& ex) {
  switch (m.kind) {
    case layer_kind::kMamba2:
      mamba2_block(m.mamba, h, &input_norm, m.cache_index, in, ctx, ex);
      return;
    case layer_kind::kAttention:
      attention_on(m.attn, h, input_norm, m.cache_index, in, ctx, ex);
      return;
    case layer_kind::kGatedDeltaNet:
    case layer_kind::kMlp:
    case layer_kind::kParallelHybrid:
      break;
  }
  throw error(label_ + ": not a Mamba2 or attention mixer");  // load_mixer refuses these
}

void hybrid_model::mlp_block(layers::mlp_weights& w, tensor& h, const tensor& norm_w, const kernels::exec_context& ex) {
  layers::mlp_forward(w, h, comm_, ex, &h, &norm_w, mc_.rms_norm_eps);
}

tensor hybrid_model::norm(const tensor& h, const tensor& weight, const kernels::exec_context& ex) const {
  tensor x = layers::rmsnorm(h, weight, mc_.rms_norm_eps, ex);
  layers::profile(ex, "norm.input", 2 * layers::nbytes(h) + layers::nbytes(weight));
  return x;
}

}  // namespace hyserve::worker
