#pragma once
// In-process service for speculative-decoding tests: the real scheduler drives a real plan
// runner (tp = 1, CPU) through a transport that executes each plan synchronously, with every
// plan and result going through the wire encoding.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <stdexcept>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "coordinator/scheduler.h"
#include "coordinator/transport.h"
#include "hyserve/common/config.h"
#include "hyserve/common/wire.h"
#include "hyserve/kernels/device.h"
#include "hyserve/worker/model.h"
#include "hyserve/worker/runner.h"

namespace hyserve::test {

class local_transport final : public coordinator::transport {
 public:
  explicit local_transport(worker::runner& r) : runner_(r) {}
  int num_groups() const override { return 1; }
  void send_plan(int group, const std::vector<uint8_t>& bytes) override {
    const wire::step_plan plan = wire::decode_step_plan(bytes);
    modes.push_back(plan.mode);
    if (!plan.commits.empty()) ++plans_with_commits;
    if (plan.is_tree) ++tree_plans;
    if (plan.mode == 4 && plan.extend_rows > 0) ++mixed_verify_plans;
    results_.emplace_back(group, wire::encode(runner_.execute(plan)));
  }
  std::optional<std::pair<int, std::vector<uint8_t>>> poll_result() override {
    if (results_.empty()) return std::nullopt;
    auto r = std::move(results_.front());
    results_.pop_front();
    return r;
  }
  void send_shutdown() override {}

  std::vector<uint8_t> modes;  // mode byte of every plan, in order
  int plans_with_commits = 0;
  int tree_plans = 0;
  int mixed_verify_plans = 0;  // TargetVerify plans that also carry prefill chunks (extend rows)

 private:
  worker::runner& runner_;
  std::deque<std::pair<int, std::vector<uint8_t>>> results_;
};

struct generation {
  std::vector<int32_t> output;
  coordinator::finish_reason reason = coordinator::finish_reason::kAbort;
  std::optional<std::string> error;
  int64_t drafted = 0, accepted = 0;
  int32_t cached_tokens = 0;  // prompt tokens served from the prefix cache
};

struct gen_request {
  std::vector<int32_t> prompt;
  coordinator::sampling_params sampling;
};

// Requests submitted to a scheduler; their events fill one generation each. A request the
// scheduler refuses ends at once with error "rejected: ...".
class submitted_requests {
 public:
  submitted_requests(coordinator::scheduler& sched, const std::vector<gen_request>& reqs) : out_(reqs.size()) {
    for (size_t i = 0; i < reqs.size(); ++i) {
      coordinator::generate_request g;
      g.input_ids = reqs[i].prompt;
      g.sampling = reqs[i].sampling;
      g.sink = [this, i](coordinator::request_event ev) {
        std::lock_guard lock(mu_);
        generation& o = out_[i];
        o.output.insert(o.output.end(), ev.new_tokens.begin(), ev.new_tokens.end());
        if (ev.finished) {
          o.reason = ev.reason;
          o.error = ev.error;
          o.drafted = ev.metrics.spec_drafted;
          o.accepted = ev.metrics.spec_accepted;
          o.cached_tokens = ev.metrics.cached_tokens;
          ++done_;
          cv_.notify_all();
        }
      };
      const auto res = sched.submit(std::move(g));
      if (res.status != coordinator::submit_status::kAccepted) {
        std::lock_guard lock(mu_);
        out_[i].error = "rejected: " + res.message;
        ++done_;
      }
    }
  }
  // Waits until every request has finished (at most `limit`); the generations so far.
  std::vector<generation> wait(std::chrono::minutes limit) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, limit, [&] { return done_ == out_.size(); });
    return out_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<generation> out_;
  size_t done_ = 0;
};

class spec_service {
 public:
  explicit spec_service(const service_config& cfg) : cfg_(cfg), mc_(resolve_model_config(cfg)) {
    const kernels::exec_context ctx = kernels::open_device(cfg.device, 0);
    runner_ = std::make_unique<worker::runner>(worker::make_model(cfg, mc_, worker::tp_placement{}, nullptr, ctx),
                                               cfg.cache, nullptr);
    runner_->set_draft_model(worker::make_draft_model(cfg, mc_, worker::tp_placement{}, nullptr, ctx), cfg.cache);
    link_ = std::make_unique<local_transport>(*runner_);
    sched_ = std::make_unique<coordinator::scheduler>(cfg, mc_, std::vector<wire::hello>{runner_->capacity(0)}, *link_);
  }

  const model_config& config() const { return mc_; }
  local_transport& link() { return *link_; }

  // Submits every request at once (they share batches), runs until all finished. Once per
  // service: stopping the scheduler drains it, so later submissions are aborted.
  std::vector<generation> run(const std::vector<gen_request>& reqs) {
    if (ran_) throw std::logic_error("spec_service::run: once per service (the first run drained the scheduler)");
    ran_ = true;
    submitted_requests batch(*sched_, reqs);
    std::atomic<bool> stop{false};
    std::thread loop([&] { sched_->run(stop); });
    std::vector<generation> out = batch.wait(std::chrono::minutes(10));
    stop = true;
    loop.join();
    return out;
  }

 private:
  service_config cfg_;
  model_config mc_;
  std::unique_ptr<worker::runner> runner_;
  std::unique_ptr<local_transport> link_;
  std::unique_ptr<coordinator::scheduler> sched_;
  bool ran_ = false;
};

}  // namespace hyserve::test
