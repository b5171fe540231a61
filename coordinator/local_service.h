#pragma once
// The service's code path in one process, without MPI or HTTP: the service's scheduler drives
// one worker's plan runner (tp = 1, dp = 1, on the config's device, with the draft model when
// the config has one) through a transport that executes each plan at once, every plan and
// result going through the wire encoding. Tools (hyserve-generate) and the in-process tests run
// exactly what the service runs this way.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "coordinator/request.h"
#include "coordinator/scheduler.h"
#include "coordinator/transport.h"
#include "hyserve/common/config.h"
#include "hyserve/common/model_config.h"
#include "hyserve/common/wire.h"

namespace hyserve::worker {
class runner;
}

namespace hyserve::coordinator {

// One group whose plans run on `runner` as they are sent; results wait for poll_result. Counts
// what went through (for tests of the scheduler's plans).
class local_transport final : public transport {
 public:
  explicit local_transport(worker::runner& r) : runner_(r) {}
  int num_groups() const override { return 1; }
  void send_plan(int group, const std::vector<uint8_t>& bytes) override;
  std::optional<std::pair<int, std::vector<uint8_t>>> poll_result() override;
  void send_shutdown() override {}

  std::vector<uint8_t> modes;  // mode byte of every plan, in order
  int plans_with_commits = 0;
  int tree_plans = 0;
  int mixed_verify_plans = 0;  // TargetVerify plans that also carry prefill chunks (extend rows)
  size_t max_spec_rows = 0;    // the most rows of a TargetVerify or Draft plan

 private:
  worker::runner& runner_;
  std::deque<std::pair<int, std::vector<uint8_t>>> results_;
};

struct local_request {
  std::vector<int32_t> prompt;
  sampling_params sampling;
};

struct local_generation {
  std::vector<int32_t> output;
  std::vector<float> logprobs;  // with sampling.logprobs: one per output token
  finish_reason reason = finish_reason::kAbort;
  std::optional<std::string> error;
  int64_t drafted = 0, accepted = 0;
  int32_t cached_tokens = 0;  // prompt tokens served from the prefix cache
};

// Requests submitted to a scheduler; their events fill one generation each. A request the
// scheduler refuses ends at once with error "rejected: ...".
class local_batch {
 public:
  local_batch(scheduler& sched, const std::vector<local_request>& reqs);
  // Waits until every request has finished (at most `limit`); the generations so far.
  std::vector<local_generation> wait(std::chrono::milliseconds limit);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<local_generation> out_;
  size_t done_ = 0;
};

class local_service {
 public:
  explicit local_service(const service_config& cfg);
  ~local_service();  // stops a running loop (it drains)
  local_service(const local_service&) = delete;
  local_service& operator=(const local_service&) = delete;

  const model_config& config() const { return mc_; }
  local_transport& link() { return *link_; }
  scheduler& sched() { return *sched_; }

  // Submits every request at once (they share batches) and runs the scheduler loop until all
  // have finished, then stops it (draining: later submissions are aborted). Once per service.
  std::vector<local_generation> run(const std::vector<local_request>& reqs,
                                    std::chrono::milliseconds limit = std::chrono::minutes(10));
  // Or: the loop keeps running (start_loop, until destruction) and waves of requests come in
  // (later waves see what earlier ones cached).
  void start_loop();
  std::vector<local_generation> submit_and_wait(const std::vector<local_request>& reqs,
                                                std::chrono::milliseconds limit = std::chrono::minutes(5));

 private:
  void stop_loop();

  model_config mc_;
  std::unique_ptr<worker::runner> runner_;
  std::unique_ptr<local_transport> link_;
  std::unique_ptr<scheduler> sched_;
  std::atomic<bool> stop_{false};
  std::thread loop_;
  bool ran_ = false;
};

}  // namespace hyserve::coordinator
