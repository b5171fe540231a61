#pragma once
// Per-step metadata shared by every SSM layer (and the attention layers' row bookkeeping),
// built by a pure function of the forward batch. Contract: docs/ARCHITECTURE.md, Forward modes and hybrid metadata.
#include <cstdint>
#include <vector>

#include "hyserve/worker/forward_batch.h"

namespace hyserve::worker {

struct hybrid_metadata {
  forward_mode mode = forward_mode::kIdle;
  int32_t batch_size = 0;                 // rows, padding included
  int64_t num_tokens = 0;                 // query_start_loc.back()
  std::vector<int32_t> query_start_loc;   // [bs+1] cumulative token offsets
  std::vector<int32_t> mamba_slots;       // [bs]; -1 = padding
  std::vector<uint8_t> has_initial_state; // [bs]; prefix_len > 0 (Decode/Verify/Draft: 1 unless padding)
  std::vector<int32_t> prefix_lens;       // [bs] cached tokens before this step
  std::vector<int32_t> seq_lens;          // [bs] total length after this step
  std::vector<int32_t> positions;         // [num_tokens] absolute position of each token
  int32_t draft_len = 0;                  // D for TargetVerify / Draft; 0 otherwise
  bool is_tree = false;
  // TargetVerify: rows [0, verify_rows) are verify rows (D tokens, per-step states); rows
  // [verify_rows, bs) are extend rows (prefill chunks: varlen prefill from the slot, final state
  // written to the slot, chain positions, one logit row). verify_rows = bs without extend rows.
  int32_t verify_rows = 0;
  // Mixed: rows [0, mixed_decode_rows) are decode rows (one token on a cached prefix, is_decode)
  // and run the recurrent mixers' one-token update, as in a Decode step, so a decode row gets
  // the same result beside a prefill chunk as in a Decode step (batch invariance); the other
  // rows prefill. A decode row after an extend row prefills its one token.
  int32_t mixed_decode_rows = 0;
  std::vector<int32_t> draft_steps;       // [bs] Draft mode: scratch column per row
  // Tree TargetVerify only, [bs, D] row-major; -1 = none. retrieve_parent[b, 0] = -1 (root).
  std::vector<int32_t> retrieve_next_token;
  std::vector<int32_t> retrieve_next_sibling;
  std::vector<int32_t> retrieve_parent;
  // Rows whose tokens should produce logits: index of the last token of each row (Extend,
  // Decode, Mixed, DraftExtend, Draft, extend rows of TargetVerify), or every token (verify rows
  // of TargetVerify). [n_logit_rows]
  std::vector<int32_t> logit_token_indices;
  // Logit rows of batch row b: [logit_row_start[b], logit_row_start[b + 1]). [bs + 1]
  std::vector<int32_t> logit_row_start;
};

// Builds the metadata for any mode. Throws invalid_argument_error on an inconsistent batch
// (Decode row with ≠1 token, Verify row with ≠D tokens, tree links out of range or cyclic, …).
hybrid_metadata build_hybrid_metadata(const forward_batch& batch);

}  // namespace hyserve::worker
