// Text in and out of the HTTP API over the deterministic test frontend and the 512-token test
// tokenizer: text prompts in /generate and /v1/completions, /v1/chat/completions (plain and
// streamed), stop strings that span tokens, and the refusals without a tokenizer or a chat
// format.
// These tests load the fixture tokenizer, whose pre-tokenizer is a Regex: they need PCRE2.
#if HYSERVE_TOKENIZER_HAS_REGEX
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "coordinator/api/text_support.h"
#include "coordinator/http/server.h"
#include "coordinator/log.h"
#include "coordinator/metrics/service_metrics.h"
#include "coordinator_test_support.h"
#include "hyserve/tokenizer/bpe_tokenizer.h"
#include "hyserve/tokenizer/utf8.h"

namespace hyserve::coordinator::testing {
namespace {

namespace json = boost::json;
using tokenizer::bpe_tokenizer;

const std::string kTokenizerPath = std::string(HYSERVE_SOURCE_DIR) + "/tests/fixtures/tokenizer-bpe512/tokenizer.json";

std::shared_ptr<const bpe_tokenizer> fixture_tokenizer() {
  static const auto tok = std::make_shared<const bpe_tokenizer>(bpe_tokenizer::from_file(kTokenizerPath));
  return tok;
}

api::chat_format chatml() {
  api::chat_format f;
  f.message_template = "<|im_start|>{role}\n{content}<|im_end|>\n";
  f.generation_prompt = "<|im_start|>assistant\n";
  f.stop_token_ids = {2};
  return f;
}

json::value parse(const std::string& text) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  EXPECT_FALSE(ec) << "not JSON: " << text;
  return v;
}

std::vector<int32_t> ids_of(const json::value& v) {
  std::vector<int32_t> out;
  for (const auto& e : v.as_array()) out.push_back(static_cast<int32_t>(e.to_number<int64_t>()));
  return out;
}

// What the test frontend generates after a prompt ending in `last`.
std::vector<int32_t> frontend_tokens(int32_t last, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(static_cast<int32_t>((last + 1 + i) % test_frontend::kVocab));
  return out;
}

std::string decode(const std::vector<int32_t>& ids) { return fixture_tokenizer()->decode(ids); }

class text_server_test : public ::testing::Test {
 protected:
  void SetUp() override {
    set_log_level(log_level::kError);
    http::server_options opts;
    opts.host = "127.0.0.1";
    opts.port = 0;
    opts.threads = 2;
    opts.read_timeout = std::chrono::milliseconds(5000);
    opts.write_timeout = std::chrono::milliseconds(5000);
    configure(opts.text);
    server_ = std::make_unique<http::server>(std::move(opts), frontend_, metrics_);
    server_->start();
    ASSERT_NE(server_->port(), 0);
  }
  void TearDown() override {
    if (server_) server_->stop(std::chrono::milliseconds(2000));
    server_.reset();
  }

  virtual void configure(api::text_support& text) {
    text.tokenizer = fixture_tokenizer();
    text.chat = chatml();
  }

  http_reply post(const std::string& target, const std::string& body) {
    return http_client(server_->port()).request("POST", target, body);
  }

