#pragma once
// Executes step plans on one worker rank: applies the plan's page-table additions and state
// resets, builds the forward batch and hybrid metadata, runs the model and samples. Every rank
// of a tensor-parallel group runs the same plan; the group agrees on failures before any
// collective so one rank's bad step cannot leave the others waiting.
#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hyserve/common/config.h"
#include "hyserve/common/wire.h"
#include "hyserve/worker/collective.h"
#include "hyserve/worker/model.h"
#include "hyserve/worker/state_pools.h"

namespace hyserve::worker {

// Test-only fault injection: throw in step `step` (counting executed plans from 0) on tp rank `rank`.
struct fault_injection {
  int64_t step = -1;  // -1 = never
  int rank = 0;
};

class runner {
 public:
  runner(std::unique_ptr<model> m, const cache_section& cache, collective* comm, fault_injection fault = {});
  // Speculative decoding with a draft model (null: none): Draft and DraftExtend plans run on it,
  // and it follows every Extend / Mixed / Decode plan of the target so its cache covers the same
  // tokens. Its pools mirror the target's (same slots and page numbers), and the page count is
  // planned for both (make_state_pools).
  runner(std::unique_ptr<model> m, std::unique_ptr<model> draft, const cache_section& cache, collective* comm,
         fault_injection fault = {});
  ~runner();

  wire::hello capacity(int32_t dp_rank) const;
  // Runs one plan to its end (submit, then finish). Never throws for a bad plan or a failed
  // step: the result carries ok = false and the message.
  wire::step_result execute(const wire::step_plan& plan);

  // The pipelined form: submit() starts a plan. A Decode step replayed as a CUDA graph that
  // samples on the device (tp = 1, no draft model) is only queued on the device; any other step
  // runs to its end in submit. finish() waits for the oldest submitted step and returns its
  // result (results come in submission order). A plan may be submitted while one step is in
  // flight when can_submit_behind(plan) holds: its preparation then runs on the host while the
  // device still runs the step before it. Never throws for a bad plan or a failed step.
  void submit(wire::step_plan plan);
  bool can_submit_behind(const wire::step_plan& next) const;
  size_t in_flight() const { return flights_.size(); }
  // The oldest step's finish() would not wait (true when none is in flight).
  bool oldest_ready() const;
  wire::step_result finish();
  const model& get_model() const { return *model_; }
  // The request state the plans run on (KV pages, recurrent state), in their element types.
  const state_pools& pools() const { return pools_; }

  // A plan's forward pass on the target model with the caller's options, returning the model's
  // logits (nothing is sampled): the plan is prepared as for execute (page tables, released
  // slots, state resets, commits, restores). Throws on a bad plan. For what needs the logits or
  // hidden states of the service's steps: worker::engine (model tests, hyserve-generate --logits).
  host_tensor forward_logits(const wire::step_plan& plan, const forward_options& opts);

  // Host wall time of the executed plans by forward-mode byte, split into phases: prepare (page
  // tables, state resets, the previous round's commits), forward (metadata, the model's forward
  // pass up to the logits on the host) and sampling. For benchmarks and step profiles.
  struct phase_times {
    int64_t steps = 0;
    double prepare_s = 0, forward_s = 0, sample_s = 0;
  };
  const std::array<phase_times, 8>& phases() const { return phases_; }
  // Device → host bytes the last executed step moved (kernels::device_to_host_bytes): 8 per
  // logits row when the step samples on the device, without logprobs.
  uint64_t last_step_d2h_bytes() const { return last_d2h_bytes_; }
  void reset_phases() { phases_ = {}; }

 private:
  // A submitted step: its plan, what its result is built from, and its device work when that
  // is still running (defer).
  struct flight {
    wire::step_plan plan;
    std::chrono::steady_clock::time_point started;
    std::string failure;
    wire::step_result res;                         // statistics; rows are built by complete()
    std::vector<int32_t> logit_row_start;          // hybrid_metadata's, per row (+ 1)
    std::vector<uint64_t> request_ids;
    std::vector<kernels::sample_output> sampled;  // one per logits row (forward_options::sampled)
    std::vector<kernels::top_logprob> top;        // [logits rows, top_width] (forward_options::top_logprobs)
    int32_t top_width = 0;
    host_tensor logits;                            // a draft tree's first-position logits
    bool want_logits = false;
    // Rows whose sampling settings the sampler cannot use (sampled greedily, returned without a
    // token, named in the result's error): they fail alone.
    std::vector<std::pair<size_t, std::string>> bad_rows;
    deferred_step defer;
    uint64_t d2h_before = 0;
    std::chrono::steady_clock::time_point t_forward, t_sample;
  };

  void prepare(const wire::step_plan& plan, forward_batch& batch);
  void launch(const forward_batch& batch, flight& f);
  void complete(flight& f);

  std::unique_ptr<model> model_;
  collective* comm_;
  fault_injection fault_;
  int64_t executed_ = 0;
  uint64_t last_d2h_bytes_ = 0;
  std::array<phase_times, 8> phases_{};
  int32_t page_size_ = 16;
  int32_t max_requests_ = 0;
  state_pools pools_;
  std::unique_ptr<model> draft_;
  state_pools draft_pools_;
  std::deque<flight> flights_;  // submitted, oldest first (a deque keeps their addresses)
};

}  // namespace hyserve::worker
