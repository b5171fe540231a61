#pragma once
// rmsnorm_linear (norm.h) in its unfused form, shared by the CPU op and the CUDA op's fallback:
// the parameter checks, then the rmsnorm op (the gated_rmsnorm op with a gate) into xn [m, k]
// (when norm_weight is set) and the
// swiglu_linear op (up_w set) or the gemm op on xn (or on x), then the relu2 op on out (relu2).
// `run` is called with each op's params (run_cpu or run_cuda on a stream).
#include "dtype_dispatch.h"
#include "hyserve/kernels/activation.h"
#include "hyserve/kernels/gemm.h"
#include "hyserve/kernels/norm.h"
#include "validate.h"

namespace hyserve::kernels::cpu_detail {

inline void check_rmsnorm_linear(const rmsnorm_linear_params& p) {
  constexpr const char* op = "rmsnorm_linear";
  require_ptrs(op, {{p.x, "x"}, {p.w, "w"}, {p.out, "out"}});
  require_non_negative(p.m, op, "m");
  require_sizes(op, {{p.n, "n"}, {p.k, "k"}});
  require_strides(p.k, op, {{p.x_stride, "x_stride"}, {p.w_stride, "w_stride"}});
  require_stride(p.out_stride, p.n, op, "out_stride");
  if (p.beta != 0.0f && p.beta != 1.0f) fail(op, "beta", p.beta, "must be 0 or 1");
  if (p.beta != 0.0f && p.up_w != nullptr) fail(op, "beta", p.beta, "must be 0 with up_w");
  if (p.relu2 && (p.up_w != nullptr || p.beta != 0.0f)) fail(op, "relu2", "true", "needs up_w null and beta 0");
  if (p.norm_weight != nullptr && !(p.eps >= 0.0f)) fail(op, "eps", p.eps, "must be >= 0");
  if (p.normed_out != nullptr && p.norm_weight == nullptr) fail(op, "normed_out", "set", "needs norm_weight");
  if (p.gate != nullptr) {
    if (p.norm_weight == nullptr) fail(op, "gate", "set", "needs norm_weight");
    require_stride(p.gate_stride, p.k, op, "gate_stride");
  }
  if (p.norm_group < 0 || (p.norm_group > 0 && p.k % p.norm_group != 0))
    fail(op, "norm_group", p.norm_group, ("must be 0 or divide k = " + std::to_string(p.k)).c_str());
  if (p.norm_group > 0 && p.gate == nullptr) fail(op, "norm_group", p.norm_group, "needs gate");
  require_storage(p.w_dtype, op, "w_dtype");
}

// xn: [m, k] scratch for the normed rows (used only when p.norm_weight is set; p.normed_out
// instead when that is set).
template <class Run>
void run_rmsnorm_linear_unfused(const rmsnorm_linear_params& p, float* xn, Run&& run) {
  const float* a = p.x;
  int64_t lda = p.x_stride;
  if (p.norm_weight != nullptr) {
    if (p.normed_out != nullptr) xn = p.normed_out;
    if (p.gate != nullptr) {
      gated_rmsnorm_params g;
      g.x = p.x;
      g.gate = p.gate;
      g.weight = p.norm_weight;
      g.out = xn;
      g.rows = p.m;
      g.cols = p.k;
      g.x_stride = p.x_stride;
      g.gate_stride = p.gate_stride;
      g.out_stride = p.k;
      g.group_size = p.norm_group > 0 ? p.norm_group : p.k;
      g.eps = p.eps;
      g.norm_before_gate = p.norm_before_gate;
      run(g);
    } else {
      rmsnorm_params r;
      r.x = p.x;
      r.weight = p.norm_weight;
      r.out = xn;
      r.rows = p.m;
      r.cols = p.k;
      r.x_stride = p.x_stride;
      r.out_stride = p.k;
      r.eps = p.eps;
      run(r);
    }
    a = xn;
    lda = p.k;
  }
  swiglu_linear_params s;
  s.x = a;
  s.gate_w = p.w;
  s.up_w = p.up_w;
  s.w_dtype = p.w_dtype;
  s.out = p.out;
  s.m = p.m;
  s.n = p.n;
  s.k = p.k;
  s.x_stride = lda;
  s.w_stride = p.w_stride;
  s.out_stride = p.out_stride;
  if (p.up_w != nullptr) {
    run(s);
    return;
  }
  // Without up_w the op is the gate projection alone: out = xn · wᵀ (+ out when beta = 1).
  gemm_params g = swiglu_linear_gate_gemm(s);
  g.beta = p.beta;
  run(g);
  if (p.relu2) {
    relu2_params r;
    r.x = p.out;
    r.rows = p.m;
    r.cols = p.n;
    r.stride = p.out_stride;
    run(r);
  }
}

}  // namespace hyserve::kernels::cpu_detail
