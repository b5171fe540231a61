// The scheduler's faults and reports: a lost rank, failing open requests, the fatal path, the
// load report and the step loop's statistics at shutdown.
#include "coordinator/scheduler.h"

#include <algorithm>
#include <cstdio>

#include "hyserve/common/error.h"
#include "hyserve/common/forward_mode.h"

namespace hyserve::coordinator {

void scheduler::report_lost_rank(int world_rank, const std::string& host) {
  std::lock_guard<std::mutex> lock(lost_mu_);
  if (!lost_.empty()) return;
  const int tp = std::max(1, cfg_.parallel.tp);
  const int g = (world_rank - 1) / tp;
  lost_ = "worker rank " + std::to_string(world_rank) + " (data-parallel group " + std::to_string(g) + ", tp rank " +
          std::to_string((world_rank - 1) % tp) + ") on host " + host + " exited";
  healthy_ = false;
  lost_flag_ = true;
}

void scheduler::fail_open_requests(const std::string& why) {
  std::unordered_map<uint64_t, event_sink> open;
  {
    std::lock_guard<std::mutex> lock(sinks_mu_);
    open.swap(sinks_);
  }
  // A sink only posts to its session (thread-safe); events the loop might still send for these
  // requests later reach no one (their handlers end with this one).
  for (auto& [id, sink] : open) {
    request_event ev;
    ev.finished = true;
    ev.reason = finish_reason::kAbort;
    ev.error = why;
    sink(std::move(ev));
  }
}

void scheduler::fatal(const std::string& why) {
  healthy_ = false;
  std::fprintf(stderr, "[coordinator] fatal: %s; failing %zu request(s)\n", why.c_str(), requests_.size());
  std::fflush(stderr);
  fail_all("fatal worker fault: " + why);
}

void scheduler::fail_all(const std::string& why) {
  std::vector<uint64_t> ids;
  for (const auto& [id, r] : requests_) ids.push_back(id);
  for (uint64_t id : ids) finish(id, finish_reason::kAbort, why);
}

void scheduler::report_load() {
  if (observer_.on_load) {
    int64_t running = 0;
    for (const auto& g : groups_) running += static_cast<int64_t>(g.running.size());
    observer_.on_load(static_cast<int64_t>(waiting_.size()) + static_cast<int64_t>(inbox_.size()), running);
  }
  if (observer_.on_capacity) {
    int64_t pages = 0, slots = 0;
    for (const auto& g : groups_) {
      pages += g.mem.pages.available();
      slots += g.mem.free_mamba_slots();
    }
    observer_.on_capacity(pages, slots);
  }
  int64_t pages = 0, slots = 0, ckpts = 0, cached = 0, used = 0;
  for (const auto& g : groups_) {
    pages += g.mem.pages.available();
    slots += g.mem.free_mamba_slots();
    ckpts += g.mem.checkpoints.available();
    if (g.mem.tree) {
      cached += g.mem.tree->nodes();
      used += g.mem.tree->checkpoints();
    }
  }
  cap_pages_ = pages;
  cap_slots_ = slots;
  cap_ckpts_ = ckpts;
  cap_cached_pages_ = cached;
  cap_ckpts_used_ = used;
  if (prefix_enabled() && observer_.on_prefix_capacity) observer_.on_prefix_capacity(used, cached);
}

void scheduler::log_loop_stats() const {
  const loop_stats& s = loop_stats_;
  auto us = [](double sec, int64_t n) { return n > 0 ? sec / static_cast<double>(n) * 1e6 : 0.0; };
  std::fprintf(stderr,
               "[coordinator] step loop: %lld results, %.1f us each to handle; %lld plans, %.1f us each to plan "
               "and send; %.1f us from a result to the next plan of its group (%lld plans that waited); "
               "after a result: %.1f us to the loop's top, %.1f us to take submissions and admit\n",
               static_cast<long long>(s.results), us(s.handle_s, s.results), static_cast<long long>(s.plans),
               us(s.schedule_s, s.plans), us(s.gap_s, s.gaps), static_cast<long long>(s.gaps),
               us(s.tail_s, s.results), us(s.admit_s, s.results));
}

}  // namespace hyserve::coordinator
