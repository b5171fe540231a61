// The coordinator's HTTP layer end to end: the real server on an ephemeral port, a
// deterministic test frontend, and a Beast client.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "coordinator/http/server.h"
#include "coordinator/log.h"
#include "coordinator/metrics/service_metrics.h"
#include "coordinator_test_support.h"

namespace hyserve::coordinator::testing {
namespace {

namespace json = boost::json;

json::value parse(const std::string& text) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  EXPECT_FALSE(ec) << "not JSON: " << text;
  return v;
}

std::vector<int64_t> ids_of(const json::value& v) {
  std::vector<int64_t> out;
  for (const auto& e : v.as_array()) out.push_back(e.to_number<int64_t>());
  return out;
}

std::vector<int64_t> expected_tokens(int64_t last_prompt_id, int n) {
  std::vector<int64_t> out;
  for (int i = 0; i < n; ++i) out.push_back((last_prompt_id + 1 + i) % test_frontend::kVocab);
  return out;
}

// The value of one exact series in a Prometheus text body, or -1 when absent.
double metric_value(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1.0;
}

class server_test : public ::testing::Test {
 protected:
  void SetUp() override {
    set_log_level(log_level::kError);
    http::server_options opts;
    opts.host = "127.0.0.1";
    opts.port = 0;
    opts.threads = 2;
    opts.body_limit = 4096;
    opts.read_timeout = std::chrono::milliseconds(5000);
    opts.write_timeout = std::chrono::milliseconds(5000);
    opts.server_info["scheduler"] = json::object{{"max_queue", 4}};
    configure(opts);
    server_ = std::make_unique<http::server>(std::move(opts), frontend_, metrics_);
    server_->start();
    ASSERT_NE(server_->port(), 0);
  }

  void TearDown() override {
    if (server_) server_->stop(std::chrono::milliseconds(2000));
    server_.reset();
  }

  virtual void configure(http::server_options&) {}

  http_reply get(const std::string& target) { return http_client(server_->port()).request("GET", target); }
  http_reply post(const std::string& target, const std::string& body) {
    return http_client(server_->port()).request("POST", target, body);
  }

  test_frontend frontend_;  // first: outlives the server, whose late events it may still send
  metrics::service_metrics metrics_;
  std::unique_ptr<http::server> server_;
};

TEST_F(server_test, Health_OkWhenHealthy_503Otherwise) {
  http_reply r = get("/health");
  ASSERT_EQ(r.status, 200u) << r.error;
  EXPECT_EQ(parse(r.body).at("status").as_string(), "ok");
  frontend_.healthy_flag = false;
  r = get("/health");
  EXPECT_EQ(r.status, 503u);
}

TEST_F(server_test, Generate_NonStream_ReturnsTokensAndMetaInfo) {
  // /generate is this server's own API: an unknown field is a mistake, answered 400.
  http_reply bad = post("/generate",
                        R"({"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 8}, "unknown_field": 1})");
  EXPECT_EQ(bad.status, 400u) << bad.body;
  EXPECT_EQ(parse(bad.body).at("error").at("param").as_string(), "unknown_field") << bad.body;
  http_reply r = post("/generate", R"({"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 8}})");
  ASSERT_EQ(r.status, 200u) << r.error << r.body;
  EXPECT_EQ(r.header("content-type"), "application/json");
  json::value v = parse(r.body);
  EXPECT_EQ(ids_of(v.at("output_ids")), expected_tokens(7, 8));
  const auto& meta = v.at("meta_info").as_object();
  EXPECT_EQ(meta.at("prompt_tokens").to_number<int>(), 3);
  EXPECT_EQ(meta.at("completion_tokens").to_number<int>(), 8);
  EXPECT_EQ(meta.at("finish_reason").at("type").as_string(), "length");
  EXPECT_GE(meta.at("latency_ms").to_number<double>(), 0.0);
  EXPECT_GT(meta.at("id").to_number<int64_t>(), 0);
}

TEST_F(server_test, Generate_StopTokenFinishesWithStop) {
  http_reply r = post("/generate", R"({"input_ids": [5], "sampling_params": {"max_new_tokens": 50,
                                      "stop_token_ids": [10]}})");
  ASSERT_EQ(r.status, 200u) << r.body;
  json::value v = parse(r.body);
  EXPECT_EQ(ids_of(v.at("output_ids")), (std::vector<int64_t>{6, 7, 8, 9, 10}));
  EXPECT_EQ(v.at("meta_info").at("finish_reason").at("type").as_string(), "stop");
}

