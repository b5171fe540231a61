#pragma once
// Checks of the Gated DeltaNet params structs (gdn.h), shared by the CPU and CUDA backends so
// both reject the same calls with the same messages. They read host-visible fields only:
// state_indices, query_start_loc and has_initial_state may live in device memory, so each
// backend checks their contents itself where it can (the CPU op), and adds its own limits.
#include <cmath>
#include <string>

#include "hyserve/kernels/gdn.h"
#include "validate.h"

namespace hyserve::kernels::cpu_detail {

// Pointers, sizes, strides and the query scale of gdn_common_params. f32_io: q, k, v and out
// are the f32 pointers (else the chunked prefill's bf16 ones, checked by
// check_gdn_chunk_scan_fields).
inline void check_gdn_common_fields(const gdn_common_params& p, const char* op, bool f32_io = true) {
  if (f32_io) {
    require_ptrs(op, {{p.q, "q"}, {p.k, "k"}, {p.v, "v"}, {p.out, "out"}});
  }
  require_ptrs(op, {{p.a, "a"}, {p.b, "b"}, {p.A_log, "A_log"}, {p.states, "states"},
                    {p.state_indices, "state_indices"}});
  require_sizes(op, {{p.batch, "batch"}, {p.heads_k, "heads_k"}, {p.heads_v, "heads_v"}, {p.k_dim, "k_dim"},
                     {p.v_dim, "v_dim"}});
  if (p.heads_v % p.heads_k != 0)
    fail(op, "heads_v", p.heads_v, ("must be a multiple of heads_k = " + std::to_string(p.heads_k)).c_str());
  require_strides(p.heads_k * p.k_dim, op, {{p.q_stride, "q_stride"}, {p.k_stride, "k_stride"}});
  require_stride(p.v_stride, p.heads_v * p.v_dim, op, "v_stride");
  require_strides(p.heads_v, op, {{p.a_stride, "a_stride"}, {p.b_stride, "b_stride"}});
  require_stride(p.out_stride, p.heads_v * p.v_dim, op, "out_stride");
  if (!std::isfinite(p.scale)) fail(op, "scale", p.scale, "must be finite");
}

// gdn_chunk_scan: the io type, the common fields with the pointers of that type, and the
// prefill's own fields.
inline void check_gdn_chunk_scan_fields(const gdn_chunk_scan_params& p, const char* op) {
  if (p.io_dtype != dtype::kF32 && p.io_dtype != dtype::kBF16)
    fail(op, "io_dtype", dtype_name(p.io_dtype), "must be f32 or bf16");
  const bool bf16_io = p.io_dtype == dtype::kBF16;
  check_gdn_common_fields(p, op, !bf16_io);
  if (bf16_io) {
    require_ptrs(op, {{p.q_bf16, "q_bf16"}, {p.k_bf16, "k_bf16"}, {p.v_bf16, "v_bf16"}, {p.out_bf16, "out_bf16"}});
  }
  require_ptr(p.query_start_loc, op, "query_start_loc");
  require_positive(p.chunk_size, op, "chunk_size");
}

// gdn_state_update_multi: the common fields (f32 io), the step states and the step columns.
inline void check_gdn_update_multi_fields(const gdn_state_update_multi_params& p, const char* op) {
  check_gdn_common_fields(p, op);
  require_ptr(p.step_states, op, "step_states");
  require_step_columns(p.tokens_per_row, p.steps, op);
}

}  // namespace hyserve::kernels::cpu_detail
