#pragma once
// Continuous-batching scheduler (docs/ARCHITECTURE.md, One request, end to end; Memory). Runs on the thread that owns MPI; HTTP
// threads only enqueue submissions and cancellations. It owns the memory bookkeeping of every
// data-parallel group (request slots, mamba slots, KV pages), builds one step plan per idle
// group (Extend, Decode or Mixed with chunked prefill; with speculation, Draft and TargetVerify
// steps whose verify rows share the step with prefill chunks), and turns step results into
// request events.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "hyserve/common/config.h"
#include "hyserve/common/step_trace.h"
#include "hyserve/common/wire.h"
#include "coordinator/memory_book.h"
#include "coordinator/prefix_tree.h"
#include "coordinator/request.h"
#include "coordinator/request_state.h"
#include "coordinator/speculative.h"
#include "coordinator/speculative_round.h"
#include "coordinator/transport.h"

namespace hyserve::coordinator {

struct scheduler_observer {
  std::function<void(std::string_view mode, double seconds)> on_step;
  std::function<void(int64_t queued, int64_t running)> on_load;
  std::function<void(int64_t free_pages, int64_t free_slots)> on_capacity;
  std::function<void()> on_cancel;
  // A step result's decode attention: rows, sparse rows, KV pages one attention layer read.
  std::function<void(int64_t decode_rows, int64_t sparse_rows, int64_t pages_read)> on_decode_attention;
  // One speculative verify row: drafts proposed and accepted.
  std::function<void(int64_t drafted, int64_t accepted)> on_spec;
  // Overlapped loop: a step sent while the group's previous one was in flight (its rows), and
  // rows of a step in flight whose request finished before it came back.
  std::function<void(int64_t rows)> on_overlap;
  std::function<void(int64_t rows)> on_wasted_rows;
  // Prefix caching: an admitted request's prompt tokens and those served from the cache; nodes
  // (pages, with their checkpoints) evicted; checkpoints in use and pages held by the trees.
  std::function<void(int64_t prompt_tokens, int64_t cached_tokens)> on_prefix_lookup;
  std::function<void(int64_t nodes, int64_t checkpoints)> on_prefix_evict;
  std::function<void(int64_t checkpoints, int64_t cached_pages)> on_prefix_capacity;
};

// Free capacity summed over the groups, updated by the loop each iteration (any thread may read).
struct capacity_snapshot {
  int64_t free_pages = 0, free_slots = 0, free_checkpoints = 0;
  int64_t cached_pages = 0, checkpoints = 0;
};

class scheduler final : public frontend {
 public:
  scheduler(const service_config& cfg, const model_config& mc, std::vector<wire::hello> groups, transport& link);

  submit_result submit(generate_request req) override;
  void cancel(uint64_t id) override;
  model_info info() const override { return info_; }
  // false once draining (SIGINT / SIGTERM / SIGUSR1) or after a fatal worker fault.
  bool healthy() const override { return healthy_.load() && !draining_.load(); }
  bool draining() const override { return draining_.load(); }
  flush_result flush_cache() override;
  capacity_snapshot capacity() const {
    return capacity_snapshot{cap_pages_.load(), cap_slots_.load(), cap_ckpts_.load(), cap_cached_pages_.load(),
                             cap_ckpts_used_.load()};
  }

  // From any thread: a worker rank is known to be gone (its process exited). The loop fails
  // every request with an error naming the rank and host, and run() returns 1.
  void report_lost_rank(int world_rank, const std::string& host);
  // From any thread: a fatal fault found outside the loop (a watchdog): /health answers 503.
  void mark_unhealthy() { healthy_ = false; }
  // From any thread, when the loop itself is stuck (a watchdog): every open request gets a final
  // error event now (streams end with an error event rather than being cut when the job ends).
  void fail_open_requests(const std::string& why);
  // Steady-clock nanoseconds of the loop's last iteration (a watchdog checks that it advances).
  int64_t last_tick_ns() const { return last_tick_ns_.load(); }

  void set_observer(scheduler_observer obs) { observer_ = std::move(obs); }
  // No drain and loop-statistics lines on stderr (an in-process user such as a tool); errors
  // are still written.
  void set_quiet(bool quiet) { quiet_ = quiet; }

  // The scheduling loop. Returns when stop was requested and in-flight work drained (0), or on
  // a fatal worker fault (1, after failing every request).
  int run(const std::atomic<bool>& stop_requested);

