// A group's speculative rounds (docs/ARCHITECTURE.md, Speculative decoding): whether a round
// pays (the measured step times), the draft / verify steps of a round, and taking their results.
#include "coordinator/speculative_round.h"

#include <algorithm>
#include <string>

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

speculative_round::speculative_round(const service_config& cfg, int32_t page_size, int32_t max_context)
    : cfg_(cfg.speculative),
      max_batch_tokens_(cfg.scheduler.max_batch_tokens),
      page_size_(page_size),
      max_context_(max_context) {}

// Starts a speculative round over the decode-ready requests. n-gram: one TargetVerify step with
// the drafts found by prompt lookup. draft_model: Draft steps 0..k (step j consumes the last
// accepted token, then draft j, and proposes draft j+1; the extra step k lets the draft's state
// reach every accepted length), then TargetVerify. Nothing when no request drafts or the round
// would not pay.
std::optional<built_step> speculative_round::start(round_host& h, const std::vector<uint64_t>& decode_ids,
                                                   const std::vector<uint64_t>& prefill_ids) {
  const speculative_section& sc = cfg_;
  // Above speculative.max_batch rows the group decodes plainly (the verify step's per-token
  // states are planned for that many rows).
  if (sc.max_batch > 0 && decode_ids.size() + prefill_ids.size() > static_cast<size_t>(sc.max_batch)) return std::nullopt;
  const int32_t ps = page_size_;
  int32_t most = 0;
  int32_t cap_all = sc.num_draft_tokens;
  for (uint64_t id : decode_ids) {
    request_state& r = *h.find(id);
    // Verify writes positions consumed .. consumed + drafts: they must exist in the page table.
    const int32_t room = std::min(max_context_, static_cast<int32_t>(r.pages.size()) * ps) - r.total_len();
    const int32_t cap = std::max(0, std::min(r.spec.budget->allowed(), room));
    cap_all = std::min(cap_all, std::max(0, room));
    r.spec.drafts = {};
    r.spec.round_drafts = cap;
    if (sc.algorithm == speculative_algorithm::kNgram && room > 0) {
      // Tokens only grow: the contiguous copy takes the new ones.
      for (auto i = static_cast<int32_t>(r.spec.lookup_tokens.size()); i < r.total_len(); ++i)
        r.spec.lookup_tokens.push_back(r.token_at(i));
      if (cap > 0) {
        r.spec.drafts = spec::ngram_propose(r.spec.lookup_tokens, sc.ngram, cap);
      } else {
        // Backed off: a match of the longest suffix length (the text repeats itself) is strong
        // enough evidence to probe with one draft before the cool-down ends.
        spec::draft_tree probe = spec::ngram_propose(r.spec.lookup_tokens, sc.ngram, 1);
        if (sc.ngram.max_match >= 2 && probe.match_len >= sc.ngram.max_match) {
          r.spec.budget->probe_now();
          r.spec.drafts = std::move(probe);
        }
      }
      r.spec.round_drafts = static_cast<int32_t>(r.spec.drafts.tokens.size());
    }
    most = std::max(most, r.spec.round_drafts);
  }
  if (most == 0) return std::nullopt;
  if (sc.cost_check && prefill_ids.empty()) {
    const double g = gain(h, decode_ids, most, cap_all);
    if (g < spec::kMinRoundGain && (++skipped_rounds_ % kRemeasureAfter != 0 || g < kRemeasureGain)) {
      // Plain decoding yields about as many tokens per second as this round is expected to, or
      // more: skip it (a skipped round within reach of paying runs now and then, so the times
      // it was judged by are measured again).
      for (uint64_t id : decode_ids) h.find(id)->spec.budget->forget();
      return std::nullopt;
    }
  }
  skipped_rounds_ = 0;
  ids_ = decode_ids;
  prefill_ = prefill_ids;
  step_ = 0;
  if (sc.algorithm == speculative_algorithm::kDraftModel) {
    k_ = std::min(most, cap_all);
    if (k_ == 0) return std::nullopt;
    // A tree leaves room for the siblings of the first position within num_draft_tokens.
    const int32_t width = tree_width();
    if (width > 1) k_ = std::max(1, k_ - (width - 1));
    for (uint64_t id : decode_ids) {
      request_state& r = *h.find(id);
      r.spec.round_cap = r.spec.round_drafts;
      r.spec.round_drafts = std::min(r.spec.round_drafts, k_);
      r.spec.siblings.clear();
    }
  } else {
    k_ = most;
    step_ = k_ + 1;  // straight to verify
  }
  active_ = true;
  return next_step(h);
}

