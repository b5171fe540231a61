// The coordinator's speculation pieces as units (coordinator/speculative.h): n-gram proposals
// (chains and trees), the acceptance rule, the draft budget's back-off and cool-down, the
// group's acceptance prior and the pricing of a round against a plain step; and the
// speculative config's validation by field name.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "coordinator/speculative.h"
#include "hyserve/common/config.h"

namespace hyserve::test {
namespace {

namespace spec = coordinator::spec;

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