TEST_F(server_test, Generate_StreamAgreesWithNonStream) {
  const std::string request = R"({"input_ids": [40, 41], "sampling_params": {"max_new_tokens": 12}})";
  http_reply plain = post("/generate", request);
  ASSERT_EQ(plain.status, 200u);
  const auto expected = ids_of(parse(plain.body).at("output_ids"));
  ASSERT_EQ(expected, expected_tokens(41, 12));

  http_reply streamed = post("/generate", R"({"input_ids": [40, 41], "stream": true,
                                             "sampling_params": {"max_new_tokens": 12}})");
  ASSERT_EQ(streamed.status, 200u) << streamed.error;
  EXPECT_EQ(streamed.header("content-type"), "text/event-stream");
  EXPECT_EQ(streamed.header("transfer-encoding"), "chunked");
  const auto events = sse_events(streamed.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::vector<int64_t> joined;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json::value chunk = parse(events[i]);
    for (int64_t id : ids_of(chunk.at("new_ids"))) joined.push_back(id);
    // output_ids is everything so far
    EXPECT_EQ(ids_of(chunk.at("output_ids")), joined);
  }
  EXPECT_EQ(joined, expected);
  json::value last = parse(events[events.size() - 2]);
  EXPECT_EQ(last.at("meta_info").at("finish_reason").at("type").as_string(), "length");
  EXPECT_EQ(last.at("meta_info").at("completion_tokens").to_number<int>(), 12);
}

TEST_F(server_test, Generate_IncrementalStreamCarriesOnlyNewIds) {
  const std::string request = R"({"input_ids": [40, 41], "sampling_params": {"max_new_tokens": 12}})";
  const auto expected = ids_of(parse(post("/generate", request).body).at("output_ids"));
  http_reply streamed = post("/generate", R"({"input_ids": [40, 41], "stream": true,
                                             "stream_options": {"incremental": true},
                                             "sampling_params": {"max_new_tokens": 12}})");
  ASSERT_EQ(streamed.status, 200u) << streamed.error;
  const auto events = sse_events(streamed.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::vector<int64_t> joined;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json::value chunk = parse(events[i]);
    const auto fresh = ids_of(chunk.at("new_ids"));
    EXPECT_EQ(ids_of(chunk.at("output_ids")), fresh) << "chunk " << i << ": only this chunk's ids";
    joined.insert(joined.end(), fresh.begin(), fresh.end());
  }
  EXPECT_EQ(joined, expected);
  EXPECT_EQ(parse(events[events.size() - 2]).at("meta_info").at("completion_tokens").to_number<int>(), 12);

  http_reply bad = post("/generate", R"({"input_ids": [40], "stream": true, "stream_options": {"incremental": 1}})");
  EXPECT_EQ(bad.status, 400u);
  EXPECT_NE(bad.body.find("stream_options.incremental"), std::string::npos) << bad.body;
  http_reply unknown = post("/generate", R"({"input_ids": [40], "stream_options": {"include_usage": true}})");
  EXPECT_EQ(unknown.status, 400u);
  EXPECT_NE(unknown.body.find("stream_options.include_usage"), std::string::npos) << unknown.body;
}

TEST_F(server_test, Completions_AgreesWithGenerate) {
  http_reply gen = post("/generate", R"({"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 8}})");
  ASSERT_EQ(gen.status, 200u);
  http_reply r = post("/v1/completions", R"({"model": "whatever", "prompt": [5, 6, 7], "max_tokens": 8,
                                            "temperature": 0})");
  ASSERT_EQ(r.status, 200u) << r.body;
  json::value v = parse(r.body);
  EXPECT_EQ(v.at("object").as_string(), "text_completion");
  EXPECT_EQ(v.at("model").as_string(), "test-model");
  EXPECT_EQ(v.at("id").as_string().subview().substr(0, 5), "cmpl-");
  EXPECT_GT(v.at("created").to_number<int64_t>(), 0);
  const auto& choice = v.at("choices").at(0);
  EXPECT_EQ(choice.at("index").to_number<int>(), 0);
  EXPECT_EQ(choice.at("text").as_string(), "");
  EXPECT_EQ(ids_of(choice.at("token_ids")), ids_of(parse(gen.body).at("output_ids")));
  EXPECT_EQ(choice.at("finish_reason").as_string(), "length");
  EXPECT_EQ(v.at("usage").at("prompt_tokens").to_number<int>(), 3);
  EXPECT_EQ(v.at("usage").at("completion_tokens").to_number<int>(), 8);
  EXPECT_EQ(v.at("usage").at("total_tokens").to_number<int>(), 11);
}

