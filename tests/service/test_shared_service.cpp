// End-to-end tests against one running service per suite: DP=1×TP=2 (most cases) and
// DP=2×TP=1 (the fixture over both groups). The real binaries run under real mpirun and are
// driven over HTTP.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "service_test_support.h"

namespace hyserve::service_test {
namespace {

// ---------------------------------------------------------------------------------------------
// DP=1 × TP=2, shared by the cases below.

constexpr const char* kTp2Config = R"(model: {path: @MODEL@}
parallel: {tp: 2, dp: 1}
cache: {page_size: 16, max_requests: 16, max_context: 512}
server: {host: 127.0.0.1, port: @PORT@, max_body_bytes: 4096}
)";

class Tp2Service : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    service_ = std::make_unique<service_process>("tp2", kTp2Config, 2);
    service_->launch();
  }
  static void TearDownTestSuite() { service_.reset(); }
  void SetUp() override {
    ASSERT_TRUE(service_ && service_->port() != 0) << "the tp=2 service did not start: " << service_->report();
  }
  void TearDown() override {
    if (HasFailure()) std::printf("---- tp=2 service log tail ----\n%s\n", service_->log_tail(3000).c_str());
  }
  static uint16_t port() { return service_->port(); }

  static inline std::unique_ptr<service_process> service_;
};

TEST_F(Tp2Service, HealthModelsServerInfoAndMetrics) {
  const http_reply health = http_get(port(), "/health");
  EXPECT_EQ(health.status, 200u) << health.describe();
  EXPECT_EQ(health.json().at("status").as_string(), "ok");

  const http_reply models = http_get(port(), "/v1/models");
  ASSERT_EQ(models.status, 200u) << models.describe();
  EXPECT_EQ(models.json().at("data").as_array().at(0).at("max_model_len").to_number<int64_t>(), kMaxContext);

  const http_reply info = http_get(port(), "/server_info");
  ASSERT_EQ(info.status, 200u) << info.describe();
  EXPECT_EQ(info.json().at("model_info").at("tp").to_number<int64_t>(), 2);
  EXPECT_EQ(info.json().at("model_info").at("dp").to_number<int64_t>(), 1);
  EXPECT_EQ(info.json().at("model_info").at("vocab_size").to_number<int64_t>(), kVocab);

  // One request so that the request-scoped series have samples.
  ASSERT_EQ(generate(port(), {1, 2, 3}, greedy(2, false)).status, 200u);
  const http_reply m = http_get(port(), "/metrics");
  ASSERT_EQ(m.status, 200u) << m.describe();
  EXPECT_NE(m.header("content-type").find("text/plain"), std::string::npos) << m.header("content-type");
  for (const char* name :
       {"hyserve_requests_total", "hyserve_prompt_tokens_total", "hyserve_generation_tokens_total",
        "hyserve_cancelled_requests_total", "hyserve_time_to_first_token_seconds",
        "hyserve_inter_token_latency_seconds", "hyserve_request_latency_seconds", "hyserve_queue_depth",
        "hyserve_running_requests", "hyserve_free_kv_pages", "hyserve_free_mamba_slots", "hyserve_step_seconds"}) {
    EXPECT_NE(m.body.find(name), std::string::npos) << "metric " << name << " missing from /metrics:\n" << m.body;
  }
  // Idle: every slot free, nothing running.
  EXPECT_TRUE(eventually(
      [&] {
        const std::string t = metrics_text(port());
        return metric_value(t, "hyserve_free_mamba_slots") == 16.0 && metric_value(t, "hyserve_running_requests") == 0.0;
      },
      10s))
      << metrics_text(port());
}

// One keep-alive connection carries several exchanges, errors included.
TEST_F(Tp2Service, KeepAliveConnectionServesSeveralRequests) {
  http_connection c(port());
  ASSERT_TRUE(c.connected()) << c.error();
  const auto& prompts = reference();
  for (int round = 0; round < 2; ++round) {
    for (size_t p = 0; p < prompts.size(); ++p) {
      const generation g = parse_generation(c.request("POST", "/generate", generate_body(prompts[p].input_ids)));
      EXPECT_EQ(g.ids, prompts[p].greedy_ids) << "round " << round << " prompt " << p << ": " << g;
    }
    const http_reply bad = c.request("POST", "/generate", R"({"input_ids": [1, 99999]})");
    EXPECT_EQ(bad.status, 400u) << bad.describe();
    EXPECT_EQ(c.request("GET", "/health").status, 200u);
  }
}

TEST_F(Tp2Service, ReproducesFixtureGreedy) { expect_fixture_greedy(port(), "dp=1 tp=2"); }