double speculative_round::gain(round_host& h, const std::vector<uint64_t>& decode_ids, int32_t most,
                               int32_t cap_all) const {
  const speculative_section& sc = cfg_;
  const auto rows = static_cast<int32_t>(decode_ids.size());
  // Requests' prior: the group's measured acceptance; before any round with drafts has run, an
  // optimistic one, so a round that pays off if its drafts are accepted runs and measures it
  // (a batch-1 chain: a verify step costing twice a decode step), while a round whose few
  // drafting rows could never pay for the whole batch's wider step does not.
  const double prior = accept_.measured() ? accept_.probability() : spec::acceptance_prior::kUnmeasured;
  double expected = 0;
  for (uint64_t id : decode_ids) {
    const request_state& r = *h.find(id);
    expected += r.spec.budget->expected_accepted(r.spec.round_drafts, prior);
  }
  const double decode_s = costs_.get(kCostDecode, rows, 1);
  double round_s = 0;
  if (sc.algorithm == speculative_algorithm::kDraftModel) {
    // Draft steps 0..k, then the verify of the chain and the first position's siblings.
    const int32_t width = tree_width();
    int32_t k = std::min(most, cap_all);
    if (width > 1) k = std::max(1, k - (width - 1));
    const double draft_s = costs_.get(kCostDraft, rows, 1);
    const double verify_s = costs_.estimate(kCostVerify, rows, k + 1 + (width > 1 ? width - 1 : 0), decode_s);
    round_s = draft_s > 0 && verify_s > 0 ? (k + 1) * draft_s + verify_s : 0.0;
  } else {
    round_s = costs_.estimate(kCostVerify, rows, most + 1, decode_s);
  }
  return spec::round_gain(rows, expected, decode_s, round_s);
}

