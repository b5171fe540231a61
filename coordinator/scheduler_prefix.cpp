// The scheduler's prefix-cache bookkeeping (docs/ARCHITECTURE.md, Prefix caching): where a
// prefill saves a checkpoint, eviction for pages and checkpoint slots, the tree taking a step's
// saves, and POST /flush_cache.
#include "coordinator/scheduler.h"

#include <algorithm>
#include <cstdio>

#include "hyserve/common/error.h"
#include "hyserve/common/forward_mode.h"

namespace hyserve::coordinator {

int32_t scheduler::shared_boundary(const request_state& r) const {
  const group_state& g = groups_[static_cast<size_t>(r.group)];
  const auto L = static_cast<int32_t>(r.req.input_ids.size());
  const int32_t ps = hellos_.front().page_size;
  return g.tree->matched_pages(r.req.input_ids, (L - 1) / ps) * ps;
}

bool scheduler::checkpoint_at(const request_state& r, int32_t pos) const {
  const auto L = static_cast<int32_t>(r.req.input_ids.size());
  const int32_t ps = hellos_.front().page_size;
  if (pos <= 0 || pos > L || pos % ps != 0) return false;
  // A chunk that ends on a multiple of state_interval; the prompt's last page boundaries: the
  // one at or before its end (a longer prompt that continues it, e.g. the next turn of a chat)
  // and the one before its last token (the same prompt again: a request always prefills at
  // least its last token); and where this prompt leaves the pages the tree already holds.
  return pos % cfg_.cache.state_interval() == 0 || pos == L / ps * ps || pos == (L - 1) / ps * ps ||
         pos == shared_boundary(r);
}

int32_t scheduler::prefill_chunk(const request_state& r, int32_t n) const {
  if (!prefix_enabled() || n <= 0 || r.group < 0) return n;
  const group_state& g = groups_[static_cast<size_t>(r.group)];
  const int32_t f = r.fed(), ps = hellos_.front().page_size;
  const auto L = static_cast<int32_t>(r.req.input_ids.size());
  const int32_t last = std::min<int32_t>(f + n, L);
  // Every split costs a forward step, so a chunk is cut only where a checkpoint the tree lacks
  // is worth a step: where this prompt leaves another prompt's pages (a shared prefix; later
  // requests that share it start there), and at the prompt's last page boundary when the prompt
  // does not end on one (the next turn of a conversation starts there). Other checkpoint
  // positions are saved only when a chunk ends on them anyway.
  const int32_t shared = shared_boundary(r);
  for (int32_t c : {shared, L % ps != 0 ? L / ps * ps : 0})
    if (c > f && c < last && !g.tree->has_checkpoint(r.req.input_ids, c / ps)) n = std::min(n, c - f);
  return n;
}

bool scheduler::evict_for(group_state& g, int32_t pages, int32_t ckpts) {
  int64_t nodes = 0, ckpt_freed = 0;
  while (static_cast<int32_t>(g.free_pages.size()) < pages || static_cast<int32_t>(g.free_ckpt_slots.size()) < ckpts) {
    if (!g.tree) break;
    // Short of checkpoint slots only: the stalest checkpoint goes, not necessarily a leaf.
    const bool pages_short = static_cast<int32_t>(g.free_pages.size()) < pages;
    auto e = pages_short ? g.tree->evict_one() : g.tree->evict_checkpoint();
    if (!e && !pages_short) e = g.tree->evict_one();
    if (!e) break;
    if (e->page >= 0) g.free_pages.push_back(e->page);
    if (e->checkpoint >= 0) {
      g.free_ckpt_slots.push_back(e->checkpoint);
      ++ckpt_freed;
    }
    ++nodes;
  }
  if (nodes > 0 && observer_.on_prefix_evict) observer_.on_prefix_evict(nodes, ckpt_freed);
  return static_cast<int32_t>(g.free_pages.size()) >= pages && static_cast<int32_t>(g.free_ckpt_slots.size()) >= ckpts;
}

void scheduler::insert_saves(group_state& g, const std::vector<pending_save>& saves, bool ok) {
  for (const pending_save& sv : saves) {
    auto it = requests_.find(sv.id);
    if (!ok || it == requests_.end() || it->second.cancelled || it->second.group < 0) {
      g.free_ckpt_slots.push_back(sv.slot);
      continue;
    }
    request_state& r = it->second;
    const prefix_tree::inserted ins = g.tree->insert(r.req.input_ids, r.pages, sv.pages, ++tick_);
    r.page_shared.resize(r.pages.size(), 0);
    for (int32_t d : ins.adopted_pages) r.page_shared[static_cast<size_t>(d)] = 1;
    r.held_nodes.insert(r.held_nodes.end(), ins.adopted_nodes.begin(), ins.adopted_nodes.end());
    if (!g.tree->attach_checkpoint(ins.last, sv.slot, ++tick_)) g.free_ckpt_slots.push_back(sv.slot);
  }
}

flush_result scheduler::flush_cache() {
  if (!prefix_enabled()) return flush_result{false, 0, 0, "prefix caching is off (cache.prefix.enabled: false)"};
  auto w = std::make_shared<flush_waiter>();
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    flush_inbox_.push_back(w);
  }
  std::unique_lock<std::mutex> lock(w->mu);
  if (!w->cv.wait_for(lock, std::chrono::seconds(30), [&] { return w->done; }))
    return flush_result{false, 0, 0, "the scheduler did not take the flush within 30 s"};
  return w->res;
}

void scheduler::take_flushes() {
  std::vector<std::shared_ptr<flush_waiter>> ws;
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    ws.swap(flush_inbox_);
  }
  if (ws.empty()) return;
  flush_result res;
  res.ok = true;
  for (group_state& g : groups_) {
    if (!g.tree) continue;
    int64_t nodes = 0, ckpts = 0;
    while (const auto e = g.tree->evict_one()) {
      g.free_pages.push_back(e->page);
      ++nodes;
      if (e->checkpoint >= 0) {
        g.free_ckpt_slots.push_back(e->checkpoint);
        ++ckpts;
      }
    }
    res.pages += nodes;
    res.checkpoints += ckpts;
    if (nodes > 0 && observer_.on_prefix_evict) observer_.on_prefix_evict(nodes, ckpts);
  }
  for (auto& w : ws) {
    std::lock_guard<std::mutex> lock(w->mu);
    w->res = res;
    w->done = true;
    w->cv.notify_all();
  }
}

}  // namespace hyserve::coordinator
