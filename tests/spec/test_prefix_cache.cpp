// Prefix caching end to end in one process (the real scheduler driving a real plan runner on the
// CPU, every plan and result through the wire encoding):
//  - identity: every output is token-for-token the same with cache.prefix on and off, for the
//    fixture prompts resent as a second turn (prompt + answer + more), and for 200 random
//    requests that share prefixes of random lengths (not multiples of a page or of the state
//    interval), greedy and seeded sampling, submitted in waves so later waves hit what earlier
//    ones cached; with plain decoding and with n-gram speculative decoding; and under eviction
//    pressure (a KV pool and checkpoint pool so small that admission keeps evicting);
//  - no leak: after every request has ended and the cache is flushed, free pages, request slots
//    and checkpoint slots are back at their start values;
//  - the radix tree as a unit (lookup, holds, LRU eviction of leaves).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <thread>
#include <vector>

#include "coordinator/prefix_tree.h"
#include "fixture.h"
#include "hyserve/kernels/device.h"
#include "prefix_harness.h"

namespace hyserve::test {
namespace {

using coordinator::finish_reason;

using result = generation;

struct setup {
  bool prefix = false;
  bool ngram = false;
  bool tiny_pool = false;  // eviction pressure
  std::string fixture = "bamba-tiny";
  std::string device = "cpu";
  bool bf16 = false;  // bf16 weights, KV cache and SSM state
};

service_config make_config(const setup& s) {
  std::string yaml = "model: {path: " + fixture_dir(s.fixture) + (s.bf16 ? ", dtype: bfloat16" : "") +
                     "}\ndevice: " + s.device + "\n";
  yaml += "cache: {page_size: 16, max_requests: 16, max_context: 512";
  if (s.bf16) yaml += ", kv_dtype: bfloat16, ssm_state_dtype: bfloat16";
  if (s.tiny_pool) yaml += ", num_pages: 100";
  if (s.prefix)
    yaml += std::string(", prefix: {enabled: true, state_interval: 48, state_slots: ") + (s.tiny_pool ? "4" : "64") + "}";
  else
    yaml += ", prefix: {enabled: false}";
  yaml += "}\n";
  yaml += "scheduler: {max_batch_tokens: 256, max_running: 16, chunked_prefill: 64, max_queue: 1024}\n";
  if (s.ngram)
    yaml += "speculative: {algorithm: ngram, num_draft_tokens: 4, cost_check: false, ngram: {min_match: 1, max_match: 3}}\n";
  return load_config_string(yaml);
}

// 200 requests in waves of 20 (prefix_harness.h): each takes a random-length prefix (0-300
// tokens) of one of four shared "system prompts" (or of an earlier request's prompt: a resent
// conversation), then 1-40 tokens of its own; 1-24 new tokens, greedy or seeded at temperature 0.9.
std::vector<std::vector<gen_request>> random_waves(int64_t vocab, uint32_t seed, int n_waves = 10) {
  return shared_prefix_waves(vocab, seed, n_waves);
}

// The random waves' seed (PREFIX_TEST_SEED overrides it). Seeded sampling at temperature 0.9
// has draws that sit at a rounding edge: with seed 4321 one request's 17th token differs between
// two cache-off runs that only batch differently (all 200 requests at once instead of in waves),
// so no cache can be compared against it. With this seed, cache-off runs with chunked_prefill
// 16, 48, 64 and 100 and one-wave batching all agree.
uint32_t waves_seed() {
  const char* e = std::getenv("PREFIX_TEST_SEED");
  return e ? static_cast<uint32_t>(std::strtoul(e, nullptr, 10)) : 1234u;
}

std::vector<result> run_waves(prefix_service& svc, const std::vector<std::vector<gen_request>>& waves) {
  std::vector<result> all;
  for (const auto& w : waves) {
    auto got = svc.run(w);
    all.insert(all.end(), got.begin(), got.end());
  }
  return all;
}

void expect_same(const std::vector<result>& want, const std::vector<result>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_FALSE(want[i].error) << what << " request " << i << ": " << *want[i].error;
    ASSERT_FALSE(got[i].error) << what << " request " << i << ": " << *got[i].error;
    EXPECT_EQ(got[i].output, want[i].output) << what << " request " << i;
    EXPECT_EQ(got[i].reason, want[i].reason) << what << " request " << i;
  }
}

int64_t cached_total(const std::vector<result>& r) {
  int64_t s = 0;
  for (const auto& x : r) s += x.cached_tokens;
  return s;
}

// The cache-off reference of the random waves (computed once per fixture).
const std::vector<result>& reference(const std::string& fixture, const std::vector<std::vector<gen_request>>& waves) {
  static std::map<std::string, std::vector<result>> cache;
  auto it = cache.find(fixture);
  if (it != cache.end()) return it->second;
  setup s;
  s.fixture = fixture;
  prefix_service off(make_config(s));
  return cache[fixture] = run_waves(off, waves);
}

int64_t vocab_of(const std::string& fixture) {
  setup s;
  s.fixture = fixture;
  return resolve_model_config(make_config(s)).vocab_size;
}

TEST(PrefixCache, FixturePromptsResentAsSecondTurnMatchTheCacheOff) {
  for (const char* fixture : {"bamba-tiny", "qwen3next-tiny"}) {
    const auto prompts = load_reference_prompts(fixture);
    std::vector<gen_request> first, second;
    for (const auto& p : prompts) {
      gen_request g;
      g.prompt = p.input_ids;
      g.sampling.max_new_tokens = static_cast<int32_t>(p.greedy_ids.size());
      g.sampling.ignore_eos = true;
      first.push_back(g);
      // The next turn resends the conversation and adds to it; the same prompt is sent again too.
      gen_request t = g;
      t.prompt.insert(t.prompt.end(), p.greedy_ids.begin(), p.greedy_ids.end());
      t.prompt.insert(t.prompt.end(), p.input_ids.begin(), p.input_ids.begin() + std::min<long>(5, p.input_ids.size()));
      second.push_back(t);
      second.push_back(g);
    }
    setup off_s, on_s;
    off_s.fixture = on_s.fixture = fixture;
    on_s.prefix = true;
    prefix_service off(make_config(off_s)), on(make_config(on_s));
    const auto off1 = off.run(first), off2 = off.run(second);
    const auto on1 = on.run(first), on2 = on.run(second);
    expect_same(off1, on1, std::string(fixture) + " first turn");
    expect_same(off2, on2, std::string(fixture) + " second turn");
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(on1[i].output, std::vector<int32_t>(prompts[i].greedy_ids.begin(), prompts[i].greedy_ids.end()))
          << fixture << " prompt " << i << " (the Hugging Face greedy ids)";
    EXPECT_GT(cached_total(on2), 0) << fixture;
  }
}

// Penalties count the whole prompt (repetition) and the answer (all three) from the request's
// first chunk; a cached prompt resent with penalties must give the cache-off tokens. (Before
// the fix, a hit started from a checkpoint kept the slot's counts of an earlier request and left
// the cached prompt tokens unmarked: 6 of the 9 penalised resends here differed.)
TEST(PrefixCache, PenalisedRequestsOfACachedPromptMatchTheCacheOff) {
  // Each prompt plain and with each penalty, sent twice: the second time every prompt is cached
  // and the request slots hold the first run's counts.
  const auto prompts = load_reference_prompts("bamba-tiny");
  const std::tuple<float, float, float> penalties[] = {{3.0f, 0.0f, 0.0f}, {1.0f, 1.5f, 0.5f}, {1.0f, 0.0f, 2.0f}};
  std::vector<gen_request> turn;
  for (const auto& p : prompts) {
    gen_request g;
    g.prompt = p.input_ids;
    g.sampling.max_new_tokens = 24;
    g.sampling.ignore_eos = true;
    turn.push_back(g);
    for (const auto& [rep, pres, freq] : penalties) {
      gen_request t = g;
      t.sampling.repetition_penalty = rep;
      t.sampling.presence_penalty = pres;
      t.sampling.frequency_penalty = freq;
      turn.push_back(t);
    }
  }
  setup off_s, on_s;
  off_s.fixture = on_s.fixture = "bamba-tiny";
  on_s.prefix = true;
  prefix_service off(make_config(off_s)), on(make_config(on_s));
  const auto off1 = off.run(turn), off2 = off.run(turn);
  const auto on1 = on.run(turn), on2 = on.run(turn);
  expect_same(off1, on1, "first");
  expect_same(off2, on2, "resend");
  int64_t plain_hits = 0;
  bool changed = false;  // the penalties must change some answer, or the comparison is idle
  for (size_t i = 0; i < turn.size(); ++i) {
    if (turn[i].sampling.penalties()) {
      EXPECT_EQ(on2[i].cached_tokens, 0) << "request " << i << " has penalties";
      changed = changed || off2[i].output != off2[i / 4 * 4].output;
    } else {
      plain_hits += on2[i].cached_tokens;
    }
  }
  EXPECT_GT(plain_hits, 0) << "no plain resend hit the cache: the test compares nothing cached";
  EXPECT_TRUE(changed) << "no penalty changed an answer";
}

// Half the waves (100 requests) for the slower Gated DeltaNet fixture.
int waves_for(const std::string& fixture) { return fixture == "qwen3next-tiny" ? 5 : 10; }

class PrefixRandom : public ::testing::TestWithParam<std::tuple<const char*, bool, bool>> {};

TEST_P(PrefixRandom, SharedPrefixesMatchTheCacheOffAndNothingLeaks) {
  const auto [fixture, ngram, tiny] = GetParam();
  const auto waves = random_waves(vocab_of(fixture), waves_seed(), waves_for(fixture));
  const std::vector<result>& want = reference(fixture, waves);
  setup s;
  s.fixture = fixture;
  s.prefix = true;
  s.ngram = ngram;
  s.tiny_pool = tiny;
  prefix_service on(make_config(s));
  const coordinator::capacity_snapshot start = on.settled_capacity();
  const auto got = run_waves(on, waves);
  expect_same(want, got, std::string(fixture) + (ngram ? " ngram" : "") + (tiny ? " tiny pool" : ""));
  {
    size_t i = 0;
    for (const auto& w : waves)
      for (const auto& g : w) {
        if (got[i].output != want[i].output)
          std::printf("[prefix] request %zu: prompt %zu tokens, %d cached, temperature %.1f, %d new\n", i, g.prompt.size(),
                      got[i].cached_tokens, static_cast<double>(g.sampling.temperature), g.sampling.max_new_tokens);
        ++i;
      }
  }
  int64_t prompt_tokens = 0;
  int hits = 0;
  for (const auto& w : waves)
    for (const auto& g : w) prompt_tokens += static_cast<int64_t>(g.prompt.size());
  for (const auto& r : got) hits += r.cached_tokens > 0 ? 1 : 0;
  const int64_t cached = cached_total(got);
  std::printf("[prefix] %s%s%s: %d of %zu requests hit, %lld of %lld prompt tokens cached\n", fixture,
              ngram ? " ngram" : "", tiny ? " tiny pool" : "", hits, got.size(), static_cast<long long>(cached),
              static_cast<long long>(prompt_tokens));
  std::printf("[prefix] %lld tree nodes evicted\n", static_cast<long long>(on.evicted.load()));
  if (tiny) {
    EXPECT_GT(on.evicted.load(), static_cast<int64_t>(got.size()) / 2);  // admission keeps evicting
  }
  EXPECT_GT(hits, static_cast<int>(got.size()) / (tiny ? 10 : 5));  // a 4-slot pool churns
  EXPECT_GT(cached, prompt_tokens / (tiny ? 10 : 3));
  // No leak: once every request has ended and the cache is flushed, everything is free again.
  const coordinator::capacity_snapshot before_flush = on.settled_capacity();
  EXPECT_GT(before_flush.cached_pages, 0);
  const coordinator::flush_result fl = on.sched().flush_cache();
  ASSERT_TRUE(fl.ok) << fl.message;
  EXPECT_EQ(fl.pages, before_flush.cached_pages);
  EXPECT_EQ(fl.checkpoints, before_flush.checkpoints);
  const coordinator::capacity_snapshot end = on.settled_capacity();
  EXPECT_EQ(end.free_pages, start.free_pages);
  EXPECT_EQ(end.free_slots, start.free_slots);
  EXPECT_EQ(end.free_checkpoints, start.free_checkpoints);
  EXPECT_EQ(end.cached_pages, 0);
  EXPECT_EQ(end.checkpoints, 0);
}

INSTANTIATE_TEST_SUITE_P(Prefix, PrefixRandom,
                         ::testing::Values(std::make_tuple("bamba-tiny", false, false),
                                           std::make_tuple("bamba-tiny", true, true),
                                           std::make_tuple("qwen3next-tiny", false, true)),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param);
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n + (std::get<1>(info.param) ? "_ngram" : "_plain") +
                                  (std::get<2>(info.param) ? "_tiny_pool" : "");
                         });

