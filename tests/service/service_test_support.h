#pragma once
// Helpers shared by the end-to-end service tests: request bodies, response parsing, the
// Prometheus text, bounded polling and the reference fixture.
#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <boost/json.hpp>

#include "fixture.h"
#include "http_client.h"
#include "service_process.h"

namespace hyserve::service_test {

// The HTTP client of the test-support library (tests/support/http_client.h).
using namespace hyserve::test_support;

constexpr int32_t kVocab = 512;      // bamba-tiny
constexpr int32_t kEosId = 2;
constexpr int32_t kMaxContext = 512;  // cache.max_context of the test configs

inline const std::vector<test::reference_prompt>& reference() {
  static const std::vector<test::reference_prompt> prompts = test::load_reference_prompts("bamba-tiny");
  return prompts;
}

// A config shipped in configs/ (the file launch/serve.sh serves) for a service_process, which
// writes it into a directory of its own: the port becomes @PORT@ (an ephemeral one), relative
// paths (which resolve against configs/) become absolute, and `tp` replaces the config's
// tensor-parallel degree when given. Every substitution must find its text: an edited config
// fails here rather than silently serving something else.
inline std::string shipped_config(const std::string& name, int tp = 0) {
  std::string yaml = read_text(std::string(HYSERVE_SOURCE_DIR) + "/configs/" + name);
  auto replace_all = [&](const std::string& from, const std::string& to) {
    size_t n = 0;
    for (size_t pos = yaml.find(from); pos != std::string::npos; pos = yaml.find(from, pos + to.size()), ++n)
      yaml.replace(pos, from.size(), to);
    if (n == 0) ADD_FAILURE() << "configs/" << name << " has no '" << from << "'";
  };
  replace_all("port: 8000", "port: @PORT@");
  replace_all("../tests/fixtures/", std::string(HYSERVE_SOURCE_DIR) + "/tests/fixtures/");
  if (tp > 0) replace_all("parallel: {tp: 1, dp: 1}", "parallel: {tp: " + std::to_string(tp) + ", dp: 1}");
  return yaml;
}

inline boost::json::array to_json_ids(const std::vector<int32_t>& ids) {
  boost::json::array a;
  for (int32_t id : ids) a.emplace_back(id);
  return a;
}

struct gen_options {
  int32_t max_new_tokens = 24;
  bool ignore_eos = true;
  bool stream = false;
  std::vector<int32_t> stop_token_ids;
};

// Greedy options: n new tokens; EOS ends the request unless ignore_eos.
inline gen_options greedy(int32_t n, bool ignore_eos = true) {
  gen_options o;
  o.max_new_tokens = n;
  o.ignore_eos = ignore_eos;
  return o;
}
inline gen_options streaming(int32_t n, bool ignore_eos = true) {
  gen_options o = greedy(n, ignore_eos);
  o.stream = true;
  return o;
}
inline gen_options greedy_stop(int32_t n, std::vector<int32_t> stop_ids) {
  gen_options o = greedy(n, true);
  o.stop_token_ids = std::move(stop_ids);
  return o;
}

inline std::string generate_body(const std::vector<int32_t>& ids, const gen_options& o = {}) {
  boost::json::object sp;
  sp["max_new_tokens"] = o.max_new_tokens;
  sp["temperature"] = 0;
  sp["ignore_eos"] = o.ignore_eos;
  if (!o.stop_token_ids.empty()) sp["stop_token_ids"] = to_json_ids(o.stop_token_ids);
  boost::json::object body;
  body["input_ids"] = to_json_ids(ids);
  body["sampling_params"] = std::move(sp);
  if (o.stream) body["stream"] = true;
  return boost::json::serialize(body);
}

inline std::vector<int32_t> ids_of(const boost::json::value& v) {
  std::vector<int32_t> out;
  if (!v.is_array()) return out;
  for (const auto& e : v.as_array()) out.push_back(static_cast<int32_t>(e.to_number<int64_t>()));
  return out;
}

// /generate result: output ids and finish reason ("" when absent).
struct generation {
  unsigned status = 0;
  std::vector<int32_t> ids;
  std::string finish;
  int64_t completion_tokens = -1;
  int64_t prompt_tokens = -1;
  std::string error;  // transport error or non-200 body