TEST_F(server_test, Completions_DefaultsAndNestedPrompt) {
  // max_tokens defaults to 16; a prompt may be an array holding one token-id array.
  http_reply r = post("/v1/completions", R"({"prompt": [[3, 4]], "stop": null, "seed": 7})");
  ASSERT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(ids_of(parse(r.body).at("choices").at(0).at("token_ids")), expected_tokens(4, 16));
  // Stop ids through `stop` and through the stop_token_ids extension.
  r = post("/v1/completions", R"({"prompt": [3], "max_tokens": 20, "stop": [6]})");
  ASSERT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(ids_of(parse(r.body).at("choices").at(0).at("token_ids")), (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(parse(r.body).at("choices").at(0).at("finish_reason").as_string(), "stop");
  r = post("/v1/completions", R"({"prompt": [3], "max_tokens": 20, "stop_token_ids": [5]})");
  ASSERT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(ids_of(parse(r.body).at("choices").at(0).at("token_ids")), (std::vector<int64_t>{4, 5}));
}

TEST_F(server_test, Completions_StreamAgreesWithNonStream) {
  http_reply plain = post("/v1/completions", R"({"prompt": [100], "max_tokens": 10})");
  ASSERT_EQ(plain.status, 200u);
  http_reply streamed = post("/v1/completions", R"({"prompt": [100], "max_tokens": 10, "stream": true})");
  ASSERT_EQ(streamed.status, 200u);
  EXPECT_EQ(streamed.header("content-type"), "text/event-stream");
  const auto events = sse_events(streamed.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::vector<int64_t> joined;
  std::string finish;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json::value chunk = parse(events[i]);
    EXPECT_EQ(chunk.at("object").as_string(), "text_completion");
    const auto& choice = chunk.at("choices").at(0);
    for (int64_t id : ids_of(choice.at("token_ids"))) joined.push_back(id);
    if (!choice.at("finish_reason").is_null()) finish = std::string(choice.at("finish_reason").as_string());
  }
  EXPECT_EQ(joined, ids_of(parse(plain.body).at("choices").at(0).at("token_ids")));
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(parse(events[events.size() - 2]).at("usage").at("completion_tokens").to_number<int>(), 10);
}

// --- validation ---

struct bad_input {
  const char* name;
  const char* path;
  std::string body;
  const char* param;  // nullptr: the error's param is null
  std::vector<std::string> message_has;
};

std::string many_ids(int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ",1" : "1");
  return s + "]";
}

std::vector<bad_input> bad_inputs() {
  const std::string gen = "/generate";
  auto with_sampling = [](const std::string& sampling) {
    return R"({"input_ids": [1, 2, 3], "sampling_params": {)" + sampling + "}}";
  };
  return {
      {"MalformedJson", "/generate", R"({"input_ids": [1, 2)", nullptr, {"malformed JSON"}},
      {"BodyNotObject", "/generate", "[1, 2]", nullptr, {"object"}},
      {"EmptyBody", "/generate", "", nullptr, {}},
      {"TextPrompt", "/generate", R"({"text": "hello"})", "text", {"no tokenizer"}},
      {"MissingInputIds", "/generate", "{}", "input_ids", {}},
      {"InputIdsString", "/generate", R"({"input_ids": "1 2 3"})", "input_ids", {"array"}},
      {"InputIdsFloat", "/generate", R"({"input_ids": [1, 2.5]})", "input_ids", {"input_ids[1]"}},
      {"InputIdsNestedString", "/generate", R"({"input_ids": [1, "2"]})", "input_ids", {}},
      {"EmptyPrompt", "/generate", R"({"input_ids": []})", "input_ids", {"empty"}},
      {"NegativeTokenId", "/generate", R"({"input_ids": [3, -1]})", "input_ids", {"-1", "1000"}},
      {"TokenIdEqualsVocab", "/generate", R"({"input_ids": [1000]})", "input_ids", {"1000", "vocab"}},
      {"HugeTokenId", "/generate", R"({"input_ids": [99999999999999999999]})", "input_ids", {}},
      {"PromptOverContext", "/generate", R"({"input_ids": )" + many_ids(300) + "}", "input_ids", {"300", "256"}},
      {"MaxNewTokensString", "/generate", with_sampling(R"("max_new_tokens": "10")"),
       "sampling_params.max_new_tokens", {"integer"}},
      {"MaxNewTokensNegative", "/generate", with_sampling(R"("max_new_tokens": -1)"),
       "sampling_params.max_new_tokens", {}},
      {"MaxNewTokensAbsurd", "/generate", with_sampling(R"("max_new_tokens": 100000000)"),
       "sampling_params.max_new_tokens", {"256"}},
      {"PromptPlusMaxOverContext", "/generate",
       R"({"input_ids": )" + many_ids(10) + R"(, "sampling_params": {"max_new_tokens": 250}})",
       "sampling_params.max_new_tokens", {"10", "250", "256"}},
      {"TemperatureNegative", "/generate", with_sampling(R"("temperature": -0.5)"), "sampling_params.temperature", {}},
      {"TemperatureInfinite", "/generate", with_sampling(R"("temperature": 1e999)"), "sampling_params.temperature",
       {}},
      {"TemperatureString", "/generate", with_sampling(R"("temperature": "hot")"), "sampling_params.temperature", {}},
      {"TopPZero", "/generate", with_sampling(R"("top_p": 0)"), "sampling_params.top_p", {}},
      {"TopPOverOne", "/generate", with_sampling(R"("top_p": 1.5)"), "sampling_params.top_p", {}},
      {"TopKBelowMinusOne", "/generate", with_sampling(R"("top_k": -2)"), "sampling_params.top_k", {}},
      {"TopKFraction", "/generate", with_sampling(R"("top_k": 2.5)"), "sampling_params.top_k", {}},
      {"SeedString", "/generate", with_sampling(R"("seed": "x")"), "sampling_params.seed", {}},
      {"StopIdOutsideVocab", "/generate", with_sampling(R"("stop_token_ids": [5, 5000])"),
       "sampling_params.stop_token_ids", {"5000", "1000"}},
      {"StopIdsNotArray", "/generate", with_sampling(R"("stop_token_ids": 5)"), "sampling_params.stop_token_ids", {}},
      {"IgnoreEosNotBool", "/generate", with_sampling(R"("ignore_eos": 1)"), "sampling_params.ignore_eos", {}},
      {"SparseNotBool", "/generate", with_sampling(R"("sparse": "no")"), "sampling_params.sparse",
       {"sampling_params.sparse must be a boolean", "string"}},
      {"CompletionsSparseNotBool", "/v1/completions", R"({"prompt": [1], "sparse": 0})", "sparse",
       {"sparse must be a boolean"}},
      {"SamplingParamsNotObject", "/generate", R"({"input_ids": [1], "sampling_params": 5})", "sampling_params", {}},
      {"StreamNotBool", "/generate", R"({"input_ids": [1], "stream": "yes"})", "stream", {}},
      {"CompletionsMalformedJson", "/v1/completions", "{", nullptr, {}},
      {"CompletionsStringPrompt", "/v1/completions", R"({"prompt": "hello"})", "prompt", {"no tokenizer"}},
      {"CompletionsStringArrayPrompt", "/v1/completions", R"({"prompt": ["a", "b"]})", "prompt", {"no tokenizer"}},
      {"CompletionsMissingPrompt", "/v1/completions", R"({"max_tokens": 3})", "prompt", {}},
      {"CompletionsEmptyPrompt", "/v1/completions", R"({"prompt": []})", "prompt", {"empty"}},
      {"CompletionsEmptyNestedPrompt", "/v1/completions", R"({"prompt": [[]]})", "prompt", {"empty"}},
      {"CompletionsBatchedPrompt", "/v1/completions", R"({"prompt": [[1], [2]]})", "prompt", {"batched"}},
      {"CompletionsTokenOutsideVocab", "/v1/completions", R"({"prompt": [1, 1001]})", "prompt", {"1001", "1000"}},
      {"CompletionsMaxTokensString", "/v1/completions", R"({"prompt": [1], "max_tokens": "8"})", "max_tokens", {}},
      {"CompletionsOverContext", "/v1/completions", R"({"prompt": [1, 2], "max_tokens": 255})", "max_tokens",
       {"2", "255", "256"}},
      {"CompletionsTemperatureNegative", "/v1/completions", R"({"prompt": [1], "temperature": -1})", "temperature",
       {}},
      {"CompletionsTopPZero", "/v1/completions", R"({"prompt": [1], "top_p": 0.0})", "top_p", {}},
      {"CompletionsStopString", "/v1/completions", R"({"prompt": [1], "stop": "\n"})", "stop", {"no tokenizer"}},
      {"CompletionsStopIdOutsideVocab", "/v1/completions", R"({"prompt": [1], "stop": [1000]})", "stop", {"1000"}},
      {"CompletionsStopTokenIdsOutsideVocab", "/v1/completions", R"({"prompt": [1], "stop_token_ids": [-3]})",
       "stop_token_ids", {"-3"}},
      {"CompletionsNTwo", "/v1/completions", R"({"prompt": [1], "n": 2})", "n", {}},
  };
}

class bad_input_test : public server_test, public ::testing::WithParamInterface<bad_input> {};

TEST_P(bad_input_test, Returns400WithParam) {
  const bad_input& c = GetParam();
  http_reply r = post(c.path, c.body);
  ASSERT_EQ(r.status, 400u) << r.error << r.body;
  json::value v = parse(r.body);
  const auto& error = v.at("error").as_object();
  EXPECT_EQ(error.at("type").as_string(), "invalid_request_error");
  EXPECT_EQ(error.at("code").to_number<int>(), 400);
  if (c.param == nullptr) {
    EXPECT_TRUE(error.at("param").is_null()) << r.body;
  } else {
    ASSERT_TRUE(error.at("param").is_string()) << r.body;
    EXPECT_EQ(error.at("param").as_string(), c.param);
  }
  const std::string message(error.at("message").as_string());
  EXPECT_FALSE(message.empty());
  for (const auto& part : c.message_has) EXPECT_NE(message.find(part), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(Matrix, bad_input_test, ::testing::ValuesIn(bad_inputs()),
                         [](const ::testing::TestParamInfo<bad_input>& p) { return std::string(p.param.name); });

TEST_F(server_test, KeepAlive_SeveralRequestsAndBadOnesOnOneConnection) {
  http_client client(server_->port());
  http_reply r = client.request("GET", "/health");
  ASSERT_EQ(r.status, 200u);
  EXPECT_TRUE(r.keep_alive);
  r = client.request("POST", "/generate", R"({"input_ids": [1, 2")");
  ASSERT_EQ(r.status, 400u);
  EXPECT_TRUE(r.keep_alive);
  r = client.request("POST", "/generate", R"({"input_ids": [5000]})");
  ASSERT_EQ(r.status, 400u);
  r = client.request("GET", "/nope");
  ASSERT_EQ(r.status, 404u);
  r = client.request("POST", "/generate", R"({"input_ids": [1], "sampling_params": {"max_new_tokens": 3}})");
  ASSERT_EQ(r.status, 200u) << r.error;
  EXPECT_EQ(ids_of(parse(r.body).at("output_ids")), expected_tokens(1, 3));
  r = client.request("POST", "/v1/completions", R"({"prompt": [1], "max_tokens": 2, "stream": true})");
  ASSERT_EQ(r.status, 200u);
  EXPECT_EQ(sse_events(r.body).back(), "[DONE]");
  r = client.request("GET", "/v1/models");
  ASSERT_EQ(r.status, 200u);
  EXPECT_TRUE(r.keep_alive);
}

TEST_F(server_test, BodyOverLimit_413) {
  const std::string body = R"({"input_ids": )" + many_ids(3000) + "}";  // ~6 KB > 4096
  http_reply r = post("/generate", body);
  ASSERT_EQ(r.status, 413u) << r.error;
  json::value v = parse(r.body);
  EXPECT_EQ(v.at("error").at("code").to_number<int>(), 413);
  EXPECT_NE(std::string(v.at("error").at("message").as_string()).find("4096"), std::string::npos);
  // The server is fine afterwards.
  EXPECT_EQ(get("/health").status, 200u);
}

TEST_F(server_test, UnknownPath_404_WrongMethod_405WithAllow) {
  http_reply r = get("/v2/nothing");
  ASSERT_EQ(r.status, 404u);
  EXPECT_EQ(parse(r.body).at("error").at("code").to_number<int>(), 404);
  r = get("/generate");
  ASSERT_EQ(r.status, 405u);
  EXPECT_EQ(r.header("allow"), "POST");
  EXPECT_EQ(parse(r.body).at("error").at("code").to_number<int>(), 405);
  r = post("/health", "{}");
  ASSERT_EQ(r.status, 405u);
  EXPECT_EQ(r.header("allow"), "GET");
  // The query string is not part of the route.
  EXPECT_EQ(get("/health?verbose=1").status, 200u);
}

TEST_F(server_test, QueueFull_503WithRetryAfter_ShuttingDown_503) {
  frontend_.queue_full = true;
  http_reply r = post("/generate", R"({"input_ids": [1]})");
  ASSERT_EQ(r.status, 503u);
  EXPECT_EQ(r.header("retry-after"), "1");
  EXPECT_NE(parse(r.body).at("error").at("message").as_string().find("queue"), std::string::npos);
  frontend_.queue_full = false;
  frontend_.shutting_down = true;
  r = post("/v1/completions", R"({"prompt": [1]})");
  EXPECT_EQ(r.status, 503u);
}

TEST_F(server_test, WorkerError_500_OrSseErrorOnceStreaming) {
  frontend_.fail_after_tokens = 0;
  http_reply r = post("/generate", R"({"input_ids": [1]})");
  ASSERT_EQ(r.status, 500u);
  json::value v = parse(r.body);
  EXPECT_EQ(v.at("error").at("code").to_number<int>(), 500);
  EXPECT_NE(v.at("error").at("message").as_string().find("injected fault"), std::string::npos);

  frontend_.fail_after_tokens = 2;
  r = post("/generate", R"({"input_ids": [1], "stream": true})");
  ASSERT_EQ(r.status, 200u);
  const auto events = sse_events(r.body);
  // The two tokens (in one or two chunks: events that queue up while the stream catches up go
  // out together, the error's own tokens before it), the error, [DONE].
  ASSERT_GE(events.size(), 3u) << r.body;
  ASSERT_LE(events.size(), 4u) << r.body;
  size_t streamed = 0;
  for (size_t i = 0; i + 2 < events.size(); ++i) streamed += parse(events[i]).at("new_ids").as_array().size();
  EXPECT_EQ(streamed, 2u) << r.body;
  EXPECT_EQ(parse(events[events.size() - 2]).at("error").at("code").to_number<int>(), 500);
  EXPECT_EQ(events.back(), "[DONE]");

  // Other requests are not affected once the worker recovers.
  frontend_.fail_after_tokens = -1;
  EXPECT_EQ(post("/generate", R"({"input_ids": [1], "sampling_params": {"max_new_tokens": 2}})").status, 200u);
}

TEST_F(server_test, HandlerException_EndsOnlyItsSession) {
  http_client other(server_->port());
  ASSERT_EQ(other.request("GET", "/health").status, 200u);
  frontend_.throw_on_submit = true;
  http_reply r = post("/generate", R"({"input_ids": [1]})");
  EXPECT_EQ(r.status, 500u);
  EXPECT_FALSE(r.keep_alive);
  frontend_.throw_on_submit = false;
  EXPECT_EQ(other.request("POST", "/generate", R"({"input_ids": [1], "sampling_params": {"max_new_tokens": 1}})").status,
            200u);
}

TEST_F(server_test, ClientDisconnectMidStream_CancelsRequest) {
  frontend_.tick_us = 5000;
  http_client client(server_->port());
  client.send_only("POST", "/generate", R"({"input_ids": [1], "stream": true, "sampling_params": {"max_new_tokens": 200}})");
  const std::string so_far = client.read_stream_until("\n\n");
  const auto events = sse_events(so_far);
  ASSERT_FALSE(events.empty()) << so_far;
  const uint64_t id = parse(events[0]).at("meta_info").at("id").to_number<uint64_t>();
  const double cancelled_before = metrics_.cancelled_requests().value();
  client.close();
  EXPECT_TRUE(frontend_.wait_for_cancel(id, std::chrono::milliseconds(3000)));
  // The counter moves on the session's strand right after cancel(): poll briefly.
  for (int i = 0; i < 100 && metrics_.cancelled_requests().value() == cancelled_before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(metrics_.cancelled_requests().value(), cancelled_before + 1);
}

TEST_F(server_test, ClientDisconnectWhileWaiting_NonStream_CancelsRequest) {
  frontend_.tick_us = 5000;
  http_client client(server_->port());
  client.send_only("POST", "/v1/completions", R"({"prompt": [1], "max_tokens": 200})");
  ASSERT_TRUE(frontend_.wait_for_active(1, std::chrono::milliseconds(3000)));
  const uint64_t id = frontend_.last_id();
  client.close();
  EXPECT_TRUE(frontend_.wait_for_cancel(id, std::chrono::milliseconds(3000)));
}

TEST_F(server_test, Metrics_NamesPresentAndCountsMove) {
  http_reply before = get("/metrics");
  ASSERT_EQ(before.status, 200u);
  EXPECT_EQ(before.header("content-type"), "text/plain; version=0.0.4; charset=utf-8");
  for (const char* name :
       {"hyserve_requests_total", "hyserve_prompt_tokens_total", "hyserve_generation_tokens_total",
        "hyserve_queue_depth", "hyserve_running_requests", "hyserve_time_to_first_token_seconds",
        "hyserve_inter_token_latency_seconds", "hyserve_request_latency_seconds", "hyserve_step_seconds",
        "hyserve_cancelled_requests_total", "hyserve_free_kv_pages", "hyserve_free_mamba_slots"}) {
    EXPECT_NE(before.body.find(std::string("# TYPE ") + name + " "), std::string::npos) << name;
  }
  EXPECT_EQ(metric_value(before.body, "hyserve_generation_tokens_total"), 0.0);

  ASSERT_EQ(post("/generate", R"({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4}})").status, 200u);
  ASSERT_EQ(post("/generate", R"({"input_ids": []})").status, 400u);
  metrics_.queue_depth().set(3);
  metrics_.step_seconds("decode").observe(0.004);

  const std::string after = get("/metrics").body;
  EXPECT_EQ(metric_value(after, R"(hyserve_requests_total{status="200"})"), 1.0);
  EXPECT_EQ(metric_value(after, R"(hyserve_requests_total{status="400"})"), 1.0);
  EXPECT_EQ(metric_value(after, "hyserve_prompt_tokens_total"), 2.0);
  EXPECT_EQ(metric_value(after, "hyserve_generation_tokens_total"), 4.0);
  EXPECT_EQ(metric_value(after, "hyserve_request_latency_seconds_count"), 1.0);
  EXPECT_EQ(metric_value(after, "hyserve_time_to_first_token_seconds_count"), 1.0);
  EXPECT_EQ(metric_value(after, "hyserve_inter_token_latency_seconds_count"), 3.0);
  EXPECT_EQ(metric_value(after, "hyserve_queue_depth"), 3.0);
  EXPECT_EQ(metric_value(after, R"(hyserve_step_seconds_bucket{mode="decode",le="0.005"})"), 1.0);
  EXPECT_EQ(metric_value(after, R"(hyserve_step_seconds_count{mode="decode"})"), 1.0);
}

TEST_F(server_test, ModelsAndServerInfo) {
  http_reply r = get("/v1/models");
  ASSERT_EQ(r.status, 200u);
  json::value v = parse(r.body);
  EXPECT_EQ(v.at("object").as_string(), "list");
  EXPECT_EQ(v.at("data").at(0).at("id").as_string(), "test-model");
  EXPECT_EQ(v.at("data").at(0).at("max_model_len").to_number<int>(), test_frontend::kMaxContext);
  r = get("/server_info");
  ASSERT_EQ(r.status, 200u);
  v = parse(r.body);
  EXPECT_EQ(v.at("model_info").at("vocab_size").to_number<int64_t>(), test_frontend::kVocab);
  EXPECT_EQ(v.at("http").at("port").to_number<int>(), server_->port());
  EXPECT_EQ(v.at("http").at("body_limit_bytes").to_number<int>(), 4096);
  EXPECT_EQ(v.at("scheduler").at("max_queue").to_number<int>(), 4);
}

TEST_F(server_test, MalformedHttp_400) {
  http_client client(server_->port());
  io_deadline deadline(client.socket(), std::chrono::milliseconds(5000));
  const std::string garbage = "NOT AN HTTP REQUEST\r\n\r\n";
  boost::asio::write(client.socket(), boost::asio::buffer(garbage));
  beast::flat_buffer buffer;
  bhttp::response<bhttp::string_body> res;
  beast::error_code ec;
  bhttp::read(client.socket(), buffer, res, ec);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(res.result_int(), 400u);
}

TEST_F(server_test, GracefulStop_InFlightRequestFinishes) {
  frontend_.tick_us = 5000;
  auto reply = std::async(std::launch::async, [port = server_->port()] {
    return http_client(port).request("POST", "/generate",
                                     R"({"input_ids": [1], "sampling_params": {"max_new_tokens": 30}})");
  });
  ASSERT_TRUE(frontend_.wait_for_active(1, std::chrono::milliseconds(3000)));
  http_client idle(server_->port());  // an idle keep-alive connection must not hold the stop up
  EXPECT_TRUE(server_->stop(std::chrono::milliseconds(5000)));
  http_reply r = reply.get();
  ASSERT_EQ(r.status, 200u) << r.error;
  EXPECT_EQ(ids_of(parse(r.body).at("output_ids")).size(), 30u);
  EXPECT_FALSE(r.keep_alive);
  // No longer accepting.
  EXPECT_THROW(http_client(server_->port()), boost::system::system_error);
}

TEST_F(server_test, GracefulStop_DeadlineAbortsAndCancels) {
  frontend_.tick_us = 5000;
  auto reply = std::async(std::launch::async, [port = server_->port()] {
    return http_client(port).request("POST", "/generate",
                                     R"({"input_ids": [1], "sampling_params": {"max_new_tokens": 250}})");
  });
  ASSERT_TRUE(frontend_.wait_for_active(1, std::chrono::milliseconds(3000)));
  const uint64_t id = frontend_.last_id();
  EXPECT_FALSE(server_->stop(std::chrono::milliseconds(100)));
  EXPECT_TRUE(frontend_.wait_for_cancel(id, std::chrono::milliseconds(1000)));
  EXPECT_EQ(reply.get().status, 0u);  // the connection was closed without an answer
}

TEST_F(server_test, ExpectContinue_AnswersContinueThenTheResponse) {
  http_client client(server_->port());
  io_deadline deadline(client.socket(), std::chrono::milliseconds(5000));
  bhttp::request<bhttp::string_body> req{bhttp::verb::post, "/generate", 11};
  req.set(bhttp::field::host, "127.0.0.1");
  req.set(bhttp::field::expect, "100-continue");
  req.set(bhttp::field::content_type, "application/json");
  req.body() = R"({"input_ids": [1], "sampling_params": {"max_new_tokens": 2}})";
  req.prepare_payload();
  bhttp::write(client.socket(), req);
  beast::flat_buffer buffer;
  bhttp::response<bhttp::string_body> interim;
  bhttp::read(client.socket(), buffer, interim);
  EXPECT_EQ(interim.result_int(), 100u);
  bhttp::response<bhttp::string_body> res;
  bhttp::read(client.socket(), buffer, res);
  ASSERT_EQ(res.result_int(), 200u);
  EXPECT_EQ(ids_of(parse(res.body()).at("output_ids")), expected_tokens(1, 2));
}

TEST_F(server_test, ClientGone_CountsAs499) {
  frontend_.tick_us = 5000;
  http_client client(server_->port());
  client.send_only("POST", "/generate", R"({"input_ids": [1], "sampling_params": {"max_new_tokens": 200}})");
  ASSERT_TRUE(frontend_.wait_for_active(1, std::chrono::milliseconds(3000)));
  client.close();
  ASSERT_TRUE(frontend_.wait_for_cancel(frontend_.last_id(), std::chrono::milliseconds(3000)));
  double value = -1;
  for (int i = 0; i < 100 && value != 1.0; ++i) {
    value = metric_value(get("/metrics").body, R"(hyserve_requests_total{status="499"})");
    if (value != 1.0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(value, 1.0);
}

class short_timeout_test : public server_test {
 protected:
  void configure(http::server_options& opts) override { opts.read_timeout = std::chrono::milliseconds(200); }
};

TEST_F(short_timeout_test, IdleAndStalledConnectionsAreClosedByTheReadTimeout) {
  // Idle after a request (keep-alive), and stalled in the middle of a header.
  http_client idle(server_->port());
  ASSERT_EQ(idle.request("GET", "/health").status, 200u);
  http_client stalled(server_->port());
  const std::string partial = "POST /generate HTTP/1.1\r\nHost: x\r\n";
  boost::asio::write(stalled.socket(), boost::asio::buffer(partial));
  for (http_client* c : {&idle, &stalled}) {
    io_deadline deadline(c->socket(), std::chrono::milliseconds(3000));
    char byte = 0;
    beast::error_code ec;
    const auto start = std::chrono::steady_clock::now();
    c->socket().read_some(boost::asio::buffer(&byte, 1), ec);
    EXPECT_EQ(ec, boost::asio::error::eof);
    EXPECT_FALSE(deadline.expired());
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(2000));
  }
  // A request that takes longer than the read timeout to generate is not cut off: the timeout
  // is per read, not per request.
  frontend_.tick_us = 5000;
  http_reply r = post("/generate", R"({"input_ids": [1], "sampling_params": {"max_new_tokens": 80}})");
  ASSERT_EQ(r.status, 200u) << r.error;
  EXPECT_EQ(ids_of(parse(r.body).at("output_ids")).size(), 80u);
}

class api_key_test : public server_test {
 protected:
  void configure(http::server_options& opts) override { opts.api_key = "sekrit"; }
};

TEST_F(api_key_test, RequiresBearerKeyExceptHealth) {
  http_client client(server_->port());
  EXPECT_EQ(client.request("GET", "/health").status, 200u);
  http_reply r = client.request("GET", "/v1/models");
  ASSERT_EQ(r.status, 401u);
  EXPECT_EQ(parse(r.body).at("error").at("code").to_number<int>(), 401);
  EXPECT_EQ(client.request("GET", "/metrics", {}, {{"Authorization", "Bearer wrong"}}).status, 401u);
  EXPECT_EQ(client.request("GET", "/metrics", {}, {{"Authorization", "sekrit"}}).status, 401u);
  EXPECT_EQ(client.request("POST", "/generate", R"({"input_ids": [1]})").status, 401u);
  const std::vector<std::pair<std::string, std::string>> auth = {{"Authorization", "Bearer sekrit"}};
  EXPECT_EQ(client.request("GET", "/v1/models", {}, auth).status, 200u);
  EXPECT_EQ(client.request("GET", "/server_info", {}, auth).status, 200u);
  r = client.request("POST", "/generate", R"({"input_ids": [1], "sampling_params": {"max_new_tokens": 2}})", auth);
  ASSERT_EQ(r.status, 200u);
  EXPECT_EQ(ids_of(parse(r.body).at("output_ids")), expected_tokens(1, 2));
}

}  // namespace
}  // namespace hyserve::coordinator::testing
