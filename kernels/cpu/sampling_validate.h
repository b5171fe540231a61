#pragma once
// Pointer and shape checks of the batched sampling ops (sampling.h), shared by the CPU and CUDA
// backends so both reject the same calls with the same messages. Each returns false when the
// call has nothing to do (no rows). Setting values are checked by check_sample_settings.
#include <cstdint>
#include <limits>

#include "hyserve/kernels/sampling.h"
#include "validate.h"

namespace hyserve::kernels::cpu_detail {

inline bool check_call(const sample_rows_params& p) {
  constexpr const char* op = "sample_rows";
  require_non_negative(p.rows, op, "rows");
  if (p.rows == 0) return false;
  require_ptrs(op, {{p.logits, "logits"}, {p.settings, "settings"}, {p.out, "out"}});
  require_positive(p.vocab, op, "vocab");
  require_stride(p.stride, p.vocab, op, "stride");
  if (p.vocab > std::numeric_limits<int32_t>::max()) fail(op, "vocab", p.vocab, "exceeds the int32 id range");
  if (p.rows > std::numeric_limits<int32_t>::max()) fail(op, "rows", p.rows, "exceeds the int32 row range");
  return true;
}

inline bool check_call(const last_token_scatter_params& p) {
  constexpr const char* op = "last_token_scatter";
  require_counts(op, {{p.rows, "rows"}, {p.n_slots, "n_slots"}});
  if (p.rows == 0) return false;
  require_ptrs(op, {{p.sampled, "sampled"}, {p.slots, "slots"}, {p.last, "last"}});
  return true;
}

inline bool check_call(const token_resolve_params& p) {
  constexpr const char* op = "token_resolve";
  require_counts(op, {{p.n, "n"}, {p.n_slots, "n_slots"}});
  if (p.n == 0) return false;
  require_ptrs(op, {{p.ids, "ids"}, {p.last, "last"}});
  return true;
}

}  // namespace hyserve::kernels::cpu_detail
