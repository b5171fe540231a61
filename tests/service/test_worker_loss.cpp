// Losing a worker rank under load (tp = 2, the real binaries under mpirun):
//  - a rank killed outright (SIGKILL): mpirun ends every rank, names the lost rank and its host,
//    and no client waits forever;
//  - a rank that hangs (SIGSTOP): the coordinator detects the step that is not answered within
//    worker.step_timeout_s, /health answers 503 (and new requests 503) for worker.fault_grace_s,
//    the log names the group's ranks and host, and the job ends with every rank gone.
#include <gtest/gtest.h>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "service_test_support.h"

namespace hyserve::service_test {
namespace {

using steady = std::chrono::steady_clock;

std::string dump_on_failure(const service_process& s) { return "\n" + s.report(); }

double seconds_since(steady::time_point t) { return std::chrono::duration<double>(steady::now() - t).count(); }

// Starts `n` long greedy requests on their own threads; returns once the service reports them
// running (or after 30 s).
struct load {
  std::vector<std::thread> clients;
  std::vector<generation> results;
  std::vector<double> seconds;

  load(const service_process& svc, size_t n) : results(n), seconds(n) {
    const auto& prompts = reference();
    for (size_t i = 0; i < n; ++i) {
      clients.emplace_back([&, i, port = svc.port()] {
        const auto t0 = steady::now();
        results[i] = generate(port, prompts[i % prompts.size()].input_ids, greedy(400, true));
        seconds[i] = seconds_since(t0);
      });
    }
    eventually([&] { return metric_value(metrics_text(svc.port()), "hyserve_running_requests").value_or(0) >= 1.0; },
               std::chrono::seconds(30));
  }
  void join() {
    for (auto& t : clients) t.join();
  }
};

TEST(ServiceWorkerLoss, KilledRankEndsEveryRankAndIsNamedWithItsHost) {
  service_process svc("kill", R"(model: {path: @MODEL@}
parallel: {tp: 2, dp: 1}
cache: {page_size: 16, max_requests: 8, max_context: 512}
server: {host: 127.0.0.1, port: @PORT@}
worker: {step_timeout_s: 5}
)",
                      2);
  ASSERT_TRUE(svc.launch()) << svc.report();
  const std::vector<pid_t> workers = svc.worker_pids();
  ASSERT_EQ(workers.size(), 2u) << "worker processes of this instance not found";
  load l(svc, 3);
  ASSERT_EQ(::kill(workers[1], SIGKILL), 0);
  const auto killed = steady::now();

  // Every rank goes, well within the step timeout plus a margin, and mpirun reports failure.
  const std::optional<int> status = svc.wait_exit(std::chrono::seconds(35));
  ASSERT_TRUE(status.has_value()) << "mpirun still running 35 s after a rank was killed" << dump_on_failure(svc);
  const double took = seconds_since(killed);
  EXPECT_FALSE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << service_process::describe_status(*status);
  EXPECT_TRUE(svc.wait_ranks_gone(std::chrono::seconds(10))) << "rank processes left behind";
  for (pid_t p : svc.coordinator_pids()) EXPECT_NE(::kill(p, 0), 0) << "coordinator " << p << " still exists";

  // In-flight clients get an answer (an error or a closed connection), none a full 200.
  l.join();
  for (size_t i = 0; i < l.results.size(); ++i) {
    EXPECT_NE(l.results[i].status, 200u) << "request " << i << " completed after its rank was killed";
    EXPECT_LT(l.seconds[i], 60.0) << "request " << i;
  }
  // The log names the lost rank and the host it ran on.
  const std::string log = svc.log();
  std::smatch m;
  EXPECT_TRUE(std::regex_search(log, m, std::regex(R"(rank \d+ with PID \d+ on node \S+)")))
      << "the log does not name the lost rank and its host:\n"
      << svc.log_tail();
  std::printf("every rank gone %.2f s after SIGKILL; %s\n", took, m.empty() ? "" : m.str().c_str());
}

TEST(ServiceWorkerLoss, HungRankTurnsHealthTo503AndEndsTheJob) {
  constexpr double kStepTimeout = 3.0, kGrace = 4.0;
  service_process svc("hang", R"(model: {path: @MODEL@}
parallel: {tp: 2, dp: 1}
cache: {page_size: 16, max_requests: 8, max_context: 512}
server: {host: 127.0.0.1, port: @PORT@}
worker: {step_timeout_s: 3, fault_grace_s: 4}
)",
                      2);
  ASSERT_TRUE(svc.launch()) << svc.report();
  const std::vector<pid_t> workers = svc.worker_pids();
  ASSERT_EQ(workers.size(), 2u) << "worker processes of this instance not found";
  EXPECT_EQ(http_get(svc.port(), "/health").status, 200u);
  load l(svc, 2);
  ASSERT_EQ(::kill(workers[1], SIGSTOP), 0);
  const auto stopped = steady::now();

  // /health turns 503 once the step timeout has passed (polled every 50 ms).
  double detected = -1.0;
  while (seconds_since(stopped) < kStepTimeout + 10.0) {
    const http_reply h = http_get(svc.port(), "/health");
    if (h.status == 503u) {
      detected = seconds_since(stopped);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GT(detected, 0.0) << "/health never answered 503" << dump_on_failure(svc);
  EXPECT_LE(detected, kStepTimeout + 2.0) << "detection took too long";
  // A new request is refused with 503 while the fault is reported.
  const http_reply late = http_post(svc.port(), "/generate", generate_body({5, 6, 7}, greedy(4, false)));
  EXPECT_EQ(late.status, 503u) << late.describe();
  // The in-flight requests fail with the fault rather than hanging.
  l.join();
  for (size_t i = 0; i < l.results.size(); ++i) {
    EXPECT_NE(l.results[i].status, 200u) << "request " << i;
    EXPECT_LT(l.seconds[i], kStepTimeout + 30.0) << "request " << i;
  }

  // The job ends: every rank gone (the stopped one included).
  const std::optional<int> status = svc.wait_exit(std::chrono::seconds(40));
  ASSERT_TRUE(status.has_value()) << "mpirun still running after the fault" << dump_on_failure(svc);
  EXPECT_FALSE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << service_process::describe_status(*status);
  EXPECT_GE(seconds_since(stopped), kStepTimeout + kGrace - 0.5) << "the job ended before the grace period";
  EXPECT_TRUE(svc.wait_ranks_gone(std::chrono::seconds(10))) << "rank processes left behind";
  const std::string log = svc.log();
  EXPECT_NE(log.find("did not answer step"), std::string::npos) << svc.log_tail();
  EXPECT_TRUE(std::regex_search(log, std::regex(R"(ranks 1-2, leader rank 1 on host \S+)"))) << svc.log_tail();
  std::printf("/health 503 after %.2f s; the job ended %.2f s after SIGSTOP\n", detected, seconds_since(stopped));
}

}  // namespace
}  // namespace hyserve::service_test
