#pragma once
// Checks of the causal conv1d params structs (causal_conv1d.h), shared by the CPU and CUDA
// backends so both reject the same calls with the same messages. They read host-visible fields
// only: state_indices, query_start_loc and has_initial_state may live in device memory, so
// each backend checks their contents itself where it can (the CPU op), and adds its own limits.
#include "hyserve/kernels/causal_conv1d.h"
#include "validate.h"

namespace hyserve::kernels::cpu_detail {

// Pointers, sizes and strides of conv1d_varlen_params, conv1d_update_params and
// conv1d_update_multi_params.
template <class Params>
void check_conv1d_fields(const Params& p, const char* op) {
  require_ptrs(op, {{p.x, "x"}, {p.weight, "weight"}, {p.out, "out"}, {p.state_indices, "state_indices"}});
  if (p.width > 1) require_ptr(p.conv_states, op, "conv_states");  // width 1 keeps no window
  require_sizes(op, {{p.batch, "batch"}, {p.dim, "dim"}});
  if (p.width < 1) fail(op, "width", p.width, "must be >= 1");
  require_strides(p.dim, op, {{p.x_stride, "x_stride"}, {p.out_stride, "out_stride"}});
}

// causal_conv1d_update_multi: the common fields, the per-step windows and the step columns.
inline void check_conv1d_update_multi_fields(const conv1d_update_multi_params& p, const char* op) {
  check_conv1d_fields(p, op);
  if (p.width > 1) require_ptr(p.step_windows, op, "step_windows");
  require_step_columns(p.tokens_per_row, p.steps, op);
}

}  // namespace hyserve::kernels::cpu_detail
