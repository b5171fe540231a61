// The scheduler's prefix-cache bookkeeping (docs/ARCHITECTURE.md, Prefix caching): where a
// prefill or a decode step saves a checkpoint, eviction for pages and checkpoint slots, the tree
// taking a step's saves and a finished request's answer, and POST /flush_cache.
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
  return g.mem.tree->matched_pages(r.req.input_ids, (L - 1) / ps) * ps;
}

int32_t scheduler::aligned_down(int32_t p) const {
  if (!aligned_prefix()) return p;
  const int32_t g = cfg_.cache.state_interval();
  return p / g * g;
}

bool scheduler::checkpoint_at(const request_state& r, int32_t pos) const {
  const auto L = static_cast<int32_t>(r.req.input_ids.size());
  const int32_t ps = hellos_.front().page_size;
  if (pos <= 0 || pos > L || pos % ps != 0) return false;
  if (aligned_prefix()) return pos % cfg_.cache.state_interval() == 0;
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
  // determinism: batch_invariant: both rounded down to the state interval.
  const int32_t shared = aligned_down(shared_boundary(r));
  for (int32_t c : {shared, aligned_down(L % ps != 0 ? L / ps * ps : 0)})
    if (c > f + invariant_tail() && c < last && c < L - invariant_tail() &&
        !g.mem.tree->has_checkpoint(r.req.input_ids, c / ps))
      n = std::min(n, c - f);
  return n;
}

bool scheduler::evict_for(group_state& g, int32_t pages, int32_t ckpts) {
  memory_book::evicted freed;
  const bool ok = g.mem.evict_for(pages, ckpts, freed);
  report_evicted(freed);
  return ok;
}

void scheduler::report_evicted(const memory_book::evicted& freed) {
  if (freed.nodes > 0 && observer_.on_prefix_evict) observer_.on_prefix_evict(freed.nodes, freed.checkpoints);
}

void scheduler::plan_save(request_state& r, int32_t end) {
  group_state& gs = groups_[static_cast<size_t>(r.group)];
  if (!gs.mem.tree) return;
  const int32_t ps = hellos_.front().page_size;
  // A chunk that ends at a checkpoint position the tree lacks saves the state after it into a
  // checkpoint slot (the tree takes it and the pages when the result is in); a decode row that
  // ends a page saves it for the request to hand over when it finishes. When the slots are
  // full, the stalest unpinned checkpoint makes room (prefix_tree.h); when none can, no save.
  const bool decode = decode_checkpoint_at(r, end);
  if (!decode && !(checkpoint_at(r, end) && !gs.mem.tree->has_checkpoint(r.req.input_ids, end / ps))) return;
  memory_book::evicted freed;
  const std::optional<int32_t> taken = gs.mem.take_checkpoint(freed);
  report_evicted(freed);
  if (!taken) return;
  const int32_t slot = *taken;
  gs.saves.push_back(wire::state_copy_op{r.mamba_slot, slot});
  gs.step_saves.push_back(pending_save{r.req.id, end / ps, slot, decode});
  if (decode) ++gs.mem.decode_checkpoints;
}

bool scheduler::decode_checkpoint_at(const request_state& r, int32_t end) const {
  // Speculative decoding: a verify row feeds several tokens and the state at a page boundary
  // among them reaches the request's slot only through the next plan's commit, and a draft
  // model's state may lag the target's; decode checkpoints are not saved for speculative
  // services (their answers are re-prefilled by the next turn, as before).
  if (spec_enabled()) return false;
  // determinism: batch_invariant: the next turn prefills the answer in chunks, whose state at a
  // page boundary is not the decode step's bits.
  if (aligned_prefix()) return false;
  const group_state& g = groups_[static_cast<size_t>(r.group)];
  const auto L = static_cast<int32_t>(r.req.input_ids.size());
  const int32_t ps = hellos_.front().page_size;
  // A request that holds a decode checkpoint may always save the next one (it frees the older
  // when that lands); others start holding one only while running requests' decode saves take
  // less than a quarter of the slots. The prompt checkpoints later requests start from keep the
  // rest: at least half.
  const bool room = r.gen_ckpt_slot >= 0 || g.mem.decode_checkpoints < cfg_.cache.prefix.state_slots / 4;
  return end > L && end % ps == 0 && room;
}

