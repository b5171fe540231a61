// End-to-end cases that need a service of their own: queue overflow, an injected worker
// failure, SIGTERM under load, a wrong world size, and the port-0 launch.
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "service_test_support.h"

namespace hyserve::service_test {
namespace {

std::string dump_on_failure(const service_process& s) { return "\n" + s.report(); }

// Queue overflow: with max_running 1 and max_queue 2 a burst is partly refused with 503 +
// Retry-After, and every request that was accepted (200) is complete and correct.
TEST(ServiceQueue, OverflowAnswers503WithRetryAfterAndLosesNoAcceptedRequest) {
  service_process svc("queue", R"(model: {path: @MODEL@}
parallel: {tp: 1, dp: 1}
cache: {page_size: 16, max_requests: 8, max_context: 512}
scheduler: {max_queue: 2, max_running: 1}
server: {host: 127.0.0.1, port: @PORT@}
)",
                      1);
  ASSERT_TRUE(svc.launch()) << svc.report();
  const auto& prompts = reference();
  constexpr size_t kBurst = 24;
  size_t refused = 0, accepted = 0;
  for (int burst = 0; burst < 3 && refused == 0; ++burst) {
    std::vector<http_reply> replies(kBurst);
    run_concurrently(kBurst, [&](size_t i) {
      replies[i] = http_post(svc.port(), "/generate",
                             generate_body(prompts[i % 3].input_ids, greedy(24, true)), 120s);
    });
    for (size_t i = 0; i < kBurst; ++i) {
      const http_reply& r = replies[i];
      SCOPED_TRACE("burst " + std::to_string(burst) + " request " + std::to_string(i));
      if (r.status == 503) {
        ++refused;
        const std::string retry = r.header("retry-after");
        EXPECT_FALSE(retry.empty()) << "503 without Retry-After: " << r.describe();
        EXPECT_TRUE(!retry.empty() && std::all_of(retry.begin(), retry.end(), ::isdigit) && std::stoi(retry) >= 1)
            << "Retry-After: '" << retry << "'";
        const auto err = error_object(r);
        ASSERT_TRUE(err.has_value()) << r.body;
        EXPECT_EQ(err->at("code").to_number<int64_t>(), 503);
        continue;
      }
      ASSERT_EQ(r.status, 200u) << "every request is either accepted and answered, or refused with 503: "
                                << r.describe() << dump_on_failure(svc);
      ++accepted;
      const generation g = parse_generation(r);
      EXPECT_EQ(g.ids, prompts[i % 3].greedy_ids) << "accepted request incomplete or wrong";
      EXPECT_EQ(g.finish, "length");
      EXPECT_EQ(g.completion_tokens, 24);
    }
  }
  std::printf("queue overflow: %zu answered 200, %zu refused with 503\n", accepted, refused);
  EXPECT_GE(refused, 1u) << "no burst of " << kBurst << " overflowed a queue of 2";
  EXPECT_GE(accepted, 1u);
  // The queue drains and the server keeps working.
  EXPECT_TRUE(eventually(
      [&] {
        const std::string t = metrics_text(svc.port());
        return metric_value(t, "hyserve_queue_depth") == 0.0 && metric_value(t, "hyserve_running_requests") == 0.0;
      },
      10s));
  const generation after = generate(svc.port(), prompts[0].input_ids, greedy(24, true));
  EXPECT_EQ(after.ids, prompts[0].greedy_ids) << after;
  EXPECT_EQ(http_get(svc.port(), "/health").status, 200u);
}

// Small prefill chunks and a small token budget (chunked prefill, mixed prefill+decode steps)
// give the same greedy output as the fixture, alone and while other requests decode.
TEST(ServiceChunkedPrefill, SmallChunksAndTokenBudgetReproduceFixture) {
  service_process svc("chunked", R"(model: {path: @MODEL@}
parallel: {tp: 2, dp: 1}
cache: {page_size: 16, max_requests: 8, max_context: 512}
scheduler: {chunked_prefill: 8, max_batch_tokens: 20}
server: {host: 127.0.0.1, port: @PORT@}
)",
                      2);
  ASSERT_TRUE(svc.launch()) << svc.report();
  const auto& prompts = reference();
  for (size_t p = 0; p < prompts.size(); ++p) {
    const generation g = generate(svc.port(), prompts[p].input_ids, greedy(24, true));
    EXPECT_EQ(g.ids, prompts[p].greedy_ids) << "prompt " << p << ": " << g;
  }
  // A long prompt alone, then the same long prompt while the fixture prompts run beside it.
  std::vector<int32_t> long_prompt;
  for (int i = 0; i < 300; ++i) long_prompt.push_back(3 + (i * 37) % 500);
  const generation long_alone = generate(svc.port(), long_prompt, greedy(40, true));
  ASSERT_EQ(long_alone.status, 200u) << long_alone;
  std::vector<generation> got(7);
  run_concurrently(got.size(), [&](size_t i) {
    got[i] = i == 0 ? generate(svc.port(), long_prompt, greedy(40, true))
                    : generate(svc.port(), prompts[i % 3].input_ids, greedy(24, true));
  });
  EXPECT_EQ(got[0], long_alone) << "the long prompt among others";
  for (size_t i = 1; i < got.size(); ++i)
    EXPECT_EQ(got[i].ids, prompts[i % 3].greedy_ids) << "request " << i << ": " << got[i];
}

