// Prefix caching under determinism: batch_invariant (the scheduler driving a real plan runner in
// one process, every plan and result through the wire encoding): with cache.prefix on, every
// request's tokens and logprobs are the same bits as with it off. A recurrent layer's chunked scan
// (SSD, Gated DeltaNet) starts its chunks at each call's first token, so a prompt cut where
// another prompt's pages end, or resumed from a checkpoint there, sums in another order than the
// same prompt run whole. In this mode the scheduler cuts, saves and resumes only at multiples of
// cache.prefix.state_interval (a multiple of the scans' chunk, and chunked_prefill a multiple of
// it), and answers are not cached (a decode step's state is not a prefill's): a resumed prompt
// then meets the chunk boundaries the uncut prompt has. Random waves of requests that share
// prefixes of random lengths (most not multiples of a page or of the interval), greedy and
// seeded, on the CPU with bamba-tiny (SSD chunk 16; f32, and bf16 weights, KV and SSM state) and
// qwen3next-tiny (GDN chunk 64); the same on a device when there is one. A bf16 SSM state is
// rounded where a prefill call ends, so there cuts fall only at multiples of the prefill chunk
// (check_invariant_prefix); with the interval at 64, 3 of 48 bf16 requests' logprobs differed on the
// CPU and 1 on the GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "fixture.h"
#include "hyserve/kernels/device.h"
#include "prefix_harness.h"

namespace hyserve::test {
namespace {

struct invariant_prefix_case {
  std::string fixture;
  std::string device = "cpu";
  bool bf16 = false;
  int waves = 3;
};

std::string case_name(const testing::TestParamInfo<invariant_prefix_case>& info) {
  std::string n = info.param.fixture + "_" + info.param.device + (info.param.bf16 ? "_bf16" : "_f32");
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
}

service_config make_config(const invariant_prefix_case& c, bool prefix) {
  std::string yaml = "model: {path: " + fixture_dir(c.fixture) + (c.bf16 ? ", dtype: bfloat16" : "") +
                     "}\ndevice: " + c.device + "\ndeterminism: batch_invariant\n";
  yaml += "cache: {page_size: 16, max_requests: 16, max_context: 512";
  if (c.bf16) yaml += ", kv_dtype: bfloat16, ssm_state_dtype: bfloat16";
  // A bf16 SSM state is rounded where a prefill call ends: the interval is then the prefill chunk
  // (the default under batch_invariant; config.h), so cached prompts resume at multiples of 128.
  if (prefix) yaml += c.bf16 ? ", prefix: {enabled: true, state_slots: 32}" : ", prefix: {enabled: true, state_interval: 64, state_slots: 32}";
  else yaml += ", prefix: {enabled: false}";
  yaml += "}\n";
  yaml += "scheduler: {max_batch_tokens: 256, max_running: 16, chunked_prefill: 128, max_queue: 1024}\n";
  return load_config_string(yaml);
}

// Waves of 16 requests (prefix_harness.h): a random-length prefix (0-320 tokens) of one of three
// shared prompts, or an earlier request's prompt, then 1-40 tokens of its own; 1-16 new tokens
// with logprobs, greedy or seeded at temperature 0.9.
std::vector<std::vector<gen_request>> waves(int64_t vocab, int n_waves) {
  return shared_prefix_waves(
      vocab, 2027, n_waves,
      {.bases = 3, .base_len = 320, .per_wave = 16, .max_prompt = 440, .max_new = 16, .logprobs = true});
}

std::vector<generation> run_all(prefix_service& svc, const std::vector<std::vector<gen_request>>& ws) {
  std::vector<generation> all;
  for (const auto& w : ws) {
    auto got = svc.run(w);
    all.insert(all.end(), got.begin(), got.end());
  }
  return all;
}

class PrefixInvariance : public testing::TestWithParam<invariant_prefix_case> {};

TEST_P(PrefixInvariance, CacheOnEqualsCacheOffBitForBit) {
  const invariant_prefix_case& c = GetParam();
  if (c.device == "cuda" && kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const service_config off_cfg = make_config(c, false);
  const auto ws = waves(resolve_model_config(off_cfg).vocab_size, c.waves);
  std::vector<generation> want, got;
  {
    prefix_service off(off_cfg);
    want = run_all(off, ws);
  }
  prefix_service on(make_config(c, true));
  got = run_all(on, ws);
  ASSERT_EQ(want.size(), got.size());
  int64_t cached = 0;
  int hits = 0;
  size_t i = 0;
  for (const auto& w : ws)
    for (const auto& g : w) {
      ASSERT_FALSE(want[i].error) << "request " << i << ": " << *want[i].error;
      ASSERT_FALSE(got[i].error) << "request " << i << ": " << *got[i].error;
      EXPECT_EQ(got[i].output, want[i].output) << "request " << i << " (prompt " << g.prompt.size() << " tokens, "
                                               << got[i].cached_tokens << " cached)";
      ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size()) << "request " << i;
      EXPECT_EQ(std::memcmp(got[i].logprobs.data(), want[i].logprobs.data(), got[i].logprobs.size() * sizeof(float)), 0)
          << "request " << i << " (prompt " << g.prompt.size() << " tokens, " << got[i].cached_tokens
          << " cached): logprobs differ from the cache-off run";
      EXPECT_EQ(got[i].cached_tokens % 64, 0) << "request " << i << " resumed off the state interval";
      cached += got[i].cached_tokens;
      hits += got[i].cached_tokens > 0 ? 1 : 0;
      ++i;
    }
  std::printf("[prefix-invariance] %s: %d of %zu requests hit, %lld prompt tokens from the cache\n",
              case_name(testing::TestParamInfo<invariant_prefix_case>(c, 0)).c_str(), hits, got.size(),
              static_cast<long long>(cached));
  EXPECT_GT(hits, static_cast<int>(got.size()) / 4);
}

INSTANTIATE_TEST_SUITE_P(Cpu, PrefixInvariance,
                         testing::Values(invariant_prefix_case{"bamba-tiny"}, invariant_prefix_case{"bamba-tiny", "cpu", true}, invariant_prefix_case{"qwen3next-tiny", "cpu",
                                                                                                    false, 2}),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Device, PrefixInvariance,
                         testing::Values(invariant_prefix_case{"bamba-tiny", "cuda"},
                                         invariant_prefix_case{"bamba-tiny", "cuda", true},
                                         invariant_prefix_case{"qwen3next-tiny", "cuda"}),
                         case_name);

}  // namespace
}  // namespace hyserve::test