// 32 requests of different lengths at once return exactly what each returns alone.
TEST_F(Tp2Service, ConcurrentRequestsMatchOneAtATime) {
  struct spec {
    std::vector<int32_t> ids;
    gen_options opts;
  };
  std::vector<spec> specs;
  uint32_t state = 12345;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return state >> 8;
  };
  for (int i = 0; i < 32; ++i) {
    spec s;
    const int len = 1 + (i * 7) % 61;  // 1..61 tokens
    for (int k = 0; k < len; ++k) s.ids.push_back(static_cast<int32_t>(3 + next() % (kVocab - 3)));
    s.opts.max_new_tokens = 1 + (i * 5) % 40;  // 1..40
    s.opts.ignore_eos = i % 2 == 0;           // odd ones may stop at EOS
    specs.push_back(std::move(s));
  }
  std::vector<generation> alone(specs.size()), together(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) alone[i] = generate(port(), specs[i].ids, specs[i].opts);
  run_concurrently(specs.size(), [&](size_t i) { together[i] = generate(port(), specs[i].ids, specs[i].opts); });
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_EQ(alone[i].status, 200u) << "request " << i << " alone: " << alone[i];
    EXPECT_FALSE(alone[i].ids.empty()) << "request " << i;
    EXPECT_LE(alone[i].ids.size(), static_cast<size_t>(specs[i].opts.max_new_tokens)) << "request " << i;
    if (specs[i].opts.ignore_eos) {
      EXPECT_EQ(alone[i].ids.size(), static_cast<size_t>(specs[i].opts.max_new_tokens)) << "request " << i;
      EXPECT_EQ(alone[i].finish, "length") << "request " << i;
    }
    EXPECT_EQ(together[i], alone[i]) << "request " << i << " (prompt " << specs[i].ids.size()
                                     << " tokens, max_new_tokens " << specs[i].opts.max_new_tokens << ")";
  }
}

// /v1/completions with a token-id prompt and SSE streaming of both APIs agree with /generate.
TEST_F(Tp2Service, CompletionsAndStreamingAgreeWithGenerate) {
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& p : reference()) prompts.push_back(p.input_ids);
  prompts.push_back({7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24});  // crosses a page
  for (size_t p = 0; p < prompts.size(); ++p) {
    const std::vector<int32_t>& ids = prompts[p];
    const int32_t n = p == 3 ? 40 : 24;
    const generation want = generate(port(), ids, greedy(n, true));
    ASSERT_EQ(want.status, 200u) << want;
    ASSERT_EQ(want.ids.size(), static_cast<size_t>(n));
    if (p < reference().size()) {
      EXPECT_EQ(want.ids, reference()[p].greedy_ids);
    }

    // /v1/completions, prompt as a token-id array and as a one-element array of arrays.
    for (const bool nested : {false, true}) {
      boost::json::object body;
      if (nested) {
        boost::json::array outer;
        outer.emplace_back(to_json_ids(ids));
        body["prompt"] = std::move(outer);
      } else {
        body["prompt"] = to_json_ids(ids);
      }
      body["max_tokens"] = n;
      body["temperature"] = 0;
      body["ignore_eos"] = true;
      const http_reply r = http_post(port(), "/v1/completions", boost::json::serialize(body));
      ASSERT_EQ(r.status, 200u) << r.describe();
      const boost::json::value v = r.json();
      const auto& choice = v.at("choices").as_array().at(0);
      EXPECT_EQ(ids_of(choice.at("token_ids")), want.ids) << "prompt " << p << (nested ? " (nested)" : "");
      EXPECT_EQ(choice.at("finish_reason").as_string(), "length");
      EXPECT_EQ(v.at("usage").at("completion_tokens").to_number<int64_t>(), n);
      EXPECT_EQ(v.at("usage").at("prompt_tokens").to_number<int64_t>(), static_cast<int64_t>(ids.size()));
      EXPECT_EQ(v.at("object").as_string(), "text_completion");
    }

    // /generate streamed.
    const streamed sg = stream_tokens(port(), "/generate", generate_body(ids, streaming(n)));
    EXPECT_EQ(sg.status, 200u) << sg.error;
    EXPECT_TRUE(sg.saw_done) << sg.error;
    EXPECT_TRUE(sg.error.empty()) << sg.error;
    EXPECT_EQ(sg.ids, want.ids) << "prompt " << p << " (/generate stream, " << sg.events << " events)";
    EXPECT_EQ(sg.finish, "length");
    EXPECT_GE(sg.events, 2) << "tokens should arrive in more than one event";

    // /v1/completions streamed.
    boost::json::object body;
    body["prompt"] = to_json_ids(ids);
    body["max_tokens"] = n;
    body["temperature"] = 0.0;
    body["ignore_eos"] = true;
    body["stream"] = true;
    const streamed sc = stream_tokens(port(), "/v1/completions", boost::json::serialize(body));
    EXPECT_EQ(sc.status, 200u) << sc.error;
    EXPECT_TRUE(sc.saw_done) << sc.error;
    EXPECT_TRUE(sc.error.empty()) << sc.error;
    EXPECT_EQ(sc.ids, want.ids) << "prompt " << p << " (/v1/completions stream)";
    EXPECT_EQ(sc.finish, "length");
  }

  // Stop conditions agree too: fixture prompt 0 emits EOS (id 2) as its 12th token.
  const auto& p0 = reference()[0];
  const generation eos = generate(port(), p0.input_ids, greedy(24, false));
  ASSERT_EQ(eos.status, 200u) << eos;
  const auto eos_at = std::find(p0.greedy_ids.begin(), p0.greedy_ids.end(), kEosId);
  ASSERT_NE(eos_at, p0.greedy_ids.end());
  EXPECT_EQ(eos.ids, std::vector<int32_t>(p0.greedy_ids.begin(), eos_at + 1));
  EXPECT_EQ(eos.finish, "stop");
  const streamed eos_stream =
      stream_tokens(port(), "/generate", generate_body(p0.input_ids, streaming(24, false)));
  EXPECT_EQ(eos_stream.ids, eos.ids);
  EXPECT_EQ(eos_stream.finish, "stop");
  const int32_t stop_id = p0.greedy_ids[4];
  const generation stopped =
      generate(port(), p0.input_ids, greedy_stop(24, {stop_id}));
  EXPECT_EQ(stopped.ids, std::vector<int32_t>(p0.greedy_ids.begin(), p0.greedy_ids.begin() + 5));
  EXPECT_EQ(stopped.finish, "stop");
}