// A worker that throws in one step fails only that step's request(s) with 500; the service
// stays healthy and later requests are correct.
TEST(ServiceWorkerFault, InjectedStepFailureFailsOnlyThatStep) {
  service_process svc("fault", R"(model: {path: @MODEL@}
parallel: {tp: 2, dp: 1}
cache: {page_size: 16, max_requests: 8, max_context: 512}
server: {host: 127.0.0.1, port: @PORT@}
worker: {fail_at_step: 3, fail_rank: 1}
)",
                      2);
  ASSERT_TRUE(svc.launch()) << svc.report();
  const auto& prompts = reference();
  // Steps 0 (prefill), 1, 2 succeed; step 3 (a decode) throws on tp rank 1.
  const http_reply failed =
      http_post(svc.port(), "/generate", generate_body(prompts[0].input_ids, greedy(24, true)));
  EXPECT_EQ(failed.status, 500u) << failed.describe() << dump_on_failure(svc);
  const auto err = error_object(failed);
  ASSERT_TRUE(err.has_value()) << failed.body;
  EXPECT_EQ(err->at("code").to_number<int64_t>(), 500);
  EXPECT_NE(std::string(err->at("message").as_string()).find("worker error"), std::string::npos) << failed.body;
  // The failing rank's own message reaches the client, not just "a rank failed".
  EXPECT_NE(std::string(err->at("message").as_string()).find("injected worker failure"), std::string::npos)
      << failed.body;
  EXPECT_EQ(err->at("type").as_string(), "server_error") << failed.body;

  EXPECT_EQ(http_get(svc.port(), "/health").status, 200u);
  for (size_t p = 0; p < prompts.size(); ++p) {
    const generation g = generate(svc.port(), prompts[p].input_ids, greedy(24, true));
    EXPECT_EQ(g.status, 200u) << "prompt " << p << ": " << g << dump_on_failure(svc);
    EXPECT_EQ(g.ids, prompts[p].greedy_ids) << "prompt " << p << " after the injected failure";
  }
  std::vector<generation> together(6);
  run_concurrently(together.size(), [&](size_t i) {
    together[i] = generate(svc.port(), prompts[i % 3].input_ids, greedy(24, true));
  });
  for (size_t i = 0; i < together.size(); ++i)
    EXPECT_EQ(together[i].ids, prompts[i % 3].greedy_ids) << "concurrent " << i << ": " << together[i];
  // A streamed request works as well, and every slot is free again.
  const streamed s = stream_tokens(svc.port(), "/generate",
                                   generate_body(prompts[1].input_ids, streaming(24)));
  EXPECT_EQ(s.ids, prompts[1].greedy_ids) << s.error;
  EXPECT_EQ(http_get(svc.port(), "/health").status, 200u);
  EXPECT_TRUE(eventually([&] { return metric_value(metrics_text(svc.port()), "hyserve_free_mamba_slots") == 8.0; }, 10s))
      << metrics_text(svc.port());
  // The coordinator logs the failed step.
  EXPECT_NE(svc.log().find("failed"), std::string::npos) << svc.log_tail();
}

