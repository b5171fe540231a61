#pragma once
// Prefix caching (docs/ARCHITECTURE.md, Prefix caching): a radix tree over token ids at page
// granularity, one per data-parallel group, kept by the scheduler. Node d on a path holds the KV
// page of tokens [(d-1)·page_size, d·page_size) given the tokens before them, and optionally a
// checkpoint slot: the recurrent state (SSM / GDN state and conv window) after d·page_size tokens.
// Pages in the tree are shared by reference: a running request holds the nodes whose pages are in
// its page table, and a held node is never evicted. Eviction takes least-recently-used leaves;
// a leaf's page and checkpoint are freed together. When checkpoint slots are short, the
// checkpoint restored from or made longest ago goes first, from any node whose checkpoint is not
// pinned: a request pins only the checkpoint it starts from, not the others on its path (it holds
// their pages, not their states). A node that keeps its page after losing its checkpoint still
// serves deeper checkpoints. Pure bookkeeping (no MPI, no device).
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

namespace hyserve::coordinator {

class prefix_tree {
 public:
  explicit prefix_tree(int32_t page_size);

  struct match {
    std::vector<int32_t> nodes;  // the path from the root, one node per page
    std::vector<int32_t> pages;  // their pages
    int32_t checkpoint = -1;     // checkpoint slot of the last node (-1: no match)
    int32_t tokens() const { return static_cast<int32_t>(pages.size()); }  // in pages
  };
  // The deepest node on tokens' path that has a checkpoint and covers at most max_tokens tokens.
  match lookup(const std::vector<int32_t>& tokens, int32_t max_tokens) const;
  // How many of tokens' first max_pages full pages are on the tree (checkpoints or not).
  int32_t matched_pages(const std::vector<int32_t>& tokens, int32_t max_pages) const;
  // Whether the node after `pages` full pages of tokens exists and has a checkpoint.
  bool has_checkpoint(const std::vector<int32_t>& tokens, int32_t pages) const;

  // A running request takes / gives back its references (tick orders the least recently used).
  void hold(const std::vector<int32_t>& nodes);
  void release(const std::vector<int32_t>& nodes, uint64_t tick);

  struct inserted {
    std::vector<int32_t> adopted_nodes;  // new nodes made of the request's pages (held for it)
    std::vector<int32_t> adopted_pages;  // indices into the request's pages now owned by the tree
    int32_t last = -1;                   // the node at depth `pages`
  };
  // Puts the first `pages` pages of a request (tokens' KV in req_pages) on the tree. Depths that
  // already have a node keep it (the request's own page there stays private to the request).
  inserted insert(const std::vector<int32_t>& tokens, const std::vector<int32_t>& req_pages, int32_t pages,
                  uint64_t tick);
  // Gives node a checkpoint; false when it already has one (the caller frees slot).
  bool attach_checkpoint(int32_t node, int32_t slot, uint64_t tick = 0);
  // A request starts from node's checkpoint: pins it (evict_checkpoint leaves it) and makes it
  // the freshest; unpin when the request has ended.
  void pin_checkpoint(int32_t node, uint64_t tick);
  void unpin_checkpoint(int32_t node);

  struct evicted {
    int32_t page = -1;
    int32_t checkpoint = -1;
  };
  // Removes the least recently used leaf no request holds; nullopt when there is none.
  std::optional<evicted> evict_one();
  // Frees the unpinned checkpoint restored from or made longest ago: a leaf no request holds goes
  // whole (its page is of no use without a checkpoint at or below it); any other node keeps its
  // page (evicted::page = -1). nullopt when every checkpoint is pinned.
  std::optional<evicted> evict_checkpoint();

  int32_t nodes() const { return live_; }
  int32_t checkpoints() const { return checkpoints_; }
  // Nodes no request holds (an upper bound of the pages eviction can free).
  int32_t unheld() const { return live_ - held_nodes_; }

 private:
  struct node {
    int32_t parent = -1;
    std::map<std::vector<int32_t>, int32_t> children;
    int32_t page = -1;
    int32_t checkpoint = -1;
    int32_t refs = 0;
    uint64_t last_use = 0;
    uint64_t ckpt_use = 0;  // tick of the checkpoint's making or last restore
    int32_t ckpt_pins = 0;  // requests starting from the checkpoint
    bool alive = false;
  };
  std::vector<int32_t> key(const std::vector<int32_t>& tokens, int32_t depth) const;
  bool evictable(int32_t id) const;
  void update_evictable(int32_t id);
  evicted remove_leaf(int32_t id);
  int32_t page_size_;
  std::vector<node> nodes_;  // nodes_[0] is the root (no page)
  std::vector<int32_t> free_ids_;
  std::set<std::pair<uint64_t, int32_t>> lru_;       // evictable leaves by (last_use, id)
  std::set<std::pair<uint64_t, int32_t>> ckpt_lru_;  // unpinned checkpoints by (ckpt_use, id)
  int32_t live_ = 0, checkpoints_ = 0, held_nodes_ = 0;
};

}  // namespace hyserve::coordinator
