#include "coordinator/api/chat_api.h"

#include <string>
#include <vector>

#include <boost/json.hpp>

#include "coordinator/api/json_fields.h"
#include "coordinator/api/logprobs.h"
#include "coordinator/api/openai_response.h"
#include "coordinator/api/validation.h"
#include "hyserve/common/error.h"
#include "hyserve/common/json.h"

namespace hyserve::coordinator::api {
namespace {

constexpr float kDefaultTemperature = 1.0f;

// content: a string, null (""), or an array of {"type": "text", "text": "..."} parts (joined).
std::optional<api_error> read_content(const boost::json::value* v, const std::string& param, std::string& out) {
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) {
    out = v->get_string();
    return std::nullopt;
  }
  if (!v->is_array()) {
    return invalid_param(param, param + " must be a string or an array of text parts, got " +
                                    std::string(json_kind_name(*v)));
  }
  const auto& parts = v->get_array();
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string at = param + "[" + std::to_string(i) + "]";
    const auto* part = parts[i].if_object();
    const boost::json::value* type = part ? field(*part, "type") : nullptr;
    const boost::json::value* text = part ? field(*part, "text") : nullptr;
    if (type == nullptr || !type->is_string() || type->get_string() != "text" || text == nullptr ||
        !text->is_string()) {
      return invalid_param(param, at + " must be {\"type\": \"text\", \"text\": string} (only text is supported), got " +
                                      json_excerpt(parts[i]));
    }
    out += text->get_string();
  }
  return std::nullopt;
}

std::optional<api_error> read_messages(const boost::json::object& obj, std::vector<chat_message>& out) {
  const auto* messages = field(obj, "messages");
  if (messages == nullptr) return invalid_param("messages", "messages is required (an array of {role, content})");
  if (!messages->is_array()) {
    return invalid_param("messages", "messages must be an array of {role, content}, got " +
                                         std::string(json_kind_name(*messages)));
  }
  const auto& arr = messages->get_array();
  if (arr.empty()) return invalid_param("messages", "messages must not be empty");
  for (size_t i = 0; i < arr.size(); ++i) {
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!arr[i].is_object()) {
      return invalid_param(at, at + " must be an object {role, content}, got " + std::string(json_kind_name(arr[i])));
    }
    const auto& m = arr[i].get_object();
    chat_message msg;
    const auto* role = field(m, "role");
    if (role == nullptr || !role->is_string() || role->get_string().empty()) {
      return invalid_param(at + ".role", at + ".role must be a non-empty string");
    }
    msg.role = role->get_string();
    for (const char* calls : {"tool_calls", "function_call"}) {
      if (const auto* v = field(m, calls); v && !(v->is_array() && v->get_array().empty())) {
        return invalid_param(at + "." + calls, at + "." + calls + ": tool calls in messages are not supported by this server");
      }
    }
    if (auto e = read_content(field(m, "content"), at + ".content", msg.content)) return e;
    out.push_back(std::move(msg));
  }
  return std::nullopt;
}

boost::json::object envelope(const completion_state& state, const char* object, boost::json::object choice) {
  return openai_envelope(state, "chatcmpl-", object, std::move(choice));
}

boost::json::object chunk(const completion_state& state, boost::json::object delta, bool final, size_t lp_from = 0,
                          size_t lp_to = 0) {
  boost::json::object choice;
  choice["index"] = 0;
  choice["delta"] = std::move(delta);
  if (state.logprobs && lp_from < lp_to) {
    choice["logprobs"] = chat_logprobs(state, lp_from, lp_to);
  } else {
    choice["logprobs"] = nullptr;
  }
  choice["finish_reason"] = final ? finish_reason_value(state) : nullptr;
  return envelope(state, "chat.completion.chunk", std::move(choice));
}

}  // namespace

