// The per-request sampling surface end to end (real coordinator and workers under mpirun, over
// HTTP, bamba-tiny): logit_bias, min_tokens, repetition / presence / frequency penalties and
// logprobs, checked against a reference computed from the fixture's teacher-forced logits
// (tests/fixtures/bamba-tiny/reference.safetensors, full_logits.<prompt>: one row per position of
// prompt + greedy continuation). Logprobs are those of the processed distribution (after bias,
// masks and penalties, before temperature / top-k / top-p); with no processing they are the raw
// log-softmax, which the service must match within kLogprobTol = 1e-4 (measured on the CPU:
// about 1.5e-6; the test prints the largest difference). A penalised greedy run
// must follow the recomputed argmax token for token up to and including its first departure from
// the plain greedy path (past that the reference has no logits). tp = 1 samples on the model's
// device (the eager processing path); tp = 2 samples on the host after the vocabulary gather;
// n-gram speculation runs such requests without drafts.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <sys/wait.h>

#include "service_test_support.h"

namespace hyserve::service_test {
namespace {

namespace json = boost::json;

constexpr double kLogprobTol = 1e-4;  // float32 on the CPU: measured ~1.5e-6
constexpr double kMarginTol = 2e-3;   // a recomputed argmax closer than this is not a fair test

const safetensors_file& reference_logits() {
  static const safetensors_file f =
      safetensors_file::open(test::fixture_dir("bamba-tiny") + "/reference.safetensors");
  return f;
}

// Row `pos` (a position of prompt + greedy ids) of prompt p's teacher-forced logits.
std::vector<float> ref_row(size_t p, size_t pos) {
  const float* full = static_cast<const float*>(reference_logits().data("full_logits." + std::to_string(p)));
  return std::vector<float>(full + pos * kVocab, full + (pos + 1) * kVocab);
}

std::vector<double> log_softmax(const std::vector<float>& x) {
  double mx = -INFINITY;
  for (float v : x) mx = std::max(mx, static_cast<double>(v));
  double z = 0;
  for (float v : x) z += std::exp(v - mx);
  std::vector<double> out;
  for (float v : x) out.push_back(v - mx - std::log(z));
  return out;
}

struct penalties {
  double rep = 1.0, pres = 0.0, freq = 0.0;
};

// The penalised greedy path predicted from the reference: tokens while the prediction stays on
// the greedy path, then the first token that leaves it (if any). Fails on a near tie.
std::vector<int32_t> predict_penalised(size_t p, const penalties& pen, int32_t n) {
  const test::reference_prompt& rp = reference()[p];
  std::vector<int32_t> out;
  for (int32_t t = 0; t < n; ++t) {
    std::vector<float> x = ref_row(p, rp.input_ids.size() - 1 + static_cast<size_t>(t));
    for (int32_t v = 0; v < kVocab; ++v) {
      const auto cnt = std::count(out.begin(), out.end(), v);
      const bool seen = cnt > 0 || std::find(rp.input_ids.begin(), rp.input_ids.end(), v) != rp.input_ids.end();
      if (seen && pen.rep != 1.0) x[v] = x[v] > 0 ? static_cast<float>(x[v] / pen.rep) : static_cast<float>(x[v] * pen.rep);
      x[v] -= static_cast<float>(pen.freq * static_cast<double>(cnt) + pen.pres * (cnt > 0 ? 1.0 : 0.0));
    }
    std::vector<int32_t> order(kVocab);
    for (int32_t v = 0; v < kVocab; ++v) order[v] = v;
    std::partial_sort(order.begin(), order.begin() + 2, order.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
    EXPECT_GT(x[order[0]] - x[order[1]], kMarginTol) << "prompt " << p << " step " << t << ": a near tie";
    out.push_back(order[0]);
    if (order[0] != rp.greedy_ids[static_cast<size_t>(t)]) break;  // off the reference path
  }
  return out;
}

json::object generate_request(const std::vector<int32_t>& ids, int32_t n, json::object extra_sp = {}) {
  json::object sp{{"max_new_tokens", n}, {"temperature", 0}, {"ignore_eos", true}};
  for (auto& kv : extra_sp) sp[kv.key()] = kv.value();
  return json::object{{"input_ids", to_json_ids(ids)}, {"sampling_params", std::move(sp)}};
}

http_reply post(uint16_t port, const std::string& target, const json::object& body) {
  return http_post(port, target, json::serialize(body));
}

// The logprobs of a /generate answer: ([logprob, id] per token, top lists).
struct gen_logprobs {
  std::vector<int32_t> ids;
  std::vector<double> lps;
  std::vector<std::vector<std::pair<double, int32_t>>> tops;
};

gen_logprobs parse_logprobs(const http_reply& r) {
  gen_logprobs g;
  const json::value v = r.json();
  g.ids = ids_of(v.at("output_ids"));
  const auto& meta = v.at("meta_info").as_object();
  for (const auto& e : meta.at("output_token_logprobs").as_array()) g.lps.push_back(e.as_array().at(0).to_number<double>());
  if (const auto* tops = meta.if_contains("output_top_logprobs"))
    for (const auto& t : tops->as_array()) {
      auto& list = g.tops.emplace_back();
      for (const auto& e : t.as_array())
        list.emplace_back(e.as_array().at(0).to_number<double>(), static_cast<int32_t>(e.as_array().at(1).to_number<int64_t>()));
    }
  return g;
}

// Every token's logprob and top-k against the reference log-softmax at its position (the
// largest difference is printed: the measured agreement, below the stated tolerance).
void expect_reference_logprobs(size_t p, const gen_logprobs& g, size_t top_k, const std::string& label) {
  const test::reference_prompt& rp = reference()[p];
  double worst = 0.0;
  struct report {
    const std::string& label;
    double& worst;
    ~report() { std::printf("%s: largest |logprob - reference| %.3g (tolerance %.0e)\n", label.c_str(), worst, kLogprobTol); }
  } rep{label, worst};
  ASSERT_EQ(g.ids, rp.greedy_ids) << label;
  ASSERT_EQ(g.lps.size(), g.ids.size()) << label;
  ASSERT_EQ(g.tops.size(), top_k > 0 ? g.ids.size() : 0) << label;
  for (size_t t = 0; t < g.ids.size(); ++t) {
    const std::vector<double> ls = log_softmax(ref_row(p, rp.input_ids.size() - 1 + t));
    EXPECT_NEAR(g.lps[t], ls[static_cast<size_t>(g.ids[t])], kLogprobTol) << label << " token " << t;
    worst = std::max(worst, std::fabs(g.lps[t] - ls[static_cast<size_t>(g.ids[t])]));
    if (top_k == 0) continue;
    const auto& top = g.tops[t];
    ASSERT_EQ(top.size(), top_k) << label << " token " << t;
    EXPECT_EQ(top[0].second, g.ids[t]) << label << " token " << t << ": greedy is the most likely";
    std::vector<double> sorted = ls;
    std::sort(sorted.rbegin(), sorted.rend());
    for (size_t k = 0; k < top_k; ++k) {
      EXPECT_NEAR(top[k].first, ls[static_cast<size_t>(top[k].second)], kLogprobTol) << label << " token " << t << " rank " << k;
      worst = std::max(worst, std::fabs(top[k].first - ls[static_cast<size_t>(top[k].second)]));
      EXPECT_NEAR(top[k].first, sorted[k], kLogprobTol) << label << " token " << t << " rank " << k;
      if (k > 0) {
        EXPECT_LE(top[k].first, top[k - 1].first) << label << " token " << t;
      }
    }
  }
}

void expect_bad(uint16_t port, const std::string& target, const json::object& body, const std::string& param,
                const std::string& limit) {
  const http_reply r = post(port, target, body);
  EXPECT_EQ(r.status, 400u) << param << ": " << r.describe();
  const auto err = error_object(r);
  ASSERT_TRUE(err.has_value()) << r.body;
  EXPECT_EQ(std::string(err->at("param").as_string()), param) << r.body;
  EXPECT_NE(std::string(err->at("message").as_string()).find(limit), std::string::npos)
      << param << ": the message should name " << limit << ": " << r.body;
}

std::string service_config(int tp, const std::string& extra = {}) {
  return "model: {path: @MODEL@}\nparallel: {tp: " + std::to_string(tp) + R"(, dp: 1}
cache: {page_size: 16, max_requests: 8, max_context: 512}
server: {host: 127.0.0.1, port: @PORT@}
)" + extra;
}

// hyserve-generate --logits on the fixture: its greedy ids and one logits row per position of
// prompt + output (row prompt.size() - 1 + t is the distribution of output token t).
struct cli_logits {
  std::vector<int32_t> ids;
  std::vector<std::vector<float>> rows;
  std::string error;
};

cli_logits generate_cli_logits(const std::vector<int32_t>& prompt, int32_t n) {
  cli_logits out;
  std::string joined;
  for (size_t i = 0; i < prompt.size(); ++i) joined += (i ? "," : "") + std::to_string(prompt[i]);
  const std::string cmd = binary_dir() + "/bin/hyserve-generate --model " + fixture_model_dir() + " --input-ids " +
                          joined + " --max-new-tokens " + std::to_string(n) + " --json --logits 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) {
    out.error = "popen failed: " + cmd;
    return out;
  }
  std::string text;
  std::array<char, 65536> buf{};
  for (size_t got; (got = std::fread(buf.data(), 1, buf.size(), pipe)) > 0;) text.append(buf.data(), got);
  const int status = ::pclose(pipe);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    out.error = cmd + " failed: " + text.substr(0, 2000);
    return out;
  }
  boost::system::error_code ec;
  const json::value v = json::parse(text, ec);
  if (ec || !v.is_object() || !v.as_object().contains("logits")) {
    out.error = "no JSON with logits from " + cmd + ": " + text.substr(0, 2000);
    return out;
  }
  out.ids = ids_of(v.at("output_ids"));
  out.rows = json::value_to<std::vector<std::vector<float>>>(v.at("logits"));
  return out;
}

