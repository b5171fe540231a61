// The scheduler's speculative rounds (docs/ARCHITECTURE.md, Speculative decoding): whether a
// round pays (the measured step times), the draft / verify steps of a round, and taking a
// verify step's result.
#include "coordinator/scheduler.h"

#include <algorithm>
#include <cstdio>

#include "hyserve/common/error.h"
#include "hyserve/common/forward_mode.h"

namespace hyserve::coordinator {

namespace {

// Every kRemeasureAfter-th round the cost check skips runs anyway, when its predicted gain is
// at least kRemeasureGain (a stale table can be that far off; a round predicted at a fraction
// of that would not pay however its times have drifted).
constexpr int64_t kRemeasureAfter = 128;
constexpr double kRemeasureGain = 0.8;

}  // namespace

// Starts a speculative round over the decode-ready requests. n-gram: one TargetVerify step with
// the drafts found by prompt lookup. draft_model: Draft steps 0..k (step j consumes the last
// accepted token, then draft j, and proposes draft j+1; the extra step k lets the draft's state
// reach every accepted length), then TargetVerify. Returns false when no request drafts.
bool scheduler::start_round(int g, const std::vector<uint64_t>& decode_ids, const std::vector<uint64_t>& prefill_ids) {
  group_state& gs = groups_[static_cast<size_t>(g)];
  const speculative_section& sc = cfg_.speculative;
  const int32_t ps = hellos_.front().page_size;
  int32_t most = 0;
  int32_t cap_all = sc.num_draft_tokens;
  for (uint64_t id : decode_ids) {
    request_state& r = requests_.at(id);
    // Verify writes positions consumed .. consumed + drafts: they must exist in the page table.
    const int32_t room = std::min(info_.max_context, static_cast<int32_t>(r.pages.size()) * ps) - r.total_len();
    const int32_t cap = std::max(0, std::min(r.budget->allowed(), room));
    cap_all = std::min(cap_all, std::max(0, room));
    r.drafts = {};
    r.round_drafts = cap;
    if (sc.algorithm == speculative_algorithm::kNgram && room > 0) {
      // Tokens only grow: the contiguous copy takes the new ones.
      for (auto i = static_cast<int32_t>(r.lookup_tokens.size()); i < r.total_len(); ++i)
        r.lookup_tokens.push_back(r.token_at(i));
      if (cap > 0) {
        r.drafts = spec::ngram_propose(r.lookup_tokens, sc.ngram, cap);
      } else {
        // Backed off: a match of the longest suffix length (the text repeats itself) is strong
        // enough evidence to probe with one draft before the cool-down ends.
        spec::draft_tree probe = spec::ngram_propose(r.lookup_tokens, sc.ngram, 1);
        if (sc.ngram.max_match >= 2 && probe.match_len >= sc.ngram.max_match) {
          r.budget->probe_now();
          r.drafts = std::move(probe);
        }
      }
      r.round_drafts = static_cast<int32_t>(r.drafts.tokens.size());
    }
    most = std::max(most, r.round_drafts);
  }
  if (most == 0) return false;
  if (sc.cost_check && prefill_ids.empty()) {
    const double gain = round_gain(g, decode_ids, most, cap_all);
    if (gain < spec::kMinRoundGain &&
        (++gs.skipped_rounds % kRemeasureAfter != 0 || gain < kRemeasureGain)) {
      // Plain decoding yields about as many tokens per second as this round is expected to, or
      // more: skip it (a skipped round within reach of paying runs now and then, so the times
      // it was judged by are measured again).
      for (uint64_t id : decode_ids) requests_.at(id).budget->forget();
      return false;
    }
  }
  gs.skipped_rounds = 0;
  gs.round_ids = decode_ids;
  gs.round_prefill = prefill_ids;
  gs.round_step = 0;
  if (sc.algorithm == speculative_algorithm::kDraftModel) {
    gs.round_k = std::min(most, cap_all);
    if (gs.round_k == 0) return false;
    // A tree leaves room for the siblings of the first position within num_draft_tokens.
    const int32_t width = draft_tree_width();
    if (width > 1) gs.round_k = std::max(1, gs.round_k - (width - 1));
    for (uint64_t id : decode_ids) {
      request_state& r = requests_.at(id);
      r.round_cap = r.round_drafts;
      r.round_drafts = std::min(r.round_drafts, gs.round_k);
      r.siblings.clear();
    }
  } else {
    gs.round_k = most;
    gs.round_step = gs.round_k + 1;  // straight to verify
  }
  gs.round_active = true;
  send_round_step(g);
  return true;
}

const spec::step_costs& scheduler::step_times(int g) const {
  HYSERVE_CHECK(g >= 0 && g < static_cast<int>(groups_.size()), "step_times: no group " + std::to_string(g));
  return groups_[static_cast<size_t>(g)].costs;
}

void scheduler::seed_step_times(int g, const spec::step_costs& costs) {
  HYSERVE_CHECK(g >= 0 && g < static_cast<int>(groups_.size()), "seed_step_times: no group " + std::to_string(g));
  groups_[static_cast<size_t>(g)].costs = costs;
}

double scheduler::round_gain(int g, const std::vector<uint64_t>& decode_ids, int32_t most, int32_t cap_all) const {
  const group_state& gs = groups_[static_cast<size_t>(g)];
  const speculative_section& sc = cfg_.speculative;
  const auto rows = static_cast<int32_t>(decode_ids.size());
  // Requests' prior: the group's measured acceptance; before any round with drafts has run, an
  // optimistic one, so a round that pays off if its drafts are accepted runs and measures it
  // (a batch-1 chain: a verify step costing twice a decode step), while a round whose few
  // drafting rows could never pay for the whole batch's wider step does not.
  const double prior = gs.accept.measured() ? gs.accept.probability() : spec::acceptance_prior::kUnmeasured;
  double expected = 0;
  for (uint64_t id : decode_ids) {
    const request_state& r = requests_.at(id);
    expected += r.budget->expected_accepted(r.round_drafts, prior);
  }
  const double decode_s = gs.costs.get(kCostDecode, rows, 1);
  double round_s = 0;
  if (sc.algorithm == speculative_algorithm::kDraftModel) {
    // Draft steps 0..k, then the verify of the chain and the first position's siblings.
    const int32_t width = draft_tree_width();
    int32_t k = std::min(most, cap_all);
    if (width > 1) k = std::max(1, k - (width - 1));
    const double draft_s = gs.costs.get(kCostDraft, rows, 1);
    const double verify_s = gs.costs.estimate(kCostVerify, rows, k + 1 + (width > 1 ? width - 1 : 0), decode_s);
    round_s = draft_s > 0 && verify_s > 0 ? (k + 1) * draft_s + verify_s : 0.0;
  } else {
    round_s = gs.costs.estimate(kCostVerify, rows, most + 1, decode_s);
  }
  return spec::round_gain(rows, expected, decode_s, round_s);
}

void scheduler::send_round_step(int g) {
  group_state& gs = groups_[static_cast<size_t>(g)];
  const int32_t k = gs.round_k;
  const bool verify = gs.round_step > k;
  wire::step_plan plan;
  plan.draft_len = k + 1;
  plan.mode = mode_byte(verify ? forward_mode::kTargetVerify : forward_mode::kDraft);
  if (!verify && gs.round_step == 0) plan.draft_width = draft_tree_width();
  if (verify) {
    for (uint64_t id : gs.round_ids) {
      auto it = requests_.find(id);
      if (it == requests_.end()) continue;
      request_state& r = it->second;
      r.chain_nodes = static_cast<int32_t>(std::min(r.drafts.tokens.size(), static_cast<size_t>(r.round_drafts)));
      if (!r.siblings.empty()) {
        // Draft-model tree: the greedy chain (the drafts that count), then the first
        // position's runner-up tokens as further children of the root, within the round's cap.
        r.drafts.tokens.resize(static_cast<size_t>(r.chain_nodes));
        r.drafts.parent.resize(r.drafts.tokens.size());
        for (int32_t t : r.siblings) {
          if (static_cast<int32_t>(r.drafts.tokens.size()) >= r.round_cap) break;
          r.drafts.tokens.push_back(t);
          r.drafts.parent.push_back(0);
        }
        r.round_drafts = static_cast<int32_t>(r.drafts.tokens.size());
      }
      if (!r.drafts.is_chain()) plan.is_tree = true;
      plan.draft_len = std::max(plan.draft_len, static_cast<int32_t>(r.drafts.tokens.size()) + 1);
    }
  }
  gs.kind = verify ? group_state::step_kind::kVerify : group_state::step_kind::kDraft;
  gs.step_rows.clear();
  gs.step_tokens.clear();
  for (uint64_t id : gs.round_ids) {
    auto it = requests_.find(id);
    if (it == requests_.end()) {  // finished between the round's steps: padding keeps row indices
      // (a padding row of a tree batch without links is laid out as a chain)
      wire::plan_row pad;
      pad.request_id = -1;
      pad.tokens.assign(verify ? static_cast<size_t>(plan.draft_len) : 1, 0);
      plan.rows.push_back(std::move(pad));
      gs.step_rows.push_back(0);
      gs.step_tokens.push_back(0);
      continue;
    }
    request_state& r = it->second;
    wire::plan_row row = base_row(r);
    const int32_t last = r.token_at(r.total_len() - 1);
    if (verify) {
      row.tokens.push_back(last);
      spec::draft_tree padded = r.drafts;  // filler nodes continue the last node as a chain
      while (static_cast<int32_t>(padded.tokens.size()) < plan.draft_len - 1) {
        padded.tokens.push_back(last);
        padded.parent.push_back(static_cast<int32_t>(padded.tokens.size()) - 1);
      }
      row.tokens.insert(row.tokens.end(), padded.tokens.begin(), padded.tokens.end());
      if (plan.is_tree) padded.links(row.retrieve_next_token, row.retrieve_next_sibling);
    } else {
      const int32_t j = gs.round_step;
      row.tokens.push_back(j == 0 ? last : r.drafts.tokens.at(static_cast<size_t>(j - 1)));
      row.prefix_len = r.consumed + j;
      row.draft_step = j;
    }
    plan.rows.push_back(std::move(row));
    ++r.in_steps;
    gs.step_rows.push_back(id);
    gs.step_tokens.push_back(0);
  }
  if (verify && !gs.round_prefill.empty()) {
    // Prefill chunks of the other requests ride in the verify step as extend rows.
    int32_t budget = cfg_.scheduler.max_batch_tokens - static_cast<int32_t>(gs.round_ids.size()) * plan.draft_len;
    for (uint64_t id : gs.round_prefill) {
      if (budget <= 0) break;
      auto it = requests_.find(id);
      if (it == requests_.end()) continue;
      request_state& r = it->second;
      const int32_t n = prefill_chunk(r, std::min({r.total_len() - r.consumed, cfg_.scheduler.chunked_prefill, budget}));
      if (n <= 0) continue;
      plan.rows.push_back(prefill_row(r, n));
      gs.step_rows.push_back(id);
      gs.step_tokens.push_back(n);
      budget -= n;
      ++plan.extend_rows;
    }
    gs.prefill_starved = plan.extend_rows == 0;
    gs.round_prefill.clear();
  }
  gs.cost_kind = !verify ? kCostDraft : plan.extend_rows == 0 ? kCostVerify : -1;
  gs.cost_rows = static_cast<int32_t>(gs.round_ids.size());
  gs.cost_width = verify ? plan.draft_len : 1;
  send_plan(g, plan, verify ? "target_verify" : "draft");
}

int32_t scheduler::draft_tree_width() const {
  return cfg_.speculative.algorithm == speculative_algorithm::kDraftModel
             ? std::max(1, cfg_.speculative.draft_model.max_tree_width)
             : 1;
}

bool scheduler::send_draft_catch_up(int g) {
  group_state& gs = groups_[static_cast<size_t>(g)];
  wire::step_plan plan;
  plan.mode = mode_byte(forward_mode::kDraftExtend);
  gs.step_rows.clear();
  gs.step_tokens.clear();
  for (uint64_t id : gs.running) {
    request_state& r = requests_.at(id);
    if (r.draft_lag.empty()) continue;
    // The lagging tokens sit just before the request's next token: positions consumed - n ..
    wire::plan_row row = base_row(r);
    row.tokens = r.draft_lag;
    row.prefix_len = r.consumed - static_cast<int32_t>(r.draft_lag.size());
    plan.rows.push_back(std::move(row));
    ++r.in_steps;
    gs.step_rows.push_back(id);
    gs.step_tokens.push_back(0);
  }
  if (plan.rows.empty()) return false;
  gs.kind = group_state::step_kind::kDraftCatchUp;
  gs.cost_kind = -1;
  send_plan(g, plan, "draft_extend");
  return true;
}

void scheduler::handle_verify(int g, const wire::step_result& res) {
  group_state& gs = groups_[static_cast<size_t>(g)];
  gs.round_active = false;
  const bool with_draft = cfg_.speculative.algorithm == speculative_algorithm::kDraftModel;
  for (size_t i = 0; i < gs.round_ids.size(); ++i) {
    auto it = requests_.find(gs.round_ids[i]);
    if (it == requests_.end()) continue;
    if (row_failed(g, gs.round_ids[i], res, i)) continue;
    request_state& r = it->second;
    const std::vector<int32_t>& target = res.rows[i].tokens;
    spec::draft_tree counted = r.drafts;  // only the drafts that count this round
    counted.tokens.resize(std::min(counted.tokens.size(), static_cast<size_t>(r.round_drafts)));
    counted.parent.resize(counted.tokens.size());
    const std::vector<int32_t> path = spec::accept_path(counted, target);
    const auto a = static_cast<int32_t>(path.size());
    std::vector<int32_t> out;
    for (int32_t n : path) out.push_back(counted.tokens[static_cast<size_t>(n - 1)]);
    out.push_back(target.at(path.empty() ? 0 : static_cast<size_t>(path.back())));
    const auto n_drafts = static_cast<int32_t>(counted.tokens.size());
    r.drafted += n_drafts;
    r.accepted += a;
    r.budget->record(n_drafts, a);
    gs.accept.record(n_drafts, a);
    if (observer_.on_spec && n_drafts > 0) observer_.on_spec(n_drafts, a);
    // The cache now holds the last token and the accepted drafts; the bonus token is next.
    r.consumed += a + 1;
    const int32_t step = path.empty() ? 0 : path.back();
    const auto row = static_cast<int32_t>(i);
    const int32_t prefix = r.consumed - (a + 1);
    if (emit(r, out)) continue;
    gs.commits.push_back(wire::commit_op{r.mamba_slot, row, step});
    // Tree drafts: node n's KV sits at prefix + n; the accepted path moves to its depths.
    for (size_t j = 0; j < path.size(); ++j)
      if (path[j] != static_cast<int32_t>(j + 1))
        gs.kv_moves.push_back(wire::kv_move_op{r.req_slot, prefix + path[j], prefix + static_cast<int32_t>(j + 1)});
    if (with_draft) {
      // The draft's step columns follow its greedy chain (column n = chain node n). An accepted
      // sibling (a node past the chain) is not in them: keep the state after the root and feed
      // the sibling to the draft model before its next step.
      const bool on_chain = path.empty() || path.back() <= r.chain_nodes;
      gs.draft_commits.push_back(wire::commit_op{r.mamba_slot, row, on_chain ? step : 0});
      if (!on_chain) r.draft_lag = out.size() >= 2 ? std::vector<int32_t>(out.begin(), out.end() - 1) : std::vector<int32_t>{};
    }
    r.siblings.clear();
  }
}

}  // namespace hyserve::coordinator
