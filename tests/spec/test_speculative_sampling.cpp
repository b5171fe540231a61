// Speculative decoding with sampling and on predictable models: at temperature 1.0 the sampled
// distribution is preserved (chi-square, alpha = 0.001) with drafts both accepted and rejected;
// batched rows sample as they do alone at a large vocabulary; a synthetic model with scaled-down
// residual branches gets its drafts accepted while the output still equals plain decoding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "spec_cases.h"
#include "spec_harness.h"

namespace hyserve::test {
namespace {

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

}  // namespace
}  // namespace hyserve::test