// What the worker's logits processing does to one row (vLLM's order: logit_bias, then the
// repetition penalty on tokens of the prompt or the output so far, then the frequency and
// presence penalties on the output's counts), recomputed here in float like the worker.
std::vector<float> processed_row(std::vector<float> x, const std::map<int32_t, float>& bias, const penalties& pen,
                                 const std::vector<int32_t>& prompt, const std::vector<int32_t>& output) {
  for (const auto& [id, b] : bias) x[static_cast<size_t>(id)] += b;
  for (int32_t v = 0; v < kVocab; ++v) {
    const auto cnt = std::count(output.begin(), output.end(), v);
    const bool seen = cnt > 0 || std::find(prompt.begin(), prompt.end(), v) != prompt.end();
    float& xv = x[static_cast<size_t>(v)];
    const auto rp = static_cast<float>(pen.rep);
    if (seen && rp != 1.0f) xv = xv > 0.0f ? xv / rp : xv * rp;
    if (cnt > 0) xv -= static_cast<float>(pen.freq) * static_cast<float>(cnt) + static_cast<float>(pen.pres);
  }
  return x;
}

class SamplingService : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    service_ = std::make_unique<service_process>("sampling", service_config(1), 1);
    service_->launch();
  }
  static void TearDownTestSuite() { service_.reset(); }
  void SetUp() override { ASSERT_TRUE(service_ && service_->port() != 0) << service_->report(); }
  void TearDown() override {
    if (HasFailure()) std::printf("---- service log tail ----\n%s\n", service_->log_tail(3000).c_str());
  }
  static uint16_t port() { return service_->port(); }
  static inline std::unique_ptr<service_process> service_;
};

