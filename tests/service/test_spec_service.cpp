// Speculative decoding through the real service (coordinator + worker binaries under mpirun):
// with n-gram and with draft-model drafts (chain and tree), TP=2 gives the same greedy outputs as TP=1 and as
// plain decoding; /generate reports spec_accept_rate and /metrics counts drafted and accepted
// tokens.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "service_test_support.h"

namespace hyserve::service_test {
namespace {

std::string spec_yaml(int tp, const std::string& spec) {
  return "model: {path: @MODEL@}\nparallel: {tp: " + std::to_string(tp) +
         ", dp: 1}\ncache: {page_size: 16, max_requests: 16, max_context: 512}\n"
         "server: {host: 127.0.0.1, port: @PORT@}\n" +
         spec;
}

struct prompt_case {
  std::vector<int32_t> ids;
  int32_t max_new = 0;
};

std::vector<prompt_case> prompts() {
  std::vector<prompt_case> out;
  for (const auto& p : reference()) out.push_back({p.input_ids, 32});
  std::mt19937 rng(5);
  for (int i = 0; i < 8; ++i) {
    prompt_case c;
    const int period = 2 + static_cast<int>(rng() % 6);
    std::vector<int32_t> pat;
    for (int j = 0; j < period; ++j) pat.push_back(static_cast<int32_t>(3 + rng() % 500));
    const int len = 1 + static_cast<int>(rng() % 120);
    for (int j = 0; j < len; ++j) c.ids.push_back(i % 2 ? pat[static_cast<size_t>(j % period)] : static_cast<int32_t>(3 + rng() % 500));
    c.max_new = 1 + static_cast<int32_t>(rng() % 64);
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<generation> run_all(uint16_t port, const std::vector<prompt_case>& cases) {
  std::vector<generation> out(cases.size());
  run_concurrently(cases.size(), [&](size_t i) { out[i] = generate(port, cases[i].ids, greedy(cases[i].max_new, true)); });
  return out;
}

std::vector<generation> serve_and_run(const std::string& name, const std::string& yaml, int workers,
                                      const std::vector<prompt_case>& cases, std::string* metrics = nullptr,
                                      double* accept_rate = nullptr) {
  service_process svc(name, yaml, workers);
  EXPECT_TRUE(svc.launch()) << svc.report();
  auto out = run_all(svc.port(), cases);
  if (accept_rate) {
    // Most of the vocabulary in the prompt: whatever the model generates, n-gram lookup finds it.
    std::vector<int32_t> wide;
    for (int32_t t = 3; t < 403; ++t) wide.push_back(t);
    const http_reply r = http_post(svc.port(), "/generate", generate_body(wide, greedy(16, true)));
    const auto v = r.json();
    *accept_rate = -1;
    if (v.is_object())
      if (const auto* m = v.as_object().if_contains("meta_info"); m && m->is_object())
        if (const auto* a = m->as_object().if_contains("spec_accept_rate")) *accept_rate = a->to_number<double>();
  }
  if (metrics) *metrics = metrics_text(svc.port());
  return out;
}

std::string spec_name(const ::testing::TestParamInfo<std::string>& p) {
  if (p.param.find("ngram") != std::string::npos) return "ngram";
  return p.param.find("max_tree_width") != std::string::npos ? "draft_model_tree" : "draft_model";
}

class SpecService : public ::testing::TestWithParam<std::string> {};

TEST_P(SpecService, Tp2EqualsTp1EqualsPlainDecoding) {
  const std::string spec = GetParam();
  const auto cases = prompts();
  const auto plain = serve_and_run("spec-plain", spec_yaml(1, ""), 1, cases);
  std::string metrics;
  double rate = -2;
  const auto tp1 = serve_and_run("spec-tp1", spec_yaml(1, spec), 1, cases);
  const auto tp2 = serve_and_run("spec-tp2", spec_yaml(2, spec), 2, cases, &metrics, &rate);
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    ASSERT_EQ(plain[i].status, 200u) << plain[i];
    EXPECT_EQ(tp1[i], plain[i]);
    EXPECT_EQ(tp2[i], tp1[i]);
  }
  const auto drafted = metric_value(metrics, "hyserve_spec_draft_tokens_total");
  const auto accepted = metric_value(metrics, "hyserve_spec_accepted_tokens_total");
  ASSERT_TRUE(drafted.has_value()) << metrics;
  EXPECT_GT(*drafted, 0.0);
  ASSERT_TRUE(accepted.has_value());
  EXPECT_LE(*accepted, *drafted);
  EXPECT_GE(rate, 0.0) << "meta_info.spec_accept_rate missing on a repetitive prompt";
  EXPECT_LE(rate, 1.0);
}

// cost_check: false — the test checks identity and the accounting of drafts, so rounds must not
// depend on measured step times (under a loaded machine the cost check may skip every round of
// the short requests, and then no draft is ever made).
INSTANTIATE_TEST_SUITE_P(
    Algorithms, SpecService,
    ::testing::Values(std::string("speculative: {algorithm: ngram, num_draft_tokens: 4, cost_check: false}\n"),
                      std::string("speculative: {algorithm: draft_model, num_draft_tokens: 3, cost_check: false, "
                                  "draft_model: {synthetic: {num_layers: 2}}}\n"),
                      std::string("speculative: {algorithm: draft_model, num_draft_tokens: 4, cost_check: false, "
                                  "draft_model: {synthetic: {num_layers: 2}, max_tree_width: 3}}\n")),
    spec_name);

}  // namespace
}  // namespace hyserve::service_test
