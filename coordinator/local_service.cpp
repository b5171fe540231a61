#include "coordinator/local_service.h"

#include <algorithm>

#include "hyserve/common/error.h"
#include "hyserve/common/forward_mode.h"
#include "hyserve/kernels/device.h"
#include "hyserve/worker/model.h"
#include "hyserve/worker/runner.h"

namespace hyserve::coordinator {

void local_transport::send_plan(int group, const std::vector<uint8_t>& bytes) {
  const wire::step_plan plan = wire::decode_step_plan(bytes);
  modes.push_back(plan.mode);
  if (!plan.commits.empty()) ++plans_with_commits;
  if (plan.is_tree) ++tree_plans;
  if (plan.mode == mode_byte(forward_mode::kTargetVerify) && plan.extend_rows > 0) ++mixed_verify_plans;
  if (plan.mode == mode_byte(forward_mode::kTargetVerify) || plan.mode == mode_byte(forward_mode::kDraft))
    max_spec_rows = std::max(max_spec_rows, plan.rows.size());
  results_.emplace_back(group, wire::encode(runner_.execute(plan)));
}

std::optional<std::pair<int, std::vector<uint8_t>>> local_transport::poll_result() {
  if (results_.empty()) return std::nullopt;
  auto r = std::move(results_.front());
  results_.pop_front();
  return r;
}

local_batch::local_batch(scheduler& sched, const std::vector<local_request>& reqs) : out_(reqs.size()) {
  for (size_t i = 0; i < reqs.size(); ++i) {
    generate_request g;
    g.input_ids = reqs[i].prompt;
    g.sampling = reqs[i].sampling;
    g.sink = [this, i](request_event ev) {
      std::lock_guard lock(mu_);
      local_generation& o = out_[i];
      o.output.insert(o.output.end(), ev.new_tokens.begin(), ev.new_tokens.end());
      o.logprobs.insert(o.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
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
    const submit_result res = sched.submit(std::move(g));
    if (res.status != submit_status::kAccepted) {
      std::lock_guard lock(mu_);
      out_[i].error = "rejected: " + res.message;
      ++done_;
    }
  }
}

std::vector<local_generation> local_batch::wait(std::chrono::milliseconds limit) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, limit, [&] { return done_ == out_.size(); });
  return out_;
}

local_service::local_service(const service_config& given) : mc_(resolve_model_config(given)) {
  service_config cfg = given;
  settle_prefix_cache(cfg, mc_);
  const kernels::exec_context ctx = kernels::open_device(cfg.device, 0);
  // The target, then the draft model (if any), then the pools planned for both.
  auto target = worker::make_model(cfg, mc_, worker::tp_placement{}, nullptr, ctx);
  runner_ = std::make_unique<worker::runner>(
      std::move(target), worker::make_draft_model(cfg, mc_, worker::tp_placement{}, nullptr, ctx), cfg.cache, nullptr);
  link_ = std::make_unique<local_transport>(*runner_);
  sched_ = std::make_unique<scheduler>(cfg, mc_, std::vector<wire::hello>{runner_->capacity(0)}, *link_);
  sched_->set_quiet(true);
}

local_service::~local_service() { stop_loop(); }

void local_service::start_loop() {
  if (loop_.joinable()) return;
  if (ran_) throw invalid_argument_error("local_service: the loop ran and stopped (one run per service)");
  ran_ = true;
  loop_ = std::thread([this] { sched_->run(stop_); });
}

void local_service::stop_loop() {
  if (!loop_.joinable()) return;
  stop_ = true;
  loop_.join();
}

std::vector<local_generation> local_service::run(const std::vector<local_request>& reqs,
                                                 std::chrono::milliseconds limit) {
  if (ran_) throw invalid_argument_error("local_service::run: once per service (the first run drained the scheduler)");
  local_batch batch(*sched_, reqs);
  start_loop();
  std::vector<local_generation> out = batch.wait(limit);
  stop_loop();
  return out;
}

std::vector<local_generation> local_service::submit_and_wait(const std::vector<local_request>& reqs,
                                                             std::chrono::milliseconds limit) {
  start_loop();
  return local_batch(*sched_, reqs).wait(limit);
}

}  // namespace hyserve::coordinator