TEST_F(SamplingService, LogitBiasForcesAToken) {
  const auto& rp = reference()[0];
  for (int32_t forced : {77, 0, 511}) {
    const http_reply r = post(port(), "/generate",
                              generate_request(rp.input_ids, 8, {{"logit_bias", {{std::to_string(forced), 100}}}}));
    ASSERT_EQ(r.status, 200u) << r.describe();
    EXPECT_EQ(parse_generation(r).ids, std::vector<int32_t>(8, forced));
  }
  // -100 on the greedy token: the next-best token of the reference comes instead.
  const std::vector<float> row = ref_row(0, rp.input_ids.size() - 1);
  std::vector<int32_t> order(kVocab);
  for (int32_t v = 0; v < kVocab; ++v) order[v] = v;
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
  ASSERT_EQ(order[0], rp.greedy_ids[0]);
  const http_reply r = post(port(), "/generate",
                            generate_request(rp.input_ids, 1, {{"logit_bias", {{std::to_string(order[0]), -100}}}}));
  ASSERT_EQ(r.status, 200u) << r.describe();
  EXPECT_EQ(parse_generation(r).ids, std::vector<int32_t>{order[1]});
  // The OpenAI route.
  const http_reply c = post(port(), "/v1/completions",
                            json::object{{"prompt", to_json_ids(rp.input_ids)}, {"max_tokens", 5}, {"temperature", 0},
                                         {"logit_bias", {{"300", 100}}}});
  ASSERT_EQ(c.status, 200u) << c.describe();
  EXPECT_EQ(ids_of(c.json().at("choices").as_array().at(0).at("token_ids")), std::vector<int32_t>(5, 300));
}