// Seeded sampling is reproducible: alone, repeated, and in a concurrent batch.
TEST_F(Tp2Service, SeededSamplingIsReproducible) {
  auto body = [](uint64_t seed) {
    boost::json::object sp;
    sp["max_new_tokens"] = 20;
    sp["temperature"] = 0.8;
    sp["top_p"] = 0.9;
    sp["top_k"] = 50;
    sp["seed"] = seed;
    sp["ignore_eos"] = true;
    boost::json::object b;
    b["input_ids"] = to_json_ids(reference()[1].input_ids);
    b["sampling_params"] = std::move(sp);
    return boost::json::serialize(b);
  };
  const generation first = parse_generation(http_post(port(), "/generate", body(1234)));
  ASSERT_EQ(first.status, 200u) << first;
  ASSERT_EQ(first.ids.size(), 20u);
  const generation again = parse_generation(http_post(port(), "/generate", body(1234)));
  EXPECT_EQ(again, first);
  std::vector<generation> together(8);
  run_concurrently(together.size(), [&](size_t i) {
    together[i] = parse_generation(http_post(port(), "/generate", body(i % 2 == 0 ? 1234 : 99 + i)));
  });
  bool any_differs = false;
  for (size_t i = 0; i < together.size(); ++i) {
    ASSERT_EQ(together[i].status, 200u) << together[i];
    if (i % 2 == 0) {
      EXPECT_EQ(together[i], first) << "seeded request " << i << " in a batch";
    } else {
      any_differs = any_differs || together[i].ids != first.ids;
    }
  }
  EXPECT_TRUE(any_differs) << "four other seeds all sampled the same 20 tokens";
}

struct bad_case {
  std::string label;
  std::string target;
  std::string body;
  std::string param;  // expected error.param ("" = null)
};

