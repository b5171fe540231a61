#include "gdn_layer.h"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "hyserve/common/error.h"
#include "hyserve/kernels/activation.h"
#include "hyserve/kernels/gdn.h"
#include "hyserve/kernels/norm.h"
#include "hyserve/kernels/run.h"
#include "layers.h"
#include "load_util.h"
#include "recurrent_mixer.h"

namespace hyserve::worker::layers {

namespace {
using range = std::pair<int64_t, int64_t>;
}  // namespace

gdn_weights load_gdn(const weight_source& ws, const std::string& prefix, const model_config& mc, tp_placement tp) {
  const int64_t H = mc.hidden_size, HK = mc.linear_num_key_heads, HV = mc.linear_num_value_heads;
  const int64_t dk = mc.linear_key_head_dim, dv = mc.linear_value_head_dim, K = mc.linear_conv_kernel_dim;
  const int64_t ratio = HV / HK;                  // value heads per key head
  const int64_t group = 2 * dk + 2 * ratio * dv;  // rows of one key-head group in in_proj_qkvz
  const int64_t key_dim = HK * dk, value_dim = HV * dv, conv = 2 * key_dim + value_dim;
  const int64_t hk_local = tp_split(HK, tp.size, "linear_num_key_heads");
  const int64_t g0 = tp.rank * hk_local;  // first local key-head group
  const int64_t hv0 = g0 * ratio, hv_local = hk_local * ratio;

  gdn_weights w;
  w.heads_k = hk_local;
  w.heads_v = hv_local;
  w.head_k_dim = dk;
  w.head_v_dim = dv;
  w.conv_width = K;
  w.eps = mc.rms_norm_eps;

  // in_proj_qkvz rows per group g: [q (dk) | k (dk) | v (ratio·dv) | z (ratio·dv)];
  // in_proj_ba rows per group g: [b (ratio) | a (ratio)]. Gather the local groups block by block.
  std::vector<range> qkvz;
  for (const auto& [off, n] : {std::pair{int64_t{0}, dk}, std::pair{dk, dk}, std::pair{2 * dk, ratio * dv},
                               std::pair{2 * dk + ratio * dv, ratio * dv}})
    for (int64_t g = g0; g < g0 + hk_local; ++g) qkvz.push_back({g * group + off, g * group + off + n});
  std::vector<range> ba;
  for (const int64_t off : {int64_t{0}, ratio})
    for (int64_t g = g0; g < g0 + hk_local; ++g) ba.push_back({g * 2 * ratio + off, g * 2 * ratio + off + ratio});
  const tensor p_qkvz = ws.load_row_ranges(prefix + "in_proj_qkvz.weight", {HK * group, H}, qkvz);
  const tensor p_ba = ws.load_row_ranges(prefix + "in_proj_ba.weight", {HV * 2, H}, ba);
  w.in_proj = tensor::f32({p_qkvz.shape()[0] + p_ba.shape()[0], H});
  std::memcpy(w.in_proj.data(), p_qkvz.data(), p_qkvz.nbytes());
  std::memcpy(w.in_proj.as<float>() + p_qkvz.numel(), p_ba.data(), p_ba.nbytes());

  // Conv channels q | k | v in head order; the local ones are one range of each block.
  const std::vector<range> conv_rows = {{g0 * dk, (g0 + hk_local) * dk},
                                        {key_dim + g0 * dk, key_dim + (g0 + hk_local) * dk},
                                        {2 * key_dim + hv0 * dv, 2 * key_dim + (hv0 + hv_local) * dv}};
  w.conv_w = ws.load_row_ranges(prefix + "conv1d.weight", {conv, 1, K}, conv_rows);
  w.conv_w.reshape({w.conv_w.shape()[0], K});
  if (ws.contains(prefix + "conv1d.bias")) w.conv_b = ws.load_row_ranges(prefix + "conv1d.bias", {conv}, conv_rows);

  w.dt_bias = ws.load_slice(prefix + "dt_bias", {HV}, 0, hv0, hv0 + hv_local);
  w.A_log = ws.load_slice(prefix + "A_log", {HV}, 0, hv0, hv0 + hv_local);
  // One weight of head_v_dim shared by every head, repeated per local head: the gated norm op
  // takes a weight per channel.
  const tensor norm = ws.load(prefix + "norm.weight", {dv});
  w.norm = tensor::f32({hv_local * dv});
  for (int64_t h = 0; h < hv_local; ++h) std::memcpy(w.norm.as<float>() + h * dv, norm.data(), norm.nbytes());
  w.out_proj = ws.load_slice(prefix + "out_proj.weight", {H, value_dim}, 1, hv0 * dv, (hv0 + hv_local) * dv);
  return w;
}

namespace {

void fill_gdn_common(kernels::gdn_common_params& p, const gdn_weights& w, const tensor& proj, const tensor& qkv,
                     tensor& core, mamba_layer_state& state, const step_inputs& in) {
  const int64_t conv = w.conv_dim(), in_w = proj.shape()[1];
  p.q = qkv.as<float>();
  p.k = qkv.as<float>() + w.key_dim();
  p.v = qkv.as<float>() + 2 * w.key_dim();
  p.b = proj.as<float>() + conv + w.value_dim();
  p.a = p.b + w.heads_v;
  p.A_log = w.A_log.as<float>();
  p.dt_bias = w.dt_bias.as<float>();
  p.out = core.as<float>();
  p.states = state.ssm.as<float>();
  p.state_indices = in.mamba_slots.as<int32_t>();
  p.batch = in.batch_size;
  p.heads_k = w.heads_k;
  p.heads_v = w.heads_v;
  p.k_dim = w.head_k_dim;
  p.v_dim = w.head_v_dim;
  p.q_stride = p.k_stride = p.v_stride = conv;
  p.a_stride = p.b_stride = in_w;
  p.out_stride = w.value_dim();
  p.qk_l2norm = true;
}

}  // namespace

kernels::gdn_prefill_kernel gdn_prefill_for(gdn_prefill_choice choice, dtype weight_type) {
  switch (choice) {
    case gdn_prefill_choice::kAuto:
      return weight_type == dtype::kBF16 ? kernels::gdn_prefill_kernel::kBf16 : kernels::gdn_prefill_kernel::kTc;
    case gdn_prefill_choice::kRecurrent: return kernels::gdn_prefill_kernel::kRecurrent;
    case gdn_prefill_choice::kTc: return kernels::gdn_prefill_kernel::kTc;
    case gdn_prefill_choice::kTf32: return kernels::gdn_prefill_kernel::kTf32;
    case gdn_prefill_choice::kBf16: return kernels::gdn_prefill_kernel::kBf16;
  }
  throw config_error("model.gdn_prefill: unknown choice");
}

void place(gdn_weights& w, device_kind device, dtype weight_type) {
  for (tensor* t : {&w.in_proj, &w.out_proj}) place_weight(*t, device, weight_type);
  for (tensor* t : {&w.conv_w, &w.conv_b, &w.dt_bias, &w.A_log, &w.norm}) place(*t, device);
}

tensor gdn_forward(const gdn_weights& w, const tensor& x, const step_inputs& in, mamba_layer_state& state,
                   collective* comm, const exec_context& ctx, mamba_layer_state* steps, tensor* residual,
                   const tensor* norm, float eps) {
  const int64_t T = x.shape()[0], hidden = x.shape()[1];
  if (T == 0) return tensor::f32({0, hidden}, ctx.device);

  const mixer_path path = mixer_path_of(in, steps, "Gated DeltaNet mixer");
  if (path == mixer_path::kIdle) return tensor::f32({0, hidden}, ctx.device);

  const int64_t conv = w.conv_dim(), vd = w.value_dim();
  tensor proj = norm_linear(x, norm, eps, w.in_proj, ctx);  // [T, conv + vd + 2·HV]: q | k | v | z | b | a
  const int64_t in_w = proj.shape()[1];
  profile(ctx, "gdn.in_proj", nbytes(w.in_proj) + nbytes(x) + nbytes(proj) + (norm ? nbytes(*norm) : 0.0));
  tensor qkv = tensor::f32({T, conv}, ctx.device);  // after conv + SiLU
  tensor core = tensor::f32({T, vd}, ctx.device);

  const mixer_conv cv{proj.as<float>(), in_w, qkv.as<float>(), conv, w.conv_width, &w.conv_w, &w.conv_b};
  mixer_scan scan;
  scan.prefill = [&](const device_array& slots) {
    kernels::gdn_chunk_scan_params s;
    fill_gdn_common(s, w, proj, qkv, core, state, in);
    set_prefill_rows(s, slots, in, w.chunk_size);
    s.kernel = w.prefill_kernel;
    kernels::run(s, ctx);
  };
  scan.update = [&](int64_t rows) {
    kernels::gdn_state_update_params s;
    fill_gdn_common(s, w, proj, qkv, core, state, in);
    s.batch = rows;
    kernels::run(s, ctx);
  };
  scan.steps = [&](const int32_t* retrieve_parent, const int32_t* first_step) {
    kernels::gdn_state_update_multi_params s;
    fill_gdn_common(s, w, proj, qkv, core, state, in);
    s.step_states = steps->ssm.as<float>();
    set_step_rows(s, in, retrieve_parent, first_step);
    kernels::run(s, ctx);
  };
  run_recurrent_mixer(path, cv, in, state, steps, scan, {"gdn.conv", "gdn.conv_steps", "gdn.conv_prefill", "gdn.scan_prefill"}, ctx);
  // Norm before gate, per head: rmsnorm over each head's V channels, then · silu(z), in one gated
  // norm op (a group per head).
  kernels::gated_rmsnorm_params g;
  g.x = core.as<float>();
  g.gate = proj.as<float>() + conv;  // z
  g.weight = w.norm.as<float>();
  g.out = core.as<float>();
  g.rows = T;
  g.cols = vd;
  g.x_stride = g.out_stride = vd;
  g.gate_stride = in_w;
  g.group_size = w.head_v_dim;
  g.eps = w.eps;
  g.norm_before_gate = true;
  // In place on core, run inside out_proj's op where the output goes into the residual.
  tensor out = gated_block_output(g, core, w.out_proj, comm, ctx, residual);
  // Bytes: the weight, core and z read (core's size each) and core read again by the projection.
  profile(ctx, "gdn.norm+out_proj", nbytes(w.out_proj) + 3 * nbytes(core) + 2 * (residual ? nbytes(*residual) : 0.0));
  return out;
}

}  // namespace hyserve::worker::layers