TEST_F(SamplingService, MinTokensDelaysEosAndStopIds) {
  const auto& rp = reference()[1];
  // EOS biased to be certain: it comes first without min_tokens, at index min_tokens with it.
  json::object eos_bias{{"logit_bias", {{std::to_string(kEosId), 100}}}, {"ignore_eos", false}};
  http_reply r = post(port(), "/generate", generate_request(rp.input_ids, 12, eos_bias));
  ASSERT_EQ(r.status, 200u) << r.describe();
  generation g = parse_generation(r);
  EXPECT_EQ(g.ids, std::vector<int32_t>{kEosId});
  EXPECT_EQ(g.finish, "stop");
  json::object with_min = eos_bias;
  with_min["min_new_tokens"] = 5;
  r = post(port(), "/generate", generate_request(rp.input_ids, 12, with_min));
  ASSERT_EQ(r.status, 200u) << r.describe();
  g = parse_generation(r);
  ASSERT_EQ(g.ids.size(), 6u) << ids_text(g.ids);
  for (size_t i = 0; i < 5; ++i) EXPECT_NE(g.ids[i], kEosId) << i;
  EXPECT_EQ(g.ids[5], kEosId);
  EXPECT_EQ(g.finish, "stop");
  // The first five follow the reference's greedy path (EOS is not its argmax there).
  EXPECT_EQ(std::vector<int32_t>(g.ids.begin(), g.ids.begin() + 5),
            std::vector<int32_t>(rp.greedy_ids.begin(), rp.greedy_ids.begin() + 5));
  // A stop token id on /v1/completions, streamed.
  const json::object body{{"prompt", to_json_ids(rp.input_ids)}, {"max_tokens", 10}, {"temperature", 0},
                          {"stop_token_ids", {42}},          {"logit_bias", {{"42", 100}}},
                          {"min_tokens", 3},                  {"stream", true}};
  const streamed s = stream_tokens(port(), "/v1/completions", json::serialize(body));
  ASSERT_TRUE(s.error.empty()) << s.error;
  ASSERT_EQ(s.ids.size(), 4u) << ids_text(s.ids);
  EXPECT_NE(s.ids[2], 42);
  EXPECT_EQ(s.ids[3], 42);
  EXPECT_EQ(s.finish, "stop");
}