  test_frontend frontend_;
  metrics::service_metrics metrics_;
  std::unique_ptr<http::server> server_;
};

class no_tokenizer_test : public text_server_test {
 protected:
  void configure(api::text_support&) override {}
};

class no_chat_test : public text_server_test {
 protected:
  void configure(api::text_support& text) override { text.tokenizer = fixture_tokenizer(); }
};

// ---------------------------------------------------------------------------------------------
// Pieces.

TEST(ChatFormat, RendersMessagesThenGenerationPrompt) {
  api::chat_format f = chatml();
  f.bos = "<s>";
  const std::vector<api::chat_message> messages = {{"system", "Be brief."}, {"user", "Hi {role}"}};
  EXPECT_EQ(api::render_chat(f, messages),
            "<s><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi {role}<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(TextStream, MultiByteCharactersSplitAcrossTokensAreHeldBack) {
  const auto tok = fixture_tokenizer();
  const std::string text = "caf\xC3\xA9 \xF0\x9F\x99\x82 \xE4\xB8\xAD\xE6\x96\x87";  // café 🙂 中文
  const std::vector<int32_t> ids = tok->encode(text);
  api::text_stream s(*tok, {});
  std::string joined;
  size_t held_somewhere = 0;
  for (int32_t id : ids) {
    const api::text_stream::update u = s.push(std::vector<int32_t>{id});
    EXPECT_TRUE(tokenizer::utf8_is_valid(u.delta)) << "token " << id;
    if (u.delta.empty()) ++held_somewhere;
    joined += u.delta;
  }
  joined += s.finish();
  EXPECT_EQ(joined, text);
  EXPECT_EQ(s.text(), text);
  EXPECT_GT(held_somewhere, 0u) << "the test text should split some character across tokens";
}

TEST(TextStream, StopStringAcrossTokensIsTrimmedAndStopsConsuming) {
  const auto tok = fixture_tokenizer();
  const std::vector<int32_t> ids = tok->encode("one two three four");
  ASSERT_GE(ids.size(), 4u);
  // A stop string made of the end of one token and the start of the next.
  const std::string a(tok->token_bytes(ids[1])), b(tok->token_bytes(ids[2]));
  const std::string stop = a.substr(a.size() - 1) + b.substr(0, 1);
  api::text_stream s(*tok, {stop});
  const api::text_stream::update u = s.push(ids);
  EXPECT_TRUE(u.stopped);
  EXPECT_EQ(u.consumed, 3u);
  const std::string head = tok->decode(std::vector<int32_t>{ids[0], ids[1]});
  EXPECT_EQ(u.delta, head.substr(0, head.size() - 1));
  EXPECT_EQ(s.finish(), "");
}

// ---------------------------------------------------------------------------------------------
// /generate and /v1/completions.

TEST_F(text_server_test, Generate_TextPromptIsEncodedAndTextReturned) {
  const std::vector<int32_t> prompt = fixture_tokenizer()->encode("Hello world");
  http_reply r = post("/generate", R"({"text": "Hello world", "sampling_params": {"max_new_tokens": 6}})");
  ASSERT_EQ(r.status, 200u) << r.body;
  json::value v = parse(r.body);
  const std::vector<int32_t> expected = frontend_tokens(prompt.back(), 6);
  EXPECT_EQ(ids_of(v.at("output_ids")), expected);
  EXPECT_EQ(v.at("text").as_string(), decode(expected));
  EXPECT_EQ(v.at("meta_info").at("prompt_tokens").to_number<size_t>(), prompt.size());
  // Token ids in, text out as well.
  r = post("/generate", R"({"input_ids": [70, 71], "sampling_params": {"max_new_tokens": 3}})");
  ASSERT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(parse(r.body).at("text").as_string(), decode({72, 73, 74}));
}

TEST_F(text_server_test, Generate_TextValidation) {
  http_reply r = post("/generate", R"({"text": "", "sampling_params": {"max_new_tokens": 2}})");
  EXPECT_EQ(r.status, 400u);
  EXPECT_EQ(parse(r.body).at("error").at("param").as_string(), "text");
  r = post("/generate", R"({"text": "a", "input_ids": [5]})");
  EXPECT_EQ(r.status, 400u);
  r = post("/generate", R"({"text": 5})");
  EXPECT_EQ(r.status, 400u);
  r = post("/generate", R"({"text": "a", "sampling_params": {"stop": [""]}})");
  EXPECT_EQ(r.status, 400u);
  EXPECT_EQ(parse(r.body).at("error").at("param").as_string(), "sampling_params.stop");
}

TEST_F(text_server_test, Completions_StringPromptFillsText) {
  const std::vector<int32_t> prompt = fixture_tokenizer()->encode("The answer is");
  const std::vector<int32_t> expected = frontend_tokens(prompt.back(), 8);
  for (const char* body : {R"({"prompt": "The answer is", "max_tokens": 8})",
                           R"({"prompt": ["The answer is"], "max_tokens": 8})"}) {
    http_reply r = post("/v1/completions", body);
    ASSERT_EQ(r.status, 200u) << r.body;
    json::value v = parse(r.body);
    const auto& choice = v.at("choices").at(0);
    EXPECT_EQ(ids_of(choice.at("token_ids")), expected);
    EXPECT_EQ(choice.at("text").as_string(), decode(expected));
    EXPECT_EQ(v.at("usage").at("prompt_tokens").to_number<size_t>(), prompt.size());
    EXPECT_EQ(v.at("usage").at("completion_tokens").to_number<int>(), 8);
  }
  http_reply r = post("/v1/completions", R"({"prompt": ["a", "b"], "max_tokens": 8})");
  EXPECT_EQ(r.status, 400u);
  EXPECT_NE(parse(r.body).at("error").at("message").as_string().find("batched"), std::string::npos);
}

// Stream deltas concatenate to the plain answer; every delta is valid UTF-8 even where the
// generated bytes are not (consecutive byte tokens 0x80.. are lone continuation bytes).
TEST_F(text_server_test, Completions_StreamTextAgreesWithNonStream) {
  const std::string body = R"({"prompt": [96], "max_tokens": 40)";
  http_reply plain = post("/v1/completions", body + "}");
  ASSERT_EQ(plain.status, 200u) << plain.body;
  const std::string full(parse(plain.body).at("choices").at(0).at("text").as_string());
  EXPECT_EQ(full, decode(frontend_tokens(96, 40)));
  http_reply streamed = post("/v1/completions", body + R"(, "stream": true})");
  ASSERT_EQ(streamed.status, 200u);
  const auto events = sse_events(streamed.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string joined;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const std::string delta(parse(events[i]).at("choices").at(0).at("text").as_string());
    EXPECT_TRUE(tokenizer::utf8_is_valid(delta)) << "chunk " << i;
    joined += delta;
  }
  EXPECT_EQ(joined, full);
}

// The frontend knows nothing of stop strings: the handler cancels the request when one
// appears, and answers finish_reason "stop" with the text before it.
TEST_F(text_server_test, Completions_StopStringAcrossTokensIsTrimmed) {
  const std::vector<int32_t> out = frontend_tokens(300, 20);
  const std::string a(fixture_tokenizer()->token_bytes(out[4])), b(fixture_tokenizer()->token_bytes(out[5]));
  const std::string stop = a.substr(a.size() - 1) + b.substr(0, 1);
  const std::string before = decode({out.begin(), out.begin() + 5});
  ASSERT_EQ(before.find(stop), std::string::npos);
  json::object req;
  req["prompt"] = json::array{300};
  req["max_tokens"] = 20;
  req["stop"] = json::array{"never-there", json::string(stop)};
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "plain");
    req["stream"] = stream;
    http_reply r = post("/v1/completions", json::serialize(req));
    ASSERT_EQ(r.status, 200u) << r.body;
    std::string text, finish;
    std::vector<int32_t> ids;
    int64_t completion_tokens = -1;
    if (stream) {
      const auto events = sse_events(r.body);
      ASSERT_GE(events.size(), 2u);
      EXPECT_EQ(events.back(), "[DONE]");
      for (size_t i = 0; i + 1 < events.size(); ++i) {
        json::value c = parse(events[i]);
        const auto& choice = c.at("choices").at(0);
        text += choice.at("text").as_string();
        for (int32_t id : ids_of(choice.at("token_ids"))) ids.push_back(id);
        if (!choice.at("finish_reason").is_null()) finish = std::string(choice.at("finish_reason").as_string());
        if (c.as_object().contains("usage")) completion_tokens = c.at("usage").at("completion_tokens").to_number<int64_t>();
      }
    } else {
      json::value v = parse(r.body);
      text = std::string(v.at("choices").at(0).at("text").as_string());
      ids = ids_of(v.at("choices").at(0).at("token_ids"));
      finish = std::string(v.at("choices").at(0).at("finish_reason").as_string());
      completion_tokens = v.at("usage").at("completion_tokens").to_number<int64_t>();
    }
    EXPECT_EQ(text, before.substr(0, before.size() - 1));
    EXPECT_EQ(finish, "stop");
    EXPECT_EQ(ids, std::vector<int32_t>(out.begin(), out.begin() + 6));
    EXPECT_EQ(completion_tokens, 6);
    EXPECT_TRUE(frontend_.wait_for_cancel(frontend_.last_id(), std::chrono::milliseconds(2000)));
  }
}

