#pragma once
// Speculative decoding in the coordinator (docs/ARCHITECTURE.md, Speculative decoding): n-gram prompt-lookup drafts over a
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
  int32_t match_len = 0;  // n-gram drafts: the length of the suffix that matched
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
// the request decodes plainly for a cool-down, then probes with one draft; the cool-down is 4
// rounds for the first 16 failed probes, then doubles with every further failed probe (up to
// 256), and is back to 4 once a round meets the rate. It also keeps an estimate of the
// per-draft acceptance probability (recent rounds count more) for the round's cost/benefit
// check.
class draft_budget {
 public:
  draft_budget(int32_t max_drafts, double min_rate) : max_(max_drafts), budget_(max_drafts), min_rate_(min_rate) {}
  // Drafts allowed this round (0 = plain decode).
  int32_t allowed();
  // During a cool-down: probe now (strong evidence that drafts would be accepted, e.g. an n-gram
  // match of the longest length). A failed probe counts as any other.
  void probe_now() {
    cooldown_ = 0;
    probing_ = true;
  }
  void record(int32_t drafted, int32_t accepted);
  // The probability that a draft is accepted given that the drafts before it were: the recent
  // rounds' accepted drafts and first rejections with a prior worth two observations (prior 1/2:
  // the Laplace estimate; the scheduler passes its group's acceptance_prior).
  double accept_probability(double prior = 0.5) const { return (hits_ + 2.0 * prior) / (hits_ + misses_ + 2.0); }
  // Expected accepted tokens of a chain of n drafts: p + p² + … + pⁿ.
  double expected_accepted(int32_t n, double prior = 0.5) const;
  int32_t cooldown_length() const { return cooldown_len_; }
  // A round skipped by the cost check: the evidence fades slowly (towards the prior), so a
  // request whose drafts were poor gets another chance after a while.
  void forget() {
    hits_ *= kForget;
    misses_ *= kForget;
  }

 private:
  static constexpr int32_t kCooldown = 4;
  static constexpr int32_t kMaxCooldown = 256;
  static constexpr int32_t kProbesAtBase = 16;  // failed probes before the cool-down grows
  static constexpr double kDecay = 0.8;    // weight of the previous rounds' evidence per round
  static constexpr double kForget = 0.995;  // per skipped round (half-life ~140 rounds)
  int32_t max_;
  int32_t budget_;
  double min_rate_;
  int32_t cooldown_ = 0;
  int32_t cooldown_len_ = kCooldown;
  int32_t failed_probes_ = 0;
  bool probing_ = false;  // the last allowed() was a probe after a cool-down
  double hits_ = 0, misses_ = 0;
};

// The acceptance seen over a group's recent rounds, all requests together: the prior of each
// request's own estimate, so a request without evidence starts from what the service has seen
// (a fixed prior of 1/2 prices rounds out at batch 1 when a verify step costs twice a decode
// step, however repetitive the text). Unmeasured until a round with drafts has run: the cost
// check then prices rounds with the optimistic kUnmeasured.
class acceptance_prior {
 public:
  static constexpr double kUnmeasured = 0.9;
  void record(int32_t drafted, int32_t accepted);
  bool measured() const { return measured_; }
  // Laplace estimate over the recent rounds (1/2 when unmeasured).
  double probability() const { return (hits_ + 1.0) / (hits_ + misses_ + 2.0); }

 private:
  static constexpr double kDecay = 0.9;  // weight of the evidence before each request's round recorded
  bool measured_ = false;
  double hits_ = 0, misses_ = 0;
};

// A speculative round against a plain decode step, from measured step times: a plain step
// yields `rows` tokens in decode_s; the round yields rows + expected accepted tokens in round_s
// (its draft steps and the verify step). round_gain is the ratio of the round's tokens per second
// to the plain step's. Times <= 0 are not measured yet: an unknown round has an infinite gain (it
// runs, and so gets measured); a known round against an unknown plain step has none (the plain
// step runs and gets measured).
double round_gain(int32_t rows, double expected_accepted, double decode_s, double round_s);

// The gain a round must promise to run: the step times leave out per-token host work (accepting,
// committing, streaming) and rows that finish inside a round, which a margin covers (measured on
// the 9B-shaped model at batch 32: a predicted 1.11x round gave 0.90x).
constexpr double kMinRoundGain = 1.2;

// round_gain(...) >= kMinRoundGain.
bool round_pays_off(int32_t rows, double expected_accepted, double decode_s, double round_s);

// Step times by a key (step kind, rows, tokens per row): the second sample replaces the first
// when smaller (the first step of a shape may carry one-time costs: scratch growth, kernel
// choice), later ones form an exponential moving average with each sample clipped to twice the
// estimate. A key with one sample counts as not measured (get and estimate ignore it), so the
// step runs once more and a one-time cost cannot price a shape out for good.
class step_costs {
 public:
  static constexpr int64_t kTrusted = 2;  // samples before a key's time is used
  // Seconds of the key's steps (<= 0: none measured, or one sample only).
  double get(int kind, int32_t rows, int32_t width) const;
  // Like get, but without a sample of this width, from another width of the same kind and rows:
  // the time above base_s (a plain step's) grows linearly with the extra tokens per row (with
  // base_s unknown, the measured width's time). With no width of these rows measured, the same
  // from the fewest rows above that are measured: a step of more rows takes at least as long, so
  // a shape the batch passes through once (rows finishing one by one) is priced, not run blind.
  double estimate(int kind, int32_t rows, int32_t width, double base_s) const;
  void add(int kind, int32_t rows, int32_t width, double seconds);

  struct entry {
    int kind;  // the scheduler's step kind: 0 decode, 1 verify, 2 draft
    int32_t rows, width;
    double seconds;
    int64_t samples;
  };
  // Every key measured, in the order first seen (for reports).
  const std::vector<entry>& entries() const { return entries_; }

 private:
  double estimate_rows(int kind, int32_t rows, int32_t width, double base_s) const;

  std::vector<entry> entries_;
};

}  // namespace hyserve::coordinator::spec