TEST_F(SamplingService, LogprobsMatchTheReference) {
  for (size_t p = 0; p < reference().size(); ++p) {
    const auto& rp = reference()[p];
    json::object body = generate_request(rp.input_ids, static_cast<int32_t>(rp.greedy_ids.size()));
    body["return_logprob"] = true;
    body["top_logprobs_num"] = 5;
    const http_reply r = post(port(), "/generate", body);
    ASSERT_EQ(r.status, 200u) << r.describe();
    expect_reference_logprobs(p, parse_logprobs(r), 5, "top-5, prompt " + std::to_string(p));
    // The sampled token's logprob alone stays on the fast path; same values.
    body.erase("top_logprobs_num");
    const http_reply r2 = post(port(), "/generate", body);
    ASSERT_EQ(r2.status, 200u) << r2.describe();
    expect_reference_logprobs(p, parse_logprobs(r2), 0, "logprob only, prompt " + std::to_string(p));
  }
  // /v1/completions: the OpenAI shape, plain and streamed, the same numbers.
  const auto& rp = reference()[0];
  json::object body{{"prompt", to_json_ids(rp.input_ids)}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 3}};
  const http_reply c = post(port(), "/v1/completions", body);
  ASSERT_EQ(c.status, 200u) << c.describe();
  const json::value cv = c.json();
  const auto& lp = cv.at("choices").as_array().at(0).at("logprobs").as_object();
  ASSERT_EQ(lp.at("tokens").as_array().size(), 6u);
  ASSERT_EQ(lp.at("token_logprobs").as_array().size(), 6u);
  ASSERT_EQ(lp.at("top_logprobs").as_array().size(), 6u);
  ASSERT_EQ(lp.at("text_offset").as_array().size(), 6u);
  std::vector<double> plain;
  for (size_t t = 0; t < 6; ++t) {
    const double got = lp.at("token_logprobs").as_array()[t].to_number<double>();
    plain.push_back(got);
    const std::vector<double> ls = log_softmax(ref_row(0, rp.input_ids.size() - 1 + t));
    EXPECT_NEAR(got, ls[static_cast<size_t>(rp.greedy_ids[t])], kLogprobTol) << t;
    EXPECT_EQ(std::string(lp.at("tokens").as_array()[t].as_string()), "token_id:" + std::to_string(rp.greedy_ids[t]));
    EXPECT_GE(lp.at("top_logprobs").as_array()[t].as_object().size(), 3u);
    if (t > 0) {
      EXPECT_GT(lp.at("text_offset").as_array()[t].to_number<int64_t>(),
                lp.at("text_offset").as_array()[t - 1].to_number<int64_t>());
    }
  }
  body["stream"] = true;
  const http_reply sr = post(port(), "/v1/completions", body);
  ASSERT_EQ(sr.status, 200u) << sr.describe();
  std::vector<double> streamed_lps;
  for (const std::string& ev : sse_events(sr.body)) {
    if (ev == "[DONE]") break;
    const json::value v = json::parse(ev);
    const auto& l = v.at("choices").as_array().at(0).at("logprobs");
    if (l.is_null()) continue;
    for (const auto& x : l.at("token_logprobs").as_array()) streamed_lps.push_back(x.to_number<double>());
  }
  EXPECT_EQ(streamed_lps, plain);
}