// On a GPU (skipped without one): the random waves with the cache on and off on the device, with
// a tiny pool; f32, and bf16 weights / KV / SSM state (Mamba2 only: the GDN state stays f32).
class PrefixRandomCuda : public ::testing::TestWithParam<std::tuple<const char*, bool>> {};

// Requests whose output or finish reason differ between two runs of the same requests.
int differing(const std::vector<result>& a, const std::vector<result>& b) {
  int n = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) n += a[i].output != b[i].output || a[i].reason != b[i].reason;
  return n;
}

// On the device the kernels' rounding depends on how rows are batched and how a prefill is
// chunked (bf16 GEMM tiling, the SSD / GDN chunk scans started at another position: issue #26),
// so a checkpoint computed under another request's chunking can flip a near-tie later on.
// bamba-tiny in f32 must be identical (measured: 0 of 200 differ, 7248 cached tokens). The other
// cases are bounded by the noise of batching alone, the same cache-off requests sent as one
// wave instead of ten: at most twice that plus 2 (measured on an H200: bamba-tiny bf16 74 with
// the cache against 45 re-batched; qwen3next-tiny f32 1 against 0, at output token 17).
TEST_P(PrefixRandomCuda, SharedPrefixesMatchTheCacheOffOnTheDevice) {
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const auto [fixture, bf16] = GetParam();
  const auto waves = random_waves(vocab_of(fixture), waves_seed(), 10);
  std::vector<gen_request> one_wave;
  for (const auto& w : waves) one_wave.insert(one_wave.end(), w.begin(), w.end());
  setup off_s;
  off_s.fixture = fixture;
  off_s.device = "cuda";
  off_s.bf16 = bf16;
  setup on_s = off_s;
  on_s.prefix = true;
  on_s.tiny_pool = true;
  std::vector<result> want, rebatched, got;
  {
    prefix_service off(make_config(off_s));
    want = run_waves(off, waves);
    rebatched = off.run(one_wave);
  }
  prefix_service on(make_config(on_s));
  const coordinator::capacity_snapshot start = on.settled_capacity();
  got = run_waves(on, waves);
  const std::string what = std::string(fixture) + (bf16 ? " bf16" : "") + " cuda";
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(want[i].error) << what << " request " << i << ": " << *want[i].error;
    ASSERT_FALSE(got[i].error) << what << " request " << i << ": " << *got[i].error;
    ASSERT_FALSE(rebatched[i].error) << what << " request " << i << ": " << *rebatched[i].error;
  }
  const int noise = differing(want, rebatched), changed = differing(want, got);
  std::printf("%s: %d of %zu requests differ with the cache on; %d differ cache-off batched as one wave; "
              "%lld prompt tokens from the cache\n",
              what.c_str(), changed, got.size(), noise, static_cast<long long>(cached_total(got)));
  if (std::string(fixture) == "bamba-tiny" && !bf16)
    expect_same(want, got, what);
  else
    EXPECT_LE(changed, 2 * noise + 2) << what << " (re-batched: " << noise << ")";
  EXPECT_GT(cached_total(got), 0);
  ASSERT_TRUE(on.sched().flush_cache().ok);
  const coordinator::capacity_snapshot end = on.settled_capacity();
  EXPECT_EQ(end.free_pages, start.free_pages);
  EXPECT_EQ(end.free_checkpoints, start.free_checkpoints);
}

