#include "gated_attention.h"

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/norm.h"
#include "hyserve/kernels/row_ops.h"
#include "hyserve/kernels/run.h"
#include "load_util.h"

namespace hyserve::worker::layers {

gated_attention_weights load_gated_attention(const weight_source& ws, const std::string& prefix, const model_config& mc,
                                             tp_placement tp) {
  const int64_t H = mc.hidden_size, nh = mc.num_attention_heads, kvh = mc.num_kv_heads, hd = mc.head_dim;
  const int64_t qh = tp_split(nh, tp.size, "num_attention_heads");
  const kv_head_range kv = tp_kv_heads(nh, kvh, tp.rank, tp.size);
  const int64_t h0 = tp.rank * qh;

  // q_proj rows of head h: [2h·hd, (2h+1)·hd) query, [(2h+1)·hd, (2h+2)·hd) gate.
  std::vector<std::pair<int64_t, int64_t>> q_rows, gate_rows;
  for (int64_t h = h0; h < h0 + qh; ++h) {
    q_rows.push_back({2 * h * hd, (2 * h + 1) * hd});
    gate_rows.push_back({(2 * h + 1) * hd, (2 * h + 2) * hd});
  }
  // Stacked q | k | v | gate (see gated_attention_weights), f32 until place().
  const tensor q = ws.load_row_ranges(prefix + "q_proj.weight", {2 * nh * hd, H}, q_rows);
  const tensor gate = ws.load_row_ranges(prefix + "q_proj.weight", {2 * nh * hd, H}, gate_rows);
  const tensor k = ws.load_slice(prefix + "k_proj.weight", {kvh * hd, H}, 0, kv.first * hd, (kv.first + kv.count) * hd);
  const tensor v = ws.load_slice(prefix + "v_proj.weight", {kvh * hd, H}, 0, kv.first * hd, (kv.first + kv.count) * hd);
  gated_attention_weights w;
  w.qkvg = tensor::f32({2 * qh * hd + 2 * kv.count * hd, H});
  size_t off = 0;
  for (const tensor* part : {&q, &k, &v, &gate}) {
    std::memcpy(static_cast<char*>(w.qkvg.data()) + off, part->data(), part->nbytes());
    off += part->nbytes();
  }
  w.o = ws.load_slice(prefix + "o_proj.weight", {H, nh * hd}, 1, h0 * hd, (h0 + qh) * hd);
  const tensor q_norm = load_zero_centered_norm(ws, prefix + "q_norm.weight", hd);
  const tensor k_norm = load_zero_centered_norm(ws, prefix + "k_norm.weight", hd);
  w.qk_norm = tensor::f32({qh + kv.count, hd});
  for (int64_t h = 0; h < qh + kv.count; ++h)
    std::memcpy(w.qk_norm.as<float>() + h * hd, (h < qh ? q_norm : k_norm).data(), static_cast<size_t>(hd) * sizeof(float));
  w.q_heads = qh;
  w.kv_heads = kv.count;
  w.head_dim = hd;
  w.rotary_dim = mc.rotary_dim();
  w.rope_theta = mc.rope_theta;
  w.eps = mc.rms_norm_eps;
  return w;
}

void place(gated_attention_weights& w, device_kind device, dtype weight_type) {
  for (tensor* t : {&w.qkvg, &w.o}) place_weight(*t, device, weight_type);
  place(w.qk_norm, device);
  w.bf16_products = weight_type == dtype::kBF16;
}

tensor gated_attention_forward(const gated_attention_weights& w, const tensor& x, const step_inputs& in,
                               kv_layer_cache& cache, collective* comm, const exec_context& ctx, tensor* residual,
                               const tensor& norm, float eps) {
  const int64_t T = x.shape()[0];
  const int64_t qw = w.q_heads * w.head_dim, kw = w.kv_heads * w.head_dim;
  tensor proj = norm_linear(x, &norm, eps, w.qkvg, ctx);  // [T, 2·qw + 2·kw]: q | k | v | gate
  const int64_t ld = proj.shape()[1];
  profile(ctx, "attn.qkvg_proj", nbytes(w.qkvg) + nbytes(x) + nbytes(proj) + nbytes(norm));
  tensor attn = tensor::f32({T, qw}, ctx.device);
  if (T > 0) {
    // The queries' and keys' per-head RMSNorm in place, one op over q | k.
    kernels::rmsnorm_params n;
    n.x = proj.as<float>();
    n.weight = w.qk_norm.as<float>();
    n.out = proj.as<float>();
    n.rows = T;
    n.cols = w.head_dim;
    n.groups = w.q_heads + w.kv_heads;
    n.weight_stride = w.head_dim;
    n.x_stride = n.out_stride = ld;
    n.eps = w.eps;
    kernels::run(n, ctx);

    const f32_rows q{proj.as<float>(), T, ld}, k{q.data + qw, T, ld}, v{k.data + kw, T, ld};
    rope_write_kv(q, k, v, w.q_heads, w.kv_heads, w.head_dim, w.rotary_dim, w.rope_theta, in, cache, ctx);
    kernels::paged_attention_params a =
        paged_attention_of(q, rows_of(attn), w.q_heads, w.kv_heads, w.head_dim, cache, in, comm, ctx);
    a.scale = 1.0f / std::sqrt(static_cast<float>(w.head_dim));
    a.bf16_products = w.bf16_products;
    run_attention(a, in, ctx);
    profile_attention(ctx, in, T, qw, kw, cache);

    // Output gate: attn · sigmoid(gate).
    kernels::sigmoid_mul_params sg;
    sg.x = attn.as<float>();
    sg.gate = proj.as<float>() + qw + 2 * kw;
    sg.out = attn.as<float>();
    sg.rows = T;
    sg.cols = qw;
    sg.x_stride = sg.out_stride = qw;
    sg.gate_stride = ld;
    kernels::run(sg, ctx);
  }
  tensor out = block_output(attn, w.o, comm, ctx, residual);
  profile(ctx, "attn.gate+o_proj", nbytes(w.o) + 2 * nbytes(attn) + 2 * (residual ? nbytes(*residual) : 0.0));
  return out;
}

}  // namespace hyserve::worker::layers
