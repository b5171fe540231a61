#include "gated_attention.h"

#include <cmath>
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
  gated_attention_weights w;
  w.q = ws.load_row_ranges(prefix + "q_proj.weight", {2 * nh * hd, H}, q_rows);
  w.gate = ws.load_row_ranges(prefix + "q_proj.weight", {2 * nh * hd, H}, gate_rows);
  w.k = ws.load_slice(prefix + "k_proj.weight", {kvh * hd, H}, 0, kv.first * hd, (kv.first + kv.count) * hd);
  w.v = ws.load_slice(prefix + "v_proj.weight", {kvh * hd, H}, 0, kv.first * hd, (kv.first + kv.count) * hd);
  w.o = ws.load_slice(prefix + "o_proj.weight", {H, nh * hd}, 1, h0 * hd, (h0 + qh) * hd);
  w.q_norm = load_zero_centered_norm(ws, prefix + "q_norm.weight", hd);
  w.k_norm = load_zero_centered_norm(ws, prefix + "k_norm.weight", hd);
  w.q_heads = qh;
  w.kv_heads = kv.count;
  w.head_dim = hd;
  w.rotary_dim = mc.rotary_dim();
  w.rope_theta = mc.rope_theta;
  w.eps = mc.rms_norm_eps;
  return w;
}

namespace {

// In place: RMSNorm over each head_dim slice of a contiguous [T, heads·head_dim] tensor.
void head_rmsnorm(tensor& t, int64_t heads, int64_t head_dim, const tensor& weight, float eps, const exec_context& ctx) {
  kernels::rmsnorm_params n;
  n.x = t.as<float>();
  n.weight = weight.as<float>();
  n.out = t.as<float>();
  n.rows = t.shape()[0] * heads;
  n.cols = head_dim;
  n.x_stride = n.out_stride = head_dim;
  n.eps = eps;
  kernels::run(n, ctx);
}

}  // namespace

void place(gated_attention_weights& w, device_kind device, dtype weight_type) {
  for (tensor* t : {&w.q, &w.gate, &w.k, &w.v, &w.o}) place_weight(*t, device, weight_type);
  for (tensor* t : {&w.q_norm, &w.k_norm}) place(*t, device);
}

tensor gated_attention_forward(const gated_attention_weights& w, const tensor& x, const step_inputs& in,
                               kv_layer_cache& cache, collective* comm, const exec_context& ctx, tensor* residual) {
  const int64_t T = x.shape()[0];
  const int64_t qw = w.q_heads * w.head_dim;
  tensor q = linear(x, w.q, ctx);  // [T, qh·hd]
  tensor k = linear(x, w.k, ctx);  // [T, kvh·hd]
  tensor v = linear(x, w.v, ctx);
  tensor attn = tensor::f32({T, qw}, ctx.device);
  if (T > 0) {
    head_rmsnorm(q, w.q_heads, w.head_dim, w.q_norm, w.eps, ctx);
    head_rmsnorm(k, w.kv_heads, w.head_dim, w.k_norm, w.eps, ctx);

    rope_write_kv(rows_of(q), rows_of(k), rows_of(v), w.q_heads, w.kv_heads, w.head_dim, w.rotary_dim, w.rope_theta,
                  in, cache, ctx);
    kernels::paged_attention_params a =
        paged_attention_of(rows_of(q), rows_of(attn), w.q_heads, w.kv_heads, w.head_dim, cache, in, comm, ctx);
    a.scale = 1.0f / std::sqrt(static_cast<float>(w.head_dim));
    run_attention(a, in, ctx);

    // Output gate: attn · sigmoid(gate).
    const tensor gate = linear(x, w.gate, ctx);
    kernels::sigmoid_mul_params sg;
    sg.x = attn.as<float>();
    sg.gate = gate.as<float>();
    sg.out = attn.as<float>();
    sg.rows = T;
    sg.cols = qw;
    sg.x_stride = sg.gate_stride = sg.out_stride = qw;
    kernels::run(sg, ctx);
  }
  return block_output(attn, w.o, comm, ctx, residual);
}

}  // namespace hyserve::worker::layers