  // The step times data-parallel group g has measured for the speculative cost check, and a
  // table to start from (a previous scheduler's over the same workers, e.g. a benchmark's
  // warm-up run: what a long-running service has measured). Only while run() is not running.
  const spec::step_costs& step_times(int g) const;
  void seed_step_times(int g, const spec::step_costs& costs);

 private:
  using clock = std::chrono::steady_clock;
  // A request's slots and pages, returned to the free lists (deferred until the last step in
  // flight that carries the request has come back).
  struct held_resources {
    int32_t req_slot = -1, mamba_slot = -1;
    std::vector<int32_t> pages;
    std::vector<int32_t> nodes;  // prefix-tree nodes to let go of
    int32_t pinned_node = -1;    // the node whose checkpoint the request started from
  };
  // A checkpoint a step in flight writes: the node after `pages` pages of request id's prompt,
  // or (decode) of its prompt + output, kept by the request until it finishes.
  struct pending_save {
    uint64_t id = 0;
    int32_t pages = 0;
    int32_t slot = -1;
    bool decode = false;
  };
  struct group_state {
    group_state(memory_book m, speculative_round r) : mem(std::move(m)), round(std::move(r)) {}
    memory_book mem;  // pages, slots, checkpoints and the prefix tree
    speculative_round round;  // speculative decoding: the round in progress, measured step times
    std::vector<uint64_t> running;
    // Steps sent whose results have not come back, oldest first: one, or two with
    // scheduler.overlap (the next plain step is sent while the previous one runs).
    struct flight {
      uint64_t step_id = 0;
      std::string mode;
      step_rows rows;
      clock::time_point sent_at;
      std::vector<held_resources> deferred;  // released once this step's result is in
      std::vector<pending_save> saves;       // checkpoints the step writes
    };
    std::deque<flight> flights;
    bool in_flight() const { return !flights.empty(); }
    clock::time_point last_result_at, last_plan_at;
    // Prefix caching: the state copies and checkpoints of the step being built.
    std::vector<wire::state_copy_op> restores, saves;
    std::vector<pending_save> step_saves;
  };
  // The scheduler as group g's speculative rounds see it (scheduler.cpp).
  class group_host;

