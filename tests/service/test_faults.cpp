// Faults of the job as a whole (tp = 2, the real binaries under mpirun):
//  - a rank stopped by SIGSTOP at a chosen control message (worker.fault: stop), five times over
//    leaders and non-leaders, and a rank that stops reading there (worker.fault: hang): /health
//    503 within step_timeout_s + fault_grace_s of the stop, every open stream ends with an error
//    event and [DONE], the log names the ranks and host, and every rank is gone within twice that;
//  - the coordinator's scheduler loop blocked for good (worker.fault: coordinator_stall): the
//    watchdog thread alone fails the streams, turns /health to 503 and ends the job;
//  - a rank killed outright during streams: /health stops answering 200, open streams end with
//    an error event (not cut), and the log names the rank and host;
//  - SIGINT to launch/serve.sh's process group, SIGTERM to serve.sh alone, or SIGUSR1 to mpirun
//    during three long streams: all three finish with [DONE], /health answers 503 from the signal
//    on, and every rank exits 0;
//  - server.strict_fields turns unknown OpenAI fields into a 400.
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <regex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "service_test_support.h"

namespace hyserve::service_test {
namespace {

using steady = std::chrono::steady_clock;

double seconds_since(steady::time_point t) { return std::chrono::duration<double>(steady::now() - t).count(); }

// One streamed /generate request read to its end on a thread of its own.
struct stream_watch {
  std::atomic<int> tokens{0};
  bool began = false;
  bool saw_done = false;
  bool saw_error = false;
  std::string error_text;
  std::string finish;
  unsigned status = 0;
  std::string transport_error;
  std::thread thread;