// Logprobs against hyserve-generate --logits (the same model run by the command-line tool): with
// no processing they are the log-softmax of its rows within kLogprobTol; with logit_bias and the
// penalties they are the log-softmax of its rows processed as recomputed here, and the greedy
// tokens are the argmax of those rows, token for token up to and including the first departure
// from the tool's greedy path (past that the tool has no logits for the new path).
TEST_F(SamplingService, LogprobsEqualLogSoftmaxOfGenerateCliLogitsWithBiasAndPenalties) {
  constexpr int32_t kTokens = 24;
  constexpr size_t kTop = 5;
  double worst = 0.0;
  size_t compared = 0, departures = 0;
  for (size_t p = 0; p < reference().size(); ++p) {
    const std::vector<int32_t>& prompt = reference()[p].input_ids;
    const cli_logits cli = generate_cli_logits(prompt, kTokens);
    ASSERT_TRUE(cli.error.empty()) << cli.error;
    ASSERT_EQ(cli.ids.size(), static_cast<size_t>(kTokens));
    ASSERT_GE(cli.rows.size(), prompt.size() - 1 + kTokens);
    // Biases on the 2nd and 4th most likely tokens of the first step and on a far one.
    const std::vector<float>& first = cli.rows[prompt.size() - 1];
    std::vector<int32_t> order(kVocab);
    for (int32_t v = 0; v < kVocab; ++v) order[static_cast<size_t>(v)] = v;
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return first[a] > first[b]; });
    const std::map<int32_t, float> bias = {{order[1], 1.5f}, {order[3], -2.5f}, {order[200], 4.0f}};
    struct processing_case {
      const char* label;
      std::map<int32_t, float> bias;
      penalties pen;
    };
    const std::vector<processing_case> cases = {{"none", {}, {}},
                                                {"logit_bias", bias, {}},
                                                {"penalties", {}, {1.3, 0.4, 0.7}},
                                                {"logit_bias + penalties", bias, {0.8, -0.5, 0.9}}};
    for (const processing_case& c : cases) {
      const std::string label = "prompt " + std::to_string(p) + ", " + c.label;
      SCOPED_TRACE(label);
      json::object sp{{"repetition_penalty", c.pen.rep}, {"presence_penalty", c.pen.pres},
                      {"frequency_penalty", c.pen.freq}};
      if (!c.bias.empty()) {
        json::object b;
        for (const auto& [id, v] : c.bias) b[std::to_string(id)] = v;
        sp["logit_bias"] = std::move(b);
      }
      json::object body = generate_request(prompt, kTokens, sp);
      body["return_logprob"] = true;
      body["top_logprobs_num"] = kTop;
      const http_reply r = post(port(), "/generate", body);
      ASSERT_EQ(r.status, 200u) << r.describe();
      const gen_logprobs g = parse_logprobs(r);
      ASSERT_EQ(g.ids.size(), static_cast<size_t>(kTokens));
      ASSERT_EQ(g.lps.size(), g.ids.size());
      ASSERT_EQ(g.tops.size(), g.ids.size());
      std::vector<int32_t> predicted;
      for (size_t t = 0; t < static_cast<size_t>(kTokens); ++t) {
        const std::vector<float> x = processed_row(cli.rows[prompt.size() - 1 + t], c.bias, c.pen, prompt, predicted);
        std::vector<int32_t> ranked(kVocab);
        for (int32_t v = 0; v < kVocab; ++v) ranked[static_cast<size_t>(v)] = v;
        std::partial_sort(ranked.begin(), ranked.begin() + 2, ranked.end(),
                          [&](int32_t a, int32_t b) { return x[a] > x[b]; });
        if (x[ranked[0]] - x[ranked[1]] < kMarginTol) break;  // a near tie: the path is not a fair test past it
        predicted.push_back(ranked[0]);
        EXPECT_EQ(g.ids[t], ranked[0]) << "token " << t;
        const std::vector<double> ls = log_softmax(x);
        std::vector<double> sorted = ls;
        std::sort(sorted.rbegin(), sorted.rend());
        EXPECT_NEAR(g.lps[t], ls[static_cast<size_t>(g.ids[t])], kLogprobTol) << "token " << t;
        worst = std::max(worst, std::fabs(g.lps[t] - ls[static_cast<size_t>(g.ids[t])]));
        ASSERT_EQ(g.tops[t].size(), kTop) << "token " << t;
        for (size_t k = 0; k < kTop; ++k) {
          const auto& [lp, id] = g.tops[t][k];
          EXPECT_NEAR(lp, ls[static_cast<size_t>(id)], kLogprobTol) << "token " << t << " rank " << k;
          EXPECT_NEAR(lp, sorted[k], kLogprobTol) << "token " << t << " rank " << k;
          worst = std::max(worst, std::fabs(lp - ls[static_cast<size_t>(id)]));
        }
        ++compared;
        if (ranked[0] != cli.ids[t]) {  // off the tool's greedy path: no logits past here
          ++departures;
          break;
        }
      }
      if (c.bias.empty() && c.pen.rep == 1.0 && c.pen.pres == 0.0 && c.pen.freq == 0.0) {
        EXPECT_EQ(g.ids, cli.ids) << "plain greedy differs from hyserve-generate";
      }
    }
  }
  std::printf("logprobs vs hyserve-generate --logits (plain, logit_bias, penalties): %zu tokens compared, %zu "
              "departures from the greedy path, largest |difference| %.3g (tolerance %.0e)\n",
              compared, departures, worst, kLogprobTol);
  EXPECT_GE(compared, reference().size() * static_cast<size_t>(kTokens)) << "too few tokens compared";
  EXPECT_GT(departures, 0u) << "no bias or penalty changed the greedy path: the token check tests nothing";
}

