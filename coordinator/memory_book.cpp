#include "coordinator/memory_book.h"

#include <utility>

namespace hyserve::coordinator {

memory_book::memory_book(const wire::hello& h, int32_t checkpoint_slots)
    : pages("kv page", h.num_pages),
      checkpoints("checkpoint slot", checkpoint_slots, h.mamba_slots),
      req_slots_("request slot", h.max_requests),
      mamba_slots_("mamba slot", h.mamba_slots) {
  if (checkpoint_slots > 0) tree.emplace(h.page_size);
}

std::optional<memory_book::request_slots> memory_book::take_request_slots() {
  if (!has_request_slots()) return std::nullopt;
  return request_slots{*req_slots_.alloc(), *mamba_slots_.alloc()};
}

void memory_book::release(int32_t req_slot, int32_t mamba_slot, const std::vector<int32_t>& owned_pages) {
  pages.free(owned_pages);
  req_slots_.free(req_slot);
  mamba_slots_.free(mamba_slot);
  released_req_slots_.push_back(req_slot);
}

std::vector<int32_t> memory_book::take_released_request_slots() { return std::exchange(released_req_slots_, {}); }

void memory_book::free_evicted(const prefix_tree::evicted& e, evicted& freed) {
  if (e.page >= 0) pages.free(e.page);
  if (e.checkpoint >= 0) {
    checkpoints.free(e.checkpoint);
    ++freed.checkpoints;
  }
  ++freed.nodes;
}

bool memory_book::evict_for(int32_t want_pages, int32_t want_ckpts, evicted& freed) {
  while (pages.available() < want_pages || checkpoints.available() < want_ckpts) {
    if (!tree) break;
    // Short of checkpoint slots only: the stalest checkpoint goes, not necessarily a leaf.
    const bool pages_short = pages.available() < want_pages;
    auto e = pages_short ? tree->evict_one() : tree->evict_checkpoint();
    if (!e && !pages_short) e = tree->evict_one();
    if (!e) break;
    free_evicted(*e, freed);
  }
  return pages.available() >= want_pages && checkpoints.available() >= want_ckpts;
}

memory_book::evicted memory_book::evict_all() {
  evicted freed;
  if (!tree) return freed;
  while (const auto e = tree->evict_one()) free_evicted(*e, freed);
  return freed;
}

std::optional<int32_t> memory_book::take_checkpoint(evicted& freed) {
  if (!evict_for(0, 1, freed)) return std::nullopt;
  return checkpoints.alloc();
}

}  // namespace hyserve::coordinator
