#pragma once
// The per-step metadata the device ops read (query_start_loc, slots, positions, token ids, the
// rows that produce logits, KV locations, page table, lengths, draft links), packed into ONE
// i32 buffer so that a step costs one host→device copy. Eager steps pack exactly their batch.
// CUDA-graph decode packs a bucket's fixed layout (batch padded to the bucket, page table at a
// fixed stride) so that every replay of the bucket's graph reads the same device addresses.
//
// Padding rows of a padded decode pack write nowhere and read nothing of another request:
// mamba slot -1 (every SSM/conv/GDN kernel skips the row, state untouched), KV location -1
// (the KV write skips it), length 0 and an all-zero page-table row (attention skips a row of
// length 0), token 0 at position 0, no initial state; their logits rows are discarded.
#include <cstdint>
#include <vector>

#include "hyserve/kernels/sampling.h"
#include "hyserve/worker/hybrid_metadata.h"
#include "hyserve/worker/model.h"

namespace hyserve::worker::layers {

struct attention_step;

using worker::step_sampling;  // hyserve/worker/model.h

// Offsets (in i32 elements) of each array inside the packed buffer. Arrays that a step does not
// carry have length 0 (attention: locs, page_table, seq_lens; TargetVerify trees:
// retrieve_parent; Draft: first_step; a TargetVerify step carrying prefill rows: extend_slots).
struct step_layout {
  int64_t batch = 0, tokens = 0, logit_rows = 0;
  bool attention = false;
  int64_t page_table_stride = 0;  // entries per row of the page table (attention only)
  int64_t parent_entries = 0;     // retrieve_parent elements (batch · tree nodes), 0 = none
  bool first_step = false;        // Draft: one start column per row
  // TargetVerify with extend rows, Mixed with decode rows: the slots the prefill ops run over
  bool extend_slots = false;
  bool sampling = false;          // sampling settings and feed slots per logits row

  int64_t query_start_loc = 0;    // [batch + 1]
  int64_t mamba_slots = 0;        // [batch]
  int64_t has_initial_state = 0;  // [batch] bytes in ceil(batch / 4) elements
  int64_t positions = 0;          // [tokens]
  int64_t token_ids = 0;          // [tokens]
  int64_t logit_token_rows = 0;   // [logit_rows]
  int64_t locs = 0;               // [tokens] (attention)
  int64_t page_table = 0;         // [batch · page_table_stride] (attention)
  int64_t seq_lens = 0;           // [batch] (attention)
  int64_t retrieve_parent = 0;    // [parent_entries]
  int64_t first_step_at = 0;      // [batch] (first_step)
  int64_t extend_slots_at = 0;    // [batch] (extend_slots): mamba slots, the verify / decode rows' set to -1
  int64_t sample_settings_at = 0; // [logit_rows · 8] (sampling): kernels::sample_settings, 8-byte aligned
  int64_t feed_slots_at = 0;      // [logit_rows] (sampling)
  int64_t total = 0;              // elements of the whole buffer
};

step_layout make_step_layout(int64_t batch, int64_t tokens, int64_t logit_rows, bool attention,
                             int64_t page_table_stride, int64_t parent_entries, bool first_step,
                             bool extend_slots = false, bool sampling = false);

// The layout of exactly this step (what an eager step uploads).
step_layout layout_of(const hybrid_metadata& meta, const attention_step* step, bool sampling = false);

// Fills `out` (layout.total elements) from the step. layout.batch / tokens / logit_rows /
// page_table_stride may exceed the step's (a padded decode pack): the extra rows are padding
// rows as described above, and each page-table row is copied into the wider stride. Throws
// invalid_argument_error when the step does not fit the layout. sampling: required when the
// layout has the sampling arrays (padding logits rows: greedy, feeding no slot).
void pack_step(const step_layout& layout, const hybrid_metadata& meta, const attention_step* step,
               const std::vector<int32_t>& token_ids, int32_t* out, const step_sampling* sampling = nullptr);

}  // namespace hyserve::worker::layers