// Every bad input is a 400 with an error JSON naming the param; the server stays usable.
TEST_F(Tp2Service, BadInputMatrix) {
  std::string long_prompt, too_long_prompt;
  for (int i = 0; i < 500; ++i) long_prompt += (i ? "," : "") + std::to_string(3 + i % 500);
  for (int i = 0; i < 520; ++i) too_long_prompt += (i ? "," : "") + std::to_string(3 + i % 500);
  const std::vector<bad_case> cases = {
      {"malformed JSON", "/generate", R"({"input_ids": [1, 2, 3)", ""},
      {"malformed JSON (completions)", "/v1/completions", R"({"prompt": [1, 2,, 3]})", ""},
      {"body not an object", "/generate", R"([1, 2, 3])", ""},
      {"input_ids missing", "/generate", R"({"sampling_params": {"max_new_tokens": 4}})", "input_ids"},
      {"input_ids wrong type", "/generate", R"({"input_ids": "hello"})", "input_ids"},
      {"input_ids element wrong type", "/generate", R"({"input_ids": [1, "2", 3]})", "input_ids"},
      {"input_ids float element", "/generate", R"({"input_ids": [1, 2.5]})", "input_ids"},
      {"sampling_params wrong type", "/generate", R"({"input_ids": [1, 2], "sampling_params": 7})", "sampling_params"},
      {"max_new_tokens wrong type", "/generate", R"({"input_ids": [1], "sampling_params": {"max_new_tokens": "ten"}})",
       "sampling_params.max_new_tokens"},
      {"temperature wrong type", "/generate", R"({"input_ids": [1], "sampling_params": {"temperature": "hot"}})",
       "sampling_params.temperature"},
      {"ignore_eos wrong type", "/generate", R"({"input_ids": [1], "sampling_params": {"ignore_eos": 1}})",
       "sampling_params.ignore_eos"},
      {"stream wrong type", "/generate", R"({"input_ids": [1], "stream": "yes"})", "stream"},
      {"max_tokens wrong type", "/v1/completions", R"({"prompt": [1, 2], "max_tokens": [4]})", "max_tokens"},
      {"empty input_ids", "/generate", R"({"input_ids": []})", "input_ids"},
      {"empty prompt", "/v1/completions", R"({"prompt": []})", "prompt"},
      {"text prompt without tokenizer", "/v1/completions", R"({"prompt": "hello"})", "prompt"},
      {"token id == vocab", "/generate", R"({"input_ids": [1, 512]})", "input_ids"},
      {"token id >> vocab", "/generate", R"({"input_ids": [99999999999]})", "input_ids"},
      {"negative token id", "/generate", R"({"input_ids": [5, -1]})", "input_ids"},
      {"prompt token id >= vocab", "/v1/completions", R"({"prompt": [3, 600]})", "prompt"},
      {"stop_token_ids >= vocab", "/generate", R"({"input_ids": [1], "sampling_params": {"stop_token_ids": [5, 512]}})",
       "sampling_params.stop_token_ids"},
      {"stop_token_ids wrong type", "/generate", R"({"input_ids": [1], "sampling_params": {"stop_token_ids": 5}})",
       "sampling_params.stop_token_ids"},
      {"stop >= vocab (completions)", "/v1/completions", R"({"prompt": [3], "stop": [100000]})", "stop"},
      {"negative max_new_tokens", "/generate", R"({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}})",
       "sampling_params.max_new_tokens"},
      {"absurd max_new_tokens", "/generate",
       R"({"input_ids": [1], "sampling_params": {"max_new_tokens": 1000000000000}})", "sampling_params.max_new_tokens"},
      {"huge max_new_tokens", "/generate",
       R"({"input_ids": [1], "sampling_params": {"max_new_tokens": 1e300}})", "sampling_params.max_new_tokens"},
      {"negative max_tokens", "/v1/completions", R"({"prompt": [1], "max_tokens": -5})", "max_tokens"},
      {"prompt + output over max_context", "/generate",
       R"({"input_ids": [)" + long_prompt + R"(], "sampling_params": {"max_new_tokens": 100}})",
       "sampling_params.max_new_tokens"},
      {"prompt + output over max_context (completions)", "/v1/completions",
       R"({"prompt": [)" + long_prompt + R"(], "max_tokens": 13})", "max_tokens"},
      {"prompt alone over max_context", "/generate", R"({"input_ids": [)" + too_long_prompt + R"(]})", "input_ids"},
      {"temperature < 0", "/generate", R"({"input_ids": [1], "sampling_params": {"temperature": -0.5}})",
       "sampling_params.temperature"},
      {"temperature < 0 (completions)", "/v1/completions", R"({"prompt": [1], "temperature": -1})", "temperature"},
      {"top_p = 0", "/generate", R"({"input_ids": [1], "sampling_params": {"top_p": 0}})", "sampling_params.top_p"},
      {"top_p > 1", "/generate", R"({"input_ids": [1], "sampling_params": {"top_p": 1.5}})", "sampling_params.top_p"},
      {"top_p < 0", "/generate", R"({"input_ids": [1], "sampling_params": {"top_p": -0.2}})", "sampling_params.top_p"},
      {"top_p > 1 (completions)", "/v1/completions", R"({"prompt": [1], "top_p": 2})", "top_p"},
      {"top_k < -1", "/generate", R"({"input_ids": [1], "sampling_params": {"top_k": -7}})", "sampling_params.top_k"},
      {"n != 1", "/v1/completions", R"({"prompt": [1], "n": 3})", "n"},
  };
  for (const bad_case& c : cases) {
    SCOPED_TRACE(c.label);
    ASSERT_LE(c.body.size(), 4096u) << "the case must fit the body limit";
    const http_reply r = http_post(port(), c.target, c.body, 30s);
    EXPECT_EQ(r.status, 400u) << c.label << ": " << r.describe();
    EXPECT_NE(r.header("content-type").find("application/json"), std::string::npos) << c.label;
    const auto err = error_object(r);
    ASSERT_TRUE(err.has_value()) << c.label << ": no error object: " << r.body;
    EXPECT_TRUE(err->contains("message") && err->at("message").is_string() && !err->at("message").as_string().empty())
        << c.label << ": " << r.body;
    EXPECT_TRUE(err->contains("type") && err->at("type").is_string()) << c.label << ": " << r.body;
    EXPECT_TRUE(err->contains("code") && err->at("code").to_number<int64_t>() == 400) << c.label << ": " << r.body;
    ASSERT_TRUE(err->contains("param")) << c.label << ": " << r.body;
    if (c.param.empty()) {
      EXPECT_TRUE(err->at("param").is_null()) << c.label << ": " << r.body;
    } else {
      ASSERT_TRUE(err->at("param").is_string()) << c.label << ": " << r.body;
      EXPECT_EQ(std::string(err->at("param").as_string()), c.param) << c.label << ": " << r.body;
    }
  }

  // Body over server.max_body_bytes (4096): 413.
  {
    std::string huge = R"({"input_ids": [)";
    for (int i = 0; i < 2000; ++i) huge += (i ? "," : "") + std::to_string(100 + i % 300);
    huge += "]}";
    ASSERT_GT(huge.size(), 4096u);
    const http_reply r = http_post(port(), "/generate", huge, 30s);
    EXPECT_EQ(r.status, 413u) << r.describe();
    const auto err = error_object(r);
    EXPECT_TRUE(err.has_value()) << r.body;
  }

  // Routes: unknown path 404, wrong method 405 with Allow.
  {
    const http_reply r = http_get(port(), "/no/such/route");
    EXPECT_EQ(r.status, 404u) << r.describe();
    EXPECT_TRUE(error_object(r).has_value()) << r.body;
    const http_reply r2 = http_post(port(), "/v1/embeddings", R"({"input": "x"})");
    EXPECT_EQ(r2.status, 404u) << r2.describe();
    // Chat exists, but this model has no tokenizer.
    const http_reply chat = http_post(port(), "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}]})");
    EXPECT_EQ(chat.status, 400u) << chat.describe();
    EXPECT_NE(chat.body.find("this model has no tokenizer"), std::string::npos) << chat.body;
    const http_reply g = http_get(port(), "/generate");
    EXPECT_EQ(g.status, 405u) << g.describe();
    EXPECT_NE(g.header("allow").find("POST"), std::string::npos) << g.header("allow");
    const http_reply h = http_post(port(), "/health", "{}");
    EXPECT_EQ(h.status, 405u) << h.describe();
    const http_reply d = http_call(port(), "DELETE", "/v1/completions");
    EXPECT_EQ(d.status, 405u) << d.describe();
  }

  // Garbage on the wire gets a 400, not a crash.
  {
    http_connection c(port());
    const http_reply r = c.raw_exchange("THIS IS NOT HTTP\r\n\r\n", 10s);
    EXPECT_TRUE(r.status == 400u || r.status == 0u) << r.describe();
  }

  // Still healthy, and a valid request afterwards is answered correctly.
  EXPECT_EQ(http_get(port(), "/health").status, 200u);
  const auto& p1 = reference()[1];
  const generation ok = generate(port(), p1.input_ids, greedy(24, true));
  EXPECT_EQ(ok.status, 200u) << ok;
  EXPECT_EQ(ok.ids, p1.greedy_ids);
  // Prompt + output exactly at the limit is accepted.
  std::vector<int32_t> at_limit(kMaxContext - 4, 7);
  const generation edge = generate(port(), at_limit, greedy(4, true));
  EXPECT_EQ(edge.status, 200u) << edge;
  EXPECT_EQ(edge.ids.size(), 4u);
}

