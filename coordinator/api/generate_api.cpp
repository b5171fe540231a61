#include "coordinator/api/generate_api.h"

#include <initializer_list>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "coordinator/api/json_fields.h"
#include "coordinator/api/logprobs.h"
#include "coordinator/api/validation.h"
#include "hyserve/common/json.h"

namespace hyserve::coordinator::api {
namespace {

constexpr std::string_view kNoTokenizer = "this model has no tokenizer: send token ids in input_ids instead of text";

boost::json::array to_array(std::span<const int32_t> ids) {
  boost::json::array arr;
  arr.reserve(ids.size());
  for (int32_t id : ids) arr.emplace_back(id);
  return arr;
}

boost::json::object meta_info(const completion_state& state) {
  boost::json::object meta;
  meta["id"] = state.id;
  meta["prompt_tokens"] = state.prompt_tokens;
  meta["cached_tokens"] = state.cached_tokens;
  meta["completion_tokens"] = state.output_ids.size();
  if (state.finished) {
    boost::json::object reason;
    reason["type"] = finish_reason_name(*state.finished);
    meta["finish_reason"] = std::move(reason);
  } else {
    meta["finish_reason"] = nullptr;
  }
  meta["latency_ms"] = state.latency_ms;
  if (state.spec_drafted > 0) {
    meta["spec_accept_rate"] = static_cast<double>(state.spec_accepted) / static_cast<double>(state.spec_drafted);
  }
  add_generate_logprobs(state, meta);
  return meta;
}

std::optional<api_error> refuse_unknown(const boost::json::object& obj, const std::string& prefix,
                                        std::initializer_list<std::string_view> known) {
  const std::vector<std::string> unknown = unknown_fields(obj, known);
  if (unknown.empty()) return std::nullopt;
  std::string names, known_list;
  for (const auto& u : unknown) names += (names.empty() ? "" : ", ") + prefix + u;
  for (const auto& k : known) known_list += (known_list.empty() ? "" : ", ") + std::string(k);
  return invalid_param(prefix + unknown.front(), "unknown field" + std::string(unknown.size() > 1 ? "s " : " ") +
                                                     names + " (known: " + known_list + ")");
}

}  // namespace

parse_result<completion_call> parse_generate(std::string_view body, const model_info& info, const text_support& text) {
  auto parsed = parse_object_body(body);
  if (auto* e = std::get_if<api_error>(&parsed)) return std::move(*e);
  const boost::json::object& obj = std::get<boost::json::object>(parsed);

  completion_call call;
  call.kind = api_kind::kGenerate;
  // /generate is this server's own API: a field it does not know is a mistake (a typo such as
  // max_new_token would otherwise fall back to a default without a word).
  if (auto e = refuse_unknown(obj, "", {"input_ids", "text", "sampling_params", "stream", "stream_options",
                                        "return_logprob", "top_logprobs_num"}))
    return std::move(*e);
  if (const auto* v = field(obj, "return_logprob")) {
    if (auto e = read_bool(*v, "return_logprob", call.sampling.logprobs)) return std::move(*e);
  }
  if (const auto* v = field(obj, "top_logprobs_num")) {
    if (auto e = read_top_logprobs(*v, "top_logprobs_num", call.sampling.top_logprobs)) return std::move(*e);
    if (call.sampling.top_logprobs > 0) call.sampling.logprobs = true;
  }
  const auto* ids = field(obj, "input_ids");
  if (const auto* t = field(obj, "text")) {
    if (!text.tokenizer) return invalid_param("text", std::string(kNoTokenizer));
    if (ids != nullptr) return invalid_param("text", "give one of text and input_ids, not both");
    if (!t->is_string()) {
      return invalid_param("text", "text must be a string, got " + std::string(json_kind_name(*t)));
    }
    if (auto e = encode_text(*text.tokenizer, t->get_string(), "text", {}, call.input_ids)) return std::move(*e);
  } else {
    if (ids == nullptr) return invalid_param("input_ids", "input_ids is required (an array of token ids)");
    if (auto e = read_token_ids(*ids, "input_ids", info.vocab_size, call.input_ids)) return std::move(*e);
    if (call.input_ids.empty()) return invalid_param("input_ids", "input_ids must not be empty");
  }

  sampling_keys keys;
  keys.prefix = "sampling_params.";
  keys.min_tokens = "min_new_tokens";
  bool max_given = false;
  if (const auto* sp = field(obj, "sampling_params")) {
    if (!sp->is_object()) {
      return invalid_param("sampling_params",
                           "sampling_params must be an object, got " + std::string(json_kind_name(*sp)));
    }
    if (auto e = refuse_unknown(sp->get_object(), "sampling_params.",
                                {"max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop_token_ids",
                                 "ignore_eos", "sparse", "stop", "repetition_penalty", "presence_penalty",
                                 "frequency_penalty", "min_new_tokens", "logit_bias"})) {
      return std::move(*e);
    }
    if (auto e = read_sampling(sp->get_object(), keys, info, call.sampling, max_given)) return std::move(*e);
    if (const auto* stop = field(sp->get_object(), "stop")) {
      if (!text.tokenizer) {
        return invalid_param("sampling_params.stop",
                             "this model has no tokenizer: use sampling_params.stop_token_ids, not stop strings");
      }
      if (auto e = read_stop_strings(*stop, "sampling_params.stop", call.stop_strings)) return std::move(*e);
    }
  }
  if (const auto* s = field(obj, "stream")) {
    if (auto e = read_bool(*s, "stream", call.stream)) return std::move(*e);
  }
  if (const auto* so = field(obj, "stream_options")) {
    if (!so->is_object()) {
      return invalid_param("stream_options",
                           "stream_options must be an object, got " + std::string(json_kind_name(*so)));
    }
    if (auto e = refuse_unknown(so->get_object(), "stream_options.", {"incremental"})) return std::move(*e);
    if (const auto* inc = field(so->get_object(), "incremental")) {
      if (auto e = read_bool(*inc, "stream_options.incremental", call.incremental_stream)) return std::move(*e);
    }
  }
  if (auto e = check_context(call.input_ids.size(), field(obj, "text") ? "text" : "input_ids", keys, info, max_given,
                             call.sampling)) {
    return std::move(*e);
  }
  return call;
}

boost::json::object generate_response(const completion_state& state) {
  boost::json::object out;
  out["output_ids"] = to_array(state.output_ids);
  if (state.has_text) out["text"] = state.text;
  out["meta_info"] = meta_info(state);
  return out;
}

boost::json::object generate_chunk(const completion_state& state, std::span<const int32_t> new_ids,
                                   std::string_view new_text) {
  boost::json::object out;
  out["output_ids"] = state.incremental_stream ? to_array(new_ids) : to_array(state.output_ids);
  out["new_ids"] = to_array(new_ids);
  if (state.has_text) out["text"] = state.incremental_stream ? boost::json::string(new_text) : boost::json::string(state.text);
  out["meta_info"] = meta_info(state);
  return out;
}

}  // namespace hyserve::coordinator::api
