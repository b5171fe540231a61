#pragma once
// Shared by the speculative decoding tests (test_speculative*.cpp): the speculation variants and
// storage precisions under test, their configs on the fixture models, random request sets (every
// third prompt repetitive, optionally the model's own greedy continuation) and the comparison
// with plain decoding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "fixture.h"
#include "hyserve/common/config.h"
#include "spec_harness.h"

namespace hyserve::test {

// Speculation variants under test.
enum class variant { kPlain, kNgram, kNgramTree, kDraftModel, kDraftModelTree };

// Storage types: f32 throughout; bf16 weights and KV cache with an f32 SSM state; bf16 weights,
// KV cache and SSM state (Mamba2 only: Gated DeltaNet state stays f32).
enum class precision { kF32, kBf16, kBf16State };

// The draft model of the draft_model variants: the target's first layers. Two, except on
// granite4h-tiny: its muP multipliers (embeddings x 12, every layer's update x 0.22) leave the
// hidden state dominated by the token's embedding, so a truncated Granite agrees with the four-layer target on about 99% of the drafted tokens (1880 of 1892 with
// one layer or three) and a first-position draft is seldom rejected; with three layers one of
// those rejections is caught by an accepted sibling (with one or two, none is), which the
// tree variant's check (test_speculative.cpp) asks for.
inline std::string draft_layers(const std::string& fixture) { return fixture == "granite4h-tiny" ? "3" : "2"; }

// The identity tests run without speculative.cost_check: its decisions depend on measured step
// times, and the plans (so which drafts happen to be accepted on these small random models)
// must not. The cost check has its own tests (SpecUnits, SpecPredictable).
// The `speculative:` section of a variant (empty for plain decoding).
inline std::string spec_yaml(variant v, const std::string& draft_model_layers = "2") {
  switch (v) {
    case variant::kPlain:
      return "";
    case variant::kNgram:
      return "speculative: {algorithm: ngram, num_draft_tokens: 4, cost_check: false, ngram: {min_match: 1, max_match: 3}}\n";
    case variant::kNgramTree:
      return "speculative: {algorithm: ngram, num_draft_tokens: 5, cost_check: false, ngram: {min_match: 1, max_match: 2, "
             "max_tree_width: 3}}\n";
    case variant::kDraftModel:
      return "speculative: {algorithm: draft_model, num_draft_tokens: 3, cost_check: false, "
             "draft_model: {synthetic: {num_layers: " + draft_model_layers + "}}}\n";
    case variant::kDraftModelTree:
      return "speculative: {algorithm: draft_model, num_draft_tokens: 4, cost_check: false, "
             "draft_model: {synthetic: {num_layers: " + draft_model_layers + "}, "
             "max_tree_width: 3}}\n";
  }
  return "";
}

inline service_config fixture_config(const std::string& fixture, variant v, precision prec = precision::kF32,
                              const std::string& device = "cpu") {
  const char* dtypes = prec == precision::kF32 ? ""
                       : prec == precision::kBf16 ? ", kv_dtype: bfloat16"
                                                  : ", kv_dtype: bfloat16, ssm_state_dtype: bfloat16";
  std::string yaml = "model: {path: " + fixture_dir(fixture) +
                     (prec == precision::kF32 ? "" : ", dtype: bfloat16") +
                     "}\n"
                     "device: " + device + "\n"
                     "cache: {page_size: 16, max_requests: 64, max_context: 512" + dtypes + "}\n"
                     "scheduler: {max_batch_tokens: 512, max_running: 64, chunked_prefill: 64, max_queue: 1024}\n";
  yaml += spec_yaml(v, draft_layers(fixture));
  return load_config_string(yaml);
}

inline constexpr const char* kFixtures[] = {"bamba-tiny", "qwen3next-tiny"};

// 50 random prompts (1-200 tokens) with 1-128 new tokens. Every third is repetitive: a pattern
// repeated, or with `self` (a plain configuration of the model under test) the model's own
// greedy continuation of the pattern's first 8 tokens, so that n-gram drafts match what the
// model will generate and get accepted (the tiny models do not copy a pattern, but their greedy
// runs settle into cycles).
inline std::vector<gen_request> random_requests(int64_t vocab, uint32_t seed, const service_config* self = nullptr) {
  std::mt19937 rng(seed);
  std::vector<gen_request> out;
  for (int i = 0; i < 50; ++i) {
    gen_request g;
    const int len = 1 + static_cast<int>(rng() % 200);
    if (i % 3 == 0) {  // a pattern repeated: its own continuation
      const int period = 2 + static_cast<int>(rng() % 8);
      std::vector<int32_t> pat;
      for (int j = 0; j < period; ++j) pat.push_back(static_cast<int32_t>(3 + rng() % (vocab - 3)));
      for (int j = 0; j < len; ++j) g.prompt.push_back(pat[static_cast<size_t>(j % period)]);
    } else {
      for (int j = 0; j < len; ++j) g.prompt.push_back(static_cast<int32_t>(3 + rng() % (vocab - 3)));
    }
    g.sampling.max_new_tokens = 1 + static_cast<int32_t>(rng() % 128);
    g.sampling.temperature = 0.0f;
    g.sampling.ignore_eos = true;
    out.push_back(std::move(g));
  }
  if (self) {
    constexpr size_t kSeedLen = 8;
    std::vector<gen_request> seeds;
    std::vector<size_t> which;
    for (size_t i = 0; i < out.size(); i += 3) {
      if (out[i].prompt.size() <= kSeedLen) continue;
      gen_request g;
      g.prompt.assign(out[i].prompt.begin(), out[i].prompt.begin() + kSeedLen);
      g.sampling.max_new_tokens = static_cast<int32_t>(out[i].prompt.size() - kSeedLen);
      g.sampling.ignore_eos = true;
      seeds.push_back(std::move(g));
      which.push_back(i);
    }
    spec_service svc(*self);
    const auto cont = svc.run(seeds);
    for (size_t k = 0; k < which.size(); ++k) {
      gen_request& r = out[which[k]];
      r.prompt = seeds[k].prompt;
      r.prompt.insert(r.prompt.end(), cont[k].output.begin(), cont[k].output.end());
    }
  }
  return out;
}

inline void expect_same(const std::vector<generation>& want, const std::vector<generation>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_FALSE(got[i].error) << what << " request " << i << ": " << *got[i].error;
    EXPECT_EQ(got[i].output, want[i].output) << what << " request " << i;
    EXPECT_EQ(got[i].reason, want[i].reason) << what << " request " << i;
  }
}

inline int64_t total(const std::vector<generation>& g, int64_t generation::*field) {
  int64_t s = 0;
  for (const auto& x : g) s += x.*field;
  return s;
}

inline std::string spec_case_name(const ::testing::TestParamInfo<std::tuple<const char*, variant>>& info) {
  std::string n = std::get<0>(info.param);
  std::replace(n.begin(), n.end(), '-', '_');
  switch (std::get<1>(info.param)) {
    case variant::kPlain: return n + "_plain";
    case variant::kNgram: return n + "_ngram";
    case variant::kNgramTree: return n + "_ngram_tree";
    case variant::kDraftModel: return n + "_draft_model";
    case variant::kDraftModelTree: return n + "_draft_model_tree";
  }
  return n;
}

}  // namespace hyserve::test
