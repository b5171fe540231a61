#include "coordinator/speculative.h"

#include <algorithm>
#include <cstddef>
#include <limits>

namespace hyserve::coordinator::spec {

bool draft_tree::is_chain() const {
  for (size_t i = 0; i < parent.size(); ++i)
    if (parent[i] != static_cast<int32_t>(i)) return false;
  return true;
}

void draft_tree::links(std::vector<int32_t>& next_token, std::vector<int32_t>& next_sibling) const {
  const size_t d = tokens.size() + 1;
  next_token.assign(d, -1);
  next_sibling.assign(d, -1);
  std::vector<int32_t> last_child(d, -1);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto node = static_cast<int32_t>(i + 1);
    const auto p = static_cast<size_t>(parent[i]);
    if (last_child[p] < 0) next_token[p] = node;
    else next_sibling[static_cast<size_t>(last_child[p])] = node;
    last_child[p] = node;
  }
}

draft_tree ngram_propose(const std::vector<int32_t>& tokens, const ngram_spec_section& cfg, int32_t max_drafts) {
  draft_tree tree;
  const auto len = static_cast<int64_t>(tokens.size());
  if (max_drafts <= 0 || len < 2) return tree;
  const int32_t width = std::max(1, cfg.max_tree_width);
  const int64_t max_n = std::min<int64_t>(cfg.max_match, len - 1);
  if (max_n < cfg.min_match) return tree;
  // One backward scan: for every earlier end position e (at least one token follows it), the
  // length of the common suffix of tokens[..e] and the whole sequence, up to max_n. The longest
  // n >= min_match found wins; its occurrences are the positions reaching n, most recent first.
  const int32_t* t = tokens.data();
  const int32_t last = t[len - 1];
  std::vector<std::pair<int64_t, int64_t>> hits;  // (end position, match length), most recent first
  int64_t best = 0;
  for (int64_t e = len - 2; e >= 0; --e) {
    if (t[e] != last) continue;
    int64_t l = 1;
    while (l < max_n && e - l >= 0 && t[e - l] == t[len - 1 - l]) ++l;
    if (l < cfg.min_match || l < best) continue;
    if (l > best) {
      best = l;
      hits.clear();
    }
    hits.emplace_back(e, l);
  }
  if (best == 0) return tree;
  tree.match_len = static_cast<int32_t>(best);
  std::vector<std::vector<int32_t>> conts;
  for (const auto& [e, l] : hits) {
    if (static_cast<int32_t>(conts.size()) >= width) break;
    const int64_t from = e + 1;
    const int64_t take = std::min<int64_t>(max_drafts, len - from);
    std::vector<int32_t> c(tokens.begin() + from, tokens.begin() + from + take);
    const bool dup = std::any_of(conts.begin(), conts.end(), [&](const auto& o) { return o.front() == c.front(); });
    if (!dup) conts.push_back(std::move(c));
  }
  // Branch i gets its share of the node budget, the most recent match the largest.
  int32_t left = max_drafts;
  for (size_t i = 0; i < conts.size() && left > 0; ++i) {
    const int32_t branches_left = static_cast<int32_t>(conts.size() - i);
    const int32_t share = i == 0 ? std::max(1, left - (branches_left - 1)) : std::max(1, left / branches_left);
    const auto take = static_cast<size_t>(std::min<int64_t>(share, static_cast<int64_t>(conts[i].size())));
    int32_t parent = 0;
    for (size_t j = 0; j < take; ++j) {
      tree.tokens.push_back(conts[i][j]);
      tree.parent.push_back(parent);
      parent = static_cast<int32_t>(tree.tokens.size());
    }
    left -= static_cast<int32_t>(take);
  }
  return tree;
}

std::vector<int32_t> accept_path(const draft_tree& tree, const std::vector<int32_t>& target) {
  std::vector<int32_t> path;
  int32_t node = 0;
  while (true) {
    int32_t next = -1;
    for (size_t i = 0; i < tree.tokens.size(); ++i) {
      if (tree.parent[i] == node && tree.tokens[i] == target[static_cast<size_t>(node)]) {
        next = static_cast<int32_t>(i + 1);
        break;
      }
    }
    if (next < 0) return path;
    path.push_back(next);
    node = next;
  }
}

