#pragma once
// In-process service for prefix-cache tests (coordinator/local_service.h): its scheduler loop
// keeps running between waves of requests, so later waves hit what earlier ones cached.
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "spec_harness.h"

namespace hyserve::test {

class prefix_service {
 public:
  explicit prefix_service(const service_config& cfg) : svc_(cfg) {
    coordinator::scheduler_observer obs;
    obs.on_prefix_evict = [this](int64_t nodes, int64_t) { evicted += nodes; };
    svc_.sched().set_observer(std::move(obs));
    svc_.start_loop();
  }
  const model_config& config() const { return svc_.config(); }
  std::atomic<int64_t> evicted{0};  // tree nodes evicted (pages, with their checkpoints)
  coordinator::scheduler& sched() { return svc_.sched(); }

  // Submits every request at once and waits until all have finished (the loop keeps running).
  std::vector<generation> run(const std::vector<gen_request>& reqs) { return svc_.submit_and_wait(reqs); }
  // The loop's capacity after it has gone round at least twice more.
  coordinator::capacity_snapshot settled_capacity() {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return svc_.sched().capacity();
  }

 private:
  coordinator::local_service svc_;
};

}  // namespace hyserve::test
