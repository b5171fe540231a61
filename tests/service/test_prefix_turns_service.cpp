// Prefix caching of answers end to end: the real coordinator and workers (tp = 2) under real
// mpirun, over HTTP. A conversation of four turns, each resending the conversation so far (the
// previous prompts and answers) plus new tokens, goes to a service with cache.prefix off and to
// one with it on: every answer must be the same, and each later turn must be served from the
// cache up to the last page boundary of the tokens the previous turn fed (its prompt and all of
// its answer but the last token), i.e. into the previous answer. Then nothing leaks.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "service_test_support.h"

namespace hyserve::service_test {
namespace {

constexpr int64_t kPage = 16;

std::string config(bool prefix, bool cuda = false) {
  std::string yaml = cuda ? "model: {path: @MODEL@}\ndevice: cuda\nparallel: {tp: 1, dp: 1}\n"
                          : "model: {path: @MODEL@}\nparallel: {tp: 2, dp: 1}\n";
  yaml += cuda ? "cache: {page_size: 16, max_requests: 8, max_context: 512" : "cache: {page_size: 16, max_requests: 4, max_context: 512";
  if (prefix) yaml += cuda ? ", prefix: {enabled: true, state_slots: 64}" : ", prefix: {enabled: true, state_slots: 8}";
  else yaml += ", prefix: {enabled: false}";
  yaml += "}\nscheduler: {chunked_prefill: 48, max_batch_tokens: 256}\n";
  yaml += "server: {host: 127.0.0.1, port: @PORT@}\n";
  return yaml;
}

struct turn {
  generation answer;
  int64_t cached = 0;
  int64_t prompt_len = 0;
};

// Turn t adds 20 + 7·t new tokens and asks for 23 + 5·t (answers end off and on page boundaries).
std::vector<turn> converse(uint16_t port, uint32_t seed = 5) {
  std::mt19937 rng(seed);
  std::vector<int32_t> history;
  std::vector<turn> out;
  for (int t = 0; t < 4; ++t) {
    for (int i = 0; i < 20 + 7 * t; ++i) history.push_back(static_cast<int32_t>(3 + rng() % (kVocab - 3)));
    const http_reply r = http_post(port, "/generate", generate_body(history, greedy(23 + 5 * t)));
    turn x;
    x.answer = parse_generation(r);
    x.prompt_len = static_cast<int64_t>(history.size());
    if (r.status == 200) x.cached = r.json().at("meta_info").at("cached_tokens").to_number<int64_t>();
    out.push_back(x);
    if (r.status != 200) break;
    history.insert(history.end(), x.answer.ids.begin(), x.answer.ids.end());
  }
  return out;
}

double metric(uint16_t port, const std::string& name) {
  return metric_value(metrics_text(port), name).value_or(-1.0);
}

TEST(PrefixTurnsTp2Service, NextTurnIsServedFromThePreviousAnswer) {
  std::vector<turn> want;
  {
    service_process off("prefix-turns-off", config(false), 2);
    off.launch();
    ASSERT_NE(off.port(), 0) << off.report();
    want = converse(off.port());
  }
  service_process on("prefix-turns-on", config(true), 2);
  on.launch();
  ASSERT_NE(on.port(), 0) << on.report();
  const uint16_t port = on.port();
  ASSERT_TRUE(eventually([&] { return metric(port, "hyserve_free_kv_pages") > 0; }, std::chrono::seconds(10)));
  const double pages0 = metric(port, "hyserve_free_kv_pages"), slots0 = metric(port, "hyserve_free_mamba_slots");
  const auto got = converse(port);
  ASSERT_EQ(got.size(), 4u);
  ASSERT_EQ(want.size(), 4u);
  for (size_t t = 0; t < got.size(); ++t) {
    ASSERT_EQ(want[t].answer.status, 200u) << "turn " << t << ": " << want[t].answer;
    EXPECT_EQ(got[t].answer, want[t].answer) << "turn " << t;
    if (t == 0) continue;
    const int64_t fed = got[t - 1].prompt_len + static_cast<int64_t>(got[t - 1].answer.ids.size()) - 1;
    EXPECT_EQ(got[t].cached, fed / kPage * kPage) << "turn " << t;
  }
  const http_reply fl = http_post(port, "/flush_cache", "{}");
  ASSERT_EQ(fl.status, 200u) << fl.describe();
  EXPECT_TRUE(eventually(
      [&] {
        const std::string t = metrics_text(port);
        return metric_value(t, "hyserve_free_kv_pages") == pages0 && metric_value(t, "hyserve_free_mamba_slots") == slots0 &&
               metric_value(t, "hyserve_prefix_cache_checkpoints") == 0.0 &&
               metric_value(t, "hyserve_prefix_cache_pages") == 0.0;
      },
      std::chrono::seconds(10)))
      << metrics_text(port);
}

// On a GPU, eight conversations at once: decode steps run as graphs and overlap (scheduler.overlap
// on), so most steps that save an answer's checkpoint are queued behind the step in flight
// (runner::can_submit_behind). Every answer equals the cache-off service's (bamba-tiny f32) and
// every later turn is served from the cache into the previous answer.
TEST(PrefixTurnsCudaService, OverlappedDecodeCheckpointsServeTheNextTurn) {
  if (!std::filesystem::exists("/dev/nvidiactl")) GTEST_SKIP() << "no CUDA device";
  constexpr int kConversations = 8;
  auto run_all = [&](uint16_t port) {
    std::vector<std::vector<turn>> all(kConversations);
    run_concurrently(kConversations, [&](size_t c) { all[c] = converse(port, 100 + static_cast<uint32_t>(c)); });
    return all;
  };
  std::vector<std::vector<turn>> want;
  {
    service_process off("prefix-turns-cuda-off", config(false, true), 1);
    off.launch();
    ASSERT_NE(off.port(), 0) << off.report();
    want = run_all(off.port());
  }
  service_process on("prefix-turns-cuda-on", config(true, true), 1);
  on.launch();
  ASSERT_NE(on.port(), 0) << on.report();
  const auto got = run_all(on.port());
  for (int c = 0; c < kConversations; ++c) {
    ASSERT_EQ(got[c].size(), 4u) << "conversation " << c;
    ASSERT_EQ(want[c].size(), 4u) << "conversation " << c;
    for (size_t t = 0; t < 4; ++t) {
      EXPECT_EQ(got[c][t].answer, want[c][t].answer) << "conversation " << c << " turn " << t;
      if (t == 0) continue;
      const int64_t fed = got[c][t - 1].prompt_len + static_cast<int64_t>(got[c][t - 1].answer.ids.size()) - 1;
      EXPECT_EQ(got[c][t].cached, fed / kPage * kPage) << "conversation " << c << " turn " << t;
    }
  }
  const std::string text = metrics_text(on.port());
  EXPECT_GT(metric_value(text, "hyserve_overlapped_steps_total").value_or(0), 0.0) << "decode steps overlapped";
}

}  // namespace
}  // namespace hyserve::service_test
