#pragma once
// Decode steps replayed as CUDA graphs, one graph per (batch bucket, page-table stride bucket)
// (docs/ARCHITECTURE.md, Model and kernels). A Decode batch of bs rows is padded to the smallest bucket ≥ bs
// (1, 2, 4, … up to max_batch, and max_batch itself) with padding rows that write nowhere
// (step_pack.h); its page table is laid out at the smallest power-of-two stride ≥ its pages.
//
// Per step: the host packs the padded metadata (and, when the step samples on the device, the
// rows' sampling settings) into pinned memory, one async copy puts it into the static device
// buffer every graph reads, the key's graph is launched, and either the sampled tokens of the
// real rows (8 bytes a row) or their logits come back through a reused pinned buffer, in chunks that host threads move into
// the returned tensor while later chunks are still in flight (the returned tensor itself is
// allocated while the device runs the step).
//
// A sampling step may end later (run's `defer`): run returns once the step is queued, and the
// next step can be packed and queued behind it while the device still runs the first, so the
// host's work for step N+1 overlaps the device's for step N. The pinned input and token buffers
// alternate between two halves for that (a half is reused only after its previous copy has
// finished); the device buffers are reused in stream order. At most two steps are in flight. The first step of a key runs the model body
// eagerly on the graph stream (its result is that step's logits: the warm-up), then captures the
// same body once; later steps of that key replay it. Work partitioning inside the body depends
// only on the bucket's shape, never on host-read lengths, so a replay with other lengths is
// valid.
//
// Graph memory: the warm-up measures the step's allocations (kernels::arena_footprint), and the
// capture carves them from a kernels::graph_arena of that size, so a graph holds kernels and
// copies only (no memory-alloc / memory-free nodes, which cost replay time and keep
// programmatic dependent launch from joining the kernels). Every graph of this object runs on
// its one stream and each step waits for its graph before returning, so no two of them ever
// run at once: they share one arena. A capture that needs more than the current arena gets a
// new, larger one (for itself and later captures); each graph holds (shared ownership) the
// arena its addresses point into, so an arena lives as long as the last graph that uses it.
//
// Inside a capture activations are not zero-filled (graph.h): padding rows may carry stale
// values through row-local ops only, and their logits rows are never copied back. Captured
// GEMMs use the capturing thread's cuBLAS handle and workspace (kernels/cuda/gemm.cu), so the
// thread that runs the steps (the worker's, or the engine's caller) must outlive the graphs.
//
// A model creates one decode_graphs when graphs can serve it at all (device cuda, config
// `cuda_graphs`, tp = 1, dense attention; MoE layers route on the device); it logs once which path decode
// takes and why. Per step, ineligible() names why a step runs eagerly instead (other modes,
// hidden-state capture, a batch above max_batch, forward_options::eager).
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "hyserve/common/tensor.h"
#include "hyserve/kernels/device.h"
#include "hyserve/kernels/graph.h"
#include "hyserve/worker/forward_batch.h"
#include "hyserve/worker/hybrid_metadata.h"
#include "hyserve/worker/model.h"
#include "layers.h"

namespace hyserve::worker {

// ---- Host-side plan (pure; tested on the CPU) ----

// 1, 2, 4, … (powers of two below max_batch), then max_batch. Empty when max_batch < 1.
std::vector<int32_t> decode_batch_buckets(int32_t max_batch);
// The smallest bucket ≥ bs, or nullopt when bs exceeds the largest (or bs < 1).
std::optional<int32_t> pick_batch_bucket(const std::vector<int32_t>& buckets, int32_t bs);
// Page-table stride of a step whose longest row needs `pages` pages: the smallest power of two
// ≥ max(pages, 1), capped at max_pages (the pages of cache.max_context).
int64_t pick_page_stride(int64_t pages, int64_t max_pages);

struct decode_graph_key {
  int32_t batch = 0;
  int64_t page_table_stride = 0;  // 0 for models without attention layers
  bool sampling = false;          // the graph ends with the sampler (tokens out, not logits)
  auto operator<=>(const decode_graph_key&) const = default;
};

// ---- Runtime ----

// The device-only part of a step (embedding → layers → final norm → lm_head): reads the step
// only through `in`, runs every op on ex.stream, returns this rank's logits [in.n_logit_rows,
// vocab_local] f32 on the device. Must not synchronise with the host.
using step_body = std::function<tensor(const layers::step_inputs& in, const kernels::exec_context& ex)>;

struct decode_graph_config {
  int32_t max_batch = 0;           // largest bucket
  int64_t vocab_local = 0;         // logits columns of this rank
  int32_t attention_layers = 0;    // caches whose addresses the graphs bake in
  int32_t state_layers = 0;
  bool step_clock = false;  // time replayed sampling steps (two events a step; the header below)
  kernel_paths paths;       // the model's kernel paths (exec_context::paths), captured into the graphs
};

class decode_graphs {
 public:
  explicit decode_graphs(const decode_graph_config& cfg);
  ~decode_graphs();
  decode_graphs(const decode_graphs&) = delete;
  decode_graphs& operator=(const decode_graphs&) = delete;

