#include "coordinator/speculative.h"

#include <algorithm>
#include <cstddef>

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
  for (int64_t n = std::min<int64_t>(cfg.max_match, len - 1); n >= cfg.min_match; --n) {
    const int32_t* suffix = tokens.data() + (len - n);
    std::vector<std::vector<int32_t>> conts;
    // Most recent occurrence first; the occurrence must end before the suffix itself starts
    // plus at least one continuation token.
    for (int64_t start = len - n - 1; start >= 0 && static_cast<int32_t>(conts.size()) < width; --start) {
      if (!std::equal(suffix, suffix + n, tokens.data() + start)) continue;
      const int64_t from = start + n;
      const int64_t take = std::min<int64_t>(max_drafts, len - from);
      if (take <= 0) continue;
      std::vector<int32_t> c(tokens.begin() + from, tokens.begin() + from + take);
      const bool dup = std::any_of(conts.begin(), conts.end(), [&](const auto& o) { return o.front() == c.front(); });
      if (!dup) conts.push_back(std::move(c));
    }
    if (conts.empty()) continue;
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
  if (budget_ > 0) return budget_;
  if (cooldown_ > 0) {
    --cooldown_;
    return 0;
  }
  return 1;  // probe
}

void draft_budget::record(int32_t drafted, int32_t accepted) {
  if (drafted <= 0) return;
  const double rate = static_cast<double>(accepted) / drafted;
  if (rate < min_rate_) {
    budget_ = drafted / 2;
    if (budget_ == 0) cooldown_ = kCooldown;
  } else {
    budget_ = std::min(max_, std::max(budget_, drafted * 2));
  }
}

}  // namespace hyserve::coordinator::spec
