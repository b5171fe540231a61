#include "hyserve/worker/hybrid_metadata.h"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "hyserve/common/error.h"

namespace hyserve::worker {
namespace {

constexpr int64_t kMaxI32 = std::numeric_limits<int32_t>::max();

std::string str(int64_t v) { return std::to_string(v); }

[[noreturn]] void fail_batch(const forward_batch& b, const std::string& rule) {
  throw invalid_argument_error(std::string(forward_mode_name(b.mode)) + " batch: " + rule);
}

[[noreturn]] void fail_row(const forward_batch& b, size_t i, const std::string& rule) {
  throw invalid_argument_error(std::string(forward_mode_name(b.mode)) + " batch, row " + str(static_cast<int64_t>(i)) +
                               " (request " + str(b.rows[i].request_id) + "): " + rule);
}

bool is_padding(const batch_row& r) { return r.mamba_slot == -1; }

// Checks shared by every mode that has rows: slots, prefix lengths, int32 ranges, and that
// tree links appear only where they are read.
void check_rows_common(const forward_batch& b, bool padding_allowed) {
  if (b.rows.empty()) fail_batch(b, "has no rows; a step with nothing to run is an idle batch");
  if (b.is_tree && b.mode != forward_mode::kTargetVerify)
    fail_batch(b, "is_tree is set; tree drafts exist only in target_verify batches");
  if (b.extend_rows != 0 && b.mode != forward_mode::kTargetVerify)
    fail_batch(b, "extend_rows is set; extend rows ride only in target_verify batches");
  const bool tree = b.mode == forward_mode::kTargetVerify && b.is_tree;
  std::unordered_map<int32_t, size_t> slot_owner;
  int64_t total = 0;
  for (size_t i = 0; i < b.rows.size(); ++i) {
    const batch_row& r = b.rows[i];
    if (r.mamba_slot < -1)
      fail_row(b, i, "mamba_slot " + str(r.mamba_slot) + " is negative; -1 marks padding, real rows need a slot >= 0");
    if (is_padding(r) && !padding_allowed)
      fail_row(b, i, "is a padding row (mamba_slot -1); padding rows are allowed only in decode, target_verify and "
                     "draft batches");
    if (r.prefix_len < 0) fail_row(b, i, "prefix_len " + str(r.prefix_len) + " is negative");
    const auto n = static_cast<int64_t>(r.tokens.size());
    if (r.prefix_len + n > kMaxI32)
      fail_row(b, i, "sequence length " + str(r.prefix_len + n) + " exceeds the int32 range");
    total += n;
    if (!is_padding(r)) {
      const auto [it, inserted] = slot_owner.emplace(r.mamba_slot, i);
      if (!inserted)
        fail_row(b, i, "mamba_slot " + str(r.mamba_slot) + " is already used by row " +
                           str(static_cast<int64_t>(it->second)) + "; two rows would write the same state");
    }
    if (!tree && (!r.retrieve_next_token.empty() || !r.retrieve_next_sibling.empty()))
      fail_row(b, i, "carries tree links but the batch is not a tree target_verify batch");
  }
  if (total > kMaxI32) fail_batch(b, "total token count " + str(total) + " exceeds the int32 range");
}

hybrid_metadata start(const forward_batch& b) {
  hybrid_metadata md;
  md.mode = b.mode;
  md.batch_size = static_cast<int32_t>(b.rows.size());
  md.verify_rows = b.mode == forward_mode::kTargetVerify ? md.batch_size : 0;
  md.logit_row_start.reserve(b.rows.size() + 1);
  md.logit_row_start.push_back(0);
  const size_t bs = b.rows.size();
  md.query_start_loc.reserve(bs + 1);
  md.query_start_loc.push_back(0);
  md.mamba_slots.reserve(bs);
  md.has_initial_state.reserve(bs);
  md.prefix_lens.reserve(bs);
  md.seq_lens.reserve(bs);
  md.positions.reserve(static_cast<size_t>(b.num_tokens()));
  return md;
}

// Appends the per-row fields; positions and logit rows are mode-specific and added by callers.
void push_row(hybrid_metadata& md, const batch_row& r, bool has_initial_state) {
  const auto n = static_cast<int32_t>(r.tokens.size());
  md.query_start_loc.push_back(md.query_start_loc.back() + n);
  md.mamba_slots.push_back(r.mamba_slot);
  md.has_initial_state.push_back(has_initial_state ? 1 : 0);
  md.prefix_lens.push_back(r.prefix_len);
  md.seq_lens.push_back(r.prefix_len + n);
}

void push_chain_positions(hybrid_metadata& md, const batch_row& r) {
  const auto n = static_cast<int32_t>(r.tokens.size());
  for (int32_t t = 0; t < n; ++t) md.positions.push_back(r.prefix_len + t);
}

void finish(hybrid_metadata& md) { md.num_tokens = md.query_start_loc.back(); }

// Marks the end of row b's logit rows (call after pushing them).
void close_logit_row(hybrid_metadata& md) {
  md.logit_row_start.push_back(static_cast<int32_t>(md.logit_token_indices.size()));
}

// Extend, DraftExtend and Mixed: every row extends its cached prefix by ≥1 token; Mixed decode
// rows are extends of exactly one token on top of a cached prefix. One logit row per row.
hybrid_metadata build_extend_like(const forward_batch& b) {
  check_rows_common(b, /*padding_allowed=*/false);
  hybrid_metadata md = start(b);
  for (size_t i = 0; i < b.rows.size(); ++i) {
    const batch_row& r = b.rows[i];
    if (b.mode == forward_mode::kMixed && r.is_decode) {
      if (r.tokens.size() != 1)
        fail_row(b, i, "is a decode row with " + str(static_cast<int64_t>(r.tokens.size())) +
                           " tokens; decode rows of a mixed batch have exactly 1");
      if (r.prefix_len == 0)
        fail_row(b, i, "is a decode row with prefix_len 0; a decode row continues a cached prefix (prefix_len >= 1)");
    } else if (r.tokens.empty()) {
      fail_row(b, i, "has 0 tokens; extend rows need at least 1");
    }
    push_row(md, r, r.prefix_len > 0);
    push_chain_positions(md, r);
    md.logit_token_indices.push_back(md.query_start_loc.back() - 1);
    close_logit_row(md);
    if (b.mode == forward_mode::kMixed && r.is_decode && md.mixed_decode_rows == static_cast<int32_t>(i))
      ++md.mixed_decode_rows;
  }
  finish(md);
  return md;
}

// Decode and Draft: exactly one token per row on top of a cached prefix. Padding rows keep
// their token and their logit row so the step's shapes do not depend on how many rows are real.
hybrid_metadata build_single_token(const forward_batch& b) {
  check_rows_common(b, /*padding_allowed=*/true);
  const bool draft = b.mode == forward_mode::kDraft;
  if (draft && b.draft_len < 1) fail_batch(b, "draft_len " + str(b.draft_len) + " must be >= 1");
  hybrid_metadata md = start(b);
  if (draft) {
    md.draft_len = b.draft_len;
    md.draft_steps.reserve(b.rows.size());
  }
  for (size_t i = 0; i < b.rows.size(); ++i) {
    const batch_row& r = b.rows[i];
    if (r.tokens.size() != 1)
      fail_row(b, i, "has " + str(static_cast<int64_t>(r.tokens.size())) + " tokens; " +
                         std::string(forward_mode_name(b.mode)) + " rows have exactly 1");
    if (!is_padding(r) && r.prefix_len == 0)
      fail_row(b, i, "has prefix_len 0; a " + std::string(forward_mode_name(b.mode)) +
                         " row continues a cached prefix (prefix_len >= 1)");
    if (draft) {
      if (r.draft_step < 0 || r.draft_step >= b.draft_len)
        fail_row(b, i, "draft_step " + str(r.draft_step) + " is outside [0, draft_len " + str(b.draft_len) + ")");
      md.draft_steps.push_back(r.draft_step);
    }
    push_row(md, r, !is_padding(r));
    push_chain_positions(md, r);
    md.logit_token_indices.push_back(md.query_start_loc.back() - 1);
    close_logit_row(md);
  }
  finish(md);
  return md;
}

// Validates one row's draft tree and derives parent and depth of every node by walking the
// links from the root: the children of node n are next[n], next_sibling[next[n]], …
// Each node must be reached exactly once, and parents must precede their children (the scan
// computes node t's state from its parent's saved step state, so the parent's step comes first).
void derive_tree(const forward_batch& b, size_t i, const std::vector<int32_t>& next, const std::vector<int32_t>& sibling,
                 std::vector<int32_t>& parent, std::vector<int32_t>& depth) {
  const auto d = static_cast<int32_t>(parent.size());
  if (static_cast<int64_t>(next.size()) != d || static_cast<int64_t>(sibling.size()) != d)
    fail_row(b, i, "tree links have lengths " + str(static_cast<int64_t>(next.size())) + " (next_token) and " +
                       str(static_cast<int64_t>(sibling.size())) + " (next_sibling); both must be draft_len " + str(d));
  for (int32_t k = 0; k < d; ++k) {
    const auto uk = static_cast<size_t>(k);
    if (next[uk] < -1 || next[uk] >= d)
      fail_row(b, i, "retrieve_next_token[" + str(k) + "] = " + str(next[uk]) + " is outside [-1, " + str(d) + ")");
    if (sibling[uk] < -1 || sibling[uk] >= d)
      fail_row(b, i,
               "retrieve_next_sibling[" + str(k) + "] = " + str(sibling[uk]) + " is outside [-1, " + str(d) + ")");
  }
  if (sibling[0] != -1)
    fail_row(b, i, "node 0 (the root) has next sibling " + str(sibling[0]) + "; the root has no siblings");

  std::fill(parent.begin(), parent.end(), -1);
  std::fill(depth.begin(), depth.end(), 0);
  std::vector<uint8_t> reached(static_cast<size_t>(d), 0);
  reached[0] = 1;
  std::vector<int32_t> stack = {0};
  while (!stack.empty()) {
    const int32_t n = stack.back();
    stack.pop_back();
    for (int32_t c = next[static_cast<size_t>(n)]; c != -1; c = sibling[static_cast<size_t>(c)]) {
      const auto uc = static_cast<size_t>(c);
      if (reached[uc]) {
        for (int32_t a = n; a != -1; a = parent[static_cast<size_t>(a)])
          if (a == c)
            fail_row(b, i, "tree links form a cycle: node " + str(c) + " is reached again from its descendant " + str(n));
        if (parent[uc] == n)
          fail_row(b, i, "tree links form a cycle in the sibling list of node " + str(n) + " at node " + str(c));
        fail_row(b, i, "node " + str(c) + " is reached twice (as a child of node " + str(parent[uc]) + " and of node " +
                           str(n) + "); every draft node has one parent");
      }
      reached[uc] = 1;
      parent[uc] = n;
      depth[uc] = depth[static_cast<size_t>(n)] + 1;
      stack.push_back(c);
    }
  }
  for (int32_t k = 0; k < d; ++k)
    if (!reached[static_cast<size_t>(k)])
      fail_row(b, i, "node " + str(k) + " is not reachable from node 0 through the tree links");
  for (int32_t k = 1; k < d; ++k)
    if (parent[static_cast<size_t>(k)] >= k)
      fail_row(b, i, "node " + str(k) + " has parent " + str(parent[static_cast<size_t>(k)]) +
                         "; draft nodes must be ordered parent first (parent index < node index)");
}

// TargetVerify: D tokens per verify row (last accepted token + D-1 drafts), a logit row per
// token. Padding rows keep their D tokens and D logit rows; in tree mode a padding row may omit
// its links, and is then laid out as a chain. The last extend_rows rows are prefill chunks (as
// in Extend: at least one token, chain positions, one logit row for the last token).
hybrid_metadata build_verify(const forward_batch& b) {
  check_rows_common(b, /*padding_allowed=*/true);
  const int32_t d = b.draft_len;
  if (d < 1) fail_batch(b, "draft_len " + str(d) + " must be >= 1");
  if (b.extend_rows < 0 || static_cast<size_t>(b.extend_rows) >= b.rows.size())
    fail_batch(b, "extend_rows " + str(b.extend_rows) + " must be in [0, rows " + str(static_cast<int64_t>(b.rows.size())) +
                      "): a verify step has at least one verify row");
  const size_t n_verify = b.rows.size() - static_cast<size_t>(b.extend_rows);
  hybrid_metadata md = start(b);
  md.draft_len = d;
  md.is_tree = b.is_tree;
  md.verify_rows = static_cast<int32_t>(n_verify);
  const size_t ud = static_cast<size_t>(d);
  md.logit_token_indices.reserve(b.rows.size() * ud);
  std::vector<int32_t> chain_next, chain_sibling(ud, -1), parent(ud), depth(ud);
  if (b.is_tree) {
    md.retrieve_next_token.reserve(b.rows.size() * ud);
    md.retrieve_next_sibling.reserve(b.rows.size() * ud);
    md.retrieve_parent.reserve(b.rows.size() * ud);
    for (int32_t k = 0; k < d; ++k) chain_next.push_back(k + 1 < d ? k + 1 : -1);
  }
  for (size_t i = 0; i < b.rows.size(); ++i) {
    const batch_row& r = b.rows[i];
    if (i >= n_verify) {  // an extend row
      if (is_padding(r)) fail_row(b, i, "is a padding row; the extend rows of a target_verify batch are real prefill chunks");
      if (r.tokens.empty()) fail_row(b, i, "has 0 tokens; extend rows need at least 1");
      if (!r.retrieve_next_token.empty() || !r.retrieve_next_sibling.empty())
        fail_row(b, i, "is an extend row with tree links; only verify rows carry tree links");
      push_row(md, r, r.prefix_len > 0);
      push_chain_positions(md, r);
      md.logit_token_indices.push_back(md.query_start_loc.back() - 1);
      close_logit_row(md);
      continue;
    }
    if (r.tokens.size() != ud)
      fail_row(b, i, "has " + str(static_cast<int64_t>(r.tokens.size())) + " tokens; target_verify rows have exactly " +
                         "draft_len = " + str(d) + " (the last accepted token and " + str(d - 1) + " drafts)");
    if (!is_padding(r) && r.prefix_len == 0)
      fail_row(b, i, "has prefix_len 0; a target_verify row continues a cached prefix (prefix_len >= 1)");
    const int32_t row_start = md.query_start_loc.back();
    push_row(md, r, !is_padding(r));
    if (b.is_tree) {
      const bool use_chain = is_padding(r) && r.retrieve_next_token.empty() && r.retrieve_next_sibling.empty();
      const std::vector<int32_t>& next = use_chain ? chain_next : r.retrieve_next_token;
      const std::vector<int32_t>& sibling = use_chain ? chain_sibling : r.retrieve_next_sibling;
      derive_tree(b, i, next, sibling, parent, depth);
      md.retrieve_next_token.insert(md.retrieve_next_token.end(), next.begin(), next.end());
      md.retrieve_next_sibling.insert(md.retrieve_next_sibling.end(), sibling.begin(), sibling.end());
      md.retrieve_parent.insert(md.retrieve_parent.end(), parent.begin(), parent.end());
      for (int32_t k = 0; k < d; ++k) md.positions.push_back(r.prefix_len + depth[static_cast<size_t>(k)]);
    } else {
      push_chain_positions(md, r);
    }
    for (int32_t k = 0; k < d; ++k) md.logit_token_indices.push_back(row_start + k);
    close_logit_row(md);
  }
  finish(md);
  return md;
}

// Idle: no rows; the step still runs so the worker joins every collective.
hybrid_metadata build_idle(const forward_batch& b) {
  if (b.extend_rows != 0) fail_batch(b, "extend_rows is set; extend rows ride only in target_verify batches");
  if (!b.rows.empty())
    fail_batch(b, "has " + str(static_cast<int64_t>(b.rows.size())) + " rows; an idle batch has none");
  if (b.is_tree) fail_batch(b, "is_tree is set; tree drafts exist only in target_verify batches");
  return start(b);
}

}  // namespace

hybrid_metadata build_hybrid_metadata(const forward_batch& batch) {
  switch (batch.mode) {
    case forward_mode::kExtend:
    case forward_mode::kMixed:
    case forward_mode::kDraftExtend: return build_extend_like(batch);
    case forward_mode::kDecode:
    case forward_mode::kDraft: return build_single_token(batch);
    case forward_mode::kIdle: return build_idle(batch);
    case forward_mode::kTargetVerify: return build_verify(batch);
  }
  // A mode cast from a byte that is not an enumerator: report it like a bad wire byte.
  (void)forward_mode_from_byte(static_cast<uint8_t>(batch.mode));
  throw_check_failure("build_hybrid_metadata", __FILE__, __LINE__, "unhandled forward mode");
}

}  // namespace hyserve::worker
