#include "coordinator/api/completions_api.h"

#include <string>

#include <boost/json.hpp>

#include "coordinator/api/json_fields.h"
#include "coordinator/api/logprobs.h"
#include "coordinator/api/openai_response.h"
#include "coordinator/api/validation.h"
#include "hyserve/common/json.h"

namespace hyserve::coordinator::api {
namespace {

constexpr std::string_view kNoTokenizer = "this model has no tokenizer: send token ids";
constexpr int32_t kDefaultMaxTokens = 16;
constexpr float kDefaultTemperature = 1.0f;

// The prompt: a string, an array holding one string, a token-id array, or an array holding
// exactly one token-id array.
std::optional<api_error> read_prompt(const boost::json::object& obj, const model_info& info, const text_support& text,
                                     std::vector<int32_t>& out) {
  const auto* prompt = field(obj, "prompt");
  if (prompt == nullptr) return invalid_param("prompt", "prompt is required (a string or an array of token ids)");
  if (is_text_value(*prompt)) {
    if (!text.tokenizer) return invalid_param("prompt", std::string(kNoTokenizer) + " in prompt, not text");
    if (prompt->is_array() && prompt->get_array().size() != 1) {
      return invalid_param("prompt", "batched prompts are not supported: send one prompt per request (got " +
                                         std::to_string(prompt->get_array().size()) + ")");
    }
    const boost::json::string& s = prompt->is_string() ? prompt->get_string() : prompt->get_array()[0].get_string();
    return encode_text(*text.tokenizer, s, "prompt", {}, out);
  }
  if (prompt->is_array() && !prompt->get_array().empty() && prompt->get_array()[0].is_array()) {
    const auto& outer = prompt->get_array();
    if (outer.size() != 1) {
      return invalid_param("prompt", "batched prompts are not supported: send one prompt per request (got " +
                                         std::to_string(outer.size()) + ")");
    }
    if (auto e = read_token_ids(outer[0], "prompt", info.vocab_size, out)) return e;
  } else if (auto e = read_token_ids(*prompt, "prompt", info.vocab_size, out)) {
    return e;
  }
  if (out.empty()) return invalid_param("prompt", "prompt must not be empty");
  return std::nullopt;
}

// `stop`: null, strings (with a tokenizer) or token ids. Ids are added to the stop token ids.
std::optional<api_error> read_stop(const boost::json::object& obj, const model_info& info, const text_support& text,
                                   completion_call& call) {
  sampling_params& sampling = call.sampling;
  const auto* stop = field(obj, "stop");
  if (stop == nullptr) return std::nullopt;
  if (is_text_value(*stop)) {
    if (!text.tokenizer) {
      return invalid_param("stop", std::string(kNoTokenizer) + " in stop (or stop_token_ids), not strings");
    }
    return read_stop_strings(*stop, "stop", call.stop_strings);
  }
  std::vector<int32_t> ids;
  if (auto e = read_token_ids(*stop, "stop", info.vocab_size, ids)) return e;
  sampling.stop_token_ids.insert(sampling.stop_token_ids.end(), ids.begin(), ids.end());
  return std::nullopt;
}

boost::json::array to_array(std::span<const int32_t> ids) {
  boost::json::array arr;
  arr.reserve(ids.size());
  for (int32_t id : ids) arr.emplace_back(id);
  return arr;
}

// lp_from, lp_to: the output tokens whose logprobs the body carries (when asked).
boost::json::object completion_body(const completion_state& state, std::span<const int32_t> ids,
                                    std::string_view text, size_t lp_from, size_t lp_to) {
  boost::json::object choice;
  choice["index"] = 0;
  choice["text"] = text;
  choice["token_ids"] = to_array(ids);
  if (state.logprobs && lp_from < lp_to) {
    choice["logprobs"] = completion_logprobs(state, lp_from, lp_to);
  } else {
    choice["logprobs"] = nullptr;
  }
  choice["finish_reason"] = finish_reason_value(state);
  return openai_envelope(state, "cmpl-", "text_completion", std::move(choice));
}

}  // namespace

parse_result<completion_call> parse_completion(std::string_view body, const model_info& info, const text_support& text) {
  auto parsed = parse_object_body(body);
  if (auto* e = std::get_if<api_error>(&parsed)) return std::move(*e);
  const boost::json::object& obj = std::get<boost::json::object>(parsed);

  completion_call call;
  call.kind = api_kind::kCompletions;
  call.ignored_fields = unknown_openai_fields(
      obj, {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "n",
            "stop_token_ids", "ignore_eos", "sparse", "user", "stream_options", "echo", "logprobs", "top_logprobs",
            "best_of", "suffix", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
            "min_tokens"});
  if (auto e = refuse_unimplemented(obj)) return std::move(*e);
  if (const auto* v = field(obj, "top_logprobs"); v && !v->is_null() && !(v->is_int64() && v->get_int64() == 0))
    return invalid_param("top_logprobs",
                         "top_logprobs is a chat parameter: on /v1/completions give logprobs: N (0 to " +
                             std::to_string(kMaxTopLogprobs) + ")");
  if (const auto* v = field(obj, "logprobs"); v && !v->is_null()) {
    if (auto e = read_top_logprobs(*v, "logprobs", call.sampling.top_logprobs)) return std::move(*e);
    call.sampling.logprobs = true;
  }
  if (auto e = read_prompt(obj, info, text, call.input_ids)) return std::move(*e);
  if (const auto* v = field(obj, "echo")) {
    if (auto e = read_bool(*v, "echo", call.echo)) return std::move(*e);
    if (call.echo) {
      call.echo_ids = call.input_ids;
      const auto* prompt = field(obj, "prompt");
      if (prompt->is_string()) call.echo_text = prompt->get_string();
      else if (is_text_value(*prompt)) call.echo_text = prompt->get_array()[0].get_string();
      else if (text.tokenizer) call.echo_text = text.tokenizer->decode(call.input_ids);
    }
  }
  // OpenAI's echo with logprobs also gives the prompt tokens' logprobs, which this server does not
  // compute: refused rather than answered without them.
  if (call.echo && call.sampling.logprobs)
    return invalid_param("echo", "echo with logprobs (logprobs of the prompt tokens) is not supported by this server: "
                                 "send echo or logprobs, not both");

  if (const auto* n = field(obj, "n")) {
    int64_t count = 0;
    if (auto e = read_integer(*n, "n", count)) return std::move(*e);
    if (count != 1) return invalid_param("n", "only n = 1 is supported, got " + std::to_string(count));
  }

  sampling_keys keys;
  keys.max_new_tokens = "max_tokens";
  call.sampling.max_new_tokens = kDefaultMaxTokens;
  call.sampling.temperature = kDefaultTemperature;
  bool max_given = false;
  if (auto e = read_sampling(obj, keys, info, call.sampling, max_given)) return std::move(*e);
  if (auto e = read_stop(obj, info, text, call)) return std::move(*e);
  if (const auto* s = field(obj, "stream")) {
    if (auto e = read_bool(*s, "stream", call.stream)) return std::move(*e);
  }
  if (auto e = check_context(call.input_ids.size(), "prompt", keys, info, max_given, call.sampling)) {
    return std::move(*e);
  }
  return call;
}

boost::json::object completion_response(const completion_state& state) {
  if (state.echo_text) {
    std::vector<int32_t> ids = state.echo_ids;
    ids.insert(ids.end(), state.output_ids.begin(), state.output_ids.end());
    boost::json::object out =
        completion_body(state, ids, *state.echo_text + state.text, 0, state.output_ids.size());
    out["usage"] = openai_usage(state);
    return out;
  }
  boost::json::object out = completion_body(state, state.output_ids, state.text, 0, state.output_ids.size());
  out["usage"] = openai_usage(state);
  return out;
}

boost::json::object completion_chunk(const completion_state& state, std::span<const int32_t> new_ids,
                                     std::string_view new_text, bool output) {
  const size_t to = state.output_ids.size();
  const size_t from = output && new_ids.size() <= to ? to - new_ids.size() : to;
  boost::json::object out = completion_body(state, new_ids, new_text, from, to);
  if (state.finished) out["usage"] = openai_usage(state);
  return out;
}

}  // namespace hyserve::coordinator::api
