// The overlapped step loop (scheduler.overlap) against the strict one: the same workload on two
// services that differ only in that knob must give the same tokens, request for request. The
// workload: the fixture prompts and 50 random prompts, greedy and seeded (temperature, top-k,
// top-p), some with stop ids that end them mid-way (the overlapped loop then wastes a row in
// the step it had already sent), under tensor parallelism (TP=2: three ranks under mpirun),
// with chunked prefill mixed into decode steps, more requests than slots (admission while a
// step is in flight) and a streaming request cancelled by its client in the middle. Then the
// same for speculative n-gram and draft-model rounds (which run strictly inside an overlapped
// service).
#include <gtest/gtest.h>

#include <boost/json.hpp>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "service_test_support.h"

namespace hyserve::service_test {
namespace {

struct job {
  std::vector<int32_t> ids;
  int32_t max_new_tokens = 16;
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  std::vector<int32_t> stop;
};

std::string body_of(const job& j) {
  boost::json::object sp;
  sp["max_new_tokens"] = j.max_new_tokens;
  sp["temperature"] = j.temperature;
  sp["ignore_eos"] = true;
  if (j.top_k > 0) sp["top_k"] = j.top_k;
  if (j.top_p < 1.0f) sp["top_p"] = j.top_p;
  if (j.temperature > 0.0f) sp["seed"] = j.seed;
  if (!j.stop.empty()) sp["stop_token_ids"] = to_json_ids(j.stop);
  boost::json::object body;
  body["input_ids"] = to_json_ids(j.ids);
  body["sampling_params"] = std::move(sp);
  return boost::json::serialize(body);
}

// The fixture prompts (greedy), then 50 random prompts: every other one seeded, every third with
// stop ids (a quarter of the vocabulary, so most of those stop early).
std::vector<job> workload() {
  std::vector<job> jobs;
  for (const auto& p : reference()) {
    job j;
    j.ids = p.input_ids;
    j.max_new_tokens = static_cast<int32_t>(p.greedy_ids.size());
    jobs.push_back(j);
  }
  std::mt19937 rng(20261204);
  std::vector<int32_t> stop;
  for (int32_t t = 3; t < kVocab; t += 4) stop.push_back(t);
  for (int i = 0; i < 50; ++i) {
    job j;
    const int len = 2 + static_cast<int>(rng() % 60);
    for (int k = 0; k < len; ++k) j.ids.push_back(3 + static_cast<int32_t>(rng() % (kVocab - 3)));
    j.max_new_tokens = 4 + static_cast<int32_t>(rng() % 28);
    if (i % 2 == 1) {
      j.temperature = 0.6f + 0.1f * static_cast<float>(i % 5);
      j.top_k = i % 4 == 1 ? 40 : 0;
      j.top_p = i % 3 == 0 ? 0.9f : 1.0f;
      j.seed = 1000 + static_cast<uint64_t>(i);
    }
    if (i % 3 == 2) j.stop = stop;
    jobs.push_back(std::move(j));
  }
  return jobs;
}

std::string config(bool overlap, const std::string& extra, bool cuda = false, int overlap_steps = 2) {
  return std::string(R"(model: {path: @MODEL@}
)") + (cuda ? "device: cuda\nparallel: {tp: 1, dp: 1}" : "parallel: {tp: 2, dp: 1}") + R"(
cache: {page_size: 16, max_requests: 12, max_context: 512}
scheduler: {max_running: 12, chunked_prefill: 16, max_batch_tokens: 64, overlap: )" +
         (overlap ? "true" : "false") + ", overlap_steps: " + std::to_string(overlap_steps) + "}\n" + extra + "server: {host: 127.0.0.1, port: @PORT@}\n";
}

struct outcome {
  std::vector<generation> results;
  bool cancelled_stream_ended = false;
  double overlapped_steps = 0, wasted_rows = 0;
};

// Runs the workload on one service, 16 requests at a time, with a streaming request that the
// client drops after a few tokens running beside them.
outcome run_workload(const std::string& name, bool overlap, const std::string& extra, bool with_cancel,
                     bool cuda = false, int overlap_steps = 2) {
  service_process svc(name, config(overlap, extra, cuda, overlap_steps), cuda ? 1 : 2);
  outcome out;
  EXPECT_TRUE(svc.launch()) << svc.report();
  if (testing::Test::HasFailure()) return out;
  const std::vector<job> jobs = workload();
  out.results.resize(jobs.size());
  std::thread canceller;
  if (with_cancel) {
    canceller = std::thread([&] {
      job j;
      j.ids = reference()[0].input_ids;
      j.max_new_tokens = 400;
      boost::json::object body = boost::json::parse(body_of(j)).as_object();
      body["stream"] = true;
      http_connection c(svc.port());
      if (c.begin_stream("/generate", boost::json::serialize(body)) != 200) return;
      for (int e = 0; e < 3 && c.next_event(); ++e) {
      }
      out.cancelled_stream_ended = true;  // the connection closes here: the request is cancelled
    });
  }
  run_concurrently(16, [&](size_t w) {
    for (size_t i = w; i < jobs.size(); i += 16)
      out.results[i] = parse_generation(http_post(svc.port(), "/generate", body_of(jobs[i]), 120s));
  });
  if (canceller.joinable()) canceller.join();
  // Nothing is left running or held after the cancellation and the wasted rows.
  EXPECT_TRUE(eventually(
      [&] {
        const std::string t = metrics_text(svc.port());
        return metric_value(t, "hyserve_running_requests") == 0.0 && metric_value(t, "hyserve_queue_depth") == 0.0;
      },
      10s))
      << svc.report();
  const std::string text = metrics_text(svc.port());
  out.overlapped_steps = metric_value(text, "hyserve_overlapped_steps_total").value_or(-1);
  out.wasted_rows = metric_value(text, "hyserve_overlap_wasted_rows_total").value_or(-1);
  const generation after = generate(svc.port(), reference()[1].input_ids, greedy(8, true));
  EXPECT_EQ(after.ids, std::vector<int32_t>(reference()[1].greedy_ids.begin(), reference()[1].greedy_ids.begin() + 8));
  return out;
}

void expect_same(const outcome& strict, const outcome& overlapped) {
  ASSERT_EQ(strict.results.size(), overlapped.results.size());
  const std::vector<job> jobs = workload();
  int stopped = 0, seeded = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    const generation& a = strict.results[i];
    const generation& b = overlapped.results[i];
    ASSERT_EQ(a.status, 200u) << a;
    ASSERT_EQ(b.status, 200u) << b;
    EXPECT_EQ(a.ids, b.ids) << "strict " << a << " vs overlapped " << b;
    EXPECT_EQ(a.finish, b.finish);
    if (a.finish == "stop") ++stopped;
    if (jobs[i].temperature > 0) ++seeded;
    if (i < reference().size()) {
      EXPECT_EQ(b.ids, reference()[i].greedy_ids) << "the fixture's greedy continuation";
    }
  }
  std::printf("overlap on == off: %zu requests (%d seeded, %d ended on a stop id)\n", jobs.size(), seeded, stopped);
  EXPECT_GE(stopped, 5) << "the workload should end some requests on stop ids (wasted overlapped rows)";
}

TEST(ServiceOverlap, Tp2OverlapOnEqualsOffGreedySeededStopsAndCancel) {
  const outcome strict = run_workload("overlap-off", false, "", true);
  const outcome overlapped = run_workload("overlap-on", true, "", true);
  EXPECT_TRUE(strict.cancelled_stream_ended);
  EXPECT_TRUE(overlapped.cancelled_stream_ended);
  expect_same(strict, overlapped);
  // The loops really differ: steps overlapped (and some rows were wasted on stopped requests)
  // only with the knob on.
  EXPECT_EQ(strict.overlapped_steps, 0.0);
  EXPECT_GT(overlapped.overlapped_steps, 20.0);
  EXPECT_GT(overlapped.wasted_rows, 0.0);
  std::printf("overlapped steps %.0f, wasted rows %.0f\n", overlapped.overlapped_steps, overlapped.wasted_rows);
}

// Three plain steps in flight per group (scheduler.overlap_steps: 3): a row may carry a
// placeholder for a token of the step just before it while two are still running.
TEST(ServiceOverlap, Tp2ThreeStepsInFlightEqualsStrict) {
  const outcome strict = run_workload("overlap3-off", false, "", true);
  const outcome overlapped = run_workload("overlap3-on", true, "", true, false, 3);
  EXPECT_TRUE(overlapped.cancelled_stream_ended);
  expect_same(strict, overlapped);
  EXPECT_GT(overlapped.overlapped_steps, 20.0);
  EXPECT_GT(overlapped.wasted_rows, 0.0);
}

TEST(ServiceOverlap, Tp2NgramRoundsOverlapOnEqualsOff) {
  const std::string spec = "speculative: {algorithm: ngram, num_draft_tokens: 4, cost_check: false}\n";
  const outcome strict = run_workload("overlap-ngram-off", false, spec, false);
  const outcome overlapped = run_workload("overlap-ngram-on", true, spec, false);
  expect_same(strict, overlapped);
  // Speculative rounds run strictly: the knob changes nothing there.
  EXPECT_EQ(overlapped.overlapped_steps, 0.0);
}

// Draft-model chains (a tree's sibling nodes draw seeded tokens with their node index as the
// counter, so seeded outputs of tree rounds depend on how rounds fall, with or without overlap).
TEST(ServiceOverlap, Tp2DraftModelRoundsOverlapOnEqualsOff) {
  const std::string spec =
      "speculative: {algorithm: draft_model, num_draft_tokens: 4, cost_check: false, "
      "draft_model: {synthetic: {num_layers: 2}}}\n";
  const outcome strict = run_workload("overlap-draft-off", false, spec, false);
  const outcome overlapped = run_workload("overlap-draft-on", true, spec, false);
  expect_same(strict, overlapped);
  EXPECT_EQ(overlapped.overlapped_steps, 0.0);
}

// On a GPU (one rank: NCCL does not put two ranks on one device): the decode steps run as CUDA
// graphs that sample on the device and read the placeholders from the device's last-token feed.
TEST(ServiceOverlap, CudaOverlapOnEqualsOffGreedySeededStopsAndCancel) {
  if (!std::filesystem::exists("/dev/nvidiactl")) GTEST_SKIP() << "no CUDA device";
  const outcome strict = run_workload("overlap-cuda-off", false, "", true, true);
  const outcome overlapped = run_workload("overlap-cuda-on", true, "", true, true);
  expect_same(strict, overlapped);
  EXPECT_EQ(strict.overlapped_steps, 0.0);
  EXPECT_GT(overlapped.overlapped_steps, 20.0);
  EXPECT_GT(overlapped.wasted_rows, 0.0);
  // Three steps in flight: the worker queues the third behind the running one as it finishes.
  const outcome three = run_workload("overlap3-cuda-on", true, "", true, true, 3);
  expect_same(strict, three);
  EXPECT_GT(three.overlapped_steps, 20.0);
}

}  // namespace
}  // namespace hyserve::service_test