parse_result<completion_call> parse_chat(std::string_view body, const model_info& info, const text_support& text) {
  auto parsed = parse_object_body(body);
  if (auto* e = std::get_if<api_error>(&parsed)) return std::move(*e);
  const boost::json::object& obj = std::get<boost::json::object>(parsed);

  completion_call call;
  call.kind = api_kind::kChat;
  if (!text.tokenizer) {
    return invalid_param("messages", "this model has no tokenizer: chat needs one (use /generate with input_ids)");
  }
  if (!text.chat) {
    return invalid_param("messages", "this model has no chat template: set `chat` in the server configuration");
  }
  call.ignored_fields = unknown_openai_fields(
      obj, {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed",
            "stop", "stream", "n", "stop_token_ids", "ignore_eos", "sparse", "user", "stream_options", "logprobs",
            "top_logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "min_tokens",
            "response_format", "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call", "echo",
            "best_of", "suffix"});
  if (auto e = refuse_unimplemented(obj)) return std::move(*e);
  if (const auto* v = field(obj, "logprobs"); v && !v->is_null()) {
    if (auto e = read_bool(*v, "logprobs", call.sampling.logprobs)) return std::move(*e);
  }
  if (const auto* v = field(obj, "top_logprobs"); v && !v->is_null()) {
    if (auto e = read_top_logprobs(*v, "top_logprobs", call.sampling.top_logprobs)) return std::move(*e);
    if (call.sampling.top_logprobs > 0 && !call.sampling.logprobs)
      return invalid_param("top_logprobs", "top_logprobs needs logprobs: true");
  }
  if (const auto* v = field(obj, "echo"); v && !(v->is_bool() && !v->get_bool()))
    return invalid_param("echo", "echo: echoing the prompt is supported on /v1/completions only");
  std::vector<chat_message> messages;
  if (auto e = read_messages(obj, messages)) return std::move(*e);
  // The format's bos stands for the model's BOS; message content never becomes a special token.
  try {
    call.input_ids = encode_chat(*text.tokenizer, *text.chat, messages);
  } catch (const error& e) {
    return invalid_param("messages", std::string("messages: ") + e.what());
  }
  if (call.input_ids.empty()) return invalid_param("messages", "messages encode to no tokens");

  if (const auto* n = field(obj, "n")) {
    int64_t count = 0;
    if (auto e = read_integer(*n, "n", count)) return std::move(*e);
    if (count != 1) return invalid_param("n", "only n = 1 is supported, got " + std::to_string(count));
  }
  // max_completion_tokens replaces the older max_tokens; both with different values is ambiguous.
  const auto* max_new = field(obj, "max_completion_tokens");
  if (const auto* old = field(obj, "max_tokens");
      max_new && old && !max_new->is_null() && !old->is_null() && *max_new != *old)
    return invalid_param("max_tokens", "max_tokens and max_completion_tokens differ (" + boost::json::serialize(*old) +
                                           " and " + boost::json::serialize(*max_new) + "): send one of them");
  sampling_keys keys;
  keys.max_new_tokens = max_new && !max_new->is_null() ? "max_completion_tokens" : "max_tokens";
  call.sampling.max_new_tokens = info.max_context;  // reduced to what fits by check_context
  call.sampling.temperature = kDefaultTemperature;
  bool max_given = false;
  if (auto e = read_sampling(obj, keys, info, call.sampling, max_given)) return std::move(*e);
  call.sampling.stop_token_ids.insert(call.sampling.stop_token_ids.end(), text.chat->stop_token_ids.begin(),
                                      text.chat->stop_token_ids.end());
  call.stop_strings = text.chat->stop;
  if (const auto* stop = field(obj, "stop")) {
    if (auto e = read_stop_strings(*stop, "stop", call.stop_strings)) return std::move(*e);
  }
  if (const auto* s = field(obj, "stream")) {
    if (auto e = read_bool(*s, "stream", call.stream)) return std::move(*e);
  }
  if (auto e = check_context(call.input_ids.size(), "messages", keys, info, max_given, call.sampling)) {
    return std::move(*e);
  }
  return call;
}

boost::json::object chat_response(const completion_state& state) {
  boost::json::object message;
  message["role"] = "assistant";
  message["content"] = state.text;
  boost::json::object choice;
  choice["index"] = 0;
  choice["message"] = std::move(message);
  if (state.logprobs) {
    choice["logprobs"] = chat_logprobs(state, 0, state.output_ids.size());
  } else {
    choice["logprobs"] = nullptr;
  }
  choice["finish_reason"] = finish_reason_value(state);
  boost::json::object out = envelope(state, "chat.completion", std::move(choice));
  out["usage"] = openai_usage(state);
  return out;
}

boost::json::object chat_role_chunk(const completion_state& state) {
  boost::json::object delta;
  delta["role"] = "assistant";
  delta["content"] = "";
  return chunk(state, std::move(delta), false);
}

boost::json::object chat_content_chunk(const completion_state& state, std::string_view content, size_t lp_from,
                                       size_t lp_to) {
  boost::json::object delta;
  delta["content"] = content;
  return chunk(state, std::move(delta), false, lp_from, lp_to);
}

boost::json::object chat_final_chunk(const completion_state& state, size_t lp_from, size_t lp_to) {
  boost::json::object out = chunk(state, boost::json::object(), true, lp_from, lp_to);
  out["usage"] = openai_usage(state);
  return out;
}

}  // namespace hyserve::coordinator::api
