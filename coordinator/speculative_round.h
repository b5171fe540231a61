#pragma once
// One data-parallel group's speculative rounds (docs/ARCHITECTURE.md, Speculative decoding), the
// state machine beside the scheduler. A round runs over the group's decode-ready requests:
// draft_model rounds are Draft steps 0..k then one TargetVerify step, n-gram rounds the verify
// step only; prefill chunks of the other requests ride in the verify step. The round decides
// whether it pays (from the measured step times), builds each of its steps, and takes their
// results: accepted tokens go to the requests through the scheduler (round_host), state commits
// and KV moves into the next plan. The scheduler owns the requests, the memory and the link.
#include <cstdint>
#include <optional>
#include <vector>

#include "hyserve/common/config.h"
#include "hyserve/common/wire.h"
#include "coordinator/request_state.h"
#include "coordinator/speculative.h"

namespace hyserve::coordinator {

enum class step_kind : uint8_t { kPlain, kDraft, kVerify, kDraftCatchUp };

// What the scheduler remembers of a step it sends, per row: the request it carries (0: a padding
// row), the tokens it feeds to the cache and whether it emits its sampled token (plain steps);
// the step's kind, and the key its measured time is filed under (cost_kind -1: not filed).
struct step_rows {
  step_kind kind = step_kind::kPlain;
  std::vector<uint64_t> ids;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> emits;
  int cost_kind = -1;
  int32_t cost_rows = 0, cost_width = 0;
  void add(uint64_t id, int32_t fed, bool emit = false) {
    ids.push_back(id);
    tokens.push_back(fed);
    emits.push_back(emit ? 1 : 0);
  }
};

// A step ready to send.
struct built_step {
  wire::step_plan plan;
  const char* mode = "decode";
  step_rows rows;
};

// The scheduler's side of a round: its requests, and how their rows are made and their tokens
// taken (the same as for plain steps).
class round_host {
 public:
  // nullptr when the request has finished.
  virtual request_state* find(uint64_t id) = 0;
  virtual wire::plan_row base_row(request_state& r) = 0;
  // The next prefill chunk of r (n tokens) as a plan row.
  virtual wire::plan_row prefill_row(request_state& r, int32_t n) = 0;
  // The length of r's next prefill chunk within budget tokens (0: it does not fit).
  virtual int32_t next_chunk(const request_state& r, int32_t budget) = 0;
  // Appends tokens to r's output; true when that finished the request.
  virtual bool emit(request_state& r, const std::vector<int32_t>& tokens, const wire::row_result* row) = 0;
  // A row the worker refused: fails its request and returns true.
  virtual bool row_failed(uint64_t id, const wire::step_result& res, size_t row) = 0;
  // A verify row's drafts and accepted drafts (metrics).
  virtual void on_spec(int64_t drafted, int64_t accepted) = 0;

 protected:
  ~round_host() = default;
};

class speculative_round {
 public:
  // The keys of the measured step times (spec::step_costs::entry::kind).
  static constexpr int kCostDecode = 0, kCostVerify = 1, kCostDraft = 2;

  speculative_round(const service_config& cfg, int32_t page_size, int32_t max_context);

  bool active() const { return active_; }
  // A round may start unless the last verify step left prefill waiting without a token budget
  // for it (prefill_waiting): then a plain step carries the prefill first, so it cannot starve.
  bool may_start(bool prefill_waiting) const { return !(prefill_starved_ && prefill_waiting); }
  void prefill_served() { prefill_starved_ = false; }

  // Starts a round over decode_ids (prefill_ids ride in its verify step): its first step, or
  // nothing when no request drafts or the measured step times say the round would not pay.
  std::optional<built_step> start(round_host& h, const std::vector<uint64_t>& decode_ids,
                                  const std::vector<uint64_t>& prefill_ids);
  // The active round's next step.
  built_step next_step(round_host& h);
  // Draft-model trees: a DraftExtend step feeding the draft model the accepted tokens it missed
  // (an accepted sibling), before anything else runs on it; nothing when no request lags.
  std::optional<built_step> catch_up(round_host& h, const std::vector<uint64_t>& running);
  // The result of one of the round's steps (rows as sent).
  void take_result(round_host& h, const step_rows& rows, const wire::step_result& res);
  // A step failed: the round is over.
  void abort() { active_ = false; }
  // The state commits and KV moves the last verify step asks of the next plan.
  void move_ops_into(wire::step_plan& plan);

  void record_time(const step_rows& rows, double seconds) {
    if (rows.cost_kind >= 0) costs_.add(rows.cost_kind, rows.cost_rows, rows.cost_width, seconds);
  }
  const spec::step_costs& costs() const { return costs_; }
  void seed_costs(const spec::step_costs& costs) { costs_ = costs; }

 private:
  // The round's predicted gain over a plain step (spec::round_gain) from the measured step times
  // and the requests' acceptance estimates (infinite while the round's time is not measured yet).
  double gain(round_host& h, const std::vector<uint64_t>& decode_ids, int32_t most, int32_t cap_all) const;
  void take_verify(round_host& h, const wire::step_result& res);
  int32_t tree_width() const;

  speculative_section cfg_;
  int32_t max_batch_tokens_, page_size_, max_context_;
  bool active_ = false;
  std::vector<uint64_t> ids_;  // the round's requests; their rows keep this order across steps
  int32_t k_ = 0, step_ = 0;
  // Requests in prefill when the round started: their next chunks ride in the round's verify
  // step as extend rows, within max_batch_tokens.
  std::vector<uint64_t> prefill_;
  bool prefill_starved_ = false;
  spec::step_costs costs_;
  int64_t skipped_rounds_ = 0;    // consecutive rounds the cost check skipped
  spec::acceptance_prior accept_;  // acceptance over the group's rounds (requests' prior)
  std::vector<wire::commit_op> commits_, draft_commits_;
  std::vector<wire::kv_move_op> kv_moves_;
};

}  // namespace hyserve::coordinator
