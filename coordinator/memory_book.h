#pragma once
// The memory of one data-parallel group as the coordinator books it (docs/ARCHITECTURE.md,
// Memory): KV pages, request slots, recurrent-state slots and, with prefix caching, the
// checkpoint slots (numbered after the state slots on every rank of the group) and the radix
// tree that owns cached pages and checkpoints. Each kind is an index_pool, the allocator the
// worker's own pools use. The scheduler decides who gets what; this class keeps the counts
// right: a page or slot is either free, held by a request, or owned by the tree, and freeing
// anything twice throws.
#include <cstdint>
#include <optional>
#include <vector>

#include "hyserve/common/index_pool.h"
#include "hyserve/common/wire.h"
#include "coordinator/prefix_tree.h"

namespace hyserve::coordinator {

class memory_book {
 public:
  memory_book() = default;
  // The group's sizes from its workers' hello; checkpoint_slots > 0 turns prefix caching on.
  memory_book(const wire::hello& h, int32_t checkpoint_slots);

  index_pool pages{"kv page", 0};
  index_pool checkpoints{"checkpoint slot", 0};
  std::optional<prefix_tree> tree;  // set with prefix caching
  // Checkpoint slots running requests hold for their answers (decode saves, landed or not).
  int32_t decode_checkpoints = 0;

  // A request slot and a recurrent-state slot, or nullopt (and nothing taken) when either is short.
  struct request_slots {
    int32_t req = -1, mamba = -1;
  };
  bool has_request_slots() const { return req_slots_.available() > 0 && mamba_slots_.available() > 0; }
  std::optional<request_slots> take_request_slots();
  int32_t free_mamba_slots() const { return mamba_slots_.available(); }
  // A finished request's slots and the pages it still owns (not the tree's) go back; its
  // request slot is also listed for the next plan (the worker clears that slot's row).
  void release(int32_t req_slot, int32_t mamba_slot, const std::vector<int32_t>& pages);
  std::vector<int32_t> take_released_request_slots();

  // Prefix caching. What an eviction freed.
  struct evicted {
    int64_t nodes = 0, checkpoints = 0;
  };
  // Evicts least-recently-used tree leaves (only the stalest checkpoint when pages are not
  // short) until `pages` pages and `ckpts` checkpoint slots are free or nothing more can go.
  // Returns whether both are met.
  bool evict_for(int32_t pages, int32_t ckpts, evicted& freed);
  // Evicts every node no request holds (POST /flush_cache).
  evicted evict_all();
  // A free checkpoint slot, evicting the stalest checkpoint when none is; nullopt when none can be.
  std::optional<int32_t> take_checkpoint(evicted& freed);

 private:
  void free_evicted(const prefix_tree::evicted& e, evicted& freed);

  index_pool req_slots_{"request slot", 0};
  index_pool mamba_slots_{"mamba slot", 0};
  std::vector<int32_t> released_req_slots_;
};

}  // namespace hyserve::coordinator