// SIGTERM to the coordinator under load: in-flight requests finish with 200 and full output,
// new ones are refused, and every rank exits 0.
TEST(ServiceShutdown, SigtermDrainsInFlightRequestsAndEveryRankExitsZero) {
  service_process svc("sigterm", R"(model: {path: @MODEL@}
parallel: {tp: 2, dp: 1}
cache: {page_size: 16, max_requests: 8, max_context: 512}
server: {host: 127.0.0.1, port: @PORT@, drain_timeout_s: 120}
)",
                      2);
  ASSERT_TRUE(svc.launch()) << svc.report();
  const std::vector<pid_t> coordinators = svc.coordinator_pids();
  const std::vector<pid_t> workers = svc.worker_pids();
  ASSERT_EQ(coordinators.size(), 1u) << "coordinator process of this instance not found";
  ASSERT_EQ(workers.size(), 2u) << "worker processes of this instance not found";

  const auto& prompts = reference();
  constexpr int32_t kLong = 320;
  constexpr size_t kPlain = 3, kStreams = 2;
  std::vector<generation> plain(kPlain);
  std::vector<streamed> streams(kStreams);
  std::atomic<int> streams_started{0};
  std::vector<std::thread> clients;
  for (size_t i = 0; i < kPlain; ++i) {
    clients.emplace_back([&, i] {
      plain[i] = generate(svc.port(), prompts[i % 3].input_ids, greedy(kLong, true));
    });
  }
  for (size_t i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      streamed& s = streams[i];
      http_connection c(svc.port());
      s.status = c.begin_stream("/generate", generate_body(prompts[(i + 1) % 3].input_ids,
                                                           streaming(kLong)));
      if (s.status != 200) {
        s.error = c.error();
        streams_started.fetch_add(1);
        return;
      }
      bool first = true;
      while (auto ev = c.next_event(120s)) {
        if (*ev == "[DONE]") {
          s.saw_done = true;
          break;
        }
        const boost::json::value v = boost::json::parse(*ev);
        if (v.as_object().contains("error")) {
          s.error = *ev;
        } else {
          for (int32_t id : ids_of(v.at("new_ids"))) s.ids.push_back(id);
        }
        ++s.events;
        if (first) {
          first = false;
          streams_started.fetch_add(1);
        }
      }
      if (first) streams_started.fetch_add(1);
    });
  }
  // Every request accepted and running before the signal.
  std::string last;
  const bool loaded = eventually(
      [&] {
        last = metrics_text(svc.port());
        return streams_started.load() == static_cast<int>(kStreams) &&
               metric_value(last, "hyserve_running_requests").value_or(0) +
                       metric_value(last, "hyserve_queue_depth").value_or(0) >=
                   static_cast<double>(kPlain + kStreams);
      },
      30s);
  EXPECT_TRUE(loaded) << "the requests were not all running before SIGTERM:\n" << last;
  ASSERT_EQ(::kill(coordinators[0], SIGTERM), 0);
  const auto signalled = steady::now();

  // While draining, a new request is refused (503), or finds the listener already closed.
  std::this_thread::sleep_for(100ms);
  const http_reply late = http_post(svc.port(), "/generate", generate_body({5, 6, 7}, greedy(4, false)), 30s);
  EXPECT_NE(late.status, 200u) << "a request sent after SIGTERM was accepted: " << late.describe();
  EXPECT_TRUE(late.status == 503u || late.status == 0u) << late.describe();

  for (auto& t : clients) t.join();
  for (size_t i = 0; i < kPlain; ++i) {
    EXPECT_EQ(plain[i].status, 200u) << "in-flight request " << i << ": " << plain[i] << dump_on_failure(svc);
    EXPECT_EQ(plain[i].ids.size(), static_cast<size_t>(kLong)) << "request " << i;
    EXPECT_EQ(plain[i].finish, "length");
    if (plain[i].ids.size() >= 24) {
      EXPECT_EQ(std::vector<int32_t>(plain[i].ids.begin(), plain[i].ids.begin() + 24), prompts[i % 3].greedy_ids);
    }
  }
  for (size_t i = 0; i < kStreams; ++i) {
    EXPECT_EQ(streams[i].status, 200u) << streams[i].error;
    EXPECT_TRUE(streams[i].saw_done) << "stream " << i << " ended without [DONE]: " << streams[i].error;
    EXPECT_TRUE(streams[i].error.empty()) << streams[i].error;
    EXPECT_EQ(streams[i].ids.size(), static_cast<size_t>(kLong)) << "stream " << i;
    if (streams[i].ids.size() >= 24) {
      EXPECT_EQ(std::vector<int32_t>(streams[i].ids.begin(), streams[i].ids.begin() + 24),
                prompts[(i + 1) % 3].greedy_ids);
    }
  }

  // Every rank exits, with status 0 (mpirun's exit status is 0 only when all ranks' are).
  const std::optional<int> status = svc.wait_exit(60s);
  ASSERT_TRUE(status.has_value()) << "mpirun still running 60 s after SIGTERM" << dump_on_failure(svc);
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << "mpirun: " << service_process::describe_status(*status) << dump_on_failure(svc);
  EXPECT_TRUE(svc.wait_ranks_gone(10s)) << "rank processes left behind";
  for (pid_t p : coordinators) EXPECT_NE(::kill(p, 0), 0) << "coordinator " << p << " still exists";
  for (pid_t p : workers) EXPECT_NE(::kill(p, 0), 0) << "worker " << p << " still exists";
  const std::string log = svc.log();
  EXPECT_NE(log.find("draining"), std::string::npos) << svc.log_tail();
  EXPECT_NE(log.find("shutting down"), std::string::npos) << svc.log_tail();
  EXPECT_NE(log.find("[worker 1 dp0/tp0] shut down"), std::string::npos) << svc.log_tail();
  EXPECT_NE(log.find("[worker 2 dp0/tp1] shut down"), std::string::npos) << svc.log_tail();
  EXPECT_EQ(log.find("aborted"), std::string::npos) << "nothing should be aborted:\n" << svc.log_tail();
  std::printf("shutdown took %.2f s after SIGTERM\n",
              std::chrono::duration<double>(steady::now() - signalled).count());
}

