// TargetVerify and Commit on the plan runner, both fixture models: the target's token (and its
// log-probability) at every verify position equals what sequential decode steps give for the
// same path, for chain and tree drafts; after committing an accepted path (tree: with the KV of
// the path moved to its depths) the next decode step equals sequential decoding; a verify with
// zero drafts + commit equals a decode step; Draft steps roll back to the committed step.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "fixture.h"
#include "hyserve/common/config.h"
#include "hyserve/common/wire.h"
#include "hyserve/worker/model.h"
#include "hyserve/worker/runner.h"

namespace hyserve {
namespace {

constexpr float kLogprobTol = 2e-4f;

struct sample_out {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

class plan_driver {
 public:
  plan_driver(const std::string& fixture, bool with_draft) {
    std::string yaml = "model: {path: " + test::fixture_dir(fixture) +
                       "}\ncache: {page_size: 4, max_requests: 4, max_context: 128}\n";
    if (with_draft)
      yaml += "speculative: {algorithm: draft_model, num_draft_tokens: 3, draft_model: {synthetic: {num_layers: 2}}}\n";
    cfg_ = load_config_string(yaml);
    const model_config mc = resolve_model_config(cfg_);
    auto target = worker::make_model(cfg_, mc, worker::tp_placement{}, nullptr);
    r_ = std::make_unique<worker::runner>(std::move(target), worker::make_draft_model(cfg_, mc, worker::tp_placement{}, nullptr),
                                          cfg_.cache, nullptr);
  }

  // One request in slot 0 with pages 0..31 (positions 0..127).
  wire::plan_row row(int32_t prefix, std::vector<int32_t> tokens) {
    wire::plan_row r;
    r.request_id = 1;
    r.req_slot = 0;
    r.mamba_slot = 0;
    r.prefix_len = prefix;
    r.tokens = std::move(tokens);
    if (first_) {
      for (int32_t p = 0; p < 32; ++p) r.new_pages.push_back(p);
      r.reset_state = true;
      first_ = false;
    }
    return r;
  }

  sample_out run(wire::step_plan plan) {
    plan.step_id = ++step_;
    plan.want_logprobs = true;
    plan.commits = std::move(commits);
    plan.draft_commits = std::move(draft_commits);
    plan.kv_moves = std::move(kv_moves);
    commits.clear();
    draft_commits.clear();
    kv_moves.clear();
    const wire::step_result res = r_->execute(wire::decode_step_plan(wire::encode(plan)));
    EXPECT_TRUE(res.ok) << res.error;
    if (!res.ok || res.rows.empty()) return {};
    return {res.rows[0].tokens, res.rows[0].logprobs};
  }

  sample_out extend(int32_t prefix, std::vector<int32_t> tokens) {
    wire::step_plan p;
    p.mode = 0;
    p.rows.push_back(row(prefix, std::move(tokens)));
    return run(p);
  }
  sample_out decode(int32_t prefix, int32_t token) {
    wire::step_plan p;
    p.mode = 1;
    p.rows.push_back(row(prefix, {token}));
    return run(p);
  }

  std::vector<wire::commit_op> commits, draft_commits;
  std::vector<wire::kv_move_op> kv_moves;