int32_t draft_budget::allowed() {
  probing_ = false;
  if (budget_ > 0) return budget_;
  if (cooldown_ > 0) {
    --cooldown_;
    return 0;
  }
  probing_ = true;
  return 1;  // probe
}

void draft_budget::record(int32_t drafted, int32_t accepted) {
  if (drafted <= 0) return;
  hits_ = kDecay * hits_ + accepted;
  misses_ = kDecay * misses_ + (accepted < drafted ? 1.0 : 0.0);
  const double rate = static_cast<double>(accepted) / drafted;
  if (rate < min_rate_) {
    // A failed probe: the next cool-down is twice as long.
    if (probing_ && budget_ == 0 && ++failed_probes_ > kProbesAtBase)
      cooldown_len_ = std::min(kMaxCooldown, 2 * cooldown_len_);
    budget_ = drafted / 2;
    if (budget_ == 0) cooldown_ = cooldown_len_;
  } else {
    budget_ = std::min(max_, std::max(budget_, drafted * 2));
    cooldown_len_ = kCooldown;
    failed_probes_ = 0;
  }
  probing_ = false;
}

double draft_budget::expected_accepted(int32_t n, double prior) const {
  const double p = accept_probability(prior);
  double e = 0, pk = 1;
  for (int32_t i = 0; i < n; ++i) {
    pk *= p;
    e += pk;
  }
  return e;
}

void acceptance_prior::record(int32_t drafted, int32_t accepted) {
  if (drafted <= 0) return;
  measured_ = true;
  hits_ = kDecay * hits_ + accepted;
  misses_ = kDecay * misses_ + (accepted < drafted ? 1.0 : 0.0);
}

double round_gain(int32_t rows, double expected_accepted, double decode_s, double round_s) {
  if (rows <= 0) return 0.0;
  if (round_s <= 0) return std::numeric_limits<double>::infinity();  // run it (and measure it)
  if (decode_s <= 0) return 0.0;  // a plain step first: it measures what the round competes with
  return ((rows + expected_accepted) / round_s) / (rows / decode_s);
}

bool round_pays_off(int32_t rows, double expected_accepted, double decode_s, double round_s) {
  return round_gain(rows, expected_accepted, decode_s, round_s) >= kMinRoundGain;
}

double step_costs::get(int kind, int32_t rows, int32_t width) const {
  for (const entry& e : entries_)
    if (e.kind == kind && e.rows == rows && e.width == width) return e.samples >= kTrusted ? e.seconds : 0.0;
  return 0.0;
}

double step_costs::estimate(int kind, int32_t rows, int32_t width, double base_s) const {
  if (const double same = estimate_rows(kind, rows, width, base_s); same > 0) return same;
  int32_t above = 0;
  for (const entry& e : entries_)
    if (e.kind == kind && e.rows > rows && e.samples >= kTrusted && (above == 0 || e.rows < above)) above = e.rows;
  return above > 0 ? estimate_rows(kind, above, width, base_s) : 0.0;
}

double step_costs::estimate_rows(int kind, int32_t rows, int32_t width, double base_s) const {
  if (const double exact = get(kind, rows, width); exact > 0) return exact;
  for (const entry& e : entries_) {
    if (e.kind != kind || e.rows != rows || e.width <= 1 || e.samples < kTrusted) continue;
    if (base_s <= 0) return e.seconds;  // no plain step to interpolate from: the measured width's
    const double extra = std::max(0.0, e.seconds - base_s) / (e.width - 1);
    return base_s + extra * (width - 1);
  }
  return 0.0;
}

void step_costs::add(int kind, int32_t rows, int32_t width, double seconds) {
  if (seconds <= 0) return;
  for (entry& e : entries_) {
    if (e.kind != kind || e.rows != rows || e.width != width) continue;
    if (e.samples == 1) e.seconds = std::min(e.seconds, seconds);
    else e.seconds = 0.7 * e.seconds + 0.3 * std::min(seconds, 2.0 * e.seconds);
    ++e.samples;
    return;
  }
  entries_.push_back(entry{kind, rows, width, seconds, 1});
}

}  // namespace hyserve::coordinator::spec