  void start(uint16_t port, const std::vector<int32_t>& prompt, int32_t max_new_tokens) {
    thread = std::thread([this, port, prompt, max_new_tokens] {
      http_connection c(port);
      status = c.begin_stream("/generate", generate_body(prompt, streaming(max_new_tokens)));
      if (status != 200) {
        transport_error = c.error();
        return;
      }
      began = true;
      while (auto ev = c.next_event(120s)) {
        if (*ev == "[DONE]") {
          saw_done = true;
          break;
        }
        boost::system::error_code ec;
        const boost::json::value v = boost::json::parse(*ev, ec);
        if (ec || !v.is_object()) continue;
        if (v.as_object().contains("error")) {
          saw_error = true;
          error_text = *ev;
          continue;
        }
        tokens.fetch_add(static_cast<int>(ids_of(v.at("new_ids")).size()));
        const auto& meta = v.at("meta_info").as_object();
        if (const auto* f = meta.if_contains("finish_reason"); f && f->is_object())
          finish = std::string(f->as_object().at("type").as_string());
      }
      if (!saw_done) transport_error = c.stream_error();
    });
  }
  void join() {
    if (thread.joinable()) thread.join();
  }
};

std::vector<int32_t> long_prompt(size_t n) {
  std::vector<int32_t> p;
  for (size_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(3 + (i * 37) % 500));
  return p;
}

TEST(ServiceHang, InjectedHangIsFatalWithinTheTimeoutEveryTime) {
  constexpr double kStepTimeout = 2.0, kGrace = 1.5, kBound = kStepTimeout + kGrace;
  // (control message at which the rank stops, tp rank, how): leaders and non-leaders, early and
  // later in the streams; `stop` is the process stopped by SIGSTOP (as `kill -STOP` does), `hang`
  // a process that still runs but never reads again.
  struct hang_case {
    int step, rank;
    const char* fault;
  };
  const std::vector<hang_case> cases = {{6, 0, "stop"},  {6, 1, "stop"}, {15, 0, "stop"},
                                        {15, 1, "stop"}, {30, 0, "stop"}, {6, 1, "hang"}};
  const auto& prompts = reference();
  for (const auto& [step, rank, fault] : cases) {
    const std::string what = std::string(fault) + " at control message " + std::to_string(step) + " on tp rank " +
                             std::to_string(rank);
    SCOPED_TRACE(what);
    service_process svc(std::string(fault) + std::to_string(step) + "r" + std::to_string(rank),
                        R"(model: {path: @MODEL@}
parallel: {tp: 2, dp: 1}
cache: {page_size: 16, max_requests: 8, max_context: 512}
scheduler: {chunked_prefill: 512, max_batch_tokens: 1024}
server: {host: 127.0.0.1, port: @PORT@}
worker: {step_timeout_s: 2, fault_grace_s: 1.5, fault: )" +
                            std::string(fault) + ", fail_at_step: " + std::to_string(step) +
                            ", fail_rank: " + std::to_string(rank) + "}\n",
                        2);
    ASSERT_TRUE(svc.launch()) << svc.report();
    ASSERT_EQ(http_get(svc.port(), "/health").status, 200u);
    // Two streams, then a long prompt (a plan over MPI's eager size) while the steps go on.
    std::vector<stream_watch> streams(2);
    for (size_t i = 0; i < streams.size(); ++i) streams[i].start(svc.port(), prompts[i].input_ids, 400);
    http_reply long_reply;
    std::thread long_client([&] {
      long_reply = http_post(svc.port(), "/generate", generate_body(long_prompt(450), greedy(40, true)), 60s);
    });
    // The hang, as the worker reports it.
    const std::string marker = "injected " + std::string(fault) + " before control message " + std::to_string(step);
    const bool hung = eventually([&] { return svc.log().find(marker) != std::string::npos; }, 30s);
    const auto hang_at = steady::now();
    ASSERT_TRUE(hung) << "the injected fault did not happen\n" << svc.report();
    double detected = -1.0;
    while (seconds_since(hang_at) < kBound + 5.0) {
      const http_reply h = http_call(svc.port(), "GET", "/health", {}, 2s);
      if (h.status == 503u) {
        detected = seconds_since(hang_at);
        break;
      }
      std::this_thread::sleep_for(20ms);
    }
    // Every rank gone within twice step_timeout_s + fault_grace_s of the hang.
    const auto deadline = hang_at + std::chrono::milliseconds(static_cast<int64_t>(2 * kBound * 1000));
    const std::optional<int> status =
        svc.wait_exit(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now()));
    const bool ranks_gone =
        svc.wait_ranks_gone(std::max(100ms, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now())));
    const double gone = seconds_since(hang_at);
    for (auto& s : streams) s.join();
    long_client.join();
    std::printf("%s: /health 503 after %.2f s, every rank gone %.2f s after it (bounds %.1f s, %.1f s)\n", what.c_str(),
                detected, gone, kBound, 2 * kBound);
    EXPECT_GT(detected, 0.0) << "/health never answered 503\n" << svc.report();
    EXPECT_LE(detected, kBound) << "503 came later than step_timeout_s + fault_grace_s";
    ASSERT_TRUE(status.has_value()) << "mpirun still running " << 2 * kBound << " s after the hang\n" << svc.report();
    EXPECT_FALSE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << service_process::describe_status(*status);
    EXPECT_TRUE(ranks_gone) << "rank processes left " << 2 * kBound << " s after the hang";
    EXPECT_LE(gone, 2 * kBound + 0.1) << "the job outlived twice step_timeout_s + fault_grace_s";
    for (size_t i = 0; i < streams.size(); ++i) {
      EXPECT_TRUE(streams[i].began) << "stream " << i << ": " << streams[i].status << " " << streams[i].transport_error;
      EXPECT_TRUE(streams[i].saw_error) << "stream " << i << " ended without an error event ("
                                        << streams[i].tokens.load() << " tokens): " << streams[i].transport_error;
      EXPECT_TRUE(streams[i].saw_done) << "stream " << i << " was cut: " << streams[i].transport_error;
      EXPECT_NE(streams[i].error_text.find("did not answer step"), std::string::npos) << streams[i].error_text;
      EXPECT_LT(streams[i].tokens.load(), 400) << "stream " << i;
    }
    EXPECT_NE(long_reply.status, 200u) << long_reply.describe();
    const std::string log = svc.log();
    EXPECT_TRUE(std::regex_search(log, std::regex(R"(ranks 1-2, leader rank 1 on host \S+\) did not answer step)")))
        << svc.log_tail();
  }
}

