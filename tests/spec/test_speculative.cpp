// Speculative decoding end to end in one process (scheduler + plan runner), greedy: output with
// n-gram and draft-model drafts (chains and trees) is token-for-token identical to plain
// decoding, for the fixture prompts (also equal to the Hugging Face greedy ids) and for 50
// random prompts of 1-200 tokens (every third holding the model's own greedy continuation, so
// drafts get accepted) with up to 128 new tokens, all submitted at once so verify rounds
// interleave with other requests' prefill; requests with stop ids and max_new_tokens that land
// inside accepted runs, and rounds where no request has a draft. On the CPU in f32 and bf16
// storage, and on CUDA. Sampling and acceptance: test_speculative_sampling.cpp; proposals,
// acceptance rule, draft budget and round pricing as units: test_speculative_units.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "coordinator/speculative.h"
#include "fixture.h"
#include "hyserve/kernels/device.h"
#include "hyserve/worker/engine.h"
#include "spec_cases.h"
#include "spec_harness.h"

namespace hyserve::test {
namespace {

using coordinator::finish_reason;

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

// speculative.max_batch: 50 random requests at once, speculation only in steps of at most 6 rows
// (the verify steps' per-token states are planned for 6 rows): no verify or draft plan has more,
// rounds still run and draft once few requests are left, and the outputs equal plain decoding.
TEST(SpecGreedy, MaxBatchBoundsTheRowsOfEverySpeculativeStep) {
  for (const variant v : {variant::kNgram, variant::kDraftModel}) {
    service_config cfg = fixture_config("bamba-tiny", v);
    cfg.speculative.max_batch = 6;
    cfg.cache.spec_step_rows = 6;
    spec_service plain_svc(fixture_config("bamba-tiny", variant::kPlain));
    const service_config self = fixture_config("bamba-tiny", variant::kPlain);
    const std::vector<gen_request> reqs = random_requests(plain_svc.config().vocab_size, 99, &self);
    spec_service spec_svc(cfg);
    const auto got = spec_svc.run(reqs);
    expect_same(plain_svc.run(reqs), got, "max_batch 6");
    EXPECT_GT(spec_svc.link().max_spec_rows, 0u) << "no speculative step";
    EXPECT_LE(spec_svc.link().max_spec_rows, 6u);
    EXPECT_GT(total(got, &generation::drafted), 0) << "no round drafted";
    std::printf("max_batch 6: %zu rows at most, drafted %lld, accepted %lld\n", spec_svc.link().max_spec_rows,
                static_cast<long long>(total(got, &generation::drafted)),
                static_cast<long long>(total(got, &generation::accepted)));
  }
}

}  // namespace
}  // namespace hyserve::test
