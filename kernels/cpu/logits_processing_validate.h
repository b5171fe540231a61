#pragma once
// Pointer and shape checks of the logits-processing ops (logits_processing.h), shared by the
// CPU and CUDA backends. Each returns false when the call has nothing to do.
#include <cstdint>
#include <limits>

#include "hyserve/kernels/logits_processing.h"
#include "validate.h"

namespace hyserve::kernels::cpu_detail {

inline bool check_call(const logits_process_params& p) {
  constexpr const char* op = "logits_process";
  require_non_negative(p.rows, op, "rows");
  if (p.rows == 0) return false;
  require_ptrs(op, {{p.logits, "logits"}, {p.settings, "settings"}});
  require_positive(p.vocab, op, "vocab");
  require_stride(p.stride, p.vocab, op, "stride");
  if (p.vocab > std::numeric_limits<int32_t>::max()) fail(op, "vocab", p.vocab, "exceeds the int32 id range");
  if (p.rows > std::numeric_limits<int32_t>::max()) fail(op, "rows", p.rows, "exceeds the int32 row range");
  require_counts(op, {{p.n_slots, "n_slots"}, {p.n_bias, "n_bias"}, {p.n_mask, "n_mask"}});
  if (p.max_top < 0 || p.max_top > kMaxTopLogprobs) fail(op, "max_top", p.max_top, "must be in [0, 20]");
  if (p.n_slots > 0) require_ptr(p.counts, op, "counts");
  if (p.n_bias > 0) {
    require_ptrs(op, {{p.bias_ids, "bias_ids"}, {p.bias_values, "bias_values"}});
  }
  if (p.n_mask > 0) require_ptr(p.mask_ids, op, "mask_ids");
  if (p.max_top > 0) require_ptr(p.top, op, "top");
  return true;
}

inline bool check_call(const token_count_params& p) {
  constexpr const char* op = "token_count";
  require_counts(op, {{p.n_slots, "n_slots"}, {p.n_clear, "n_clear"}, {p.n_seen, "n_seen"},
                      {p.n_sampled, "n_sampled"}});
  if (p.n_clear + p.n_seen + p.n_sampled == 0 || p.n_slots == 0) return false;
  require_ptr(p.counts, op, "counts");
  require_positive(p.vocab, op, "vocab");
  if (p.n_clear > 0) require_ptr(p.clear_slots, op, "clear_slots");
  if (p.n_seen > 0) require_ptr(p.seen, op, "seen");
  if (p.n_sampled > 0) {
    require_ptrs(op, {{p.sampled, "sampled"}, {p.sampled_slots, "sampled_slots"}});
  }
  return true;
}

}  // namespace hyserve::kernels::cpu_detail
