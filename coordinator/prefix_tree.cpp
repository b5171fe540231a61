#include "coordinator/prefix_tree.h"

#include "hyserve/common/error.h"

namespace hyserve::coordinator {

prefix_tree::prefix_tree(int32_t page_size) : page_size_(page_size) {
  nodes_.emplace_back();
  nodes_[0].alive = true;
}

std::vector<int32_t> prefix_tree::key(const std::vector<int32_t>& tokens, int32_t depth) const {
  const auto from = static_cast<size_t>(depth) * static_cast<size_t>(page_size_);
  return std::vector<int32_t>(tokens.begin() + static_cast<std::ptrdiff_t>(from),
                              tokens.begin() + static_cast<std::ptrdiff_t>(from + static_cast<size_t>(page_size_)));
}

prefix_tree::match prefix_tree::lookup(const std::vector<int32_t>& tokens, int32_t max_tokens) const {
  match best;
  match path;
  int32_t at = 0;
  const int32_t depth_limit = std::min<int32_t>(max_tokens, static_cast<int32_t>(tokens.size())) / page_size_;
  for (int32_t d = 0; d < depth_limit; ++d) {
    const auto it = nodes_[static_cast<size_t>(at)].children.find(key(tokens, d));
    if (it == nodes_[static_cast<size_t>(at)].children.end()) break;
    at = it->second;
    path.nodes.push_back(at);
    path.pages.push_back(nodes_[static_cast<size_t>(at)].page);
    if (nodes_[static_cast<size_t>(at)].checkpoint >= 0) {
      best = path;
      best.checkpoint = nodes_[static_cast<size_t>(at)].checkpoint;
    }
  }
  return best;
}

int32_t prefix_tree::matched_pages(const std::vector<int32_t>& tokens, int32_t max_pages) const {
  int32_t at = 0, d = 0;
  const auto limit = std::min<int64_t>(max_pages, static_cast<int64_t>(tokens.size()) / page_size_);
  for (; d < limit; ++d) {
    const auto it = nodes_[static_cast<size_t>(at)].children.find(key(tokens, d));
    if (it == nodes_[static_cast<size_t>(at)].children.end()) break;
    at = it->second;
  }
  return d;
}

bool prefix_tree::has_checkpoint(const std::vector<int32_t>& tokens, int32_t pages) const {
  int32_t at = 0;
  if (static_cast<int64_t>(pages) * page_size_ > static_cast<int64_t>(tokens.size())) return false;
  for (int32_t d = 0; d < pages; ++d) {
    const auto it = nodes_[static_cast<size_t>(at)].children.find(key(tokens, d));
    if (it == nodes_[static_cast<size_t>(at)].children.end()) return false;
    at = it->second;
  }
  return pages > 0 && nodes_[static_cast<size_t>(at)].checkpoint >= 0;
}

bool prefix_tree::evictable(int32_t id) const {
  const node& n = nodes_[static_cast<size_t>(id)];
  return id != 0 && n.alive && n.refs == 0 && n.children.empty();
}

void prefix_tree::update_evictable(int32_t id) {
  node& n = nodes_[static_cast<size_t>(id)];
  lru_.erase({n.last_use, id});
  if (evictable(id)) lru_.insert({n.last_use, id});
  ckpt_lru_.erase({n.ckpt_use, id});
  if (id != 0 && n.alive && n.checkpoint >= 0 && n.ckpt_pins == 0) ckpt_lru_.insert({n.ckpt_use, id});
}

void prefix_tree::hold(const std::vector<int32_t>& ids) {
  for (int32_t id : ids) {
    node& n = nodes_.at(static_cast<size_t>(id));
    HYSERVE_CHECK(n.alive, "prefix_tree::hold: node " + std::to_string(id) + " is gone");
    if (n.refs++ == 0) ++held_nodes_;
    update_evictable(id);
  }
}

void prefix_tree::release(const std::vector<int32_t>& ids, uint64_t tick) {
  for (int32_t id : ids) {
    node& n = nodes_.at(static_cast<size_t>(id));
    HYSERVE_CHECK(n.alive && n.refs > 0, "prefix_tree::release: node " + std::to_string(id) + " is not held");
    lru_.erase({n.last_use, id});
    n.last_use = tick;
    if (--n.refs == 0) --held_nodes_;
    update_evictable(id);
  }
}

prefix_tree::inserted prefix_tree::insert(const std::vector<int32_t>& tokens, const std::vector<int32_t>& req_pages,
                                          int32_t pages, uint64_t tick) {
  inserted out;
  HYSERVE_CHECK(static_cast<int64_t>(pages) * page_size_ <= static_cast<int64_t>(tokens.size()) &&
                    static_cast<size_t>(pages) <= req_pages.size(),
                "prefix_tree::insert: " + std::to_string(pages) + " pages past the request's tokens or pages");
  int32_t at = 0;
  for (int32_t d = 0; d < pages; ++d) {
    std::vector<int32_t> k = key(tokens, d);
    auto it = nodes_[static_cast<size_t>(at)].children.find(k);
    if (it != nodes_[static_cast<size_t>(at)].children.end()) {
      at = it->second;
      continue;
    }
    int32_t id;
    if (!free_ids_.empty()) {
      id = free_ids_.back();
      free_ids_.pop_back();
      nodes_[static_cast<size_t>(id)] = node{};
    } else {
      id = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
    }
    node& n = nodes_[static_cast<size_t>(id)];
    n.alive = true;
    n.parent = at;
    n.page = req_pages[static_cast<size_t>(d)];
    n.last_use = tick;
    n.refs = 1;  // held by the request whose page it is
    ++held_nodes_;
    ++live_;
    nodes_[static_cast<size_t>(at)].children.emplace(std::move(k), id);
    if (at != 0) update_evictable(at);  // no longer a leaf
    out.adopted_nodes.push_back(id);
    out.adopted_pages.push_back(d);
    at = id;
  }
  out.last = pages > 0 ? at : -1;
  return out;
}

bool prefix_tree::attach_checkpoint(int32_t id, int32_t slot, uint64_t tick) {
  node& n = nodes_.at(static_cast<size_t>(id));
  if (n.checkpoint >= 0) return false;
  ckpt_lru_.erase({n.ckpt_use, id});
  n.checkpoint = slot;
  n.ckpt_use = tick;
  ++checkpoints_;
  update_evictable(id);
  return true;
}

void prefix_tree::pin_checkpoint(int32_t id, uint64_t tick) {
  node& n = nodes_.at(static_cast<size_t>(id));
  HYSERVE_CHECK(n.alive && n.checkpoint >= 0, "prefix_tree::pin_checkpoint: node " + std::to_string(id) +
                                                  " has no checkpoint");
  ckpt_lru_.erase({n.ckpt_use, id});
  n.ckpt_use = tick;
  ++n.ckpt_pins;
  update_evictable(id);
}

void prefix_tree::unpin_checkpoint(int32_t id) {
  node& n = nodes_.at(static_cast<size_t>(id));
  HYSERVE_CHECK(n.alive && n.ckpt_pins > 0, "prefix_tree::unpin_checkpoint: node " + std::to_string(id) +
                                                " is not pinned");
  --n.ckpt_pins;
  update_evictable(id);
}

std::optional<prefix_tree::evicted> prefix_tree::evict_checkpoint() {
  if (ckpt_lru_.empty()) return std::nullopt;
  const int32_t id = ckpt_lru_.begin()->second;
  node& n = nodes_[static_cast<size_t>(id)];
  if (n.children.empty() && n.refs == 0) {
    lru_.erase({n.last_use, id});
    return remove_leaf(id);
  }
  ckpt_lru_.erase(ckpt_lru_.begin());
  evicted e{-1, n.checkpoint};
  n.checkpoint = -1;
  --checkpoints_;
  return e;
}

std::optional<prefix_tree::evicted> prefix_tree::evict_one() {
  if (lru_.empty()) return std::nullopt;
  const int32_t id = lru_.begin()->second;
  lru_.erase(lru_.begin());
  return remove_leaf(id);
}

prefix_tree::evicted prefix_tree::remove_leaf(int32_t id) {
  node& n = nodes_[static_cast<size_t>(id)];
  ckpt_lru_.erase({n.ckpt_use, id});
  evicted e{n.page, n.checkpoint};
  if (n.checkpoint >= 0) --checkpoints_;
  node& parent = nodes_[static_cast<size_t>(n.parent)];
  for (auto it = parent.children.begin(); it != parent.children.end(); ++it)
    if (it->second == id) {
      parent.children.erase(it);
      break;
    }
  const int32_t p = n.parent;
  n = node{};
  free_ids_.push_back(id);
  --live_;
  if (p != 0) update_evictable(p);
  return e;
}

}  // namespace hyserve::coordinator
