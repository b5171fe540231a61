#pragma once
// The shared expert of moe_experts_params (moe.h) as separate ops, shared by the CPU op and the
// CUDA op's paths other than the fused decode kernels: exactly the ops a layer ran after the
// routed experts before the op took the shared expert (so their bits are unchanged):
//   act = the rmsnorm_linear op without a norm, up_w set (silu(x · gateᵀ) ⊙ (x · upᵀ));
//   ungated: the rmsnorm_linear op, beta 1 into out (out = act · downᵀ + out);
//   gated:   ys = the rmsnorm_linear op, beta 0; gl = the rmsnorm_linear op on x with the [1, H]
//            gate; then the row_add op (out += sigmoid(gl) · ys).
// act [tokens, shared_inter], ys [tokens, hidden] and gl [tokens] are the caller's scratch (ys
// and gl only when gated). `run` is called with each op's params (run_cpu or run_cuda on a stream).
#include "hyserve/kernels/moe.h"
#include "hyserve/kernels/norm.h"
#include "hyserve/kernels/row_ops.h"

namespace hyserve::kernels::cpu_detail {

template <class Run>
void run_moe_shared_unfused(const moe_experts_params& p, float* act, float* ys, float* gl, Run&& run) {
  const int64_t T = p.tokens, H = p.hidden, Is = p.shared_inter;
  auto linear = [&](const float* x, int64_t x_stride, const void* w, int64_t n, int64_t k, float* out,
                    int64_t out_stride, float beta) {
    rmsnorm_linear_params l;
    l.x = x;
    l.w = w;
    l.w_dtype = p.w_dtype;
    l.out = out;
    l.m = T;
    l.n = n;
    l.k = k;
    l.x_stride = x_stride;
    l.w_stride = k;
    l.out_stride = out_stride;
    l.beta = beta;
    return l;
  };
  rmsnorm_linear_params up = linear(p.x, p.x_stride, p.shared_gate, Is, H, act, Is, 0.0f);
  up.up_w = p.shared_up;
  run(up);
  if (p.shared_gate_w == nullptr) {
    run(linear(act, Is, p.shared_down, H, Is, p.out, p.out_stride, 1.0f));
    return;
  }
  run(linear(act, Is, p.shared_down, H, Is, ys, H, 0.0f));
  run(linear(p.x, p.x_stride, p.shared_gate_w, 1, H, gl, 1, 0.0f));
  row_add_params a;
  a.x = ys;
  a.out = p.out;
  a.gate_logits = gl;
  a.gate_stride = 1;
  a.rows = T;
  a.cols = H;
  a.x_stride = H;
  a.out_stride = p.out_stride;
  run(a);
}

}  // namespace hyserve::kernels::cpu_detail