// The case a blocking send could not survive: the first plan is a 1500-token prefill (over MPI's
// eager size, so a blocking send waits for the receiver) to a leader that never reads it. With
// the non-blocking send the step timeout fails the request ("did not answer step"); were the
// loop stuck in a send, only the watchdog's stall check would answer ("scheduler loop stalled").
TEST(ServiceHang, LargePlanToALeaderThatStoppedReadingDoesNotBlockTheCoordinator) {
  constexpr double kStepTimeout = 2.0, kGrace = 1.5, kBound = kStepTimeout + kGrace;
  service_process svc("hangbig", R"(model: {path: @MODEL@}
parallel: {tp: 2, dp: 1}
cache: {page_size: 16, max_requests: 4, max_context: 2048}
scheduler: {chunked_prefill: 2048, max_batch_tokens: 2048}
server: {host: 127.0.0.1, port: @PORT@}
worker: {step_timeout_s: 2, fault_grace_s: 1.5, fault: hang, fail_at_step: 0, fail_rank: 0}
)",
                      2);
  ASSERT_TRUE(svc.launch()) << svc.report();
  http_reply reply;
  const auto sent = steady::now();
  std::thread client([&] {
    reply = http_post(svc.port(), "/generate", generate_body(long_prompt(1500), greedy(8, true)), 60s);
  });
  double detected = -1.0;
  while (seconds_since(sent) < kBound + 5.0) {
    if (http_call(svc.port(), "GET", "/health", {}, 2s).status == 503u) {
      detected = seconds_since(sent);
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  client.join();
  const std::optional<int> status = svc.wait_exit(std::chrono::milliseconds(static_cast<int64_t>(2 * kBound * 1000)));
  std::printf("1500-token plan to a leader that stopped reading: /health 503 after %.2f s, job ended %.2f s after the "
              "request\n",
              detected, seconds_since(sent));
  EXPECT_GT(detected, 0.0) << "/health never answered 503\n" << svc.report();
  EXPECT_LE(detected, kBound);
  EXPECT_EQ(reply.status, 500u) << reply.describe();
  EXPECT_NE(reply.body.find("did not answer step"), std::string::npos) << reply.body;
  ASSERT_TRUE(status.has_value()) << "mpirun still running\n" << svc.report();
  EXPECT_TRUE(svc.wait_ranks_gone(100ms)) << "rank processes left behind";
}

// The watchdog on its own: the coordinator's scheduler loop blocks for good (worker.fault:
// coordinator_stall, as a blocking call that never returns would) while two streams run. The
// watchdog thread alone turns /health to 503 within step_timeout_s + fault_grace_s, ends both
// streams with an error event and [DONE], and ends the job within twice that.
TEST(ServiceHang, StalledSchedulerLoopIsAnsweredByTheWatchdog) {
  constexpr double kStepTimeout = 2.0, kGrace = 1.5, kBound = kStepTimeout + kGrace;
  service_process svc("stall", R"(model: {path: @MODEL@}
parallel: {tp: 2, dp: 1}
cache: {page_size: 16, max_requests: 8, max_context: 512}
server: {host: 127.0.0.1, port: @PORT@}
worker: {step_timeout_s: 2, fault_grace_s: 1.5, fault: coordinator_stall, fail_at_step: 20}
)",
                      2);
  ASSERT_TRUE(svc.launch()) << svc.report();
  const auto& prompts = reference();
  std::vector<stream_watch> streams(2);
  for (size_t i = 0; i < streams.size(); ++i) streams[i].start(svc.port(), prompts[i].input_ids, 400);
  const bool stalled = eventually(
      [&] { return svc.log().find("injected stall of the scheduler loop before control message 20") != std::string::npos; },
      30s);
  const auto stall_at = steady::now();
  ASSERT_TRUE(stalled) << "the injected stall did not happen\n" << svc.report();
  double detected = -1.0;
  while (seconds_since(stall_at) < kBound + 5.0) {
    if (http_call(svc.port(), "GET", "/health", {}, 2s).status == 503u) {
      detected = seconds_since(stall_at);
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  const auto deadline = stall_at + std::chrono::milliseconds(static_cast<int64_t>(2 * kBound * 1000));
  const std::optional<int> status =
      svc.wait_exit(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now()));
  const bool ranks_gone =
      svc.wait_ranks_gone(std::max(100ms, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now())));
  const double gone = seconds_since(stall_at);
  for (auto& s : streams) s.join();
  std::printf("stalled scheduler loop: /health 503 after %.2f s, every rank gone %.2f s after the stall\n", detected,
              gone);
  EXPECT_GT(detected, 0.0) << "/health never answered 503\n" << svc.report();
  EXPECT_LE(detected, kBound);
  ASSERT_TRUE(status.has_value()) << "mpirun still running " << 2 * kBound << " s after the stall\n" << svc.report();
  EXPECT_FALSE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << service_process::describe_status(*status);
  EXPECT_TRUE(ranks_gone) << "rank processes left behind";
  for (size_t i = 0; i < streams.size(); ++i) {
    EXPECT_TRUE(streams[i].saw_error) << "stream " << i << " ended without an error event ("
                                      << streams[i].tokens.load() << " tokens): " << streams[i].transport_error;
    EXPECT_TRUE(streams[i].saw_done) << "stream " << i << " was cut: " << streams[i].transport_error;
    EXPECT_NE(streams[i].error_text.find("scheduler loop stalled"), std::string::npos) << streams[i].error_text;
    EXPECT_LT(streams[i].tokens.load(), 400) << "stream " << i;
  }
  EXPECT_NE(svc.log().find("the scheduler loop has not advanced"), std::string::npos) << svc.log_tail();
}