// Sampling values are checked in the type the worker uses (float): a temperature of 1e300 (inf
// as a float) or a top_p of 1e-50 (0 as a float) is a 400 naming the field and the limit, and
// fails nothing else: six valid requests sent beside it all complete.
TEST_F(Tp2Service, OutOfFloatRangeSamplingValueFailsOnlyItsRequest) {
  const auto& prompts = reference();
  std::vector<http_reply> replies(7);
  run_concurrently(replies.size(), [&](size_t i) {
    if (i == 3) {
      replies[i] = http_post(port(), "/generate",
                             R"({"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 24, "temperature": 1e300}})");
    } else {
      replies[i] = http_post(port(), "/generate", generate_body(prompts[i % 3].input_ids, greedy(24, true)));
    }
  });
  int ok = 0, bad = 0;
  for (size_t i = 0; i < replies.size(); ++i) {
    if (i == 3) {
      EXPECT_EQ(replies[i].status, 400u) << replies[i].describe();
      const auto err = error_object(replies[i]);
      ASSERT_TRUE(err.has_value()) << replies[i].body;
      EXPECT_EQ(err->at("param").as_string(), "sampling_params.temperature");
      EXPECT_NE(std::string(err->at("message").as_string()).find("3.40282347e+38"), std::string::npos) << replies[i].body;
      bad += replies[i].status == 400u;
    } else {
      const generation g = parse_generation(replies[i]);
      EXPECT_EQ(g.status, 200u) << g;
      EXPECT_EQ(g.ids, prompts[i % 3].greedy_ids) << "request " << i;
      ok += g.status == 200u;
    }
  }
  EXPECT_EQ(ok, 6);
  EXPECT_EQ(bad, 1);
  for (const auto& [target, body, param] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"/generate", R"({"input_ids": [5], "sampling_params": {"top_p": 1e-50}})", "sampling_params.top_p"},
           {"/generate", R"({"input_ids": [5], "sampling_params": {"temperature": 1e-40}})", "sampling_params.temperature"},
           {"/v1/completions", R"({"prompt": [5], "temperature": 1e300})", "temperature"},
           {"/v1/completions", R"({"prompt": [5], "top_p": 1e-45})", "top_p"}}) {
    const http_reply r = http_post(port(), target, body);
    EXPECT_EQ(r.status, 400u) << body << ": " << r.describe();
    const auto err = error_object(r);
    ASSERT_TRUE(err.has_value()) << r.body;
    EXPECT_EQ(err->at("param").as_string(), param) << r.body;
    EXPECT_NE(std::string(err->at("message").as_string()).find("float range"), std::string::npos) << r.body;
  }
  EXPECT_EQ(http_get(port(), "/health").status, 200u);
}

