#pragma once
// Executes step plans on one worker rank: applies the plan's page-table additions and state
// resets, builds the forward batch and hybrid metadata, runs the model and samples. Every rank
// of a tensor-parallel group runs the same plan; the group agrees on failures before any
// collective so one rank's bad step cannot leave the others waiting.
#include <array>
#include <cstdint>
#include <memory>

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
  ~runner();

  // Speculative decoding with a draft model: Draft and DraftExtend plans run on it, and it
  // follows every Extend / Mixed / Decode plan of the target so its cache covers the same tokens.
  // Its pools mirror the target's (same slots and page numbers).
  void set_draft_model(std::unique_ptr<model> draft, const cache_section& cache);

  wire::hello capacity(int32_t dp_rank) const;
  // Never throws for a bad plan or a failed step: the result carries ok = false and the message.
  wire::step_result execute(const wire::step_plan& plan);
  const model& get_model() const { return *model_; }

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
  void prepare(const wire::step_plan& plan, forward_batch& batch);
  wire::step_result run(const wire::step_plan& plan, const forward_batch& batch);

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
};

}  // namespace hyserve::worker