// A world size that does not match dp·tp: every rank prints the expected size and the job
// ends non-zero.
TEST(ServiceLaunch, WrongWorldSizeIsAClearErrorOnEveryRank) {
  constexpr const char* kConfig = R"(model: {path: @MODEL@}
parallel: {tp: 2, dp: 1}
cache: {page_size: 16, max_requests: 4, max_context: 512}
server: {host: 127.0.0.1, port: @PORT@}
)";
  for (const int workers : {1, 3}) {
    SCOPED_TRACE(std::to_string(workers) + " worker rank(s) for tp=2");
    service_process svc("world" + std::to_string(workers), kConfig, workers);
    ASSERT_TRUE(svc.start()) << svc.report();
    const std::optional<int> status = svc.wait_exit(60s);
    ASSERT_TRUE(status.has_value()) << "the job did not end within 60 s" << dump_on_failure(svc);
    EXPECT_FALSE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
        << "mpirun: " << service_process::describe_status(*status) << dump_on_failure(svc);
    const std::string log = svc.log();
    const int world = 1 + workers;
    for (int rank = 0; rank < world; ++rank) {
      const std::string line = "[rank " + std::to_string(rank) + "] world size " + std::to_string(world) +
                               " does not match the configuration";
      EXPECT_NE(log.find(line), std::string::npos) << "missing on rank " << rank << ": '" << line << "'\n" << log;
    }
    EXPECT_NE(log.find("= 3 ranks"), std::string::npos) << "the expected world size (3) is not named:\n" << log;
    EXPECT_EQ(log.find("serving on"), std::string::npos) << log;
    EXPECT_TRUE(svc.wait_ranks_gone(10s));
  }
}

// `server.port: 0` binds an ephemeral port, which the "serving on" line reports.
TEST(ServiceLaunch, PortZeroServesOnAnEphemeralPort) {
  service_process svc("port0", R"(model: {path: @MODEL@}
parallel: {tp: 1, dp: 1}
cache: {page_size: 16, max_requests: 2, max_context: 128}
server: {host: 127.0.0.1, port: 0}
)",
                      1);
  ASSERT_TRUE(svc.launch()) << dump_on_failure(svc);
  EXPECT_NE(svc.port(), 0);
  EXPECT_EQ(http_get(svc.port(), "/health").status, 200u);
}

}  // namespace
}  // namespace hyserve::service_test