// /generate is this server's API: a field it does not know is a 400 naming it (a typo such as
// max_new_token must not fall back to the default length).
TEST_F(Tp2Service, GenerateRejectsUnknownFields) {
  const http_reply typo =
      http_post(port(), "/generate", R"({"input_ids": [5, 6], "sampling_params": {"max_new_token": 3}})");
  EXPECT_EQ(typo.status, 400u) << typo.describe();
  EXPECT_EQ(error_object(typo)->at("param").as_string(), "sampling_params.max_new_token") << typo.body;
  EXPECT_NE(typo.body.find("known: max_new_tokens"), std::string::npos) << typo.body;
  const http_reply top = http_post(port(), "/generate", R"({"input_ids": [5, 6], "streem": true, "x": 1})");
  EXPECT_EQ(top.status, 400u) << top.describe();
  EXPECT_EQ(error_object(top)->at("param").as_string(), "streem") << top.body;
  EXPECT_NE(top.body.find("unknown fields streem, x"), std::string::npos) << top.body;
}

// Numbers in JSON answers are plain decimals (never 7.4859148E1), and an HTTP/1.0 client gets a
// close-delimited stream (no chunked encoding, which HTTP/1.0 does not have).
TEST_F(Tp2Service, PlainDecimalNumbersAndHttp10Streams) {
  const std::regex exponent(R"([0-9][eE][-+]?[0-9])");
  for (int i = 0; i < 5; ++i) {
    const http_reply r = http_post(port(), "/generate", generate_body(reference()[0].input_ids, greedy(4, true)));
    ASSERT_EQ(r.status, 200u) << r.describe();
    EXPECT_FALSE(std::regex_search(r.body, exponent)) << r.body;
    EXPECT_GT(r.json().at("meta_info").at("latency_ms").to_number<double>(), 0.0) << r.body;
  }
  const std::string body = generate_body(reference()[1].input_ids, streaming(8));
  http_connection c(port());
  const http_reply r = c.raw_exchange("POST /generate HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\n"
                                      "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body,
                                      30s);
  ASSERT_EQ(r.status, 200u) << r.describe();
  EXPECT_EQ(r.header("transfer-encoding"), "") << "chunked encoding sent to an HTTP/1.0 client";
  EXPECT_EQ(r.header("content-type"), "text/event-stream");
  EXPECT_NE(r.body.find("data: [DONE]\n\n"), std::string::npos) << r.body;
  std::vector<int32_t> ids;
  for (size_t pos = r.body.find("data: {"); pos != std::string::npos; pos = r.body.find("data: {", pos + 1)) {
    const size_t end = r.body.find("\n\n", pos);
    const boost::json::value v = boost::json::parse(r.body.substr(pos + 6, end - pos - 6));
    for (int32_t id : ids_of(v.at("new_ids"))) ids.push_back(id);
  }
  EXPECT_EQ(ids, std::vector<int32_t>(reference()[1].greedy_ids.begin(), reference()[1].greedy_ids.begin() + 8));
}