  void take_submissions();
  void take_cancellations();
  void admit();
  void schedule_group(int g);
  void schedule_plain(int g, const std::vector<uint64_t>& decode_ids, const std::vector<uint64_t>& prefill_ids);
  // The next prefill chunk of r (n tokens) as a plan row.
  wire::plan_row prefill_row(request_state& r, int32_t n);
  // The length of r's next prefill chunk within budget tokens: up to the next multiple of
  // min(chunked_prefill, max_batch_tokens) counted from the prompt's first token, so where a
  // prompt is split depends on that request alone (batch invariance: docs/ARCHITECTURE.md),
  // then cut where the prefix cache wants a checkpoint (prefill_chunk); 0 when it does not fit:
  // the request waits for a step with room rather than being cut at the budget.
  int32_t next_chunk(const request_state& r, int32_t budget) const;
  void send_plan(int g, built_step step);
  wire::plan_row base_row(request_state& r) const;
  // Appends tokens to a request's output, finishing it on a stop token, max_new_tokens or the
  // context limit (later tokens are dropped). Returns true when it finished.
  bool emit(request_state& r, const std::vector<int32_t>& tokens, const wire::row_result* row = nullptr);
  // A row the worker returned without tokens (it refused that row only): fails its request
  // with the worker's message and returns true.
  bool row_failed(int g, uint64_t id, const wire::step_result& res, size_t row);
  bool spec_enabled() const { return cfg_.speculative.algorithm != speculative_algorithm::kNone; }
  void handle_result(int g, const std::vector<uint8_t>& bytes);
  void process_result(int g, const group_state::flight& st, const std::optional<wire::step_result>& res,
                      const std::string& failure);
  void finish(uint64_t id, finish_reason reason, std::optional<std::string> error);
  void release(request_state& r);
  void free_resources(group_state& g, held_resources& h);
  // Whether group g may send a step now (none in flight, or an overlapped plain step).
  bool may_send(int g) const;
  void fail_all(const std::string& why);
  // A fatal fault: /health 503, the reason logged, every request failed with it.
  void fatal(const std::string& why);
  void report_load();
  int32_t pages_for(const request_state& r) const;
  // Prefix caching.
  bool prefix_enabled() const { return cfg_.cache.prefix.enabled; }
  // determinism: batch_invariant: a prompt is cut, saved and resumed only at multiples of
  // cache.prefix.state_interval (a multiple of the recurrent scans' chunk, and chunked_prefill a
  // multiple of it: check_invariant_prefix), and answers are not cached, so the cache changes no
  // bit of any output (docs/ARCHITECTURE.md, Prefix caching).
  bool aligned_prefix() const { return cfg_.kernels.batch_invariant; }
  // p rounded down to the positions aligned_prefix() allows (p itself otherwise).
  int32_t aligned_down(int32_t p) const;
  // aligned_prefix(): the fewest prompt tokens a cut or a resumed prompt leaves on either side,
  // plus one. The CUDA attention serves a row of at most 16 queries (kernels::kMaxDecodeQueries)
  // on its decode kernel and a longer one on the extend kernel, so a piece of 16 tokens or fewer
  // would take another kernel than the same tokens inside the uncut prompt's chunk. 0 otherwise.
  int32_t invariant_tail() const { return aligned_prefix() ? 16 : 0; }
  bool checkpoint_at(const request_state& r, int32_t pos) const;
  // The page boundary up to which the prefix tree holds r's prompt (before its last token).
  int32_t shared_boundary(const request_state& r) const;
  // A prefill chunk of n tokens from r.fed(), cut at the next checkpoint position the tree lacks.
  int32_t prefill_chunk(const request_state& r, int32_t n) const;
  // memory_book::evict_for, with the evictions reported to the observer.
  bool evict_for(group_state& g, int32_t pages, int32_t ckpts);
  void report_evicted(const memory_book::evicted& freed);
  void take_flushes();
  void insert_saves(group_state& g, const std::vector<pending_save>& saves, bool ok);
  // A row of r that feeds up to position end saves the state there when the tree lacks it (a
  // prompt checkpoint position) or when end is a page boundary past the prompt (decode).
  void plan_save(request_state& r, int32_t end);
  bool decode_checkpoint_at(const request_state& r, int32_t end) const;
  void land_decode_save(group_state& g, request_state& r, const pending_save& sv);
  // A finished request's pages up to its decode checkpoint go on the tree, with the checkpoint.
  void insert_generated(request_state& r);
  void free_decode_slot(group_state& g, int32_t slot);
  // r now holds the nodes the tree made of its pages, and those pages are the tree's.
  void adopt(request_state& r, const prefix_tree::inserted& ins);
  uint64_t tick_ = 0;
  bool quiet_ = false;
  std::atomic<int64_t> cap_pages_{0}, cap_slots_{0}, cap_ckpts_{0}, cap_cached_pages_{0}, cap_ckpts_used_{0};
  struct flush_waiter {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    flush_result res;
  };
  std::vector<std::shared_ptr<flush_waiter>> flush_inbox_;  // guarded by inbox_mu_

  service_config cfg_;
  model_info info_;
  transport& link_;
  std::vector<wire::hello> hellos_;
  std::vector<group_state> groups_;
  scheduler_observer observer_;
  std::atomic<bool> healthy_{true};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> last_tick_ns_{0};
  std::mutex lost_mu_;  // guards lost_ (written by a watchdog thread)
  std::string lost_;    // non-empty: a worker rank is gone (what to report)
  std::atomic<bool> lost_flag_{false};
  // The sink of every request submitted and not finished, for fail_open_requests.
  std::mutex sinks_mu_;
  std::unordered_map<uint64_t, event_sink> sinks_;

  std::mutex inbox_mu_;  // guards the three inbox fields below (touched by HTTP threads)
  std::deque<generate_request> inbox_;
  std::vector<uint64_t> cancel_inbox_;
  std::atomic<int64_t> queued_{0};
  uint64_t next_id_ = 1;

  // Where the loop's time goes (logged when run() returns): results handled and the time that
  // took, plans sent and the time from a group's last result to its next plan.
  struct loop_stats {
    int64_t results = 0, plans = 0, gaps = 0;
    double handle_s = 0, schedule_s = 0, gap_s = 0, tail_s = 0, admit_s = 0;
  } loop_stats_;
  std::optional<clock::time_point> after_result_;  // the last iteration handled a result
  void log_loop_stats() const;
  step_trace trace_;  // scheduler.step_trace: result / plan / flush events
  // Request events of the loop iteration, delivered to the requests' sinks after the next plans
  // are sent (flush_events): a step's streaming costs the device no idle time. A request's
  // events keep their order; finish() flushes before it hands its request's last event over.
  struct pending_event {
    uint64_t id = 0;
    request_event event;
  };
  std::vector<pending_event> outbox_;
  void flush_events();

  std::deque<uint64_t> waiting_;
  std::unordered_map<uint64_t, request_state> requests_;
  uint64_t next_step_ = 1;
};

}  // namespace hyserve::coordinator