INSTANTIATE_TEST_SUITE_P(Prefix, PrefixRandomCuda,
                         ::testing::Values(std::make_tuple("bamba-tiny", false), std::make_tuple("bamba-tiny", true),
                                           std::make_tuple("qwen3next-tiny", false)),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param);
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n + (std::get<1>(info.param) ? "_bf16" : "_f32");
                         });

TEST(PrefixTree, LookupHoldsAndEvictsLeastRecentlyUsedLeaves) {
  coordinator::prefix_tree t(2);
  const std::vector<int32_t> a{1, 2, 3, 4, 5, 6}, b{1, 2, 3, 4, 9, 9};
  auto ins = t.insert(a, {10, 11, 12}, 3, 1);
  EXPECT_EQ(ins.adopted_pages, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_TRUE(t.attach_checkpoint(ins.last, 100));
  EXPECT_FALSE(t.attach_checkpoint(ins.last, 101));
  EXPECT_EQ(t.lookup(a, 6).tokens(), 3);
  EXPECT_EQ(t.lookup(a, 5).tokens(), 0);  // the only checkpoint is after 6 tokens
  auto ins_b = t.insert(b, {20, 21, 22}, 3, 2);
  EXPECT_EQ(ins_b.adopted_pages, (std::vector<int32_t>{2}));  // pages 0, 1 were there
  EXPECT_TRUE(t.attach_checkpoint(ins_b.last, 102));
  EXPECT_EQ(t.nodes(), 4);
  EXPECT_FALSE(t.evict_one());  // everything is held
  t.release(ins.adopted_nodes, 3);
  // a's leaf is free; its inner nodes still have b's leaf below them.
  auto e = t.evict_one();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->page, 12);
  EXPECT_EQ(e->checkpoint, 100);
  EXPECT_FALSE(t.evict_one());
  t.release(ins_b.adopted_nodes, 4);
  std::vector<int32_t> pages;
  while (auto x = t.evict_one()) pages.push_back(x->page);
  EXPECT_EQ(pages, (std::vector<int32_t>{22, 11, 10}));
  EXPECT_EQ(t.nodes(), 0);
  EXPECT_EQ(t.checkpoints(), 0);
}

