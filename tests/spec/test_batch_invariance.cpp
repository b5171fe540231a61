// Batch invariance on the CPU (the service's scheduler driving a real plan runner in one process,
// every plan and result through the wire encoding): a request's tokens and logprobs are the same,
// bit for bit, when it runs alone and when it runs inside a batch of 63 other random requests
// that arrive at random times, so its rows share Decode, Extend and Mixed steps with different
// neighbours and the token budget left for its prefill chunks differs from step to step. This
// holds because the scheduler splits a prompt at positions that depend on that request only
// (scheduler::next_chunk; with the prefix cache, on by default, a resent target resumes only at
// multiples of cache.prefix.state_interval, chunk boundaries of its uncut prompt too), a Mixed step's decode rows run the recurrent mixers' one-token update
// as a Decode step does, and every CPU op computes a row without regard to the other rows (the
// GEMM: kernels/cpu/gemm.cpp). With n-gram speculative decoding the greedy tokens are the same too
// (rounds, their widths and the rows they verify with depend on the batch).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fixture.h"
#include "hyserve/common/forward_mode.h"
#include "hyserve/kernels/device.h"
#include "spec_harness.h"

namespace hyserve::test {
namespace {

struct invariance_case {
  std::string fixture;
  bool bf16 = false;
  bool ngram = false;  // tokens compared (a request with logprobs does not speculate)
  int trials = 50;
  std::string device = "cpu";
};

std::string case_name(const testing::TestParamInfo<invariance_case>& info) {
  std::string n = info.param.fixture + (info.param.bf16 ? "_bf16" : "_f32") + (info.param.ngram ? "_ngram" : "");
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
}

service_config make_config(const invariance_case& c) {
  std::string yaml =
      "model: {path: " + fixture_dir(c.fixture) + (c.bf16 ? ", dtype: bfloat16" : "") + "}\ndevice: " + c.device + "\n";
  // Checkpoint slots for every arrival's checkpoints, so the targets' outlive a trial of 63 others.
  yaml += "cache: {page_size: 16, max_requests: 64, max_context: 512, prefix: {state_slots: 256}";
  if (c.bf16) yaml += ", kv_dtype: bfloat16, ssm_state_dtype: bfloat16";
  yaml += "}\n";
  // A small token budget: prefill chunks meet decode rows and each other's leftovers. The chunk,
  // 64 tokens, is a multiple of both fixtures' scan chunks, so the prefix cache (on by default)
  // stays on: the targets resent in the trials resume from the checkpoints of their first run.
  yaml += "scheduler: {max_batch_tokens: 160, max_running: 64, chunked_prefill: 64, max_queue: 1024}\n";
  // The CUDA kernels' row-invariant variants (the CPU kernels are row-invariant either way), and
  // the prefix cache cutting and resuming prompts only at multiples of its interval.
  yaml += "determinism: batch_invariant\n";
  if (c.ngram)
    yaml += "speculative: {algorithm: ngram, num_draft_tokens: 4, cost_check: false, ngram: {min_match: 1, max_match: 3}}\n";
  return load_config_string(yaml);
}

// The requests whose outputs are compared: the fixture prompts and a few random ones, greedy and
// seeded, with logprobs.
std::vector<gen_request> targets(const std::string& fixture, int64_t vocab, bool logprobs) {
  std::vector<gen_request> out;
  for (const reference_prompt& p : load_reference_prompts(fixture)) {
    gen_request g;
    g.prompt = p.input_ids;
    g.sampling.max_new_tokens = 12;
    g.sampling.ignore_eos = true;
    g.sampling.logprobs = logprobs;
    out.push_back(g);
  }
  std::mt19937 rng(77);
  for (int i = 0; i < 3; ++i) {
    gen_request g;
    const int len = 60 + static_cast<int>(rng() % 90);
    for (int j = 0; j < len; ++j) g.prompt.push_back(static_cast<int32_t>(3 + rng() % static_cast<uint32_t>(vocab - 3)));
    g.sampling.max_new_tokens = 12;
    g.sampling.ignore_eos = true;
    g.sampling.logprobs = logprobs;
    if (i % 2 == 1) {
      g.sampling.temperature = 0.8f;
      g.sampling.seed = 1000 + static_cast<uint64_t>(i);
    }
    out.push_back(g);
  }
  return out;
}

gen_request random_request(std::mt19937& rng, int64_t vocab) {
  gen_request g;
  const int len = 1 + static_cast<int>(rng() % 160);
  for (int j = 0; j < len; ++j) g.prompt.push_back(static_cast<int32_t>(3 + rng() % static_cast<uint32_t>(vocab - 3)));
  g.sampling.max_new_tokens = 1 + static_cast<int32_t>(rng() % 20);
  g.sampling.ignore_eos = true;
  if (rng() % 2 == 0) {
    g.sampling.temperature = 0.9f;
    g.sampling.seed = rng();
  }
  return g;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

class BatchInvariance : public testing::TestWithParam<invariance_case> {};

TEST_P(BatchInvariance, RequestAloneEqualsRequestAmongRandomArrivals) {
  const invariance_case c = GetParam();
  if (c.device == "cuda" && kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const service_config cfg = make_config(c);
  coordinator::local_service svc(cfg);
  const int64_t vocab = svc.config().vocab_size;
  const std::vector<gen_request> tg = targets(c.fixture, vocab, !c.ngram);
  svc.start_loop();
  std::vector<generation> alone;
  for (const gen_request& g : tg) {
    std::vector<generation> got = svc.submit_and_wait({g});
    ASSERT_FALSE(got[0].error) << *got[0].error;
    ASSERT_EQ(got[0].logprobs.size(), c.ngram ? 0 : got[0].output.size());
    alone.push_back(got[0]);
  }
  std::mt19937 rng(4242);
  const int kOthers = 63;
  const size_t plans_before = svc.link().modes.size();
  int diverged = 0, checked = 0;
  int64_t drafted = 0, cached = 0;
  for (int trial = 0; trial < c.trials; ++trial) {
    const size_t t = static_cast<size_t>(trial) % tg.size();
    const int at = static_cast<int>(rng() % (kOthers + 1));  // the target's place among the arrivals
    std::vector<std::unique_ptr<coordinator::local_batch>> batches;
    std::unique_ptr<coordinator::local_batch> target;
    for (int i = 0; i <= kOthers; ++i) {
      if (i == at) {
        target = std::make_unique<coordinator::local_batch>(svc.sched(), std::vector<gen_request>{tg[t]});
      } else {
        batches.push_back(std::make_unique<coordinator::local_batch>(
            svc.sched(), std::vector<gen_request>{random_request(rng, vocab)}));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
    }
    const generation got = target->wait(std::chrono::minutes(5))[0];
    for (auto& b : batches)
      for (const generation& o : b->wait(std::chrono::minutes(5))) drafted += o.drafted;
    ASSERT_FALSE(got.error) << *got.error;
    drafted += got.drafted;
    cached += got.cached_tokens;
    ++checked;
    const bool same = got.output == alone[t].output && same_bits(got.logprobs, alone[t].logprobs);
    if (!same) {
      ++diverged;
      size_t k = 0;
      while (k < got.output.size() && k < alone[t].output.size() && got.output[k] == alone[t].output[k] &&
             got.logprobs[k] == alone[t].logprobs[k])
        ++k;
      ADD_FAILURE() << "trial " << trial << " target " << t << " differs from alone at output " << k << ": token "
                    << (k < got.output.size() ? got.output[k] : -1) << " vs "
                    << (k < alone[t].output.size() ? alone[t].output[k] : -1) << ", logprob "
                    << (k < got.logprobs.size() ? got.logprobs[k] : 0.f) << " vs "
                    << (k < alone[t].logprobs.size() ? alone[t].logprobs[k] : 0.f);
    }
  }
  EXPECT_EQ(diverged, 0) << "of " << checked;
  // The trials' steps mixed decode rows with prefill chunks, and (n-gram) drafts were verified.
  int64_t mixed = 0, decode = 0;
  for (size_t i = plans_before; i < svc.link().modes.size(); ++i) {
    mixed += svc.link().modes[i] == mode_byte(forward_mode::kMixed);
    decode += svc.link().modes[i] == mode_byte(forward_mode::kDecode);
  }
  EXPECT_GT(mixed, c.trials) << "mixed steps";
  EXPECT_GT(decode, c.trials) << "decode steps";
  if (c.ngram) EXPECT_GT(drafted, 0);
  // Resent targets started from the cache (at least the random ones, of 60 to 150 tokens).
  EXPECT_GT(cached, 0) << "prompt tokens served from the prefix cache";
}

INSTANTIATE_TEST_SUITE_P(Cpu, BatchInvariance,
                         testing::Values(invariance_case{"bamba-tiny", false, false, 200},
                                         invariance_case{"qwen3next-tiny", false, false, 50},
                                         invariance_case{"bamba-tiny", true, false, 50},
                                         invariance_case{"bamba-tiny", false, true, 50}),
                         case_name);

// The same on the GPU (skipped without one) with determinism: batch_invariant (row-invariant
// GEMMs, batch-independent attention splits and SSD path); bench/run_gpu_set.sh's `invariance`
// stage runs these and reports the diverging trials.
INSTANTIATE_TEST_SUITE_P(Device, BatchInvariance,
                         testing::Values(invariance_case{"bamba-tiny", false, false, 200, "cuda"},
                                         invariance_case{"qwen3next-tiny", false, false, 50, "cuda"},
                                         invariance_case{"bamba-tiny", true, false, 50, "cuda"},
                                         invariance_case{"bamba-tiny", true, true, 50, "cuda"}),
                         case_name);

}  // namespace
}  // namespace hyserve::test
