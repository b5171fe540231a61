// Each hybrid family served over HTTP from its config in configs/ (real mpirun, real HTTP
// client): the greedy continuations of the family's reference fixture come back token for token
// over /generate, one prompt at a time, all at once and streamed, and text prompts pass through the
// config's tokenizer. One family is started through
// launch/serve.sh, the others through mpirun directly; TP=2 runs the shipped config with its
// tensor-parallel degree raised.
#include <gtest/gtest.h>

#include <cstdio>
#include <ostream>
#include <string>

#include "service_test_support.h"

namespace hyserve::service_test {
namespace {

struct family_case {
  const char* config;   // under configs/
  const char* fixture;  // under tests/fixtures/: the model the config serves
  int tp;
  bool serve_sh;  // started through launch/serve.sh
};

// Names the case in gtest's and ctest's listings (instead of the struct's bytes).
void PrintTo(const family_case& c, std::ostream* os) {
  *os << "configs/" << c.config << " tp=" << c.tp << (c.serve_sh ? " via launch/serve.sh" : "");
}

std::string family_case_name(const ::testing::TestParamInfo<family_case>& info) {
  std::string n = info.param.fixture;
  for (char& c : n)
    if (c == '-') c = '_';
  return n + "_tp" + std::to_string(info.param.tp) + (info.param.serve_sh ? "_serve_sh" : "");
}

class FamilyConfigService : public ::testing::TestWithParam<family_case> {};

// The configs name the 512-token test tokenizer, whose pre-tokenizer is a Regex: a build without
// PCRE2 cannot load it (a start-up error naming the package). There the service runs the config
// on token ids: its tokenizer and chat section are left out, and so is the text prompt below.
constexpr bool kTextPrompts = HYSERVE_TOKENIZER_HAS_REGEX != 0;

std::string family_config(const family_case& c) {
  std::string yaml = shipped_config(c.config, c.tp);
  if (kTextPrompts) return yaml;
  const size_t tok = yaml.find(", tokenizer: ");
  const size_t chat = yaml.find("# /v1/chat/completions");
  if (tok == std::string::npos || chat == std::string::npos) {
    ADD_FAILURE() << "configs/" << c.config << " has no tokenizer or chat section to leave out";
    return yaml;
  }
  yaml.erase(chat);
  yaml.erase(tok, yaml.find('}', tok) - tok);
  return yaml;
}

TEST_P(FamilyConfigService, ReproducesFixtureGreedy) {
  const family_case c = GetParam();
  service_process svc(std::string(c.fixture) + "-tp" + std::to_string(c.tp), family_config(c), c.tp);
  if (c.serve_sh) svc.use_serve_script();
  ASSERT_TRUE(svc.launch()) << svc.report();
  const double ready_s = svc.seconds_since_start();

  // The service serves the config's model (its path resolved) with the config's parallelism.
  const http_reply info = http_get(svc.port(), "/server_info");
  ASSERT_EQ(info.status, 200u) << info.describe();
  const boost::json::value info_json = info.json();
  const auto& model = info_json.at("model_info").as_object();
  const std::string model_id(model.at("model_id").as_string());
  EXPECT_TRUE(model_id.ends_with("/tests/fixtures/" + std::string(c.fixture))) << model_id;
  EXPECT_EQ(model.at("tp").to_number<int64_t>(), c.tp);
  EXPECT_EQ(model.at("vocab_size").to_number<int64_t>(), kVocab);

  const auto prompts = test::load_reference_prompts(c.fixture);
  expect_fixture_greedy(svc.port(), c.config, prompts);
  // Streamed, the same tokens arrive.
  const streamed s = stream_tokens(svc.port(), "/generate", generate_body(prompts[2].input_ids, streaming(24, true)));
  EXPECT_TRUE(s.saw_done) << s.error;
  EXPECT_EQ(s.ids, prompts[2].greedy_ids) << s.error;
  // Text through the config's tokenizer.
  if (kTextPrompts) {
    const http_reply text = http_post(svc.port(), "/v1/completions", R"({"prompt": "hello world", "max_tokens": 4})");
    ASSERT_EQ(text.status, 200u) << text.describe();
    EXPECT_EQ(text.json().at("usage").at("completion_tokens").to_number<int64_t>(), 4) << text.body;
  } else {
    std::printf("%s: this build has no regex support (PCRE2): served without the tokenizer, no text prompt\n",
                c.config);
  }
  if (HasFailure()) std::printf("---- %s log tail ----\n%s\n", c.config, svc.log_tail(3000).c_str());
  std::printf("%s (tp=%d%s): serving after %.1f s; 3 prompts alone, 6 at once and one stream reproduce the fixture\n",
              c.config, c.tp, c.serve_sh ? ", launch/serve.sh" : "", ready_s);
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyConfigService,
                         ::testing::Values(family_case{"nemotronh-tiny.yaml", "nemotronh-tiny", 1, true},
                                           family_case{"granite4h-tiny.yaml", "granite4h-tiny", 1, false},
                                           family_case{"falconh1-tiny.yaml", "falconh1-tiny", 1, false},
                                           family_case{"nemotronh-tiny.yaml", "nemotronh-tiny", 2, false},
                                           family_case{"granite4h-tiny.yaml", "granite4h-tiny", 2, false},
                                           family_case{"falconh1-tiny.yaml", "falconh1-tiny", 2, false}),
                         family_case_name);

}  // namespace
}  // namespace hyserve::service_test