// Fuzzing the HTTP surface (seeded, bounded in count and time): random JSON, mutated valid bodies
// and random headers on every route. No answer is a 500 or a dropped connection, the server stays
// healthy, every slot comes back, and a fixed greedy request gives the same output afterwards.
TEST_F(Tp2Service, FuzzedBodiesAndHeadersLeaveTheServerHealthy) {
  constexpr uint32_t kSeed = 20261204;
  constexpr int kRequests = 2000;
  const auto time_limit = 60s;
  std::mt19937 rng(kSeed);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  const std::vector<std::string> atoms = {"0", "-1", "1", "2", "1e300", "-1e300", "1e-50", "1e999", "0.5", "3.5",
                                          "9223372036854775808", "18446744073709551616", "true", "false", "null",
                                          "\"\"", "\"x\"", "\"\\ud800\"", "\"<|im_end|>\"", "[]", "{}", "[5,6,7]",
                                          "[-1]", "[512]"};
  const std::vector<std::string> keys = {"input_ids", "text", "prompt", "messages", "sampling_params",
                                         "max_new_tokens", "max_tokens", "temperature", "top_p", "top_k", "seed",
                                         "stop", "stop_token_ids", "ignore_eos", "stream", "n", "sparse", "echo",
                                         "logprobs", "best_of", "suffix", "logit_bias", "tools", "zzz"};
  std::function<std::string(int)> random_json = [&](int depth) -> std::string {
    const size_t kind = depth > 3 ? 0 : pick(4);
    if (kind == 0) return atoms[pick(atoms.size())];
    if (kind == 1) {
      std::string a = "[";
      for (size_t i = 0, n = pick(5); i < n; ++i) a += (i ? "," : "") + random_json(depth + 1);
      return a + "]";
    }
    std::string o = "{";
    for (size_t i = 0, n = 1 + pick(5); i < n; ++i)
      o += (i ? ",\"" : "\"") + keys[pick(keys.size())] + "\":" + random_json(depth + 1);
    return o + "}";
  };
  const std::vector<std::string> valid = {
      generate_body({5, 6, 7}, greedy(4, true)), generate_body({9, 10}, streaming(3)),
      R"({"prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0})",
      R"({"prompt": [5, 6], "max_tokens": 3, "stream": true, "temperature": 0.7, "top_p": 0.9, "seed": 3})",
      R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})"};
  const std::vector<std::string> junk = {"1e309", "\xff", "\"", "{", "]", "\\u0000", ",", "null", "-", "99999999999"};
  auto mutate = [&](std::string b) {
    for (size_t k = 0, n = 1 + pick(4); k < n && !b.empty(); ++k) {
      const size_t at = pick(b.size());
      switch (pick(4)) {
        case 0: b[at] = static_cast<char>(rng() & 0xff); break;
        case 1: b.erase(at, 1 + pick(8)); break;
        case 2: b.insert(at, junk[pick(junk.size())]); break;
        default: b.insert(at, b.substr(pick(b.size()), pick(16))); break;
      }
    }
    return b;
  };
  const std::vector<std::string> targets = {"/generate", "/v1/completions", "/v1/chat/completions", "/generate",
                                            "/v1/completions", "/health", "/nope"};
  const std::vector<std::string> content_types = {"application/json", "text/plain", "", "application/json; charset=utf-8",
                                                  "multipart/form-data; boundary=x"};
  const auto started = steady::now();
  int sent = 0;
  std::map<unsigned, int> statuses;
  for (; sent < kRequests && steady::now() - started < time_limit; ++sent) {
    const std::string target = targets[pick(targets.size())];
    const size_t how = pick(3);
    std::string body = how == 0 ? random_json(0) : how == 1 ? mutate(valid[pick(valid.size())]) : valid[pick(valid.size())];
    std::string head = std::string(pick(8) == 0 ? "GET " : "POST ") + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    if (const std::string& ct = content_types[pick(content_types.size())]; !ct.empty())
      head += "Content-Type: " + ct + "\r\n";
    for (size_t h = 0, n = pick(4); h < n; ++h) {
      std::string name = "X-F" + std::to_string(rng() % 1000), value;
      for (size_t i = 0, len = pick(40); i < len; ++i) value += static_cast<char>(0x20 + rng() % 95);
      head += name + ": " + value + "\r\n";
    }
    // Malformed header lines now and then (bad names, bad or conflicting lengths).
    const std::vector<std::string> bad_lines = {"X\x01" "Bad: 1\r\n", "Bad Name: 1\r\n", "NoColon\r\n",
                                                "Content-Length: abc\r\n", "Content-Length: 1\r\n",
                                                "X-Long: " + std::string(2000, 'a') + "\r\n", ": empty\r\n"};
    if (pick(12) == 0) head += bad_lines[pick(bad_lines.size())];
    // Never a body shorter than announced (that waits for the read timeout); a Content-Length
    // shorter than the body now and then.
    const size_t length = pick(10) == 0 ? pick(body.size() + 1) : body.size();
    head += "Content-Length: " + std::to_string(length) + "\r\nConnection: close\r\n\r\n";
    http_connection c(port());
    const http_reply r = c.raw_exchange(head + body, 30s);
    ++statuses[r.status];
    ASSERT_NE(r.status, 0u) << "no answer to fuzz request " << sent << " (seed " << kSeed << "): " << r.error
                            << "\n" << head << body;
    ASSERT_LT(r.status, 500u) << "fuzz request " << sent << " (seed " << kSeed << "): " << r.describe() << "\n"
                              << head << body;
  }
  std::string summary;
  for (const auto& [status, n] : statuses) summary += " " + std::to_string(status) + ":" + std::to_string(n);
  std::printf("fuzz: %d requests in %.1f s (seed %u), statuses%s\n", sent,
              std::chrono::duration<double>(steady::now() - started).count(), kSeed, summary.c_str());
  EXPECT_GE(sent, 100);
  EXPECT_EQ(http_get(port(), "/health").status, 200u);
  const generation g = generate(port(), reference()[0].input_ids, greedy(24, true));
  EXPECT_EQ(g.ids, reference()[0].greedy_ids) << g;
  EXPECT_TRUE(eventually([&] { return metric_value(metrics_text(port()), "hyserve_free_mamba_slots") == 16.0; }, 10s))
      << metrics_text(port());
}