// ---------------------------------------------------------------------------------------------
// /v1/chat/completions.

const char* kChatBody = R"({"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                            "max_tokens": 12, "temperature": 0)";

// The ids the frontend generated for a chat answer to kChatBody.
std::vector<int32_t> ids_of_text_prompt_tail(const http_reply& chat_reply) {
  tokenizer::encode_options no_template;
  no_template.add_special_tokens = false;
  const std::vector<int32_t> prompt = fixture_tokenizer()->encode(
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
      no_template);
  const int n = parse(chat_reply.body).at("usage").at("completion_tokens").to_number<int>();
  return frontend_tokens(prompt.back(), n);
}

TEST_F(text_server_test, Chat_NonStream) {
  http_reply r = post("/v1/chat/completions", std::string(kChatBody) + "}");
  ASSERT_EQ(r.status, 200u) << r.body;
  json::value v = parse(r.body);
  EXPECT_EQ(v.at("object").as_string(), "chat.completion");
  EXPECT_EQ(v.at("id").as_string().subview().substr(0, 9), "chatcmpl-");
  EXPECT_EQ(v.at("model").as_string(), "test-model");
  const std::string prompt_text =
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
  tokenizer::encode_options no_template;
  no_template.add_special_tokens = false;
  const std::vector<int32_t> prompt = fixture_tokenizer()->encode(prompt_text, no_template);
  const auto& choice = v.at("choices").at(0);
  EXPECT_EQ(choice.at("message").at("role").as_string(), "assistant");
  EXPECT_EQ(choice.at("message").at("content").as_string(), decode(frontend_tokens(prompt.back(), 12)));
  EXPECT_EQ(choice.at("finish_reason").as_string(), "length");
  EXPECT_EQ(v.at("usage").at("prompt_tokens").to_number<size_t>(), prompt.size());
  EXPECT_EQ(v.at("usage").at("completion_tokens").to_number<int>(), 12);
  EXPECT_EQ(v.at("usage").at("total_tokens").to_number<size_t>(), prompt.size() + 12);
}

