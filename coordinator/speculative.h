#pragma once
// Speculative decoding in the coordinator (DESIGN.md §8): n-gram prompt-lookup drafts over a
// request's own tokens, the acceptance rule, and the per-request draft budget that backs off
// when acceptance is low. Pure functions of their inputs; the scheduler owns the rounds.
#include <cstdint>
#include <vector>

#include "hyserve/common/config.h"

namespace hyserve::coordinator::spec {

// A draft tree over nodes 1..n (node 0 is the last accepted token, the root). tokens[i] is
// node i+1's token; parent[i] is node i+1's parent node (0 = the root). A chain has
// parent[i] = i.
struct draft_tree {
  std::vector<int32_t> tokens;
  std::vector<int32_t> parent;
  bool is_chain() const;
  // Links in the TargetVerify layout over D = tokens.size() + 1 nodes: next_token[n] = first
  // child of n, next_sibling[n] = next child of n's parent (-1 = none).
  void links(std::vector<int32_t>& next_token, std::vector<int32_t>& next_sibling) const;
};

// Prompt lookup: for n from max_match down to min_match, the most recent earlier occurrence of
// the last n tokens whose continuation is non-empty gives the draft (up to max_drafts tokens).
// With max_tree_width > 1, up to that many distinct continuations (different first tokens, the
// most recent first) share the root; max_drafts bounds the total node count. Empty when no
// suffix matches.
draft_tree ngram_propose(const std::vector<int32_t>& tokens, const ngram_spec_section& cfg, int32_t max_drafts);

// The accepted path given the target's sampled token at every node (target[k] = the token the
// target samples after node k, k = 0 the root): from the root, follow the child whose draft
// token equals the target sample, as long as one exists. Returns the accepted node indices
// (without the root); the bonus token is target[path.empty() ? 0 : path.back()].
std::vector<int32_t> accept_path(const draft_tree& tree, const std::vector<int32_t>& target);

// Per-request draft budget: starts at num_draft_tokens, halves when a round's acceptance rate
// falls below min_accept_rate, doubles back (up to num_draft_tokens) when it is above it. At 0
// the request decodes plainly for `cooldown` rounds, then probes with one draft.
class draft_budget {
 public:
  draft_budget(int32_t max_drafts, double min_rate) : max_(max_drafts), budget_(max_drafts), min_rate_(min_rate) {}
  // Drafts allowed this round (0 = plain decode).
  int32_t allowed();
  void record(int32_t drafted, int32_t accepted);

 private:
  static constexpr int32_t kCooldown = 4;
  int32_t max_;
  int32_t budget_;
  double min_rate_;
  int32_t cooldown_ = 0;
};

}  // namespace hyserve::coordinator::spec