TEST(ServiceWorkerLoss, KilledRankEndsOpenStreamsWithAnErrorEvent) {
  service_process svc("killstreams", R"(model: {path: @MODEL@}
parallel: {tp: 2, dp: 1}
cache: {page_size: 16, max_requests: 8, max_context: 512}
server: {host: 127.0.0.1, port: @PORT@}
worker: {step_timeout_s: 30, fault_grace_s: 5}
)",
                      2);
  ASSERT_TRUE(svc.launch()) << svc.report();
  const std::vector<pid_t> workers = svc.worker_pids();
  ASSERT_EQ(workers.size(), 2u) << "worker processes of this instance not found";
  EXPECT_NE(svc.log().find("watching 2 of 2 worker rank(s) on this host"), std::string::npos) << svc.log_tail();
  const auto& prompts = reference();
  std::vector<stream_watch> streams(2);
  for (size_t i = 0; i < streams.size(); ++i) streams[i].start(svc.port(), prompts[i].input_ids, 480);
  ASSERT_TRUE(eventually([&] { return streams[0].tokens.load() > 5 && streams[1].tokens.load() > 5; }, 30s))
      << svc.report();
  ASSERT_EQ(::kill(workers[1], SIGKILL), 0);
  const auto killed = steady::now();
  // /health never says 200 once the loss is known (20 ms polling), until the server is gone.
  std::this_thread::sleep_for(300ms);
  const http_reply h = http_call(svc.port(), "GET", "/health", {}, 2s);
  EXPECT_NE(h.status, 200u) << "/health 200 " << seconds_since(killed) << " s after a worker was killed";
  for (auto& s : streams) s.join();
  for (size_t i = 0; i < streams.size(); ++i) {
    EXPECT_TRUE(streams[i].saw_error) << "stream " << i << " was cut without an error event after "
                                      << streams[i].tokens.load() << " tokens: " << streams[i].transport_error;
    EXPECT_TRUE(streams[i].saw_done) << "stream " << i << " ended without [DONE] after its error event: "
                                     << streams[i].transport_error;
    EXPECT_NE(streams[i].error_text.find("exited"), std::string::npos) << streams[i].error_text;
    EXPECT_LT(streams[i].tokens.load(), 480);
  }
  ASSERT_TRUE(svc.wait_exit(30s).has_value()) << "mpirun still running after a rank was killed\n" << svc.report();
  EXPECT_TRUE(svc.wait_ranks_gone(10s));
  const std::string log = svc.log();
  const std::regex named("worker rank (\\d+) \\(pid " + std::to_string(workers[1]) + "\\) on host \\S+ is gone");
  std::smatch m;
  EXPECT_TRUE(std::regex_search(log, m, named)) << "no log line names the lost rank and its host\n" << svc.log_tail();
  std::printf("killed worker pid %d; %s\n", static_cast<int>(workers[1]), m.empty() ? "" : m.str().c_str());
}

