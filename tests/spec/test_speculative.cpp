// Speculative decoding end to end in one process (scheduler + plan runner on the CPU):
//  - greedy output with n-gram and draft-model drafts is token-for-token identical to plain
//    decoding, for the fixture prompts (also equal to the Hugging Face greedy ids) and for 50
//    random prompts of 1-200 tokens (every third holding the model's own greedy continuation,
//    so drafts get accepted) with up to 128 new tokens, all submitted at once so verify
//    rounds interleave with other requests' prefill; requests with stop ids and max_new_tokens
//    that land inside accepted runs, and rounds where no request has a draft;
//  - at temperature 1.0 the sampled distribution is preserved (chi-square, alpha = 0.001);
//  - n-gram proposals, the acceptance rule and the draft budget as units.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "coordinator/speculative.h"
#include "hyserve/kernels/device.h"
#include "hyserve/worker/engine.h"
#include "fixture.h"
#include "spec_harness.h"

namespace hyserve::test {
namespace {

using coordinator::finish_reason;
namespace spec = coordinator::spec;

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
// tree variant's check below asks for.
std::string draft_layers(const std::string& fixture) { return fixture == "granite4h-tiny" ? "3" : "2"; }

// The identity tests run without speculative.cost_check: its decisions depend on measured step
// times, and the plans (so which drafts happen to be accepted on these small random models)
// must not. The cost check has its own tests (SpecUnits, SpecPredictable).
// The `speculative:` section of a variant (empty for plain decoding).
std::string spec_yaml(variant v, const std::string& draft_model_layers = "2") {
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

service_config fixture_config(const std::string& fixture, variant v, precision prec = precision::kF32,
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

const char* const kFixtures[] = {"bamba-tiny", "qwen3next-tiny"};

// 50 random prompts (1-200 tokens) with 1-128 new tokens. Every third is repetitive: a pattern
// repeated, or with `self` (a plain configuration of the model under test) the model's own
// greedy continuation of the pattern's first 8 tokens, so that n-gram drafts match what the
// model will generate and get accepted (the tiny models do not copy a pattern, but their greedy
// runs settle into cycles).
std::vector<gen_request> random_requests(int64_t vocab, uint32_t seed, const service_config* self = nullptr) {
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

void expect_same(const std::vector<generation>& want, const std::vector<generation>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_FALSE(got[i].error) << what << " request " << i << ": " << *got[i].error;
    EXPECT_EQ(got[i].output, want[i].output) << what << " request " << i;
    EXPECT_EQ(got[i].reason, want[i].reason) << what << " request " << i;
  }
}

int64_t total(const std::vector<generation>& g, int64_t generation::*field) {
  int64_t s = 0;
  for (const auto& x : g) s += x.*field;
  return s;
}

std::string spec_case_name(const ::testing::TestParamInfo<std::tuple<const char*, variant>>& info) {
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

class SpecGreedy : public ::testing::TestWithParam<std::tuple<const char*, variant>> {};

TEST_P(SpecGreedy, FixturePromptsMatchPlainDecodingAndTheReference) {
  const auto [fixture, alg] = GetParam();
  const auto prompts = load_reference_prompts(fixture);
  std::vector<gen_request> reqs;
  for (const auto& p : prompts) {
    gen_request g;
    g.prompt = p.input_ids;
    g.sampling.max_new_tokens = static_cast<int32_t>(p.greedy_ids.size());
    g.sampling.ignore_eos = true;
    reqs.push_back(g);
  }
  spec_service plain_svc(fixture_config(fixture, variant::kPlain));
  const auto plain = plain_svc.run(reqs);
  spec_service spec_svc(fixture_config(fixture, alg));
  const auto got = spec_svc.run(reqs);
  expect_same(plain, got, fixture);
  for (size_t i = 0; i < prompts.size(); ++i) {
    // Near-ties (top-2 margin below 1e-4) may flip between implementations; compare up to one.
    size_t upto = prompts[i].greedy_ids.size();
    for (size_t t = 0; t < prompts[i].greedy_top2_margin.size() && t < upto; ++t)
      if (prompts[i].greedy_top2_margin[t] < 1e-4) upto = t;
    ASSERT_GE(got[i].output.size(), upto);
    EXPECT_TRUE(std::equal(prompts[i].greedy_ids.begin(), prompts[i].greedy_ids.begin() + static_cast<long>(upto),
                           got[i].output.begin()))
        << "prompt " << i;
  }
}

TEST_P(SpecGreedy, RandomPromptsStopIdsAndLengthsMatchPlainDecoding) {
  const auto [fixture, alg] = GetParam();
  spec_service probe(fixture_config(fixture, variant::kPlain));
  const int64_t vocab = probe.config().vocab_size;
  const service_config self = fixture_config(fixture, variant::kPlain);
  std::vector<gen_request> reqs = random_requests(vocab, 1234, &self);
  const auto plain0 = probe.run(reqs);
  // Every fourth request stops at a token from the middle of its plain output (a stop id that
  // may land inside an accepted run); the plain run is repeated with the stop ids.
  for (size_t i = 0; i < reqs.size(); i += 4) {
    const auto& o = plain0[i].output;
    if (o.size() >= 4) reqs[i].sampling.stop_token_ids = {o[o.size() / 2]};
  }
  spec_service plain_svc(fixture_config(fixture, variant::kPlain));
  const auto plain = plain_svc.run(reqs);
  spec_service spec_svc(fixture_config(fixture, alg));
  const auto got = spec_svc.run(reqs);
  expect_same(plain, got, std::string(fixture) + " random");
  // Speculation really happened, some drafts were accepted, and some rounds had no drafts
  // (plain decode plans under speculation).
  EXPECT_GT(total(got, &generation::drafted), 0);
  EXPECT_GT(total(got, &generation::accepted), 0);
  const auto& modes = spec_svc.link().modes;
  EXPECT_GT(std::count(modes.begin(), modes.end(), uint8_t{4}), 0) << "no target_verify step";
  EXPECT_GT(spec_svc.link().plans_with_commits, 0);
  if (alg == variant::kDraftModel || alg == variant::kDraftModelTree) {
    EXPECT_GT(std::count(modes.begin(), modes.end(), uint8_t{6}), 0) << "no draft step";
  }
  if (alg == variant::kNgramTree || alg == variant::kDraftModelTree) {
    EXPECT_GT(spec_svc.link().tree_plans, 0) << "no tree verify step";
  }
  if (alg == variant::kDraftModelTree) {
    // Accepted siblings (the draft's runner-up tokens at the first position) are fed to the
    // draft model by DraftExtend steps: some were accepted, and the outputs still match.
    const auto catch_up = std::count(modes.begin(), modes.end(), uint8_t{5});
    EXPECT_GT(catch_up, 0) << "no sibling draft was accepted; the tree path would be untested";
    std::printf("draft-model tree: %lld draft_extend steps for accepted siblings\n", static_cast<long long>(catch_up));
  }
  // Mixed batches: requests still in prefill (long prompts, 64-token chunks) shared verify steps
  // with requests that were verifying drafts, and the outputs above still equal plain decoding.
  EXPECT_GT(spec_svc.link().mixed_verify_plans, 0) << "no verify step carried prefill rows";
  std::printf("%s: %d verify steps with prefill rows of %lld verify steps; drafted %lld, accepted %lld\n",
              spec_case_name({GetParam(), 0}).c_str(), spec_svc.link().mixed_verify_plans,
              static_cast<long long>(std::count(modes.begin(), modes.end(), uint8_t{4})),
              static_cast<long long>(total(got, &generation::drafted)),
              static_cast<long long>(total(got, &generation::accepted)));
  int stopped = 0;
  for (const auto& g : got) stopped += g.reason == finish_reason::kStop;
  EXPECT_GT(stopped, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, SpecGreedy,
                         ::testing::Combine(::testing::ValuesIn(kFixtures),
                                            ::testing::Values(variant::kNgram, variant::kNgramTree,
                                                              variant::kDraftModel, variant::kDraftModelTree)),
                         spec_case_name);

// The other hybrid families (and Bamba with 4 B/C groups): n-gram and draft-model speculation,
// chain and tree, through the same verify / commit paths. The draft model is the target's first
// two layers (Nemotron-H "M*", Granite-4.0-H a Mamba2 and an attention layer with their MoE,
// Falcon-H1 two parallel attention + Mamba2 layers, bamba-groups two Mamba2 layers), run through
// the family's own model file with its own state slots and KV pages.
INSTANTIATE_TEST_SUITE_P(Families, SpecGreedy,
                         ::testing::Combine(::testing::Values("bamba-groups", "nemotronh-tiny", "granite4h-tiny",
                                                              "falconh1-tiny"),
                                            ::testing::Values(variant::kNgram, variant::kNgramTree,
                                                              variant::kDraftModel, variant::kDraftModelTree)),
                         spec_case_name);

// bf16 storage (model.dtype: bfloat16, cache.kv_dtype: bfloat16, and for Bamba also
// cache.ssm_state_dtype: bfloat16): greedy speculative output equals plain bf16 decoding token
// for token. On the CPU this holds exactly: activations are f32, the bf16 weights are widened
// exactly before the f32 GEMM (whose per-row result does not depend on the batch shape), the
// KV cache is written and read the same way in verify and decode, and per-step SSM states are
// stored in the state type after every token, as decode stores them in the slot.
using bf16_param = std::tuple<const char*, variant, precision>;

class SpecGreedyBf16 : public ::testing::TestWithParam<bf16_param> {};

TEST_P(SpecGreedyBf16, FixtureAndRandomPromptsMatchPlainBf16Decoding) {
  const auto [fixture, alg, prec] = GetParam();
  std::vector<gen_request> reqs;
  for (const auto& p : load_reference_prompts(fixture)) {
    gen_request g;
    g.prompt = p.input_ids;
    g.sampling.max_new_tokens = static_cast<int32_t>(p.greedy_ids.size());
    g.sampling.ignore_eos = true;
    reqs.push_back(g);
  }
  spec_service plain_svc(fixture_config(fixture, variant::kPlain, prec));
  const service_config self = fixture_config(fixture, variant::kPlain, prec);
  const std::vector<gen_request> random = random_requests(plain_svc.config().vocab_size, 1234, &self);
  reqs.insert(reqs.end(), random.begin(), random.end());
  const auto plain = plain_svc.run(reqs);
  spec_service spec_svc(fixture_config(fixture, alg, prec));
  const auto got = spec_svc.run(reqs);
  expect_same(plain, got, std::string(fixture) + " bf16");
  EXPECT_GT(total(got, &generation::drafted), 0);
  EXPECT_GT(total(got, &generation::accepted), 0);
  const auto& modes = spec_svc.link().modes;
  EXPECT_GT(std::count(modes.begin(), modes.end(), uint8_t{4}), 0) << "no target_verify step";
  if (alg == variant::kNgramTree) {
    EXPECT_GT(spec_svc.link().tree_plans, 0) << "no tree verify step";
  }
  EXPECT_GT(spec_svc.link().mixed_verify_plans, 0) << "no verify step carried prefill rows";
}

std::string bf16_case_name(const ::testing::TestParamInfo<bf16_param>& info) {
  const auto& [fixture, alg, prec] = info.param;
  return spec_case_name(::testing::TestParamInfo<std::tuple<const char*, variant>>({fixture, alg}, info.index)) +
         (prec == precision::kBf16State ? "_bf16_state" : "_bf16");
}

INSTANTIATE_TEST_SUITE_P(Models, SpecGreedyBf16,
                         ::testing::Values(bf16_param{"bamba-tiny", variant::kNgram, precision::kBf16State},
                                           bf16_param{"bamba-tiny", variant::kNgramTree, precision::kBf16State},
                                           bf16_param{"bamba-tiny", variant::kDraftModel, precision::kBf16State},
                                           bf16_param{"bamba-tiny", variant::kNgram, precision::kBf16},
                                           bf16_param{"qwen3next-tiny", variant::kNgram, precision::kBf16},
                                           bf16_param{"qwen3next-tiny", variant::kNgramTree, precision::kBf16},
                                           bf16_param{"qwen3next-tiny", variant::kDraftModel, precision::kBf16}),
                         bf16_case_name);

// The same on a CUDA device (skips without one): speculative greedy output equals plain greedy
// decoding on that device, f32 and bf16 storage, every algorithm. Verify runs the GEMMs over
// 1 + drafts rows per request where decode runs one; this holds exactly only where the device
// GEMM's result for a row does not depend on the other rows of the batch (the CPU's does).
// f32: exactly. bf16: the bf16 weight GEMMs of verify steps (more than 8 rows: tensor cores on
// bf16-rounded activations) and of decode steps (up to 8 rows: f32 activations) round
// differently, and a row's bits are not independent of the batch, so the rule is the project's
// bf16 parity rule: the outputs are identical up to the first position where plain decoding's
// top-2 logit margin is below kBf16NearTie; after that near-tie the rows may diverge.
constexpr float kBf16NearTie = 0.05f;  // logits

// Top-2 logit margin at every output position of plain decoding, per request: the model on the
// same device and storage, teacher-forced over prompt + plain output in one Extend step
// (prefill GEMMs, so within bf16 rounding of the decode steps' margins, far below kBf16NearTie).
std::vector<std::vector<float>> plain_top2_margins(const service_config& cfg, const std::vector<gen_request>& reqs,
                                                   const std::vector<generation>& plain) {
  const model_config mc = resolve_model_config(cfg);
  const kernels::exec_context ctx = kernels::open_device(cfg.device, 0);
  worker::engine eng(worker::make_model(cfg, mc, worker::tp_placement{}, nullptr, ctx), cfg.cache);
  worker::forward_options opts;
  opts.all_logits = true;
  const int64_t vocab = mc.vocab_size;
  std::vector<std::vector<float>> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::vector<int32_t> seq = reqs[i].prompt;
    seq.insert(seq.end(), plain[i].output.begin(), plain[i].output.end());
    if (plain[i].output.empty()) continue;
    seq.pop_back();  // the logits after the last output token are not needed
    const int32_t req = eng.open_request();
    const host_tensor logits = eng.step(worker::forward_mode::kExtend, {worker::step_row{req, seq}}, opts);
    eng.close_request(req);
    for (size_t t = 0; t < plain[i].output.size(); ++t) {
      const float* row = logits.as<float>() + static_cast<int64_t>(reqs[i].prompt.size() - 1 + t) * vocab;
      float a = -INFINITY, b = -INFINITY;
      for (int64_t v = 0; v < vocab; ++v) {
        if (row[v] > a) {
          b = a;
          a = row[v];
        } else if (row[v] > b) {
          b = row[v];
        }
      }
      out[i].push_back(a - b);
    }
  }
  return out;
}
using cuda_param = std::tuple<const char*, variant, precision>;

class SpecGreedyCuda : public ::testing::TestWithParam<cuda_param> {};

std::string cuda_case_name(const ::testing::TestParamInfo<cuda_param>& info);

TEST_P(SpecGreedyCuda, FixtureAndRandomPromptsMatchPlainDecodingOnTheDevice) {
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const auto [fixture, alg, prec] = GetParam();
  std::vector<gen_request> reqs;
  for (const auto& p : load_reference_prompts(fixture)) {
    gen_request g;
    g.prompt = p.input_ids;
    g.sampling.max_new_tokens = static_cast<int32_t>(p.greedy_ids.size());
    g.sampling.ignore_eos = true;
    reqs.push_back(g);
  }
  spec_service plain_svc(fixture_config(fixture, variant::kPlain, prec, "cuda"));
  const service_config self = fixture_config(fixture, variant::kPlain, prec, "cuda");
  const std::vector<gen_request> random = random_requests(plain_svc.config().vocab_size, 1234, &self);
  reqs.insert(reqs.end(), random.begin(), random.end());
  auto plain = plain_svc.run(reqs);
  if (prec == precision::kF32) {
    // As on the CPU: every fourth random request stops at a token from the middle of its plain
    // output (a stop id that may land inside an accepted run); the plain run is repeated with
    // the stop ids. (bf16 outputs may part after a near-tie, and a stop id would then end them
    // at different lengths: f32 only.)
    for (size_t i = reqs.size() - random.size(); i < reqs.size(); i += 4) {
      const auto& o = plain[i].output;
      if (o.size() >= 4) reqs[i].sampling.stop_token_ids = {o[o.size() / 2]};
    }
    spec_service plain_stop_svc(fixture_config(fixture, variant::kPlain, prec, "cuda"));  // run() drains its service
    plain = plain_stop_svc.run(reqs);
  }
  spec_service spec_svc(fixture_config(fixture, alg, prec, "cuda"));
  const auto got = spec_svc.run(reqs);
  if (prec == precision::kF32) {
    expect_same(plain, got, std::string(fixture) + " cuda");
    int stopped = 0;
    for (const auto& g : got) stopped += g.reason == finish_reason::kStop;
    EXPECT_GT(stopped, 0);
  } else {
    const auto margins = plain_top2_margins(fixture_config(fixture, variant::kPlain, prec, "cuda"), reqs, plain);
    int near_ties = 0;
    size_t compared = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_FALSE(got[i].error) << "request " << i << ": " << *got[i].error;
      EXPECT_EQ(got[i].output.size(), plain[i].output.size()) << "request " << i;
      size_t upto = plain[i].output.size();
      for (size_t t = 0; t < margins[i].size(); ++t)
        if (margins[i][t] < kBf16NearTie) {
          upto = t;
          ++near_ties;
          break;
        }
      upto = std::min(upto, got[i].output.size());
      compared += upto;
      EXPECT_TRUE(std::equal(plain[i].output.begin(), plain[i].output.begin() + static_cast<long>(upto),
                             got[i].output.begin()))
          << fixture << " cuda bf16 request " << i << ": differs before the first near-tie (position " << upto << ")";
    }
    std::printf("%s: %zu tokens compared, %d requests reached a near-tie (margin < %.2f)\n",
                cuda_case_name({GetParam(), 0}).c_str(), compared, near_ties, static_cast<double>(kBf16NearTie));
  }
  EXPECT_GT(total(got, &generation::accepted), 0);
  EXPECT_GT(spec_svc.link().mixed_verify_plans, 0) << "no verify step carried prefill rows";
}

std::vector<cuda_param> cuda_params() {
  std::vector<cuda_param> out;
  for (const char* f : kFixtures)
    for (variant v : {variant::kNgram, variant::kNgramTree, variant::kDraftModel, variant::kDraftModelTree})
      for (precision p : {precision::kF32, precision::kBf16, precision::kBf16State})
        if (!(p == precision::kBf16State && std::string(f) == "qwen3next-tiny")) out.emplace_back(f, v, p);
  return out;
}

std::string cuda_case_name(const ::testing::TestParamInfo<cuda_param>& info) {
  const auto& [f, v, p] = info.param;
  return spec_case_name(::testing::TestParamInfo<std::tuple<const char*, variant>>({f, v}, 0)) +
         (p == precision::kF32 ? "_f32" : p == precision::kBf16 ? "_bf16" : "_bf16_state");
}

INSTANTIATE_TEST_SUITE_P(Models, SpecGreedyCuda, ::testing::ValuesIn(cuda_params()), cuda_case_name);

// A prompt without any repeated token and one new token: no round ever has a draft, so the
// speculative service runs ordinary decode plans and matches plain decoding.
TEST(SpecGreedy, ZeroDraftRoundsAreOrdinaryDecodes) {
  std::vector<gen_request> reqs(1);
  for (int32_t t = 10; t < 40; ++t) reqs[0].prompt.push_back(t);
  reqs[0].sampling.max_new_tokens = 1;
  reqs[0].sampling.ignore_eos = true;
  spec_service plain_svc(fixture_config("bamba-tiny", variant::kPlain));
  spec_service spec_svc(fixture_config("bamba-tiny", variant::kNgram));
  expect_same(plain_svc.run(reqs), spec_svc.run(reqs), "zero drafts");
  const auto& modes = spec_svc.link().modes;
  EXPECT_EQ(std::count(modes.begin(), modes.end(), uint8_t{4}), 0);
}

// Upper tail of the chi-square distribution with k degrees of freedom (regularized upper
// incomplete gamma Q(k/2, x/2), by series / continued fraction).
double chi_square_sf(double x, int k) {
  const double a = k / 2.0, z = x / 2.0;
  if (z <= 0) return 1.0;
  if (z < a + 1) {
    double sum = 1.0 / a, term = sum;
    for (int n = 1; n < 1000; ++n) {
      term *= z / (a + n);
      sum += term;
      if (term < sum * 1e-15) break;
    }
    return 1.0 - std::exp(-z + a * std::log(z) - std::lgamma(a)) * sum;
  }
  double b = z + 1 - a, c = 1e300, d = 1 / b, h = d;
  for (int n = 1; n < 1000; ++n) {
    const double an = -n * (n - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < 1e-300) d = 1e-300;
    c = b + an / c;
    if (std::fabs(c) < 1e-300) c = 1e-300;
    d = 1 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1) < 1e-15) break;
  }
  return std::exp(-z + a * std::log(z) - std::lgamma(a)) * h;
}

// A synthetic model whose residual branches are scaled by 1e-4 (model.synthetic.residual_scale):
// its next-token distribution depends almost only on the current token, so the model's own
// greedy continuation in a prompt makes n-gram drafts that are the target's likeliest tokens,
// and its first two layers (the draft model) agree with it. Drafts are then accepted at
// temperature 1 often enough to test the acceptance rule (on the tiny fixtures they almost
// never are: their drafts are rarely among the target's top tokens).
service_config predictable_config(variant v) {
  return load_config_string(
      "model: {synthetic: {seed: 3, residual_scale: 0.0001}}\n"
      "device: cpu\n"
      "cache: {page_size: 16, max_requests: 64, max_context: 512}\n"
      "scheduler: {max_batch_tokens: 512, max_running: 64, chunked_prefill: 64, max_queue: 1024}\n" +
      spec_yaml(v));
}

// Two-sample chi-square homogeneity test on the histogram of the token generated at output
// positions 1..3 (after drafts could be accepted), temperature 1.0 with top_k 3, 400 seeds per
// arm (disjoint seeds), on the predictable model above. Bins with fewer than 20 samples over
// both arms are pooled; every position must keep at least two bins (a position whose token is
// fixed would compare nothing). The test fails when p < 0.001 (false-failure rate 0.1% per
// position for a correct implementation). Every speculative arm must have drafts both accepted
// and rejected (both branches of the rule): at least 100 of the 1200 tokens at positions 1..3
// come from accepted drafts (the arms accept 155, 158 and 343 of 1108, 1375 and 1721 drafted;
// a rule that accepted every draft would shift the histograms to the greedy tokens).
TEST(SpecSampling, TemperatureOneDistributionIsPreserved) {
  for (const variant alg : {variant::kNgram, variant::kNgramTree, variant::kDraftModel}) {
    // A prompt that contains its own likely continuation: a seed and its 48-token greedy
    // continuation, which n-gram lookup finds.
    std::vector<int32_t> prompt = {21, 22, 23, 24, 25};
    {
      std::vector<gen_request> g(1);
      g[0].prompt = prompt;
      g[0].sampling.max_new_tokens = 48;
      g[0].sampling.ignore_eos = true;
      spec_service greedy_svc(predictable_config(variant::kPlain));
      const auto cont = greedy_svc.run(g)[0].output;
      prompt.insert(prompt.end(), cont.begin(), cont.end());
    }
    auto make = [&](uint64_t seed0) {
      std::vector<gen_request> reqs(400);
      for (size_t i = 0; i < reqs.size(); ++i) {
        reqs[i].prompt = prompt;
        reqs[i].sampling.max_new_tokens = 4;
        reqs[i].sampling.temperature = 1.0f;
        reqs[i].sampling.top_k = 3;
        reqs[i].sampling.ignore_eos = true;
        reqs[i].sampling.seed = seed0 + i;
      }
      return reqs;
    };
    spec_service plain_svc(predictable_config(variant::kPlain));
    const auto plain = plain_svc.run(make(1));
    spec_service spec_svc(predictable_config(alg));
    const auto got = spec_svc.run(make(100001));
    for (const auto& g : got) ASSERT_FALSE(g.error) << *g.error;
    const int64_t drafted = total(got, &generation::drafted), accepted = total(got, &generation::accepted);
    std::printf("chi-square arm %d: drafted %lld, accepted %lld\n", static_cast<int>(alg),
                static_cast<long long>(drafted), static_cast<long long>(accepted));
    EXPECT_GT(drafted, 0) << "arm " << static_cast<int>(alg);
    EXPECT_GE(accepted, 100) << "arm " << static_cast<int>(alg)
                             << ": too few drafts accepted; the acceptance rule would be barely tested";
    EXPECT_LT(accepted, drafted) << "arm " << static_cast<int>(alg) << ": no draft was rejected";
    for (size_t pos = 1; pos < 4; ++pos) {
      std::map<int32_t, std::pair<double, double>> hist;
      for (const auto& g : plain) hist[g.output.at(pos)].first += 1;
      for (const auto& g : got) hist[g.output.at(pos)].second += 1;
      // Pool small bins.
      std::vector<std::pair<double, double>> bins;
      std::pair<double, double> pool{0, 0};
      for (const auto& [tok, c] : hist) {
        if (c.first + c.second < 20) {
          pool.first += c.first;
          pool.second += c.second;
        } else {
          bins.push_back(c);
        }
      }
      if (pool.first + pool.second > 0) bins.push_back(pool);
      ASSERT_GE(bins.size(), 2u) << "arm " << static_cast<int>(alg) << ", position " << pos
                                 << ": one token only; the comparison would be vacuous";
      double chi = 0;
      const double n1 = static_cast<double>(plain.size()), n2 = static_cast<double>(got.size());
      for (const auto& [a, b] : bins) {
        const double tot = a + b;
        const double e1 = tot * n1 / (n1 + n2), e2 = tot * n2 / (n1 + n2);
        chi += (a - e1) * (a - e1) / e1 + (b - e2) * (b - e2) / e2;
      }
      const double p = chi_square_sf(chi, static_cast<int>(bins.size()) - 1);
      EXPECT_GT(p, 1e-3) << "arm " << static_cast<int>(alg) << ", position " << pos << ": chi2 " << chi << " with "
                         << bins.size() - 1 << " df";
    }
  }
}

TEST(SpecUnits, NgramChainAndTree) {
  ngram_spec_section cfg;
  cfg.min_match = 1;
  cfg.max_match = 3;
  // ... 5 6 7 8 ... 5 6 → the continuation after the earlier "5 6" is 7 8 9.
  const std::vector<int32_t> toks = {1, 5, 6, 7, 8, 9, 2, 5, 6};
  const auto chain = spec::ngram_propose(toks, cfg, 3);
  EXPECT_EQ(chain.tokens, (std::vector<int32_t>{7, 8, 9}));
  EXPECT_TRUE(chain.is_chain());
  EXPECT_TRUE(spec::ngram_propose({1, 2, 3}, cfg, 4).tokens.empty());
  EXPECT_TRUE(spec::ngram_propose(toks, cfg, 0).tokens.empty());
  // Two different continuations of "4": a tree of width 2.
  cfg.max_tree_width = 2;
  const auto tree = spec::ngram_propose({4, 10, 11, 4, 12, 13, 4}, cfg, 4);
  ASSERT_EQ(tree.tokens.size(), 4u);
  EXPECT_FALSE(tree.is_chain());
  EXPECT_EQ(tree.tokens[0], 12);  // most recent first
  std::vector<int32_t> next, sib;
  tree.links(next, sib);
  EXPECT_EQ(next[0], 1);
  EXPECT_EQ(sib[1], 4);  // branch 12 13 4 gets 3 nodes, branch 10 the last one
  EXPECT_EQ(tree.tokens[3], 10);
}

TEST(SpecUnits, AcceptLongestMatchingPath) {
  spec::draft_tree t;
  t.tokens = {7, 8, 9};
  t.parent = {0, 1, 2};
  EXPECT_EQ(spec::accept_path(t, {7, 8, 1, 5}), (std::vector<int32_t>{1, 2}));
  EXPECT_TRUE(spec::accept_path(t, {3, 8, 9, 5}).empty());
  EXPECT_EQ(spec::accept_path(t, {7, 8, 9, 5}).size(), 3u);
  spec::draft_tree tr;  // root → 1 (tok 5) → 2 (tok 6); root → 3 (tok 7)
  tr.tokens = {5, 6, 7};
  tr.parent = {0, 1, 0};
  EXPECT_EQ(spec::accept_path(tr, {7, 0, 0, 4}), (std::vector<int32_t>{3}));
}

TEST(SpecUnits, DraftBudgetBacksOffAndRecovers) {
  spec::draft_budget b(4, 0.5);
  EXPECT_EQ(b.allowed(), 4);
  b.record(4, 0);
  EXPECT_EQ(b.allowed(), 2);
  b.record(2, 0);
  EXPECT_EQ(b.allowed(), 1);
  b.record(1, 0);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(b.allowed(), 0) << i;  // cool-down: plain decoding
  EXPECT_EQ(b.allowed(), 1);                                    // probe
  b.record(1, 1);
  EXPECT_EQ(b.allowed(), 2);
  b.record(2, 2);
  EXPECT_EQ(b.allowed(), 4);
}

// After 16 failed probes every further failed probe doubles the next cool-down; a round that
// meets the rate resets it. The
// acceptance estimate falls with rejected rounds and rises with accepted ones.
TEST(SpecUnits, DraftBudgetCooldownGrowsAfterFailedProbes) {
  spec::draft_budget b(4, 0.5);
  const double prior = b.accept_probability();
  EXPECT_DOUBLE_EQ(prior, 0.5);
  b.record(b.allowed(), 0);  // 4 drafted
  b.record(b.allowed(), 0);  // 2
  b.record(b.allowed(), 0);  // 1
  EXPECT_LT(b.accept_probability(), 0.25);
  for (int probe = 0; probe < 16; ++probe) {  // the first 16 failed probes: 4 rounds each
    for (int32_t i = 0; i < 4; ++i) ASSERT_EQ(b.allowed(), 0) << "probe " << probe << " round " << i;
    ASSERT_EQ(b.allowed(), 1) << "probe " << probe;
    b.record(1, 0);
  }
  EXPECT_EQ(b.cooldown_length(), 4);
  for (const int32_t cooldown : {4, 8, 16, 32}) {
    for (int32_t i = 0; i < cooldown; ++i) ASSERT_EQ(b.allowed(), 0) << "cool-down " << cooldown << " round " << i;
    ASSERT_EQ(b.allowed(), 1) << "probe after " << cooldown;
    b.record(1, 0);  // the probe fails
  }
  EXPECT_EQ(b.cooldown_length(), 64);
  for (int32_t i = 0; i < 64; ++i) ASSERT_EQ(b.allowed(), 0);
  ASSERT_EQ(b.allowed(), 1);
  const double low = b.accept_probability();
  b.record(1, 1);  // the probe is accepted: drafting resumes, the cool-down is short again
  EXPECT_EQ(b.cooldown_length(), 4);
  EXPECT_EQ(b.allowed(), 2);
  EXPECT_GT(b.accept_probability(), low);
  // Expected accepted tokens of a chain: p + p² + … (p = 1/2 for a fresh budget).
  EXPECT_NEAR(spec::draft_budget(4, 0.5).expected_accepted(3), 0.5 + 0.25 + 0.125, 1e-12);
  // Skipped rounds fade the evidence towards the prior.
  spec::draft_budget f(4, 0.5);
  f.record(4, 0);
  const double before = f.accept_probability();
  for (int i = 0; i < 1000; ++i) f.forget();
  EXPECT_GT(f.accept_probability(), before);
  EXPECT_NEAR(f.accept_probability(), 0.5, 0.01);
}

// The group's acceptance is the prior of a request without evidence: at batch 1 with a verify
// step 2.1x a decode step, a fresh request's round pays off after the group has seen rounds
// accepted (with the fixed prior 1/2 it never would), and the request's own rejections then
// outweigh the prior.
TEST(SpecUnits, GroupAcceptanceIsTheRequestsPrior) {
  spec::acceptance_prior g;
  EXPECT_FALSE(g.measured());
  EXPECT_DOUBLE_EQ(g.probability(), 0.5);
  g.record(0, 0);  // a round without drafts is no evidence
  EXPECT_FALSE(g.measured());
  for (int i = 0; i < 5; ++i) g.record(4, 4);
  EXPECT_TRUE(g.measured());
  EXPECT_GT(g.probability(), 0.9);
  spec::draft_budget fresh(4, 0.5);
  EXPECT_DOUBLE_EQ(fresh.accept_probability(g.probability()), g.probability());
  const double decode_s = 0.0060, verify_s = 0.0126;
  EXPECT_FALSE(spec::round_pays_off(1, fresh.expected_accepted(4), decode_s, verify_s));
  EXPECT_TRUE(spec::round_pays_off(1, fresh.expected_accepted(4, g.probability()), decode_s, verify_s));
  fresh.record(4, 0);
  fresh.record(2, 0);
  fresh.record(1, 0);
  EXPECT_LT(fresh.accept_probability(g.probability()), 0.45);
  EXPECT_FALSE(spec::round_pays_off(1, fresh.expected_accepted(1, g.probability()), decode_s, verify_s));
  // Before any round: the optimistic prior runs a batch-1 round, but not a batch-32 round in
  // which one row drafts (measured: verify 32 x 5 = 67 ms, decode 32 = 10.1 ms).
  const double first = spec::acceptance_prior::kUnmeasured;
  EXPECT_TRUE(spec::round_pays_off(1, spec::draft_budget(4, 0.5).expected_accepted(4, first), decode_s, verify_s));
  EXPECT_FALSE(spec::round_pays_off(32, spec::draft_budget(4, 0.5).expected_accepted(4, first), 0.0101, 0.067));
  // A group whose rounds are rejected drifts down (recent rounds count more).
  for (int i = 0; i < 30; ++i) g.record(4, 0);
  EXPECT_LT(g.probability(), 0.2);
}

TEST(SpecUnits, RoundPaysOffOnlyWhenExpectedTokensCoverItsTime) {
  // Batch 32: a plain step yields 32 tokens in 60 ms; a verify round of 120 ms breaks even
  // with 32 more, and runs only with the margin kMinRoundGain = 1.2 on top (44.8 more).
  EXPECT_FALSE(spec::round_pays_off(32, 0.5, 0.060, 0.120));
  EXPECT_NEAR(spec::round_gain(32, 32.0, 0.060, 0.120), 1.0, 1e-12);
  EXPECT_NEAR(spec::round_gain(32, 0.5, 0.060, 0.120), 32.5 / 64.0, 1e-12);
  EXPECT_FALSE(spec::round_pays_off(32, 33.0, 0.060, 0.120));
  EXPECT_FALSE(spec::round_pays_off(32, 44.5, 0.060, 0.120));
  EXPECT_TRUE(spec::round_pays_off(32, 45.0, 0.060, 0.120));
  // Measured on the 9B-shaped model (decode 32 rows 10.3 ms, verify 32 x 5 46.4 ms): every row
  // drafting 4 with all accepted is predicted 1.11x, short of the margin (it ran at 0.90x).
  EXPECT_NEAR(spec::round_gain(32, 128.0, 0.0103, 0.0464), 1.11, 0.01);
  EXPECT_FALSE(spec::round_pays_off(32, 128.0, 0.0103, 0.0464));
  // Batch 1: a verify about as costly as a decode step pays off with a fair chance of acceptance.
  EXPECT_TRUE(spec::round_pays_off(1, 0.5, 0.0076, 0.0082));
  EXPECT_FALSE(spec::round_pays_off(1, 0.01, 0.0076, 0.0082));
  // Not measured yet: an unknown round runs (and gets measured); against an unknown plain step a
  // measured round waits for a plain step to be measured.
  EXPECT_TRUE(spec::round_pays_off(32, 0.0, 0.060, 0.0));
  EXPECT_TRUE(spec::round_pays_off(32, 0.0, 0.0, 0.0));
  EXPECT_EQ(spec::round_gain(32, 0.0, 0.060, 0.0), std::numeric_limits<double>::infinity());
  EXPECT_EQ(spec::round_gain(32, 40.0, 0.0, 0.120), 0.0);
  EXPECT_FALSE(spec::round_pays_off(32, 40.0, 0.0, 0.120));
  EXPECT_FALSE(spec::round_pays_off(0, 1.0, 0.060, 0.120));
  // Step times: one sample is not trusted (a one-time cost must not price a shape out for good:
  // the step runs again), the second replaces a larger first one, later samples are averaged
  // with outliers clipped to twice the estimate; other widths are interpolated.
  spec::step_costs c;
  EXPECT_EQ(c.get(1, 8, 5), 0.0);
  c.add(1, 8, 5, 0.100);
  EXPECT_EQ(c.get(1, 8, 5), 0.0);
  EXPECT_EQ(c.estimate(1, 8, 3, 0.010), 0.0);
  c.add(1, 8, 5, 0.020);
  EXPECT_DOUBLE_EQ(c.get(1, 8, 5), 0.020);
  c.add(1, 8, 5, 1.0);
  EXPECT_NEAR(c.get(1, 8, 5), 0.7 * 0.020 + 0.3 * 0.040, 1e-12);
  c.add(1, 8, 5, 0.020);
  c.add(1, 8, 5, 0.020);
  c.add(1, 8, 5, 0.020);
  for (int i = 0; i < 40; ++i) c.add(1, 8, 5, 0.020);
  EXPECT_NEAR(c.get(1, 8, 5), 0.020, 1e-6);
  // A plain step of 10 ms and 4 extra tokens per row costing 10 ms: 2 extra tokens cost 5 ms.
  EXPECT_NEAR(c.estimate(1, 8, 3, 0.010), 0.015, 1e-6);
  EXPECT_NEAR(c.estimate(1, 8, 5, 0.010), 0.020, 1e-6);
  EXPECT_EQ(c.estimate(1, 16, 3, 0.010), 0.0);  // no verify of 16 rows or more measured
  EXPECT_NEAR(c.estimate(1, 8, 3, 0.0), 0.020, 1e-6);  // no plain step measured: width 5's time
  // Fewer rows than any measured: priced as the fewest rows above (a bound from above), so a
  // batch whose rows finish one by one does not run each new shape blind.
  EXPECT_NEAR(c.estimate(1, 5, 5, 0.010), 0.020, 1e-6);
  EXPECT_NEAR(c.estimate(1, 5, 3, 0.010), 0.015, 1e-6);
  c.add(1, 32, 5, 0.060);
  c.add(1, 32, 5, 0.060);
  EXPECT_NEAR(c.estimate(1, 17, 5, 0.010), 0.060, 1e-6);
  EXPECT_NEAR(c.estimate(1, 7, 5, 0.010), 0.020, 1e-6);  // 8 rows is the nearest above
  EXPECT_EQ(c.estimate(1, 33, 5, 0.010), 0.0);
  EXPECT_EQ(c.estimate(2, 5, 1, 0.010), 0.0);  // another kind
}

// The runner samples the rows of a step on several host threads when the vocabulary is large
// (worker/src/runner.cpp: vocab >= 4096): a batch of greedy and seeded sampled requests (top-k,
// top-p) run together gives each request exactly the output it gets alone.
TEST(SpecSampling, BatchedRowsSampleAsAloneAtALargeVocabulary) {
  const std::string cfg_text =
      "model: {synthetic: {seed: 5, vocab_size: 8192, hidden_size: 64, num_layers: 2, attn_layer_indices: [1],\n"
      "                    num_attention_heads: 4, num_kv_heads: 2, head_dim: 16, intermediate_size: 128,\n"
      "                    mamba_n_heads: 4, mamba_d_head: 16, mamba_d_state: 16, mamba_n_groups: 1}}\n"
      "device: cpu\n"
      "cache: {page_size: 16, max_requests: 8, max_context: 128}\n"
      "scheduler: {max_batch_tokens: 512, max_running: 8, chunked_prefill: 64, max_queue: 16}\n";
  std::mt19937 rng(29);
  std::vector<gen_request> reqs(6);
  for (size_t i = 0; i < reqs.size(); ++i) {
    gen_request& r = reqs[i];
    for (int j = 0; j < 5 + static_cast<int>(i) * 3; ++j) r.prompt.push_back(static_cast<int32_t>(3 + rng() % 8000));
    r.sampling.max_new_tokens = 12;
    r.sampling.ignore_eos = true;
    if (i % 3 == 1) {
      r.sampling.temperature = 1.0f;
      r.sampling.seed = 100 + i;
    } else if (i % 3 == 2) {
      r.sampling.temperature = 0.8f;
      r.sampling.top_k = 40;
      r.sampling.top_p = 0.9f;
      r.sampling.seed = 200 + i;
    }
  }
  spec_service together(load_config_string(cfg_text));
  ASSERT_EQ(together.config().vocab_size, 8192);
  const std::vector<generation> batched = together.run(reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    spec_service alone(load_config_string(cfg_text));  // one run per service
    const std::vector<generation> one = alone.run({reqs[i]});
    ASSERT_FALSE(one[0].error) << *one[0].error;
    ASSERT_FALSE(batched[i].error) << *batched[i].error;
    EXPECT_EQ(batched[i].output.size(), 12u) << "request " << i;
    EXPECT_EQ(batched[i].output, one[0].output) << "request " << i << " (temperature " << reqs[i].sampling.temperature
                                                << ")";
  }
}

// model.synthetic.residual_scale: a synthetic model whose residual branches are scaled down is
// predictable. Prompts hold the model's own greedy continuation of a random prefix; n-gram
// drafts and the target's first layer as draft model are then accepted in most rounds, and the
// output still equals plain decoding. The same construction on the ordinary synthetic model
// (residual_scale 1) accepts far fewer.
service_config synthetic_config(double residual_scale, const std::string& spec) {
  return load_config_string("model: {synthetic: {seed: 3, residual_scale: " + std::to_string(residual_scale) +
                            "}}\n"
                            "device: cpu\n"
                            "cache: {page_size: 16, max_requests: 16, max_context: 256}\n"
                            "scheduler: {max_batch_tokens: 512, max_running: 16, chunked_prefill: 64, max_queue: 64}\n" +
                            spec);
}

TEST(SpecPredictable, ResidualScaleMakesDraftsAccepted) {
  const std::string ngram = "speculative: {algorithm: ngram, num_draft_tokens: 4, ngram: {min_match: 1, max_match: 4}}\n";
  const std::string draft =
      "speculative: {algorithm: draft_model, num_draft_tokens: 4, draft_model: {synthetic: {num_layers: 1}}}\n";
  auto rate = [](const std::vector<generation>& g) {
    const int64_t d = total(g, &generation::drafted);
    return d > 0 ? static_cast<double>(total(g, &generation::accepted)) / static_cast<double>(d) : 0.0;
  };
  std::map<double, double> ngram_rate;
  for (const double scale : {1e-4, 1.0}) {
    spec_service plain_svc(synthetic_config(scale, ""));
    const int64_t vocab = plain_svc.config().vocab_size;
    // 6 prompts: 8 random tokens, then the model's own 64-token greedy continuation.
    std::mt19937 rng(17);
    std::vector<gen_request> reqs(6);
    for (auto& r : reqs) {
      for (int j = 0; j < 8; ++j) r.prompt.push_back(static_cast<int32_t>(3 + rng() % (vocab - 3)));
      r.sampling.max_new_tokens = 64;
      r.sampling.ignore_eos = true;
    }
    const auto cont = plain_svc.run(reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      reqs[i].prompt.insert(reqs[i].prompt.end(), cont[i].output.begin(), cont[i].output.end());
      reqs[i].sampling.max_new_tokens = 48;
    }
    spec_service plain_again(synthetic_config(scale, ""));  // one run per service
    const auto plain = plain_again.run(reqs);
    spec_service ngram_svc(synthetic_config(scale, ngram));
    const auto got = ngram_svc.run(reqs);
    expect_same(plain, got, "ngram, residual_scale " + std::to_string(scale));
    ngram_rate[scale] = rate(got);
    std::printf("residual_scale %g: n-gram drafted %lld, accepted %lld\n", scale,
                static_cast<long long>(total(got, &generation::drafted)),
                static_cast<long long>(total(got, &generation::accepted)));
    if (scale < 1.0) {
      spec_service draft_svc(synthetic_config(scale, draft));
      const auto dgot = draft_svc.run(reqs);
      expect_same(plain, dgot, "draft_model, residual_scale " + std::to_string(scale));
      std::printf("residual_scale %g: draft model drafted %lld, accepted %lld\n", scale,
                  static_cast<long long>(total(dgot, &generation::drafted)),
                  static_cast<long long>(total(dgot, &generation::accepted)));
      // Most drafts accepted: the truncated target agrees with the target on most tokens.
      EXPECT_GE(rate(dgot), 0.8);
      EXPECT_GE(ngram_rate[scale], 0.8);
      // The accepted drafts shorten the run: fewer verify rounds than tokens.
      const auto& modes = ngram_svc.link().modes;
      EXPECT_LT(std::count(modes.begin(), modes.end(), uint8_t{4}), 6 * 48 / 2);
    }
  }
  EXPECT_GT(ngram_rate[1e-4], ngram_rate[1.0] + 0.2);
}

TEST(SpecConfig, FieldsAreValidatedByName) {
  auto err = [](const std::string& yaml) {
    try {
      (void)load_config_string("model: {path: /nonexistent}\n" + yaml);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err("speculative: {algorithm: ngram, ngram: {min_match: 3, max_match: 2}}").find("speculative.ngram.max_match"),
            std::string::npos);
  EXPECT_NE(err("speculative: {algorithm: draft_model}").find("speculative.draft_model"), std::string::npos);
  EXPECT_NE(err("speculative: {algorithm: ngram, ngram: {bogus: 1}}").find("bogus"), std::string::npos);
  EXPECT_NE(err("speculative: {algorithm: draft_model, draft_model: {path: a, synthetic: {num_layers: 1}}}")
                .find("speculative.draft_model"),
            std::string::npos);
  EXPECT_NE(err("speculative: {num_draft_tokens: 0}").find("speculative.num_draft_tokens"), std::string::npos);
  try {
    (void)load_config_string("model: {synthetic: {residual_scale: 0}}\n");
    ADD_FAILURE() << "residual_scale 0 accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("model.synthetic.residual_scale"), std::string::npos) << e.what();
  }
  EXPECT_DOUBLE_EQ(load_config_string("model: {synthetic: {residual_scale: 1.0e-4}}\n").model.synthetic->residual_scale,
                   1e-4);
  EXPECT_NE(err("speculative: {algorithm: draft_model, draft_model: {synthetic: {num_layers: 1}, max_tree_width: 0}}")
                .find("speculative.draft_model.max_tree_width"),
            std::string::npos);
}

}  // namespace
}  // namespace hyserve::test
