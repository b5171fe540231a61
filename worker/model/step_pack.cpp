#include "step_pack.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "hyserve/common/error.h"
#include "layers.h"

namespace hyserve::worker::layers {

step_layout make_step_layout(int64_t batch, int64_t tokens, int64_t logit_rows, bool attention,
                             int64_t page_table_stride, int64_t parent_entries, bool first_step,
                             bool extend_slots, bool sampling) {
  step_layout l;
  l.batch = batch;
  l.tokens = tokens;
  l.logit_rows = logit_rows;
  l.attention = attention;
  l.page_table_stride = attention ? page_table_stride : 0;
  l.parent_entries = parent_entries;
  l.first_step = first_step;
  l.extend_slots = extend_slots;
  l.sampling = sampling;
  int64_t at = 0;
  auto take = [&](int64_t n) {
    const int64_t o = at;
    at += n;
    return o;
  };
  l.query_start_loc = take(batch + 1);
  l.mamba_slots = take(batch);
  l.has_initial_state = take((batch + 3) / 4);
  l.positions = take(tokens);
  l.token_ids = take(tokens);
  l.logit_token_rows = take(logit_rows);
  l.locs = take(attention ? tokens : 0);
  l.page_table = take(attention ? batch * l.page_table_stride : 0);
  l.seq_lens = take(attention ? batch : 0);
  l.retrieve_parent = take(parent_entries);
  l.first_step_at = take(first_step ? batch : 0);
  l.extend_slots_at = take(extend_slots ? batch : 0);
  if (sampling) {
    at += at % 2;  // sample_settings holds 64-bit fields
    l.sample_settings_at = take(logit_rows * static_cast<int64_t>(sizeof(kernels::sample_settings) / sizeof(int32_t)));
    l.feed_slots_at = take(logit_rows);
  }
  l.total = at;
  return l;
}

step_layout layout_of(const hybrid_metadata& meta, const attention_step* step, bool sampling) {
  const bool parents = meta.mode == forward_mode::kTargetVerify && meta.is_tree;
  return make_step_layout(meta.batch_size, meta.num_tokens, static_cast<int64_t>(meta.logit_token_indices.size()),
                          step != nullptr, step ? step->page_table_stride : 0,
                          parents ? static_cast<int64_t>(meta.retrieve_parent.size()) : 0,
                          meta.mode == forward_mode::kDraft,
                          (meta.mode == forward_mode::kTargetVerify && meta.verify_rows < meta.batch_size) ||
                              (meta.mode == forward_mode::kMixed && meta.mixed_decode_rows > 0),
                          sampling);
}

void pack_step(const step_layout& l, const hybrid_metadata& meta, const attention_step* step,
               const std::vector<int32_t>& token_ids, int32_t* out, const step_sampling* sampling) {
  const int64_t bs = meta.batch_size, T = meta.num_tokens;
  const auto n_logits = static_cast<int64_t>(meta.logit_token_indices.size());
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw invalid_argument_error("step pack: " + what);
  };
  need(bs <= l.batch, "batch " + std::to_string(bs) + " exceeds the layout's " + std::to_string(l.batch));
  need(T <= l.tokens, "tokens " + std::to_string(T) + " exceed the layout's " + std::to_string(l.tokens));
  need(n_logits <= l.logit_rows, "logit rows " + std::to_string(n_logits) + " exceed the layout's " +
                                     std::to_string(l.logit_rows));
  need(static_cast<int64_t>(token_ids.size()) == T, "token ids do not match the batch's tokens");
  need((step != nullptr) == l.attention, "attention arrays present in only one of the step and the layout");
  const bool padded = bs < l.batch || T < l.tokens;
  need(!padded || (l.batch - bs == l.tokens - T && l.logit_rows - n_logits == l.batch - bs),
       "padding rows carry one token and one logits row each");
  std::fill(out, out + l.total, 0);