 private:
  service_config cfg_;
  std::unique_ptr<worker::runner> r_;
  bool first_ = true;
  uint64_t step_ = 0;
};

// Sequential reference: the token and logprob after each token of `path` following the prompt.
sample_out sequential(const std::string& fixture, const std::vector<int32_t>& prompt, const std::vector<int32_t>& path) {
  plan_driver d(fixture, false);
  sample_out out;
  sample_out s = d.extend(0, prompt);
  auto n = static_cast<int32_t>(prompt.size());
  for (int32_t t : path) {
    s = d.decode(n++, t);
    out.tokens.push_back(s.tokens.at(0));
    out.logprobs.push_back(s.logprobs.at(0));
  }
  return out;
}

void expect_same_sample(const sample_out& got, size_t i, const sample_out& want, size_t j, const std::string& what) {
  ASSERT_LT(i, got.tokens.size()) << what;
  ASSERT_LT(j, want.tokens.size()) << what;
  EXPECT_EQ(got.tokens[i], want.tokens[j]) << what;
  EXPECT_NEAR(got.logprobs[i], want.logprobs[j], kLogprobTol) << what;
}

class VerifyCommit : public ::testing::TestWithParam<const char*> {};

const std::vector<int32_t> kPrompt = {301, 47, 78, 405, 85, 12, 9, 250, 33};

TEST_P(VerifyCommit, ChainVerifyEqualsSequentialDecodeAndCommitContinuesFromTheAcceptedStep) {
  const std::string fx = GetParam();
  const std::vector<int32_t> drafts = {17, 3, 99};  // verify row: last token 40 + drafts
  const auto ref = sequential(fx, kPrompt, {40, 17, 3, 99});
  plan_driver d(fx, false);
  d.extend(0, kPrompt);
  const auto P = static_cast<int32_t>(kPrompt.size());
  wire::step_plan v;
  v.mode = 4;
  v.draft_len = 4;
  v.rows.push_back(d.row(P, {40, 17, 3, 99}));
  const sample_out got = d.run(v);
  for (size_t k = 0; k < 4; ++k) expect_same_sample(got, k, ref, k, fx + " chain node " + std::to_string(k));
  // Accept 40, 17 (step 1): the next decode consumes 3 at position P + 2.
  d.commits.push_back({0, 0, 1});
  const sample_out next = d.decode(P + 2, 3);
  expect_same_sample(next, 0, ref, 2, fx + " after commit");
}

TEST_P(VerifyCommit, ZeroDraftVerifyPlusCommitEqualsDecode) {
  const std::string fx = GetParam();
  const auto ref = sequential(fx, kPrompt, {40, 41});
  plan_driver d(fx, false);
  d.extend(0, kPrompt);
  const auto P = static_cast<int32_t>(kPrompt.size());
  wire::step_plan v;
  v.mode = 4;
  v.draft_len = 1;
  v.rows.push_back(d.row(P, {40}));
  expect_same_sample(d.run(v), 0, ref, 0, fx + " zero-draft verify");
  d.commits.push_back({0, 0, 0});
  expect_same_sample(d.decode(P + 1, 41), 0, ref, 1, fx + " decode after zero-draft commit");
}

TEST_P(VerifyCommit, TreeVerifyEachNodeSeesItsPathAndCommitMovesTheKv) {
  const std::string fx = GetParam();
  // Nodes: 0 = 40 (root); 1 = 17 (child of 0); 2 = 5 (child of 0); 3 = 8 (child of 2); 4 = 6 (child of 1).
  const std::vector<int32_t> tokens = {40, 17, 5, 8, 6};
  const auto ref_a = sequential(fx, kPrompt, {40, 17, 6});
  const auto ref_b = sequential(fx, kPrompt, {40, 5, 8, 77});
  plan_driver d(fx, false);
  d.extend(0, kPrompt);
  const auto P = static_cast<int32_t>(kPrompt.size());
  wire::step_plan v;
  v.mode = 4;
  v.draft_len = 5;
  v.is_tree = true;
  wire::plan_row r = d.row(P, tokens);
  r.retrieve_next_token = {1, 4, 3, -1, -1};
  r.retrieve_next_sibling = {-1, 2, -1, -1, -1};
  v.rows.push_back(r);
  const sample_out got = d.run(v);
  expect_same_sample(got, 0, ref_a, 0, fx + " root");
  expect_same_sample(got, 1, ref_a, 1, fx + " node 1 (path 40 17)");
  expect_same_sample(got, 4, ref_a, 2, fx + " node 4 (path 40 17 6)");
  expect_same_sample(got, 2, ref_b, 1, fx + " node 2 (path 40 5)");
  expect_same_sample(got, 3, ref_b, 2, fx + " node 3 (path 40 5 8)");
  // Accept path 40 → node 2 (5) → node 3 (8): keep step 3, move KV of nodes 2, 3 to depths 1, 2.
  d.commits.push_back({0, 0, 3});
  d.kv_moves.push_back({0, P + 2, P + 1});
  d.kv_moves.push_back({0, P + 3, P + 2});
  expect_same_sample(d.decode(P + 3, 77), 0, ref_b, 3, fx + " after tree commit");
}

// Draft steps on the draft model: step j continues step j-1's state; committing step 1 and
// running Draft step 0 of the next round equals the draft model decoding the accepted tokens.
TEST_P(VerifyCommit, DraftStepsRollBackToTheCommittedStep) {
  const std::string fx = GetParam();
  plan_driver d(fx, true);
  d.extend(0, kPrompt);  // the draft model follows the prompt
  const auto P = static_cast<int32_t>(kPrompt.size());
  auto draft = [&](int32_t prefix, int32_t token, int32_t step) {
    wire::step_plan p;
    p.mode = 6;
    p.draft_len = 3;
    wire::plan_row r = d.row(prefix, {token});
    r.draft_step = step;
    p.rows.push_back(r);
    return d.run(p);
  };
  const sample_out a0 = draft(P, 40, 0);
  const sample_out a1 = draft(P + 1, 17, 1);
  draft(P + 2, 3, 2);
  // Keep step 1 (40, 17 consumed): the next round's first Draft step consumes 3 at P + 2 and
  // must equal Draft step 2 above only if it starts from step 1's state; compare with a fresh
  // chain instead: DraftExtend over 40 17 3 from the prompt.
  d.draft_commits.push_back({0, 0, 1});
  const sample_out b0 = draft(P + 2, 3, 0);
  plan_driver ref(fx, true);
  ref.extend(0, kPrompt);
  wire::step_plan de;
  de.mode = 5;  // DraftExtend over the accepted tokens from the committed state
  de.rows.push_back(ref.row(P, {40, 17, 3}));
  const sample_out want = ref.run(de);
  ASSERT_FALSE(b0.tokens.empty());
  EXPECT_EQ(b0.tokens[0], want.tokens.at(0));
  EXPECT_NEAR(b0.logprobs[0], want.logprobs.at(0), kLogprobTol);
  (void)a0;
  (void)a1;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, VerifyCommit, ::testing::Values("bamba-tiny", "qwen3next-tiny"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           std::string n = i.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace hyserve