built_step speculative_round::next_step(round_host& h) {
  const int32_t k = k_;
  const bool verify = step_ > k;
  built_step out;
  wire::step_plan& plan = out.plan;
  plan.draft_len = k + 1;
  plan.mode = mode_byte(verify ? forward_mode::kTargetVerify : forward_mode::kDraft);
  if (!verify && step_ == 0) plan.draft_width = tree_width();
  if (verify) {
    for (uint64_t id : ids_) {
      request_state* found = h.find(id);
      if (found == nullptr) continue;
      request_state& r = *found;
      r.spec.chain_nodes = static_cast<int32_t>(std::min(r.spec.drafts.tokens.size(), static_cast<size_t>(r.spec.round_drafts)));
      if (!r.spec.siblings.empty()) {
        // Draft-model tree: the greedy chain (the drafts that count), then the first
        // position's runner-up tokens as further children of the root, within the round's cap.
        r.spec.drafts.tokens.resize(static_cast<size_t>(r.spec.chain_nodes));
        r.spec.drafts.parent.resize(r.spec.drafts.tokens.size());
        for (int32_t t : r.spec.siblings) {
          if (static_cast<int32_t>(r.spec.drafts.tokens.size()) >= r.spec.round_cap) break;
          r.spec.drafts.tokens.push_back(t);
          r.spec.drafts.parent.push_back(0);
        }
        r.spec.round_drafts = static_cast<int32_t>(r.spec.drafts.tokens.size());
      }
      if (!r.spec.drafts.is_chain()) plan.is_tree = true;
      plan.draft_len = std::max(plan.draft_len, static_cast<int32_t>(r.spec.drafts.tokens.size()) + 1);
    }
  }
  out.rows.kind = verify ? step_kind::kVerify : step_kind::kDraft;
  for (uint64_t id : ids_) {
    request_state* found = h.find(id);
    if (found == nullptr) {  // finished between the round's steps: padding keeps row indices
      // (a padding row of a tree batch without links is laid out as a chain)
      wire::plan_row pad;
      pad.request_id = -1;
      pad.tokens.assign(verify ? static_cast<size_t>(plan.draft_len) : 1, 0);
      plan.rows.push_back(std::move(pad));
      out.rows.add(0, 0);
      continue;
    }
    request_state& r = *found;
    wire::plan_row row = h.base_row(r);
    const int32_t last = r.token_at(r.total_len() - 1);
    if (verify) {
      row.tokens.push_back(last);
      spec::draft_tree padded = r.spec.drafts;  // filler nodes continue the last node as a chain
      while (static_cast<int32_t>(padded.tokens.size()) < plan.draft_len - 1) {
        padded.tokens.push_back(last);
        padded.parent.push_back(static_cast<int32_t>(padded.tokens.size()) - 1);
      }
      row.tokens.insert(row.tokens.end(), padded.tokens.begin(), padded.tokens.end());
      if (plan.is_tree) padded.links(row.retrieve_next_token, row.retrieve_next_sibling);
    } else {
      const int32_t j = step_;
      row.tokens.push_back(j == 0 ? last : r.spec.drafts.tokens.at(static_cast<size_t>(j - 1)));
      row.prefix_len = r.consumed + j;
      row.draft_step = j;
    }
    plan.rows.push_back(std::move(row));
    ++r.in_steps;
    out.rows.add(id, 0);
  }
  if (verify && !prefill_.empty()) {
    // Prefill chunks of the other requests ride in the verify step as extend rows.
    int32_t budget = max_batch_tokens_ - static_cast<int32_t>(ids_.size()) * plan.draft_len;
    for (uint64_t id : prefill_) {
      if (budget <= 0) break;
      request_state* found = h.find(id);
      if (found == nullptr) continue;
      request_state& r = *found;
      const int32_t n = h.next_chunk(r, budget);
      if (n <= 0) continue;
      plan.rows.push_back(h.prefill_row(r, n));
      out.rows.add(id, n);
      budget -= n;
      ++plan.extend_rows;
    }
    prefill_starved_ = plan.extend_rows == 0;
    prefill_.clear();
  }
  out.rows.cost_kind = !verify ? kCostDraft : plan.extend_rows == 0 ? kCostVerify : -1;
  out.rows.cost_rows = static_cast<int32_t>(ids_.size());
  out.rows.cost_width = verify ? plan.draft_len : 1;
  out.mode = verify ? "target_verify" : "draft";
  return out;
}

int32_t speculative_round::tree_width() const {
  return cfg_.algorithm == speculative_algorithm::kDraftModel ? std::max(1, cfg_.draft_model.max_tree_width) : 1;
}

std::optional<built_step> speculative_round::catch_up(round_host& h, const std::vector<uint64_t>& running) {
  built_step out;
  wire::step_plan& plan = out.plan;
  plan.mode = mode_byte(forward_mode::kDraftExtend);
  for (uint64_t id : running) {
    request_state& r = *h.find(id);
    if (r.spec.draft_lag.empty()) continue;
    // The lagging tokens sit just before the request's next token: positions consumed - n ..
    wire::plan_row row = h.base_row(r);
    row.tokens = r.spec.draft_lag;
    row.prefix_len = r.consumed - static_cast<int32_t>(r.spec.draft_lag.size());
    plan.rows.push_back(std::move(row));
    ++r.in_steps;
    out.rows.add(id, 0);
  }
  if (plan.rows.empty()) return std::nullopt;
  out.rows.kind = step_kind::kDraftCatchUp;
  out.mode = "draft_extend";
  return out;
}