// Three 1500-token streams, then `send_signal` (once each has 20 tokens): all three end with
// [DONE] and full length, /health answers 503 from the signal on, and every rank exits 0.
void expect_signal_drains_three_long_streams(const std::string& name, bool via_serve_script,
                                             const std::function<void(service_process&)>& send_signal,
                                             const std::string& how,
                                             const std::function<void(service_process&)>& before_launch = {}) {
  constexpr int32_t kTokens = 1500;
  service_process svc(name, R"(model: {path: @MODEL@}
parallel: {tp: 1, dp: 1}
cache: {page_size: 16, max_requests: 8, max_context: 2048}
server: {host: 127.0.0.1, port: @PORT@, drain_timeout_s: 120}
)",
                      1);
  if (via_serve_script) svc.use_serve_script();
  if (before_launch) before_launch(svc);
  ASSERT_TRUE(svc.launch()) << svc.report();
  const std::vector<pid_t> coordinators = svc.coordinator_pids();
  ASSERT_EQ(coordinators.size(), 1u);
  const auto& prompts = reference();
  std::vector<stream_watch> streams(3);
  for (size_t i = 0; i < streams.size(); ++i) streams[i].start(svc.port(), prompts[i].input_ids, kTokens);
  ASSERT_TRUE(eventually(
      [&] {
        for (auto& s : streams)
          if (s.tokens.load() < 20) return false;
        return true;
      },
      60s))
      << svc.report();
  send_signal(svc);
  const auto signalled = steady::now();
  // /health answers 503 from the signal on (the coordinator drains; the server still listens).
  const bool unhealthy = eventually([&] { return http_call(svc.port(), "GET", "/health", {}, 2s).status == 503u; },
                                    5s);
  const double to_503 = seconds_since(signalled);
  EXPECT_TRUE(unhealthy) << "/health did not answer 503 while draining\n" << svc.log_tail();
  int at_signal_min = kTokens;
  for (auto& s : streams) at_signal_min = std::min(at_signal_min, s.tokens.load());
  for (auto& s : streams) s.join();
  for (size_t i = 0; i < streams.size(); ++i) {
    EXPECT_TRUE(streams[i].saw_done) << "stream " << i << " ended without [DONE] after " << streams[i].tokens.load()
                                     << " tokens: " << streams[i].transport_error << "\n"
                                     << svc.log_tail();
    EXPECT_FALSE(streams[i].saw_error) << streams[i].error_text;
    EXPECT_EQ(streams[i].tokens.load(), kTokens) << "stream " << i;
    EXPECT_EQ(streams[i].finish, "length") << "stream " << i;
  }
  const std::optional<int> status = svc.wait_exit(60s);
  ASSERT_TRUE(status.has_value()) << "still running 60 s after the signal\n" << svc.report();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << service_process::describe_status(*status) << "\n"
                                                               << svc.log_tail();
  EXPECT_TRUE(svc.wait_ranks_gone(10s)) << "rank processes left behind";
  const std::string log = svc.log();
  EXPECT_NE(log.find("draining"), std::string::npos) << svc.log_tail();
  EXPECT_NE(log.find("[worker 1 dp0/tp0] shut down"), std::string::npos) << svc.log_tail();
  std::printf("%s with >= %d of %d tokens streamed: /health 503 after %.2f s, all streams [DONE], job ended "
              "%.2f s after the signal\n",
              how.c_str(), at_signal_min, kTokens, to_503, seconds_since(signalled));
}

