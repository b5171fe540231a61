#include "hyserve/kernels/logits_processing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "logits_processing_validate.h"
#include "validate.h"

namespace hyserve::kernels {

using namespace cpu_detail;

void check_logits_row_settings(const logits_row_settings& s, int64_t n_slots, int64_t n_bias, int64_t n_mask,
                               int64_t max_top) {
  constexpr const char* op = "logits_process";
  if (!std::isfinite(s.repetition_penalty) || !(s.repetition_penalty > 0.0f))
    fail(op, "repetition_penalty", s.repetition_penalty, "must be finite and > 0");
  if (!std::isfinite(s.presence_penalty)) fail(op, "presence_penalty", s.presence_penalty, "must be finite");
  if (!std::isfinite(s.frequency_penalty)) fail(op, "frequency_penalty", s.frequency_penalty, "must be finite");
  if (s.count_slot < -1 || s.count_slot >= n_slots)
    fail(op, "count_slot", s.count_slot, ("must be -1 or in [0, " + std::to_string(n_slots) + ")").c_str());
  if (s.bias_begin < 0 || s.bias_count < 0 || static_cast<int64_t>(s.bias_begin) + s.bias_count > n_bias)
    fail(op, "bias_count", s.bias_count, ("entries must lie in [0, " + std::to_string(n_bias) + ")").c_str());
  if (s.mask_begin < 0 || s.mask_count < 0 || static_cast<int64_t>(s.mask_begin) + s.mask_count > n_mask)
    fail(op, "mask_count", s.mask_count, ("entries must lie in [0, " + std::to_string(n_mask) + ")").c_str());
  if (s.top_n < 0 || s.top_n > max_top)
    fail(op, "top_n", s.top_n, ("must be in [0, max_top = " + std::to_string(max_top) + "]").c_str());
}

void run_cpu(const logits_process_params& p) {
  if (!check_call(p)) return;
  for (int64_t r = 0; r < p.rows; ++r)
    check_logits_row_settings(p.settings[r], p.n_slots, p.n_bias, p.n_mask, p.max_top);
  for (int64_t i = 0; i < p.n_bias; ++i)
    if (p.bias_ids[i] < 0 || p.bias_ids[i] >= p.vocab || !std::isfinite(p.bias_values[i]))
      fail("logits_process", "bias_ids[" + std::to_string(i) + "]", p.bias_ids[i],
           "must be a token id of the vocabulary with a finite bias");
  for (int64_t i = 0; i < p.n_mask; ++i)
    if (p.mask_ids[i] < 0 || p.mask_ids[i] >= p.vocab)
      fail("logits_process", "mask_ids[" + std::to_string(i) + "]", p.mask_ids[i], "must be a token id of the vocabulary");
  const float neg_inf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for schedule(dynamic, 1) if (p.rows > 1 && p.vocab >= 4096)
  for (int64_t r = 0; r < p.rows; ++r) {
    const logits_row_settings& s = p.settings[r];
    float* x = p.logits + r * p.stride;
    for (int32_t i = 0; i < s.bias_count; ++i) x[p.bias_ids[s.bias_begin + i]] += p.bias_values[s.bias_begin + i];
    for (int32_t i = 0; i < s.mask_count; ++i) x[p.mask_ids[s.mask_begin + i]] = neg_inf;
    if (s.count_slot >= 0) {
      const int32_t* c = p.counts + static_cast<int64_t>(s.count_slot) * p.vocab;
      const float rp = s.repetition_penalty;
      for (int64_t v = 0; v < p.vocab; ++v) {
        const int32_t n = c[v] & kCountMask;
        if (c[v] != 0 && rp != 1.0f) x[v] = x[v] > 0.0f ? x[v] / rp : x[v] * rp;
        if (n > 0) x[v] -= s.frequency_penalty * static_cast<float>(n) + s.presence_penalty;
      }
    }
    if (s.top_n > 0) {
      float mx = neg_inf;
      for (int64_t v = 0; v < p.vocab; ++v) mx = std::max(mx, x[v]);
      double z = 0.0;
      for (int64_t v = 0; v < p.vocab; ++v) z += std::exp(static_cast<double>(x[v]) - static_cast<double>(mx));
      const double lse = static_cast<double>(mx) + std::log(z);
      std::vector<int32_t> ids(static_cast<size_t>(p.vocab));
      for (int64_t v = 0; v < p.vocab; ++v) ids[static_cast<size_t>(v)] = static_cast<int32_t>(v);
      const auto n = static_cast<std::ptrdiff_t>(std::min<int64_t>(s.top_n, p.vocab));
      std::partial_sort(ids.begin(), ids.begin() + n, ids.end(),
                        [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
      top_logprob* out = p.top + r * p.max_top;
      for (std::ptrdiff_t k = 0; k < n; ++k) {
        out[k].token = ids[static_cast<size_t>(k)];
        out[k].logprob = static_cast<float>(static_cast<double>(x[out[k].token]) - lse);
      }
    }
  }
}

void run_cpu(const token_count_params& p) {
  if (!check_call(p)) return;
  auto cell = [&](int64_t slot, int64_t token) -> int32_t* {
    if (slot < 0 || slot >= p.n_slots || token < 0 || token >= p.vocab) return nullptr;
    return p.counts + slot * p.vocab + token;
  };
  for (int64_t i = 0; i < p.n_clear; ++i)
    if (p.clear_slots[i] >= 0 && p.clear_slots[i] < p.n_slots)
      std::fill_n(p.counts + static_cast<int64_t>(p.clear_slots[i]) * p.vocab, p.vocab, 0);
  for (int64_t i = 0; i < p.n_seen; ++i)
    if (int32_t* c = cell(p.seen[2 * i], p.seen[2 * i + 1])) *c |= kPromptSeenBit;
  for (int64_t r = 0; r < p.n_sampled; ++r)
    if (int32_t* c = cell(p.sampled_slots[r], p.sampled[r].token); c && (*c & kCountMask) < kCountMask) ++*c;
}

}  // namespace hyserve::kernels
