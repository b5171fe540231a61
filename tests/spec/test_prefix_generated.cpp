// Prefix caching of generated tokens in one process (docs/ARCHITECTURE.md, Prefix caching: decode
// checkpoints): a finished request's answer goes on the tree after its prompt, with the state at
// the last page boundary its fed tokens reach, so the next turn of a conversation (prompt +
// answer + more) starts from there instead of re-prefilling the answer.
//  - the next turn's cached tokens are exactly that boundary, and every output is token for
//    token the same as with the cache off (bamba-tiny and qwen3next-tiny in f32, greedy), with
//    overlapped steps (2 and 3 in flight) and without, answers ending on a length or a stop token;
//  - a cancelled request puts nothing past its prompt on the tree, and nothing leaks.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "fixture.h"
#include "prefix_harness.h"

namespace hyserve::test {
namespace {

constexpr int32_t kPage = 16;

// overlap_steps 0: overlap off.
service_config make_config(const std::string& fixture, bool prefix, int overlap_steps) {
  std::string yaml = "model: {path: " + fixture_dir(fixture) + "}\ndevice: cpu\n";
  yaml += "cache: {page_size: " + std::to_string(kPage) + ", max_requests: 16, max_context: 512";
  yaml += prefix ? ", prefix: {enabled: true, state_interval: 48, state_slots: 64}" : ", prefix: {enabled: false}";
  yaml += "}\nscheduler: {max_batch_tokens: 256, max_running: 16, chunked_prefill: 64, max_queue: 1024";
  yaml += overlap_steps > 0 ? ", overlap: true, overlap_steps: " + std::to_string(overlap_steps) : ", overlap: false";
  yaml += "}\n";
  return load_config_string(yaml);
}

// First turns of several conversations: prompt lengths on and off page boundaries, answers that
// end before, on and past page boundaries (one token only: nothing fed past the prompt).
std::vector<gen_request> first_turns(int64_t vocab) {
  std::mt19937 rng(77);
  const std::vector<std::pair<int, int>> shapes{{21, 30}, {40, 45}, {64, 16}, {77, 60}, {5, 3}, {100, 1}, {33, 48}};
  std::vector<gen_request> out;
  for (const auto& [len, n] : shapes) {
    gen_request g;
    for (int i = 0; i < len; ++i) g.prompt.push_back(static_cast<int32_t>(3 + rng() % static_cast<uint32_t>(vocab - 3)));
    g.sampling.max_new_tokens = n;
    g.sampling.ignore_eos = true;
    out.push_back(std::move(g));
  }
  return out;
}

// The next turn: the conversation so far (prompt + answer) and a few new tokens.
std::vector<gen_request> next_turns(const std::vector<gen_request>& first, const std::vector<generation>& answers) {
  std::vector<gen_request> out;
  for (size_t i = 0; i < first.size(); ++i) {
    gen_request g = first[i];
    g.prompt.insert(g.prompt.end(), answers[i].output.begin(), answers[i].output.end());
    g.prompt.insert(g.prompt.end(), {7, 8, 9});
    g.sampling.max_new_tokens = 12;
    out.push_back(std::move(g));
  }
  return out;
}

void expect_same(const std::vector<generation>& want, const std::vector<generation>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_FALSE(want[i].error) << what << " request " << i << ": " << *want[i].error;
    ASSERT_FALSE(got[i].error) << what << " request " << i << ": " << *got[i].error;
    EXPECT_EQ(got[i].output, want[i].output) << what << " request " << i;
  }
}

void expect_nothing_leaks(prefix_service& svc, const coordinator::capacity_snapshot& start) {
  ASSERT_TRUE(svc.sched().flush_cache().ok);
  const coordinator::capacity_snapshot end = svc.settled_capacity();
  EXPECT_EQ(end.free_pages, start.free_pages);
  EXPECT_EQ(end.free_slots, start.free_slots);
  EXPECT_EQ(end.free_checkpoints, start.free_checkpoints);
  EXPECT_EQ(end.cached_pages, 0);
  EXPECT_EQ(end.checkpoints, 0);
}

class PrefixGenerated : public ::testing::TestWithParam<std::tuple<const char*, int>> {};

TEST_P(PrefixGenerated, NextTurnStartsInsideTheAnswerAndMatchesTheCacheOff) {
  const auto [fixture, overlap] = GetParam();
  const std::string what = std::string(fixture) + " overlap " + std::to_string(overlap);
  prefix_service off(make_config(fixture, false, overlap)), on(make_config(fixture, true, overlap));
  const coordinator::capacity_snapshot start = on.settled_capacity();
  auto first = first_turns(on.config().vocab_size);
  // Two answers end on a stop token instead (with overlap, a step in flight behind the stop is
  // wasted, and a decode save it carries is dropped): their 21st greedy token stops them.
  const auto probe = off.run(first);
  for (size_t i : {1u, 3u}) first[i].sampling.stop_token_ids = {probe[i].output.at(20)};
  const auto off1 = off.run(first), on1 = on.run(first);
  expect_same(off1, on1, what + " first turn");
  const auto second = next_turns(first, off1);
  const auto off2 = off.run(second), on2 = on.run(second);
  expect_same(off2, on2, what + " second turn");
  for (size_t i = 0; i < first.size(); ++i) {
    // The answer's last token is never fed: the KV and state reach prompt + answer - 1 tokens,
    // and the checkpoint sits at the last page boundary of those.
    const auto fed = static_cast<int32_t>(first[i].prompt.size() + on1[i].output.size()) - 1;
    EXPECT_EQ(on2[i].cached_tokens, fed / kPage * kPage) << what << " conversation " << i;
  }
  expect_nothing_leaks(on, start);
}

INSTANTIATE_TEST_SUITE_P(Prefix, PrefixGenerated,
                         ::testing::Values(std::make_tuple("bamba-tiny", 0), std::make_tuple("bamba-tiny", 2),
                                           std::make_tuple("bamba-tiny", 3), std::make_tuple("qwen3next-tiny", 2)),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param);
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n + "_overlap" + std::to_string(std::get<1>(info.param));
                         });