  bool operator==(const generation& o) const { return status == o.status && ids == o.ids && finish == o.finish; }
};

inline std::string ids_text(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s + "]";
}

inline std::ostream& operator<<(std::ostream& os, const generation& g) {
  return os << "{status " << g.status << ", finish " << g.finish << ", ids " << ids_text(g.ids)
            << (g.error.empty() ? "" : ", error " + g.error) << "}";
}

inline generation parse_generation(const http_reply& r) {
  generation g;
  g.status = r.status;
  if (r.status != 200) {
    g.error = r.describe();
    return g;
  }
  const boost::json::value v = r.json();
  if (!v.is_object() || !v.as_object().contains("output_ids")) {
    g.error = "not a /generate answer: " + r.body.substr(0, 400);
    return g;
  }
  g.ids = ids_of(v.at("output_ids"));
  const auto& meta = v.at("meta_info").as_object();
  if (const auto* f = meta.if_contains("finish_reason"); f && f->is_object())
    g.finish = std::string(f->as_object().at("type").as_string());
  if (const auto* c = meta.if_contains("completion_tokens")) g.completion_tokens = c->to_number<int64_t>();
  if (const auto* p = meta.if_contains("prompt_tokens")) g.prompt_tokens = p->to_number<int64_t>();
  return g;
}

inline generation generate(uint16_t port, const std::vector<int32_t>& ids, const gen_options& o = {}) {
  return parse_generation(http_post(port, "/generate", generate_body(ids, o)));
}

// Streams /generate (or /v1/completions) and collects the token ids of every event until
// `data: [DONE]`. ids_key picks the token ids of one event.
struct streamed {
  unsigned status = 0;
  std::vector<int32_t> ids;
  std::string finish;
  bool saw_done = false;
  int events = 0;
  std::string error;
};

inline streamed stream_tokens(uint16_t port, const std::string& target, const std::string& body) {
  streamed s;
  http_connection c(port);
  s.status = c.begin_stream(target, body);
  if (s.status != 200) {
    s.error = "begin_stream: " + c.error();
    return s;
  }
  const bool completions = target == "/v1/completions";
  while (auto ev = c.next_event()) {
    if (*ev == "[DONE]") {
      s.saw_done = true;
      break;
    }
    ++s.events;
    boost::system::error_code ec;
    const boost::json::value v = boost::json::parse(*ev, ec);
    if (ec || !v.is_object()) {
      s.error = "bad event: " + *ev;
      break;
    }
    if (v.as_object().contains("error")) {
      s.error = "error event: " + *ev;
      continue;
    }
    if (completions) {
      const auto& choice = v.at("choices").as_array().at(0).as_object();
      for (int32_t id : ids_of(choice.at("token_ids"))) s.ids.push_back(id);
      if (const auto* f = choice.if_contains("finish_reason"); f && f->is_string()) s.finish = std::string(f->as_string());
    } else {
      for (int32_t id : ids_of(v.at("new_ids"))) s.ids.push_back(id);
      const auto& meta = v.at("meta_info").as_object();
      if (const auto* f = meta.if_contains("finish_reason"); f && f->is_object())
        s.finish = std::string(f->as_object().at("type").as_string());
    }
  }
  if (!s.saw_done && s.error.empty()) s.error = "stream ended without [DONE]: " + c.stream_error();
  return s;
}

// The value of an unlabelled Prometheus sample, or of the first sample of `name{...}`.
inline std::optional<double> metric_value(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
    const char next = line[name.size()];
    if (next != ' ' && next != '{') continue;
    const size_t sp = line.rfind(' ');
    try {
      return std::stod(line.substr(sp + 1));
    } catch (...) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

inline std::string metrics_text(uint16_t port) {
  const http_reply r = http_get(port, "/metrics");
  return r.status == 200 ? r.body : std::string();
}

// Polls `pred` every 20 ms until it holds or `limit` passes.
inline bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds limit) {
  const auto until = steady::now() + limit;
  while (true) {
    if (pred()) return true;
    if (steady::now() > until) return false;
    std::this_thread::sleep_for(20ms);
  }
}

// Runs fn(i) for i in [0, n) on n threads released together.
inline void run_concurrently(size_t n, const std::function<void(size_t)>& fn) {
  std::barrier start(static_cast<std::ptrdiff_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      fn(i);
    });
  }
  for (auto& t : threads) t.join();
}

// The greedy continuations of a fixture over /generate: every prompt alone, then all of them at
// once (twice, so that with dp=2 both groups serve some), token for token.
inline void expect_fixture_greedy(uint16_t port, const std::string& label,
                                  const std::vector<test::reference_prompt>& prompts = reference()) {
  ASSERT_EQ(prompts.size(), 3u);
  for (size_t p = 0; p < prompts.size(); ++p) {
    const auto n = static_cast<int32_t>(prompts[p].greedy_ids.size());
    const generation g = generate(port, prompts[p].input_ids, greedy(n, true));
    EXPECT_EQ(g.status, 200u) << label << " prompt " << p << ": " << g;
    EXPECT_EQ(g.ids, prompts[p].greedy_ids) << label << " prompt " << p;
    EXPECT_EQ(g.finish, "length") << label << " prompt " << p;
    EXPECT_EQ(g.completion_tokens, n) << label << " prompt " << p;
    EXPECT_EQ(g.prompt_tokens, static_cast<int64_t>(prompts[p].input_ids.size())) << label << " prompt " << p;
  }
  std::vector<generation> got(2 * prompts.size());
  run_concurrently(got.size(), [&](size_t i) {
    const auto& p = prompts[i % prompts.size()];
    got[i] = generate(port, p.input_ids, greedy(static_cast<int32_t>(p.greedy_ids.size()), true));
  });
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].status, 200u) << label << " concurrent " << i << ": " << got[i];
    EXPECT_EQ(got[i].ids, prompts[i % prompts.size()].greedy_ids) << label << " concurrent " << i;
  }
}

// The error object of a JSON error answer ({"error": {message, type, param, code}}).
inline std::optional<boost::json::object> error_object(const http_reply& r) {
  const boost::json::value v = r.json();
  if (!v.is_object()) return std::nullopt;
  const auto* e = v.as_object().if_contains("error");
  if (!e || !e->is_object()) return std::nullopt;
  return e->as_object();
}

}  // namespace hyserve::service_test