TEST(PrefixTree, CheckpointEvictionTakesTheStalestUnpinnedCheckpoint) {
  coordinator::prefix_tree t(2);
  const std::vector<int32_t> a{1, 2, 3, 4, 5, 6}, b{1, 2, 3, 4, 9, 9}, c{1, 2, 7, 7};
  auto ins = t.insert(a, {10, 11, 12}, 3, 1);
  EXPECT_TRUE(t.attach_checkpoint(ins.adopted_nodes[1], 100, 2));  // inner: after 4 tokens
  EXPECT_TRUE(t.attach_checkpoint(ins.last, 101, 3));              // leaf: after 6 tokens
  auto ins_b = t.insert(b, {20, 21, 22}, 3, 4);
  EXPECT_TRUE(t.attach_checkpoint(ins_b.last, 102, 5));
  auto ins_c = t.insert(c, {30, 31}, 2, 6);
  EXPECT_TRUE(t.attach_checkpoint(ins_c.last, 103, 7));
  t.release(ins.adopted_nodes, 8);
  t.release(ins_b.adopted_nodes, 9);
  // A request starts from a's leaf: pinned, and the freshest. c's request still runs (holds its
  // nodes) but has not pinned its checkpoint.
  t.pin_checkpoint(ins.last, 10);
  // The inner checkpoint (tick 2) goes first; its page stays, b's and a's paths still use it.
  auto e = t.evict_checkpoint();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->checkpoint, 100);
  EXPECT_EQ(e->page, -1);
  EXPECT_EQ(t.nodes(), 5);
  EXPECT_EQ(t.lookup(a, 6).tokens(), 3);
  EXPECT_EQ(t.lookup(a, 5).tokens(), 0);  // no checkpoint at or before 4 tokens any more
  // Then b's leaf (tick 5), whole: no request holds it, and its page is of no use without it.
  e = t.evict_checkpoint();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->checkpoint, 102);
  EXPECT_EQ(e->page, 22);
  EXPECT_EQ(t.nodes(), 4);
  // Then c's (tick 7): held, so its page stays; a's pinned checkpoint is never taken.
  e = t.evict_checkpoint();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->checkpoint, 103);
  EXPECT_EQ(e->page, -1);
  EXPECT_FALSE(t.evict_checkpoint());
  EXPECT_EQ(t.checkpoints(), 1);
  EXPECT_EQ(t.lookup(a, 6).checkpoint, 101);
  t.unpin_checkpoint(ins.last);
  e = t.evict_checkpoint();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->checkpoint, 101);
  EXPECT_EQ(e->page, 12);  // a's leaf: unheld now, so it goes whole
}

}  // namespace
}  // namespace hyserve::test