// A client that goes away mid-stream (FIN or RST), or while waiting for a plain answer, cancels
// its request and frees its slots.
TEST_F(Tp2Service, ClientDisconnectMidStreamFreesSlots) {
  const double cancelled_before =
      metric_value(metrics_text(port()), "hyserve_cancelled_requests_total").value_or(0.0);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    http_connection c(port());
    // Long enough that it cannot finish before the close: 480 tokens.
    const unsigned status =
        c.begin_stream("/generate", generate_body({11, 12, 13, 14}, streaming(480)));
    ASSERT_EQ(status, 200u) << c.error();
    const auto first = c.next_event(30s);
    ASSERT_TRUE(first.has_value()) << c.stream_error();
    ASSERT_NE(*first, "[DONE]");
    if (round == 0) {
      c.close();  // orderly FIN
    } else {
      c.reset();  // RST
    }
  }
  // A non-streaming request whose client leaves while it runs.
  {
    http_connection c(port());
    ASSERT_TRUE(c.send_only("POST", "/generate", generate_body({21, 22, 23}, greedy(480, true)))) << c.error();
    EXPECT_TRUE(eventually([&] { return metric_value(metrics_text(port()), "hyserve_running_requests") >= 1.0; }, 10s));
    c.close();
  }
  std::string last;
  const bool freed = eventually(
      [&] {
        last = metrics_text(port());
        return metric_value(last, "hyserve_cancelled_requests_total").value_or(0.0) >= cancelled_before + 3.0 &&
               metric_value(last, "hyserve_free_mamba_slots") == 16.0 &&
               metric_value(last, "hyserve_running_requests") == 0.0 && metric_value(last, "hyserve_queue_depth") == 0.0;
      },
      10s);
  EXPECT_TRUE(freed) << "after the disconnects: cancelled_total="
                     << metric_value(last, "hyserve_cancelled_requests_total").value_or(-1)
                     << " free_mamba_slots=" << metric_value(last, "hyserve_free_mamba_slots").value_or(-1)
                     << " running=" << metric_value(last, "hyserve_running_requests").value_or(-1) << "\n"
                     << last;
  EXPECT_GE(metric_value(last, "hyserve_cancelled_requests_total").value_or(0.0), 1.0);
  // Full KV pages back too, and the service still answers correctly.
  EXPECT_EQ(metric_value(last, "hyserve_free_kv_pages"), 512.0) << last;
  const auto& p2 = reference()[2];
  const generation g = generate(port(), p2.input_ids, greedy(24, true));
  EXPECT_EQ(g.ids, p2.greedy_ids) << g;
}

// ---------------------------------------------------------------------------------------------
// DP=2 × TP=1.

constexpr const char* kDp2Config = R"(model: {path: @MODEL@}
parallel: {tp: 1, dp: 2}
cache: {page_size: 16, max_requests: 8, max_context: 512}
server: {host: 127.0.0.1, port: @PORT@}
)";

class Dp2Service : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    service_ = std::make_unique<service_process>("dp2", kDp2Config, 2);
    service_->launch();
  }
  static void TearDownTestSuite() { service_.reset(); }
  void SetUp() override {
    ASSERT_TRUE(service_ && service_->port() != 0) << "the dp=2 service did not start: " << service_->report();
  }
  void TearDown() override {
    if (HasFailure()) std::printf("---- dp=2 service log tail ----\n%s\n", service_->log_tail(3000).c_str());
  }
  static inline std::unique_ptr<service_process> service_;
};

TEST_F(Dp2Service, ReproducesFixtureGreedy) {
  const http_reply info = http_get(service_->port(), "/server_info");
  ASSERT_EQ(info.status, 200u) << info.describe();
  EXPECT_EQ(info.json().at("model_info").at("dp").to_number<int64_t>(), 2);
  EXPECT_EQ(info.json().at("model_info").at("tp").to_number<int64_t>(), 1);
  expect_fixture_greedy(service_->port(), "dp=2 tp=1");
  // Both groups' slots are back (8 each).
  EXPECT_TRUE(eventually([&] { return metric_value(metrics_text(service_->port()), "hyserve_free_mamba_slots") == 16.0; },
                         10s))
      << metrics_text(service_->port());
}

}  // namespace
}  // namespace hyserve::service_test
