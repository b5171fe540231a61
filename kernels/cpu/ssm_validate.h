#pragma once
// Checks of the SSM params structs (ssm.h), shared by the CPU and CUDA backends so both reject
// the same calls with the same messages. They read host-visible fields only: index arrays
// (state_indices, query_start_loc) may live in device memory, so each backend checks their
// contents itself where it can (the CPU op), and adds its own limits (the CUDA grid).
#include <string>

#include "hyserve/kernels/ssm.h"
#include "ssm_dtype.h"
#include "validate.h"

namespace hyserve::kernels::cpu_detail {

// Storage types, pointers, sizes, strides and the step-size limits of ssm_common_params.
inline void check_ssm_common_fields(const ssm_common_params& p, const char* op) {
  require_ssm_dtypes(p, op);
  require_ptr(p.x, op, "x");
  require_ptr(p.dt, op, "dt");
  require_ptr(p.A_log, op, "A_log");
  require_ptr(p.B, op, "B");
  require_ptr(p.C, op, "C");
  require_ptr(p.y, op, "y");
  require_ptr(p.ssm_states, op, "ssm_states");
  require_ptr(p.state_indices, op, "state_indices");
  require_positive(p.batch, op, "batch");
  require_positive(p.heads, op, "heads");
  require_positive(p.head_dim, op, "head_dim");
  require_positive(p.d_state, op, "d_state");
  require_positive(p.n_groups, op, "n_groups");
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

}  // namespace hyserve::kernels::cpu_detail