TEST_F(SamplingService, PenaltiesFollowTheReferenceRecomputation) {
  const std::vector<penalties> cases = {{1.0, 0.0, 2.0}, {1.0, 1.5, 0.5}, {3.0, 0.0, 0.0}, {0.5, -0.5, 0.0}};
  bool any_departure = false;
  for (size_t p = 0; p < reference().size(); ++p) {
    for (const penalties& pen : cases) {
      const std::vector<int32_t> want = predict_penalised(p, pen, 24);
      if (want.size() < 24 || want.back() != reference()[p].greedy_ids.back()) any_departure = true;
      json::object sp{{"repetition_penalty", pen.rep}, {"presence_penalty", pen.pres}, {"frequency_penalty", pen.freq}};
      const http_reply r = post(port(), "/generate", generate_request(reference()[p].input_ids, 24, sp));
      ASSERT_EQ(r.status, 200u) << r.describe();
      const std::vector<int32_t> got = parse_generation(r).ids;
      ASSERT_GE(got.size(), want.size());
      EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(want.size())), want)
          << "prompt " << p << " rep " << pen.rep << " pres " << pen.pres << " freq " << pen.freq;
    }
  }
  EXPECT_TRUE(any_departure) << "no penalty changed the greedy path: the test checks nothing";
}

TEST_F(SamplingService, BadValuesAre400NamingTheFieldAndLimit) {
  const std::vector<int32_t> ids = {5, 6, 7};
  json::object many;
  for (int i = 0; i < 301; ++i) many[std::to_string(i)] = 1;
  auto gen = [&](json::object sp) { return generate_request(ids, 4, std::move(sp)); };
  expect_bad(port(), "/generate", gen({{"logit_bias", many}}), "sampling_params.logit_bias", "300");
  expect_bad(port(), "/generate", gen({{"logit_bias", {{"5", 150}}}}), "sampling_params.logit_bias", "[-100, 100]");
  expect_bad(port(), "/generate", gen({{"logit_bias", {{"512", 1}}}}), "sampling_params.logit_bias", "[0, 512)");
  expect_bad(port(), "/generate", gen({{"logit_bias", {{"x", 1}}}}), "sampling_params.logit_bias", "token id");
  expect_bad(port(), "/generate", gen({{"presence_penalty", 2.5}}), "sampling_params.presence_penalty", "[-2, 2]");
  expect_bad(port(), "/generate", gen({{"frequency_penalty", -3}}), "sampling_params.frequency_penalty", "[-2, 2]");
  expect_bad(port(), "/generate", gen({{"repetition_penalty", 0}}), "sampling_params.repetition_penalty", "(0, 100]");
  expect_bad(port(), "/generate", gen({{"min_new_tokens", 5}}), "sampling_params.min_new_tokens", "max_new_tokens (4)");
  json::object top = gen({});
  top["top_logprobs_num"] = 21;
  expect_bad(port(), "/generate", top, "top_logprobs_num", "[0, 20]");
  const json::object base{{"prompt", to_json_ids(ids)}, {"max_tokens", 4}};
  auto with = [&](const char* k, json::value v) {
    json::object b = base;
    b[k] = std::move(v);
    return b;
  };
  expect_bad(port(), "/v1/completions", with("logprobs", 21), "logprobs", "[0, 20]");
  expect_bad(port(), "/v1/completions", with("top_logprobs", 2), "top_logprobs", "logprobs: N");
  expect_bad(port(), "/v1/completions", with("min_tokens", 9), "min_tokens", "max_tokens (4)");
  expect_bad(port(), "/v1/completions", with("logit_bias", many), "logit_bias", "300");
  // The service is fine afterwards.
  EXPECT_EQ(generate(port(), reference()[0].input_ids, greedy(24)).ids, reference()[0].greedy_ids);
}

TEST_F(SamplingService, OtherConcurrentRequestsAreUnaffected) {
  std::vector<generation> plain(3), biased(3);
  run_concurrently(6, [&](size_t i) {
    const auto& rp = reference()[i % 3];
    if (i < 3) {
      plain[i] = generate(port(), rp.input_ids, greedy(24));
    } else {
      json::object sp{{"logit_bias", {{"123", 100}}}, {"frequency_penalty", 1.0}, {"repetition_penalty", 1.2}};
      json::object body = generate_request(rp.input_ids, 24, sp);
      body["top_logprobs_num"] = 3;
      biased[i - 3] = parse_generation(post(port(), "/generate", body));
    }
  });
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(plain[i].ids, reference()[i].greedy_ids) << "plain " << i << ": " << plain[i];
    EXPECT_EQ(biased[i].status, 200u) << biased[i];
    // frequency 1.0 and repetition 1.2 cannot undo a +100 bias on logits of this size.
    EXPECT_EQ(biased[i].ids, std::vector<int32_t>(24, 123)) << "biased " << i;
  }
}