void speculative_round::take_result(round_host& h, const step_rows& rows, const wire::step_result& res) {
  const std::vector<uint64_t>& ids = rows.ids;
  switch (rows.kind) {
    case step_kind::kDraft:
      for (size_t i = 0; i < ids.size(); ++i) {
        request_state* r = h.find(ids[i]);
        // Step k's proposal is not verified (the step only advances the draft's state).
        if (r == nullptr || ids[i] == 0 || static_cast<int32_t>(r->spec.drafts.tokens.size()) >= k_) continue;
        if (h.row_failed(ids[i], res, i)) continue;
        const std::vector<int32_t>& toks = res.rows[i].tokens;
        r->spec.drafts.tokens.push_back(toks.at(0));
        r->spec.drafts.parent.push_back(static_cast<int32_t>(r->spec.drafts.parent.size()));
        if (step_ == 0) r->spec.siblings.assign(toks.begin() + 1, toks.end());
      }
      ++step_;
      return;
    case step_kind::kVerify:
      take_verify(h, res);
      // Extend rows after the verify rows: prefill chunks, as in a plain step.
      for (size_t i = ids_.size(); i < ids.size(); ++i) {
        request_state* r = h.find(ids[i]);
        if (r == nullptr) continue;
        r->consumed += rows.tokens[i];
        if (r->consumed < r->total_len()) continue;
        if (h.row_failed(ids[i], res, i)) continue;
        h.emit(*r, {res.rows[i].tokens.at(0)}, &res.rows[i]);
      }
      return;
    case step_kind::kDraftCatchUp:
      for (uint64_t id : ids)
        if (request_state* r = h.find(id); r != nullptr) r->spec.draft_lag.clear();
      return;
    case step_kind::kPlain:
      break;
  }
  throw error("speculative_round: a plain step's result");
}

void speculative_round::move_ops_into(wire::step_plan& plan) {
  plan.commits = std::move(commits_);
  commits_.clear();
  plan.draft_commits = std::move(draft_commits_);
  draft_commits_.clear();
  plan.kv_moves = std::move(kv_moves_);
  kv_moves_.clear();
}

void speculative_round::take_verify(round_host& h, const wire::step_result& res) {
  active_ = false;
  const bool with_draft = cfg_.algorithm == speculative_algorithm::kDraftModel;
  for (size_t i = 0; i < ids_.size(); ++i) {
    request_state* found = h.find(ids_[i]);
    if (found == nullptr) continue;
    if (h.row_failed(ids_[i], res, i)) continue;
    request_state& r = *found;
    const std::vector<int32_t>& target = res.rows[i].tokens;
    spec::draft_tree counted = r.spec.drafts;  // only the drafts that count this round
    counted.tokens.resize(std::min(counted.tokens.size(), static_cast<size_t>(r.spec.round_drafts)));
    counted.parent.resize(counted.tokens.size());
    const std::vector<int32_t> path = spec::accept_path(counted, target);
    const auto a = static_cast<int32_t>(path.size());
    std::vector<int32_t> out;
    for (int32_t n : path) out.push_back(counted.tokens[static_cast<size_t>(n - 1)]);
    out.push_back(target.at(path.empty() ? 0 : static_cast<size_t>(path.back())));
    const auto n_drafts = static_cast<int32_t>(counted.tokens.size());
    r.spec.drafted += n_drafts;
    r.spec.accepted += a;
    r.spec.budget->record(n_drafts, a);
    accept_.record(n_drafts, a);
    if (n_drafts > 0) h.on_spec(n_drafts, a);
    // The cache now holds the last token and the accepted drafts; the bonus token is next.
    r.consumed += a + 1;
    const int32_t step = path.empty() ? 0 : path.back();
    const auto row = static_cast<int32_t>(i);
    const int32_t prefix = r.consumed - (a + 1);
    if (h.emit(r, out, nullptr)) continue;
    commits_.push_back(wire::commit_op{r.mamba_slot, row, step});
    // Tree drafts: node n's KV sits at prefix + n; the accepted path moves to its depths.
    for (size_t j = 0; j < path.size(); ++j)
      if (path[j] != static_cast<int32_t>(j + 1))
        kv_moves_.push_back(wire::kv_move_op{r.req_slot, prefix + path[j], prefix + static_cast<int32_t>(j + 1)});
    if (with_draft) {
      // The draft's step columns follow its greedy chain (column n = chain node n). An accepted
      // sibling (a node past the chain) is not in them: keep the state after the root and feed
      // the sibling to the draft model before its next step.
      const bool on_chain = path.empty() || path.back() <= r.spec.chain_nodes;
      draft_commits_.push_back(wire::commit_op{r.mamba_slot, row, on_chain ? step : 0});
      if (!on_chain) r.spec.draft_lag = out.size() >= 2 ? std::vector<int32_t>(out.begin(), out.end() - 1) : std::vector<int32_t>{};
    }
    r.spec.siblings.clear();
  }
}

}  // namespace hyserve::coordinator
