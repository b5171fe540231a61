#pragma once
// Checks of moe_experts_params (moe.h), shared by the CPU and CUDA backends so both reject the
// same calls with the same messages. Host-visible fields only; the CUDA op adds its alignment
// and grid limits.
#include "dtype_dispatch.h"
#include "hyserve/kernels/moe.h"
#include "validate.h"

namespace hyserve::kernels::cpu_detail {

inline void check_moe_experts_fields(const moe_experts_params& p, const char* op) {
  require_storage(p.w_dtype, op, "w_dtype");
  require_non_negative(p.tokens, op, "tokens");
  require_positive(p.hidden, op, "hidden");
  require_positive(p.inter, op, "inter");
  require_positive(p.experts, op, "experts");
  require_positive(p.top_k, op, "top_k");
  if (p.top_k > p.experts) fail(op, "top_k", p.top_k, "exceeds experts");
  if (p.scoring != moe_scoring::kSoftmax && p.scoring != moe_scoring::kSigmoid)
    fail(op, "scoring", static_cast<int>(p.scoring), "must be softmax or sigmoid");
  if (p.tokens == 0) return;
  require_ptr(p.x, op, "x");
  require_ptr(p.router_logits, op, "router_logits");
  require_ptr(p.gate_up, op, "gate_up");
  require_ptr(p.down, op, "down");
  require_ptr(p.out, op, "out");
  require_stride(p.x_stride, p.hidden, op, "x_stride");
  require_stride(p.logits_stride, p.experts, op, "logits_stride");
  require_stride(p.out_stride, p.hidden, op, "out_stride");
}

}  // namespace hyserve::kernels::cpu_detail