// tp = 2: the logits are gathered and sampled on the host; the same processing there.
class SamplingServiceTp2 : public SamplingService {
 protected:
  static void SetUpTestSuite() {
    service_ = std::make_unique<service_process>("sampling-tp2", service_config(2), 2);
    service_->launch();
  }
};

TEST_F(SamplingServiceTp2, LogprobsPenaltiesAndBias) {
  const auto& rp = reference()[2];
  json::object body = generate_request(rp.input_ids, static_cast<int32_t>(rp.greedy_ids.size()));
  body["return_logprob"] = true;
  body["top_logprobs_num"] = 4;
  const http_reply r = post(port(), "/generate", body);
  ASSERT_EQ(r.status, 200u) << r.describe();
  expect_reference_logprobs(2, parse_logprobs(r), 4, "tp2");
  const penalties pen{1.0, 0.0, 2.0};
  const std::vector<int32_t> want = predict_penalised(2, pen, 24);
  const http_reply pr = post(port(), "/generate", generate_request(rp.input_ids, 24, {{"frequency_penalty", 2.0}}));
  ASSERT_EQ(pr.status, 200u) << pr.describe();
  const std::vector<int32_t> got = parse_generation(pr).ids;
  ASSERT_GE(got.size(), want.size());
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(want.size())), want);
  const http_reply b = post(port(), "/generate", generate_request(rp.input_ids, 4, {{"logit_bias", {{"9", 100}}}}));
  EXPECT_EQ(parse_generation(b).ids, std::vector<int32_t>(4, 9));
}

// n-gram speculation: requests with processing or logprobs run without drafts (plain steps),
// with the same results; other requests still speculate.
class SamplingServiceSpec : public SamplingService {
 protected:
  static void SetUpTestSuite() {
    service_ = std::make_unique<service_process>(
        "sampling-spec", service_config(1, "speculative: {algorithm: ngram, num_draft_tokens: 4, cost_check: false}\n"), 1);
    service_->launch();
  }
};

TEST_F(SamplingServiceSpec, ProcessingRequestsDoNotSpeculate) {
  const auto& rp = reference()[0];
  json::object body = generate_request(rp.input_ids, static_cast<int32_t>(rp.greedy_ids.size()));
  body["return_logprob"] = true;
  body["top_logprobs_num"] = 2;
  const http_reply r = post(port(), "/generate", body);
  ASSERT_EQ(r.status, 200u) << r.describe();
  expect_reference_logprobs(0, parse_logprobs(r), 2, "spec");
  EXPECT_FALSE(r.json().at("meta_info").as_object().contains("spec_accept_rate")) << r.body;
  const penalties pen{1.0, 0.0, 2.0};
  const std::vector<int32_t> want = predict_penalised(0, pen, 24);
  const http_reply pr = post(port(), "/generate", generate_request(rp.input_ids, 24, {{"frequency_penalty", 2.0}}));
  ASSERT_EQ(pr.status, 200u) << pr.describe();
  const std::vector<int32_t> got = parse_generation(pr).ids;
  ASSERT_GE(got.size(), want.size());
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(want.size())), want);
  // A repetitive forced output (a biased token) would draft well: still no drafts.
  const http_reply b = post(port(), "/generate", generate_request(rp.input_ids, 16, {{"logit_bias", {{"9", 100}}}}));
  ASSERT_EQ(b.status, 200u) << b.describe();
  EXPECT_EQ(parse_generation(b).ids, std::vector<int32_t>(16, 9));
  EXPECT_FALSE(b.json().at("meta_info").as_object().contains("spec_accept_rate")) << b.body;
  // A plain request speculates (its repetitive prompt drafts) and keeps the greedy output.
  expect_fixture_greedy(port(), "spec");
}

}  // namespace
}  // namespace hyserve::service_test