TEST_F(text_server_test, Chat_StreamAgreesWithNonStream) {
  http_reply plain = post("/v1/chat/completions", std::string(kChatBody) + "}");
  ASSERT_EQ(plain.status, 200u) << plain.body;
  http_reply streamed = post("/v1/chat/completions", std::string(kChatBody) + R"(, "stream": true})");
  ASSERT_EQ(streamed.status, 200u) << streamed.body;
  EXPECT_EQ(streamed.header("content-type"), "text/event-stream");
  const auto events = sse_events(streamed.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  json::value first = parse(events[0]);
  EXPECT_EQ(first.at("object").as_string(), "chat.completion.chunk");
  EXPECT_EQ(first.at("choices").at(0).at("delta").at("role").as_string(), "assistant");
  std::string joined;
  for (size_t i = 1; i + 2 < events.size(); ++i) {
    json::value c = parse(events[i]);
    EXPECT_EQ(c.at("id"), first.at("id"));
    const auto& choice = c.at("choices").at(0);
    EXPECT_TRUE(choice.at("finish_reason").is_null());
    const std::string delta(choice.at("delta").at("content").as_string());
    EXPECT_FALSE(delta.empty()) << "chunk " << i;
    EXPECT_TRUE(tokenizer::utf8_is_valid(delta)) << "chunk " << i;
    joined += delta;
  }
  json::value last = parse(events[events.size() - 2]);
  EXPECT_EQ(last.at("choices").at(0).at("finish_reason").as_string(), "length");
  EXPECT_TRUE(last.at("choices").at(0).at("delta").as_object().empty());
  EXPECT_EQ(last.at("usage").at("completion_tokens").to_number<int>(), 12);
  EXPECT_EQ(joined, parse(plain.body).at("choices").at(0).at("message").at("content").as_string());
}

TEST_F(text_server_test, Chat_StopStringAcrossTokensIsTrimmed) {
  http_reply plain = post("/v1/chat/completions", std::string(kChatBody) + "}");
  ASSERT_EQ(plain.status, 200u) << plain.body;
  const std::vector<int32_t> out = ids_of_text_prompt_tail(plain);
  ASSERT_EQ(out.size(), 12u);
  const std::string a(fixture_tokenizer()->token_bytes(out[6])), b(fixture_tokenizer()->token_bytes(out[7]));
  const std::string stop = a.substr(a.size() - 1) + b.substr(0, 1);
  const std::string before = decode({out.begin(), out.begin() + 7});
  ASSERT_EQ(before.find(stop), std::string::npos);
  json::value req = parse(std::string(kChatBody) + "}");
  req.as_object()["stop"] = stop;
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "plain");
    req.as_object()["stream"] = stream;
    http_reply r = post("/v1/chat/completions", json::serialize(req));
    ASSERT_EQ(r.status, 200u) << r.body;
    std::string content, finish;
    int64_t completion_tokens = -1;
    if (stream) {
      const auto events = sse_events(r.body);
      ASSERT_GE(events.size(), 3u);
      for (size_t i = 0; i + 1 < events.size(); ++i) {
        json::value c = parse(events[i]);
        const auto& choice = c.at("choices").at(0);
        if (const auto* d = choice.at("delta").as_object().if_contains("content")) content += d->as_string();
        if (!choice.at("finish_reason").is_null()) finish = std::string(choice.at("finish_reason").as_string());
        if (c.as_object().contains("usage")) completion_tokens = c.at("usage").at("completion_tokens").to_number<int64_t>();
      }
    } else {
      json::value v = parse(r.body);
      content = std::string(v.at("choices").at(0).at("message").at("content").as_string());
      finish = std::string(v.at("choices").at(0).at("finish_reason").as_string());
      completion_tokens = v.at("usage").at("completion_tokens").to_number<int64_t>();
    }
    EXPECT_EQ(content, before.substr(0, before.size() - 1));
    EXPECT_EQ(finish, "stop");
    EXPECT_EQ(completion_tokens, 8);
  }
}