  int32_t* qsl = out + l.query_start_loc;
  for (int64_t b = 0; b <= bs; ++b) qsl[b] = meta.query_start_loc[static_cast<size_t>(b)];
  for (int64_t b = bs + 1; b <= l.batch; ++b) qsl[b] = qsl[b - 1] + 1;
  int32_t* slots = out + l.mamba_slots;
  for (int64_t b = 0; b < l.batch; ++b) slots[b] = b < bs ? meta.mamba_slots[static_cast<size_t>(b)] : -1;
  std::memcpy(out + l.has_initial_state, meta.has_initial_state.data(), meta.has_initial_state.size());
  std::copy(meta.positions.begin(), meta.positions.end(), out + l.positions);
  std::copy(token_ids.begin(), token_ids.end(), out + l.token_ids);
  int32_t* logit_rows = out + l.logit_token_rows;
  std::copy(meta.logit_token_indices.begin(), meta.logit_token_indices.end(), logit_rows);
  for (int64_t r = n_logits; r < l.logit_rows; ++r) logit_rows[r] = static_cast<int32_t>(T + (r - n_logits));

  if (step) {
    need(step->page_table_stride <= l.page_table_stride,
         "page-table stride " + std::to_string(step->page_table_stride) + " exceeds the layout's " +
             std::to_string(l.page_table_stride));
    int32_t* locs = out + l.locs;
    std::copy(step->locs.begin(), step->locs.end(), locs);
    for (int64_t t = T; t < l.tokens; ++t) locs[t] = -1;
    int32_t* table = out + l.page_table;
    for (int64_t b = 0; b < bs; ++b)
      std::copy_n(step->page_table.begin() + b * step->page_table_stride, step->page_table_stride,
                  table + b * l.page_table_stride);
    std::copy(step->seq_lens.begin(), step->seq_lens.end(), out + l.seq_lens);  // padding rows: 0
  }
  if (l.parent_entries > 0) {
    need(static_cast<int64_t>(meta.retrieve_parent.size()) == l.parent_entries, "retrieve_parent size");
    std::copy(meta.retrieve_parent.begin(), meta.retrieve_parent.end(), out + l.retrieve_parent);
  }
  if (l.first_step) {
    need(static_cast<int64_t>(meta.draft_steps.size()) == bs, "draft_steps size");
    std::copy(meta.draft_steps.begin(), meta.draft_steps.end(), out + l.first_step_at);
  }
  if (l.extend_slots) {
    // The leading rows that do not prefill: TargetVerify's verify rows, Mixed's decode rows.
    const int64_t lead = meta.mode == forward_mode::kMixed ? meta.mixed_decode_rows : meta.verify_rows;
    need(lead <= bs, "verify / decode rows exceed the batch");
    int32_t* ext = out + l.extend_slots_at;
    for (int64_t b = 0; b < bs; ++b) ext[b] = b < lead ? -1 : meta.mamba_slots[static_cast<size_t>(b)];
  }
  if (l.sampling) {
    need(sampling != nullptr, "the layout samples but the step has no sampling settings");
    need(static_cast<int64_t>(sampling->settings.size()) == n_logits &&
             static_cast<int64_t>(sampling->feed_slots.size()) == n_logits,
         "sampling settings and feed slots must have one entry per logits row");
    constexpr int64_t kWords = sizeof(kernels::sample_settings) / sizeof(int32_t);
    for (int64_t r = 0; r < l.logit_rows; ++r) {
      const kernels::sample_settings s = r < n_logits ? sampling->settings[static_cast<size_t>(r)] : kernels::sample_settings{};
      std::memcpy(out + l.sample_settings_at + r * kWords, &s, sizeof s);
    }
    int32_t* feed = out + l.feed_slots_at;
    for (int64_t r = 0; r < l.logit_rows; ++r) feed[r] = r < n_logits ? sampling->feed_slots[static_cast<size_t>(r)] : -1;
  }
}

}  // namespace hyserve::worker::layers
