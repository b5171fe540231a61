#pragma once
// The service's scheduler driving one plan runner in this process (tp 1, one data-parallel
// group): plans and results go through the wire encoding and each plan runs synchronously when
// it is sent. One run() per scheduler (a scheduler drains when its loop stops); the runner, and
// so the loaded model, outlives any number of runs.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
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
#include "hyserve/kernels/graph.h"
#include "hyserve/worker/runner.h"

namespace hyserve::tools {

// Executes every plan on the runner as it is sent; counts the plans by mode.
class inline_transport final : public coordinator::transport {
 public:
  explicit inline_transport(worker::runner& r) : runner_(r) {}
  int num_groups() const override { return 1; }
  void send_plan(int group, const std::vector<uint8_t>& bytes) override {
    const wire::step_plan plan = wire::decode_step_plan(bytes);
    if (plan.mode < mode_counts.size()) ++mode_counts[plan.mode];
    const bool profile = plan.mode == kVerifyMode && ++verify_plans_ == profile_verify;
    if (profile) kernels::profile_start();
    results_.emplace_back(group, wire::encode(runner_.execute(plan)));
    if (profile) profiled = kernels::profile_stop();
  }
  std::optional<std::pair<int, std::vector<uint8_t>>> poll_result() override {
    if (results_.empty()) return std::nullopt;
    auto r = std::move(results_.front());
    results_.pop_front();
    return r;
  }
  void send_shutdown() override {}

  std::vector<int64_t> mode_counts = std::vector<int64_t>(8, 0);  // plans per forward-mode byte
  // > 0: the profile_verify-th TargetVerify plan runs under the op-level GPU profile
  // (kernels::profile_start), its segments in `profiled`.
  int64_t profile_verify = 0;
  std::vector<kernels::profile_segment> profiled;

 private:
  static constexpr uint8_t kVerifyMode = 4;  // worker::forward_mode::kTargetVerify
  int64_t verify_plans_ = 0;
  worker::runner& runner_;
  std::deque<std::pair<int, std::vector<uint8_t>>> results_;
};

struct timed_generation {
  std::vector<int32_t> output;
  std::optional<std::string> error;
  int64_t drafted = 0, accepted = 0;
  // Arrival time (seconds from submission) and size of every token event.
  std::vector<std::pair<double, int32_t>> events;
};

struct run_result {
  std::vector<timed_generation> rows;
  std::vector<int64_t> mode_counts;  // plans per forward-mode byte
  double seconds = 0;                // submission to the last finish
  std::vector<kernels::profile_segment> verify_profile;  // with profile_verify > 0 (CUDA only)
};

// Submits every prompt at once (greedy, ignore_eos, max_new_tokens each) to a fresh scheduler
// over `r` and waits until all finished. step_times (optional): the measured step times the
// scheduler starts from, replaced by the ones it holds at the end (one table carried across
// runs is what a long-running service over the same workers has measured).
inline run_result run_batch(const service_config& cfg, const model_config& mc, worker::runner& r,
                            const std::vector<std::vector<int32_t>>& prompts, int32_t max_new_tokens,
                            coordinator::spec::step_costs* step_times = nullptr, int64_t profile_verify = 0) {
  using clock = std::chrono::steady_clock;
  inline_transport link(r);
  link.profile_verify = profile_verify;
  coordinator::scheduler sched(cfg, mc, std::vector<wire::hello>{r.capacity(0)}, link);
  if (step_times) sched.seed_step_times(0, *step_times);
  run_result out;
  out.rows.resize(prompts.size());
  std::mutex mu;
  std::condition_variable cv;
  size_t done = 0;
  const auto t0 = clock::now();
  for (size_t i = 0; i < prompts.size(); ++i) {
    coordinator::generate_request g;
    g.input_ids = prompts[i];
    g.sampling.max_new_tokens = max_new_tokens;
    g.sampling.temperature = 0.0f;
    g.sampling.ignore_eos = true;
    g.sink = [&, i](coordinator::request_event ev) {
      const double t = std::chrono::duration<double>(clock::now() - t0).count();
      std::lock_guard lock(mu);
      timed_generation& o = out.rows[i];
      o.output.insert(o.output.end(), ev.new_tokens.begin(), ev.new_tokens.end());
      if (!ev.new_tokens.empty()) o.events.emplace_back(t, static_cast<int32_t>(ev.new_tokens.size()));
      if (ev.finished) {
        o.error = ev.error;
        o.drafted = ev.metrics.spec_drafted;
        o.accepted = ev.metrics.spec_accepted;
        ++done;
        cv.notify_all();
      }
    };
    const auto res = sched.submit(std::move(g));
    if (res.status != coordinator::submit_status::kAccepted) {
      std::lock_guard lock(mu);
      out.rows[i].error = "rejected: " + res.message;
      ++done;
    }
  }
  std::atomic<bool> stop{false};
  std::thread loop([&] { sched.run(stop); });
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return done == prompts.size(); });
  }
  out.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  stop = true;
  loop.join();
  if (step_times) *step_times = sched.step_times(0);
  out.mode_counts = link.mode_counts;
  out.verify_profile = std::move(link.profiled);
  return out;
}

}  // namespace hyserve::tools