// The chat format's stop token ("<|im_end|>", id 2) ends the reply: a generation prompt ending
// in "<|im_start|>" (id 1) makes the test frontend emit id 2 first.
class eos_chat_test : public text_server_test {
 protected:
  void configure(api::text_support& text) override {
    text.tokenizer = fixture_tokenizer();
    text.chat = chatml();
    text.chat->generation_prompt = "<|im_start|>";
  }
};

TEST_F(eos_chat_test, ChatEosTokenEndsTheReply) {
  http_reply r = post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5})");
  ASSERT_EQ(r.status, 200u) << r.body;
  json::value v = parse(r.body);
  EXPECT_EQ(v.at("choices").at(0).at("finish_reason").as_string(), "stop");
  EXPECT_EQ(v.at("choices").at(0).at("message").at("content").as_string(), "");  // special: not shown
  EXPECT_EQ(v.at("usage").at("completion_tokens").to_number<int>(), 1);
}

TEST_F(text_server_test, Chat_Validation) {
  struct bad {
    const char* body;
    const char* param;
  };
  for (const bad& b : {bad{R"({})", "messages"}, bad{R"({"messages": []})", "messages"},
                       bad{R"({"messages": "hi"})", "messages"},
                       bad{R"({"messages": [{"content": "hi"}]})", "messages[0].role"},
                       bad{R"({"messages": [{"role": "user", "content": 3}]})", "messages[0].content"},
                       bad{R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
                           "messages[0].content"},
                       bad{R"({"messages": [{"role": "user", "content": "hi"}], "n": 2})", "n"},
                       bad{R"({"messages": [{"role": "user", "content": "hi"}], "stop": 5})", "stop"},
                       bad{R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000})",
                           "max_tokens"},
                       bad{R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "max_completion_tokens": 4})",
                           "max_tokens"}}) {
    http_reply r = post("/v1/chat/completions", b.body);
    EXPECT_EQ(r.status, 400u) << b.body << " -> " << r.body;
    if (r.status == 400u) {
      EXPECT_EQ(parse(r.body).at("error").at("param").as_string(), b.param) << b.body;
    }
  }
  // Both names with the same value are one limit.
  http_reply r = post("/v1/chat/completions",
                      R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "max_completion_tokens": 3})");
  ASSERT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(parse(r.body).at("usage").at("completion_tokens").as_int64(), 3);
}

TEST_F(no_tokenizer_test, TextIsRefusedWithoutATokenizer) {
  for (const auto& [target, body] : std::vector<std::pair<std::string, std::string>>{
           {"/generate", R"({"text": "hi"})"},
           {"/v1/completions", R"({"prompt": "hi"})"},
           {"/v1/completions", R"({"prompt": [5], "stop": "x"})"},
           {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}]})"}}) {
    http_reply r = post(target, body);
    EXPECT_EQ(r.status, 400u) << target << " " << body;
    EXPECT_NE(r.body.find("this model has no tokenizer"), std::string::npos) << r.body;
  }
  // Token ids still work, with no "text" in the answer.
  http_reply r = post("/generate", R"({"input_ids": [5], "sampling_params": {"max_new_tokens": 2}})");
  ASSERT_EQ(r.status, 200u);
  EXPECT_FALSE(parse(r.body).as_object().contains("text"));
}

TEST_F(no_chat_test, ChatIsRefusedWithoutAChatFormat) {
  http_reply r = post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}]})");
  EXPECT_EQ(r.status, 400u);
  EXPECT_NE(r.body.find("no chat template"), std::string::npos) << r.body;
}

}  // namespace
}  // namespace hyserve::coordinator::testing

#endif  // HYSERVE_TOKENIZER_HAS_REGEX