  // Empty when the step can run through a graph; otherwise why it runs eagerly.
  std::string ineligible(const hybrid_metadata& meta, const forward_options& opts) const;

  // Runs an eligible Decode step (see the file comment). step: the step's KV bookkeeping (null
  // without attention layers); ids: its token ids. Returns host logits [bs, vocab_local]; with
  // sampling (one settings entry per row) the graph also samples, the tokens land in *sampled
  // and the returned tensor is empty (8 bytes per row leave the device).
  // With sampling, defer set and no report, a replayed step returns once queued and sets *defer
  // (model.h, forward_options::defer); a step that captures its graph ends here. after_forward
  // (forward_options::after_forward) is queued on the graph stream right behind the step.
  tensor run(const hybrid_metadata& meta, const layers::attention_step* step, const std::vector<int32_t>& ids,
             const model_context& ctx, const step_body& body, step_report* report,
             const step_sampling* sampling = nullptr, std::vector<kernels::sample_output>* sampled = nullptr,
             deferred_step* defer = nullptr,
             const std::function<void(const kernels::exec_context&)>& after_forward = {});
  // Waits for every step queued on the graph stream (eager work on another stream goes after).
  void wait_idle();

  const std::vector<int32_t>& buckets() const { return buckets_; }
  std::string describe() const;  // "CUDA graphs per batch bucket {1,2,4,8}"
  size_t graph_count() const { return graphs_.size(); }

 private:
  void ensure_buffers(const model_context& ctx, bool attention, int32_t page_size);
  void check_caches(const model_context& ctx);
  std::vector<const void*> cache_addresses(const model_context& ctx) const;

  struct stream_deleter {
    void operator()(void* s) const noexcept;  // synchronises, then destroys
  };
  struct pinned_deleter {
    void operator()(void* p) const noexcept { kernels::pinned_free(p); }
  };

  // A captured graph and the arena its allocations were carved from (destroyed after it).
  struct graph_entry {
    std::shared_ptr<kernels::graph_arena> arena;
    kernels::captured_graph graph;
  };

  decode_graph_config cfg_;
  std::vector<int32_t> buckets_;
  // Declared before the graphs and buffers: destroyed after them.
  std::unique_ptr<void, stream_deleter> stream_;  // non-blocking; graphs captured and replayed on it
  int64_t max_pages_ = 0;   // page-table stride cap: pages of max_context
  tensor inputs_;           // i32 static packed metadata (largest layout)
  tensor logits_;           // f32 [max_batch, vocab_local] static output
  tensor sampled_;          // kernels::sample_output [max_batch] static output of sampling graphs
  // Pinned staging of inputs_ (i32), two halves of host_in_elems_ used in turn, each with the
  // event of its last copy; the same for the sampled tokens.
  std::unique_ptr<void, pinned_deleter> host_in_;
  std::unique_ptr<void, pinned_deleter> host_sampled_;
  std::vector<kernels::stream_event> in_copied_, sampled_copied_;
  int half_ = 0;  // the half the next step uses
  std::unique_ptr<void, pinned_deleter> host_out_;  // pinned staging of logits_ (f32)
  size_t host_in_elems_ = 0;
  std::vector<kernels::stream_event> chunk_done_;   // one per logits chunk in flight
  std::shared_ptr<kernels::graph_arena> arena_;     // the arena the next capture carves from
  std::vector<const void*> baked_;  // cache addresses the graphs were captured with
  std::map<decode_graph_key, graph_entry> graphs_;
  std::set<decode_graph_key> failed_;  // keys whose capture failed: eager on the graph stream
  mutable std::set<std::string> logged_;
  // With cfg.step_clock: device time of replayed sampling steps, logged when the graphs are destroyed: each step's
  // busy time on the graph stream (input copy to token copy) and the idle time before it when
  // the step before it was also one (the gap the host's step loop leaves). A ring of timers:
  // at most two steps are in flight, so a step's predecessor is intact when it is taken.
  struct step_clock {
    std::array<std::unique_ptr<kernels::gpu_timer>, 4> ring;
    uint64_t timed = 0;       // timed steps so far (the next one's sequence number)
    uint64_t runs = 0;        // run() calls so far
    uint64_t last_run = 0;    // run() number of the last timed step (+ 1; 0: none)
    std::vector<float> busy_us, idle_us;
  };
  step_clock clock_;
};

// Logs a line to stderr once per distinct text (per process).
void log_decode_path_once(const std::string& line);

}  // namespace hyserve::worker