// What Ctrl-C in the terminal does: SIGINT to every process of serve.sh's group.
TEST(ServiceShutdown, SigintToServeShProcessGroupDrainsThreeLongStreams) {
  expect_signal_drains_three_long_streams(
      "sigint", true, [](service_process& svc) { ASSERT_EQ(::kill(-svc.mpirun_pid(), SIGINT), 0); },
      "SIGINT to serve.sh's process group");
}

// What a service manager's stop does: SIGTERM to serve.sh's pid alone.
TEST(ServiceShutdown, SigtermToServeShDrainsThreeLongStreams) {
  expect_signal_drains_three_long_streams(
      "sigterm-sh", true, [](service_process& svc) { ASSERT_EQ(::kill(svc.mpirun_pid(), SIGTERM), 0); },
      "SIGTERM to serve.sh");
}

// A job started with mpirun itself: SIGUSR1 to mpirun (forwarded to every rank) drains, as the
// README says (SIGTERM to mpirun is mpirun's own job kill).
TEST(ServiceShutdown, Sigusr1ToMpirunDrainsThreeLongStreams) {
  // Open MPI's isolated launcher (OMPI_MCA_plm=isolated, for hosts without ssh or rsh) forwards
  // no signal to the ranks: with Open MPI 4.1.6, a rank trapping SIGUSR1 never saw it. There
  // the drain goes to the coordinator directly (as serve.sh also sends it; the case below).
  if (const char* plm = std::getenv("OMPI_MCA_plm"); plm != nullptr && std::string_view(plm) == "isolated")
    GTEST_SKIP() << "mpirun's isolated launcher (OMPI_MCA_plm=isolated) does not forward SIGUSR1";
  expect_signal_drains_three_long_streams(
      "sigusr1", false, [](service_process& svc) { ASSERT_EQ(::kill(svc.mpirun_pid(), SIGUSR1), 0); },
      "SIGUSR1 to mpirun");
}

// A launcher that blocks SIGUSR1: mpirun inherits the mask and forwards nothing, but it starts
// its ranks with no signal blocked, so SIGUSR1 sent to the coordinator itself (as launch/serve.sh
// also does) still drains.
TEST(ServiceShutdown, Sigusr1ToTheCoordinatorDrainsWhenItsLauncherBlocksIt) {
  expect_signal_drains_three_long_streams(
      "sigusr1-blocked", false,
      [](service_process& svc) {
        const std::vector<pid_t> coordinators = svc.coordinator_pids();
        ASSERT_EQ(coordinators.size(), 1u);
        ASSERT_EQ(::kill(coordinators[0], SIGUSR1), 0);
      },
      "SIGUSR1 to the coordinator, started with SIGUSR1 blocked",
      [](service_process& svc) { svc.start_with_blocked(SIGUSR1); });
}

// server.strict_fields: an unknown field on an OpenAI route is a 400 naming it.
TEST(ServiceStrictFields, UnknownOpenAIFieldIs400) {
  service_process svc("strict", R"(model: {path: @MODEL@}
parallel: {tp: 1, dp: 1}
cache: {page_size: 16, max_requests: 4, max_context: 512}
server: {host: 127.0.0.1, port: @PORT@, strict_fields: true}
)",
                      1);
  ASSERT_TRUE(svc.launch()) << svc.report();
  const http_reply typo = http_post(svc.port(), "/v1/completions", R"({"prompt": [5, 6], "max_new_token": 3})");
  EXPECT_EQ(typo.status, 400u) << typo.describe();
  const auto err = error_object(typo);
  ASSERT_TRUE(err.has_value()) << typo.body;
  EXPECT_EQ(err->at("param").as_string(), "max_new_token");
  EXPECT_NE(std::string(err->at("message").as_string()).find("server.strict_fields"), std::string::npos) << typo.body;
  const http_reply ok =
      http_post(svc.port(), "/v1/completions", R"({"prompt": [5, 6], "max_tokens": 3, "user": "me", "model": "x"})");
  EXPECT_EQ(ok.status, 200u) << ok.describe();
  EXPECT_EQ(ok.json().at("usage").at("completion_tokens").to_number<int64_t>(), 3);
}

}  // namespace
}  // namespace hyserve::service_test
