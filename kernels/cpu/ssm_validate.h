#pragma once
// Checks of the SSM params structs (ssm.h), shared by the CPU and CUDA backends so both reject
// the same calls with the same messages. They read host-visible fields only: index arrays
// (state_indices, query_start_loc) may live in device memory, so each backend checks their
// contents itself where it can (the CPU op), and adds its own limits (the CUDA grid).
#include <string>

#include "hyserve/kernels/ssm.h"
#include "dtype_dispatch.h"
#include "ssm_dtype.h"
#include "validate.h"

namespace hyserve::kernels::cpu_detail {

// Storage types, pointers, sizes, strides and the step-size limits of ssm_common_params.
inline void check_ssm_common_fields(const ssm_common_params& p, const char* op) {
  require_ssm_dtypes(p, op);
  require_ptrs(op, {{p.x, "x"}, {p.dt, "dt"}, {p.A_log, "A_log"}, {p.B, "B"}, {p.C, "C"}, {p.y, "y"},
                    {p.ssm_states, "ssm_states"}, {p.state_indices, "state_indices"}});
  require_sizes(op, {{p.batch, "batch"}, {p.heads, "heads"}, {p.head_dim, "head_dim"}, {p.d_state, "d_state"},
                     {p.n_groups, "n_groups"}});
  if (p.heads % p.n_groups != 0) {
    fail(op, "n_groups", p.n_groups, ("must divide heads = " + std::to_string(p.heads)).c_str());
  }
  require_stride(p.x_stride, p.heads * p.head_dim, op, "x_stride");
  require_stride(p.dt_stride, p.heads, op, "dt_stride");
  require_stride(p.bc_stride, p.n_groups * p.d_state, op, "bc_stride");
  require_stride(p.y_stride, p.heads * p.head_dim, op, "y_stride");
  if (!(p.dt_min <= p.dt_max))
    fail(op, "dt_min", p.dt_min, ("must be <= dt_max = " + std::to_string(p.dt_max)).c_str());
}

// ssd_chunk_scan's fields beyond the common ones.
inline void check_ssd_chunk_scan_fields(const ssd_chunk_scan_params& p, const char* op) {
  check_ssm_common_fields(p, op);
  require_ptr(p.query_start_loc, op, "query_start_loc");
  require_positive(p.chunk_size, op, "chunk_size");
}

// selective_state_update_multi: the common fields, the step states and the step columns.
inline void check_ssm_update_multi_fields(const selective_state_update_multi_params& p, const char* op) {
  check_ssm_common_fields(p, op);
  require_ptr(p.step_states, op, "step_states");
  require_step_columns(p.tokens_per_row, p.steps, op);
}

// state_commit: the counts, then (false: nothing to commit) the pointers, steps and storage
// type. The CPU op adds its checks of conv_steps and of the host-side slots, rows and steps.
inline bool check_state_commit(const state_commit_params& p, const char* op) {
  require_counts(op, {{p.n_layers, "n_layers"}, {p.n_commits, "n_commits"}});
  if (p.n_layers == 0 || p.n_commits == 0) return false;
  require_ptrs(op, {{p.ssm_states, "ssm_states"}, {p.ssm_steps, "ssm_steps"}, {p.slots, "slots"}, {p.rows, "rows"},
                    {p.steps_taken, "steps_taken"}});
  require_positive(p.steps, op, "steps");
  require_storage(p.state_dtype, op, "state_dtype");
  return true;
}

}  // namespace hyserve::kernels::cpu_detail
