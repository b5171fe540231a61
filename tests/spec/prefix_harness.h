#pragma once
// In-process service for prefix-cache tests: the real scheduler drives a real plan runner (tp =
// 1) through the wire encoding (spec_harness.h), and its loop keeps running between waves of
// requests, so later waves hit what earlier ones cached.
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "spec_harness.h"

namespace hyserve::test {

// A service whose scheduler loop keeps running between waves of requests.
class prefix_service {
 public:
  explicit prefix_service(const service_config& cfg) : mc_(resolve_model_config(cfg)) {
    const kernels::exec_context ctx = kernels::open_device(cfg.device, 0);
    runner_ = std::make_unique<worker::runner>(worker::make_model(cfg, mc_, worker::tp_placement{}, nullptr, ctx),
                                               cfg.cache, nullptr);
    runner_->set_draft_model(worker::make_draft_model(cfg, mc_, worker::tp_placement{}, nullptr, ctx), cfg.cache);
    link_ = std::make_unique<local_transport>(*runner_);
    sched_ = std::make_unique<coordinator::scheduler>(cfg, mc_, std::vector<wire::hello>{runner_->capacity(0)}, *link_);
    coordinator::scheduler_observer obs;
    obs.on_prefix_evict = [this](int64_t nodes, int64_t) { evicted += nodes; };
    sched_->set_observer(std::move(obs));
    loop_ = std::thread([this] { sched_->run(stop_); });
  }
  ~prefix_service() {
    stop_ = true;
    loop_.join();
  }
  const model_config& config() const { return mc_; }
  std::atomic<int64_t> evicted{0};  // tree nodes evicted (pages, with their checkpoints)
  coordinator::scheduler& sched() { return *sched_; }

  // Submits every request at once and waits until all have finished (the loop keeps running).
  std::vector<generation> run(const std::vector<gen_request>& reqs) {
    return submitted_requests(*sched_, reqs).wait(std::chrono::minutes(5));
  }
  // The loop's capacity after it has gone round at least twice more.
  coordinator::capacity_snapshot settled_capacity() {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return sched_->capacity();
  }

 private:
  model_config mc_;
  std::unique_ptr<worker::runner> runner_;
  std::unique_ptr<local_transport> link_;
  std::unique_ptr<coordinator::scheduler> sched_;
  std::atomic<bool> stop_{false};
  std::thread loop_;
};

}  // namespace hyserve::test
