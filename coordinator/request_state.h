#pragma once
// What the scheduler keeps for one admitted request (docs/ARCHITECTURE.md, One request, end to
// end): its slots and pages, how far its tokens are in the cache, the steps in flight that carry
// it, its prefix-cache holdings, and its speculative-decoding state.
#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "coordinator/request.h"
#include "coordinator/speculative.h"

namespace hyserve::coordinator {

// A request's speculative decoding (the group's speculative_round reads and writes it).
struct spec_request {
  std::optional<spec::draft_budget> budget;
  spec::draft_tree drafts;   // the round in flight (draft_model: grows one token per Draft step)
  int32_t round_drafts = 0;  // drafts that count this round
  // Draft-model trees: the draft's runner-up tokens at the first position (siblings of the
  // greedy chain), and accepted tokens the draft model has not consumed yet (an accepted
  // sibling), fed to it by a DraftExtend step before anything else runs on it.
  std::vector<int32_t> siblings;
  std::vector<int32_t> draft_lag;
  int32_t round_cap = 0;    // draft nodes allowed this round (chain + siblings)
  int32_t chain_nodes = 0;  // nodes 1..chain_nodes of the verified tree are the greedy chain
  int64_t drafted = 0, accepted = 0;
  std::vector<int32_t> lookup_tokens;  // n-gram lookup: prompt + output, contiguous
};

struct request_state {
  generate_request req;
  std::vector<int32_t> output;
  int group = -1;
  int32_t req_slot = -1, mamba_slot = -1;
  std::vector<int32_t> pages;
  // Prefix caching: which of pages the group's tree owns (shared), the tree nodes this request
  // holds, the prompt tokens it found cached, and the checkpoint its first step restores.
  std::vector<uint8_t> page_shared;
  std::vector<int32_t> held_nodes;
  int32_t pinned_node = -1;  // prefix-tree node whose checkpoint it started from (pinned)
  int32_t cached_tokens = 0;
  int32_t restore_from = -1;
  // Decode checkpoint: the state after gen_ckpt_pages pages of prompt + output, saved by the
  // decode step that fed the token ending that page (the newest one that came back); the tree
  // takes it with those pages when the request finishes (a later turn resends this answer).
  int32_t gen_ckpt_slot = -1, gen_ckpt_pages = 0;
  uint64_t admit_tick = 0;  // the tree's clock when the request was admitted
  int32_t consumed = 0;     // tokens of prompt + output already in the cache
  bool pages_sent = false;
  int32_t in_steps = 0;  // steps in flight that carry a row of this request
  bool cancelled = false;
  // Overlapped loop: tokens fed by plain steps in flight, and the tokens those steps will
  // emit (their values reach the worker's next step as placeholders).
  int32_t flight_consumed = 0, flight_outputs = 0;
  std::chrono::steady_clock::time_point first_token;
  spec_request spec;

  int32_t total_len() const { return static_cast<int32_t>(req.input_ids.size() + output.size()); }
  int32_t token_at(int32_t i) const {
    const auto n = static_cast<int32_t>(req.input_ids.size());
    return i < n ? req.input_ids[static_cast<size_t>(i)] : output[static_cast<size_t>(i - n)];
  }
  // What the cache and the output will hold once the steps in flight are done.
  int32_t fed() const { return consumed + flight_consumed; }
  int32_t known_len() const { return total_len() + flight_outputs; }
  // The token at position i of known_len(): a placeholder (the worker's last sampled token
  // of the request's state slot) where the step in flight has not returned it yet.
  int32_t token_or_placeholder(int32_t i) const { return i < total_len() ? token_at(i) : -(mamba_slot + 1); }
};

}  // namespace hyserve::coordinator