// A request cancelled while it decodes: its decode checkpoint is dropped (nothing past the
// prompt goes on the tree), and after a flush every page and slot is free again.
TEST(PrefixGeneratedCancel, CancelledAnswerIsNotCachedAndNothingLeaks) {
  prefix_service on(make_config("bamba-tiny", true, 2));
  const coordinator::capacity_snapshot start = on.settled_capacity();
  gen_request g = first_turns(on.config().vocab_size)[1];  // 40 prompt tokens
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> output;
  bool done = false;
  coordinator::generate_request req;
  req.input_ids = g.prompt;
  req.sampling = g.sampling;
  req.sampling.max_new_tokens = 400;
  req.sink = [&](coordinator::request_event ev) {
    std::lock_guard lock(mu);
    output.insert(output.end(), ev.new_tokens.begin(), ev.new_tokens.end());
    done = done || ev.finished;
    cv.notify_all();
  };
  const auto sub = on.sched().submit(std::move(req));
  ASSERT_EQ(sub.status, coordinator::submit_status::kAccepted) << sub.message;
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::minutes(2), [&] { return output.size() >= 40 || done; }));
  }
  on.sched().cancel(sub.id);
  std::vector<int32_t> partial;
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::minutes(2), [&] { return done; }));
    partial = output;
  }
  ASSERT_LT(partial.size(), 400u);
  gen_request next = g;
  next.prompt.insert(next.prompt.end(), partial.begin(), partial.end());
  next.prompt.push_back(7);
  next.sampling.max_new_tokens = 4;
  const auto got = on.run({next});
  ASSERT_FALSE(got[0].error) << *got[0].error;
  // Only the prompt's own checkpoint (its last page boundary) is there.
  EXPECT_EQ(got[0].cached_tokens, static_cast<int32_t>(g.prompt.size()) / kPage * kPage);
  expect_nothing_leaks(on, start);
}

}  // namespace
}  // namespace hyserve::test
