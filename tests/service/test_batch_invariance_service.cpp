// Batch invariance through the served path: the real server, coordinator and two tensor-parallel
// worker ranks under mpirun, over HTTP. A request's output ids and logprobs (as the server
// writes them in /generate's meta_info) are the same when it is served alone and when it is one
// of 64 requests that arrive at random times (200 trials): the others' prompts, lengths and sampling are
// random, so it shares Decode, Extend and Mixed steps with different neighbours under a small
// token budget (docs/ARCHITECTURE.md, Batch invariance).
#include <gtest/gtest.h>

#include <boost/json.hpp>

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "service_test_support.h"

namespace hyserve::service_test {
namespace {

using namespace std::chrono_literals;

struct served_output {
  unsigned status = 0;
  std::vector<int32_t> ids;
  std::string logprobs;  // meta_info.output_token_logprobs as the server serialised it
  std::string error;
};

std::string body(const std::vector<int32_t>& ids, int32_t n, float temperature, uint64_t seed, bool logprobs) {
  boost::json::object sp;
  sp["max_new_tokens"] = n;
  sp["temperature"] = temperature;
  sp["ignore_eos"] = true;
  if (temperature > 0.0f) sp["seed"] = seed;
  boost::json::object b;
  b["input_ids"] = to_json_ids(ids);
  b["sampling_params"] = std::move(sp);
  if (logprobs) b["return_logprob"] = true;
  return boost::json::serialize(b);
}

served_output post(uint16_t port, const std::string& request) {
  served_output out;
  const http_reply r = http_post(port, "/generate", request, 120s);
  out.status = r.status;
  if (r.status != 200) {
    out.error = r.describe();
    return out;
  }
  const boost::json::value v = r.json();
  out.ids = ids_of(v.at("output_ids"));
  if (const auto* lp = v.at("meta_info").as_object().if_contains("output_token_logprobs"))
    out.logprobs = boost::json::serialize(*lp);
  return out;
}

TEST(ServiceBatchInvariance, Tp2RequestAloneEqualsRequestAmongRandomArrivals) {
  const std::string cfg = R"(model: {path: @MODEL@}
parallel: {tp: 2, dp: 1}
cache: {page_size: 16, max_requests: 64, max_context: 512}
scheduler: {max_running: 64, chunked_prefill: 32, max_batch_tokens: 96}
server: {host: 127.0.0.1, port: @PORT@}
)";
  service_process svc("batch-invariance", cfg, 2);
  ASSERT_TRUE(svc.launch()) << svc.report();
  // The targets: the fixture prompts and two random prompts, greedy and seeded, with logprobs.
  std::mt19937 rng(51);
  auto random_ids = [&](int lo, int hi) {
    std::vector<int32_t> ids;
    const int n = lo + static_cast<int>(rng() % static_cast<uint32_t>(hi - lo + 1));
    for (int i = 0; i < n; ++i) ids.push_back(3 + static_cast<int32_t>(rng() % (kVocab - 3)));
    return ids;
  };
  std::vector<std::string> targets;
  for (const auto& p : reference()) targets.push_back(body(p.input_ids, 12, 0.0f, 0, true));
  targets.push_back(body(random_ids(70, 120), 12, 0.0f, 0, true));
  targets.push_back(body(random_ids(70, 120), 12, 0.8f, 77, true));
  std::vector<served_output> alone;
  for (const std::string& t : targets) {
    alone.push_back(post(svc.port(), t));
    ASSERT_EQ(alone.back().status, 200u) << alone.back().error;
    ASSERT_EQ(alone.back().ids.size(), 12u);
    ASSERT_GT(alone.back().logprobs.size(), 12u * 4) << "the logprobs come back";
  }
  const int kTrials = 200, kOthers = 63;
  for (int trial = 0; trial < kTrials; ++trial) {
    const size_t t = static_cast<size_t>(trial) % targets.size();
    std::vector<std::string> bodies;
    std::vector<int> delay_ms;
    for (int i = 0; i < kOthers; ++i) {
      const bool seeded = rng() % 2 == 0;
      bodies.push_back(body(random_ids(1, 150), 1 + static_cast<int32_t>(rng() % 20), seeded ? 0.9f : 0.0f, rng(), false));
      delay_ms.push_back(static_cast<int>(rng() % 60));
    }
    const int target_delay = static_cast<int>(rng() % 60);
    served_output got;
    run_concurrently(kOthers + 1, [&](size_t w) {
      if (w == static_cast<size_t>(kOthers)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(target_delay));
        got = post(svc.port(), targets[t]);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms[w]));
      const served_output o = post(svc.port(), bodies[w]);
      EXPECT_EQ(o.status, 200u) << o.error;
    });
    ASSERT_EQ(got.status, 200u) << got.error;
    EXPECT_EQ(got.ids, alone[t].ids) << "trial " << trial << ", target " << t;
    EXPECT_EQ(got.logprobs, alone[t].logprobs) << "trial " << trial << ", target " << t;
  }
  // The trials' steps mixed decode rows with prefill chunks.
  const std::string text = metrics_text(svc.port());
  const double mixed = metric_value(text, "hyserve_step_seconds_count{mode=\"mixed\"}").value_or(0);
  EXPECT_GT(mixed, kTrials) << "mixed steps";
  std::printf("%d trials, %.0f mixed steps\n", kTrials, mixed);
}

}  // namespace
}  // namespace hyserve::service_test