void scheduler::adopt(request_state& r, const prefix_tree::inserted& ins) {
  r.page_shared.resize(r.pages.size(), 0);
  for (int32_t d : ins.adopted_pages) r.page_shared[static_cast<size_t>(d)] = 1;
  r.held_nodes.insert(r.held_nodes.end(), ins.adopted_nodes.begin(), ins.adopted_nodes.end());
}

void scheduler::insert_saves(group_state& g, const std::vector<pending_save>& saves, bool ok) {
  for (const pending_save& sv : saves) {
    auto it = requests_.find(sv.id);
    if (!ok || it == requests_.end() || it->second.cancelled || it->second.group < 0) {
      if (sv.decode) free_decode_slot(g, sv.slot);
      else g.mem.checkpoints.free(sv.slot);
      continue;
    }
    request_state& r = it->second;
    if (sv.decode) {
      land_decode_save(g, r, sv);
      continue;
    }
    const prefix_tree::inserted ins = g.mem.tree->insert(r.req.input_ids, r.pages, sv.pages, ++tick_);
    adopt(r, ins);
    if (!g.mem.tree->attach_checkpoint(ins.last, sv.slot, ++tick_)) g.mem.checkpoints.free(sv.slot);
  }
}

void scheduler::land_decode_save(group_state& g, request_state& r, const pending_save& sv) {
  // One decode checkpoint per request: the deeper one stays, the other's slot is free (the
  // step that wrote it has come back).
  if (sv.pages <= r.gen_ckpt_pages) {
    free_decode_slot(g, sv.slot);
    return;
  }
  if (r.gen_ckpt_slot >= 0) free_decode_slot(g, r.gen_ckpt_slot);
  r.gen_ckpt_slot = sv.slot;
  r.gen_ckpt_pages = sv.pages;
}

void scheduler::insert_generated(request_state& r) {
  if (r.group < 0 || r.gen_ckpt_slot < 0) return;
  group_state& g = groups_[static_cast<size_t>(r.group)];
  // The tree's key is the tokens whose KV the pages hold: the prompt, then the output tokens fed
  // back (every one before the checkpoint's position was returned before its step was). Steps
  // still in flight write only positions past the checkpoint, so the pages given away are final.
  std::vector<int32_t> tokens = r.req.input_ids;
  tokens.insert(tokens.end(), r.output.begin(), r.output.end());
  const prefix_tree::inserted ins = g.mem.tree->insert(tokens, r.pages, r.gen_ckpt_pages, ++tick_);
  adopt(r, ins);
  // The checkpoint ranks as made when the request was admitted: one no request restores (an
  // answer never resent) goes before the prompt checkpoints made since, while the next turn of
  // a chat restores it at once, which makes it the freshest.
  if (!g.mem.tree->attach_checkpoint(ins.last, r.gen_ckpt_slot, r.admit_tick)) return;  // release() frees the slot
  --g.mem.decode_checkpoints;
  r.gen_ckpt_slot = -1;
}

void scheduler::free_decode_slot(group_state& g, int32_t slot) {
  g.mem.checkpoints.free(slot);
  --g.mem.decode_checkpoints;
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
    if (!g.mem.tree) continue;
    const memory_book::evicted freed = g.mem.evict_all();
    res.pages += freed.nodes;
    res.checkpoints += freed.checkpoints;
    report_evicted(freed);
  }
  for (auto& w : ws) {
    std::lock_guard<std::mutex> lock(w->mu);
    w->res = res;
    w->done = true;
    w->cv.notify_all();
  }
}

}  // namespace hyserve::coordinator
