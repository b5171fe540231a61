#pragma once
// ForwardBatch: what one worker executes in one step, as decoded from a plan. Rows are in
// plan order; a row with mamba_slot == -1 is padding and is skipped by every kernel.
#include <cstdint>
#include <vector>

#include "hyserve/worker/forward_mode.h"

namespace hyserve::worker {

struct batch_row {
  int64_t request_id = -1;
  int32_t req_slot = -1;    // row of the req→token table; -1 for padding
  int32_t mamba_slot = -1;  // SSM/conv state slot; -1 = padding row
  int32_t prefix_len = 0;   // tokens of this request already cached before this step
  std::vector<int32_t> tokens;  // tokens consumed this step (Decode: 1; TargetVerify: D)
  // Tree drafts only (TargetVerify with is_tree): per node i < D, the first child and the next
  // sibling in the draft tree (-1 = none). Node 0 is the root (the last accepted token).
  std::vector<int32_t> retrieve_next_token;
  std::vector<int32_t> retrieve_next_sibling;
  // Draft mode: index of this draft step within the round (selects the scratch column).
  int32_t draft_step = 0;
  // Mixed mode: true when the row is a decode row (one token continuing a prompt).
  bool is_decode = false;
  // The request disabled sparse attention (sampling_params.sparse: false): dense attention only.
  bool dense_attention = false;
};

struct forward_batch {
  forward_mode mode = forward_mode::kIdle;
  std::vector<batch_row> rows;
  int32_t draft_len = 0;  // D for TargetVerify / Draft rounds
  bool is_tree = false;   // TargetVerify with tree drafts
  // TargetVerify only: the last extend_rows rows are prefill chunks riding in the verify step
  // (extend semantics: any token count on top of the cached prefix, one logit row each); the
  // rows before them are the verify rows.
  int32_t extend_rows = 0;

  int64_t num_tokens() const;
};

}  // namespace hyserve::worker
