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
  require_sizes(op, {{p.hidden, "hidden"}, {p.inter, "inter"}, {p.experts, "experts"}, {p.top_k, "top_k"}});
  if (p.top_k > p.experts) fail(op, "top_k", p.top_k, "exceeds experts");
  if (p.scoring != moe_scoring::kSoftmax && p.scoring != moe_scoring::kSigmoid)
    fail(op, "scoring", static_cast<int>(p.scoring), "must be softmax or sigmoid");
  if (p.tokens == 0) return;
  require_ptrs(op, {{p.x, "x"}, {p.router_logits, "router_logits"}, {p.gate_up, "gate_up"}, {p.down, "down"},
                    {p.out, "out"}});
  require_stride(p.x_stride, p.hidden, op, "x_stride");
  require_stride(p.logits_stride, p.experts, op, "logits_stride");
  require_stride(p.out_stride, p.hidden, op, "out_stride");
  require_non_negative(p.shared_inter, op, "shared_inter");
  if (p.shared_inter > 0)
    require_ptrs(op, {{p.shared_gate, "shared_gate"}, {p.shared_up, "shared_up"}, {p.shared_down, "shared_down"}});
}

}  // namespace hyserve::kernels::cpu_detail
