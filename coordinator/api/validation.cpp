#include "coordinator/api/validation.h"

#include <algorithm>
#include <cctype>
#include <exception>
#include <utility>
#include <cmath>
#include <limits>
#include <sstream>

#include "coordinator/api/json_fields.h"
#include "hyserve/common/error.h"
#include "hyserve/common/json.h"

namespace hyserve::coordinator::api {
namespace {

std::string number_text(double v) {
  std::ostringstream s;
  s.precision(9);
  s << v;
  return s.str();
}

constexpr double kFloatMax = static_cast<double>(std::numeric_limits<float>::max());
constexpr double kFloatMin = static_cast<double>(std::numeric_limits<float>::min());  // smallest normal

api_error not_implemented(const std::string& param, const std::string& what) {
  return invalid_param(param, param + ": " + what + " is not supported by this server");
}

}  // namespace

std::optional<api_error> read_sampling(const boost::json::object& obj, const sampling_keys& keys, const model_info& info,
                                       sampling_params& out, bool& max_new_tokens_given) {
  max_new_tokens_given = false;
  if (const auto* v = field(obj, keys.max_new_tokens)) {
    const std::string param = keys.param(keys.max_new_tokens);
    int64_t n = 0;
    if (auto e = read_integer(*v, param, n)) return e;
    if (n < 0) return invalid_param(param, param + " must be >= 0, got " + std::to_string(n));
    if (n > info.max_context) {
      return invalid_param(param, param + " " + std::to_string(n) + " is over the context limit of " +
                                      std::to_string(info.max_context) + " tokens");
    }
    out.max_new_tokens = static_cast<int32_t>(n);
    max_new_tokens_given = true;
  }
  if (const auto* v = field(obj, keys.temperature)) {
    const std::string param = keys.param(keys.temperature);
    double t = 0.0;
    if (auto e = read_number(*v, param, t)) return e;
    if (!std::isfinite(t) || t < 0.0) {
      return invalid_param(param, param + " must be a finite number >= 0, got " + number_text(t));
    }
    // The worker samples in float: 0 (greedy) or a normal float, so that logits / temperature
    // stays finite.
    if (t != 0.0 && (t > kFloatMax || t < kFloatMin)) {
      return invalid_param(param, param + " must be 0 or in [" + number_text(kFloatMin) + ", " + number_text(kFloatMax) +
                                      "] (the worker's float range), got " + number_text(t));
    }
    out.temperature = static_cast<float>(t);
  }
  if (const auto* v = field(obj, keys.top_p)) {
    const std::string param = keys.param(keys.top_p);
    double p = 0.0;
    if (auto e = read_number(*v, param, p)) return e;
    if (!(p > 0.0 && p <= 1.0)) return invalid_param(param, param + " must be in (0, 1], got " + number_text(p));
    if (p < kFloatMin) {
      return invalid_param(param, param + " must be in [" + number_text(kFloatMin) +
                                      ", 1] (the worker's float range), got " + number_text(p));
    }
    out.top_p = static_cast<float>(p);
  }
  if (const auto* v = field(obj, keys.top_k)) {
    const std::string param = keys.param(keys.top_k);
    int64_t k = 0;
    if (auto e = read_integer(*v, param, k)) return e;
    if (k < -1) return invalid_param(param, param + " must be -1 (off), 0 (off) or positive, got " + std::to_string(k));
    // A top_k at or over the vocabulary keeps every token, like no top_k.
    out.top_k = static_cast<int32_t>(std::min<int64_t>(k, std::min<int64_t>(info.vocab_size, std::numeric_limits<int32_t>::max())));
  }
  if (const auto* v = field(obj, keys.seed)) {
    uint64_t seed = 0;
    if (auto e = read_seed(*v, keys.param(keys.seed), seed)) return e;
    out.seed = seed;
  }
  if (const auto* v = field(obj, keys.stop_token_ids)) {
    if (auto e = read_token_ids(*v, keys.param(keys.stop_token_ids), info.vocab_size, out.stop_token_ids)) return e;
  }
  if (const auto* v = field(obj, keys.ignore_eos)) {
    if (auto e = read_bool(*v, keys.param(keys.ignore_eos), out.ignore_eos)) return e;
  }
  if (const auto* v = field(obj, keys.sparse)) {
    if (auto e = read_bool(*v, keys.param(keys.sparse), out.sparse)) return e;
  }
  if (const auto* v = field(obj, keys.repetition_penalty)) {
    const std::string param = keys.param(keys.repetition_penalty);
    double d = 0.0;
    if (auto e = read_number(*v, param, d)) return e;
    if (!(d > 0.0 && d <= kMaxRepetitionPenalty))
      return invalid_param(param, param + " must be in (0, " + number_text(kMaxRepetitionPenalty) + "], got " +
                                      number_text(d));
    out.repetition_penalty = static_cast<float>(d);
  }
  for (const auto& [key, target] : {std::pair<const std::string*, float*>{&keys.presence_penalty, &out.presence_penalty},
                                    std::pair<const std::string*, float*>{&keys.frequency_penalty, &out.frequency_penalty}}) {
    const auto* v = field(obj, *key);
    if (!v) continue;
    const std::string param = keys.param(*key);
    double d = 0.0;
    if (auto e = read_number(*v, param, d)) return e;
    if (!(d >= -2.0 && d <= 2.0)) return invalid_param(param, param + " must be in [-2, 2], got " + number_text(d));
    *target = static_cast<float>(d);
  }
  if (const auto* v = field(obj, keys.min_tokens)) {
    const std::string param = keys.param(keys.min_tokens);
    int64_t n = 0;
    if (auto e = read_integer(*v, param, n)) return e;
    if (n < 0 || n > info.max_context)
      return invalid_param(param, param + " must be in [0, " + std::to_string(info.max_context) +
                                      "] (the context limit), got " + std::to_string(n));
    out.min_tokens = static_cast<int32_t>(n);
  }
  if (const auto* v = field(obj, keys.logit_bias); v && !v->is_null()) {
    const std::string param = keys.param(keys.logit_bias);
    const auto* o = v->if_object();
    if (!o) return invalid_param(param, param + " must be an object mapping token ids to biases, got " +
                                            std::string(json_kind_name(*v)));
    if (o->size() > static_cast<size_t>(kMaxLogitBias))
      return invalid_param(param, param + " has " + std::to_string(o->size()) + " entries, over the limit of " +
                                      std::to_string(kMaxLogitBias));
    std::vector<std::pair<int32_t, float>> bias;
    for (const auto& kv : *o) {
      const std::string key(kv.key().data(), kv.key().size());
      const std::string at = param + "[\"" + key + "\"]";
      int64_t id = -1;
      size_t used = 0;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != key.size() || key.empty() || !(std::isdigit(static_cast<unsigned char>(key[0]))))
        return invalid_param(param, at + ": the key must be a token id (a decimal integer)");
      if (id < 0 || id >= info.vocab_size)
        return invalid_param(param, at + ": token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                        std::to_string(info.vocab_size) + ")");
      double b = 0.0;
      if (auto e = read_number(kv.value(), at, b)) return e;
      if (!(b >= -100.0 && b <= 100.0))
        return invalid_param(param, at + " must be in [-100, 100], got " + number_text(b));
      bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
    }
    std::sort(bias.begin(), bias.end());
    for (size_t i = 1; i < bias.size(); ++i)
      if (bias[i].first == bias[i - 1].first)
        return invalid_param(param, param + " names token id " + std::to_string(bias[i].first) + " twice");
    out.logit_bias = std::move(bias);
  }
  return std::nullopt;
}

std::optional<api_error> read_top_logprobs(const boost::json::value& v, std::string_view param, int32_t& out) {
  const std::string p(param);
  if (v.is_null()) {
    out = 0;
    return std::nullopt;
  }
  int64_t n = 0;
  if (auto e = read_integer(v, p, n)) return e;
  if (n < 0 || n > kMaxTopLogprobs)
    return invalid_param(p, p + " must be in [0, " + std::to_string(kMaxTopLogprobs) + "], got " + std::to_string(n));
  out = static_cast<int32_t>(n);
  return std::nullopt;
}

std::vector<std::string> unknown_fields(const boost::json::object& obj, std::initializer_list<std::string_view> known) {
  std::vector<std::string> out;
  for (const auto& kv : obj) {
    const std::string_view key(kv.key().data(), kv.key().size());
    if (std::find(known.begin(), known.end(), key) == known.end()) out.emplace_back(key);
  }
  return out;
}

namespace {

// Other servers' (and newer OpenAI) fields refuse_unimplemented checks for their default value.
constexpr std::string_view kRefusedUnlessDefault[] = {
    "min_p",          "use_beam_search",        "include_stop_str_in_output", "prompt_logprobs", "guided_json",
    "guided_regex",   "guided_choice",          "guided_grammar",             "structured_outputs",
    "allowed_token_ids", "truncate_prompt_tokens", "audio",                   "chat_template",   "bad_words",
    "modalities",     "continue_final_message", "add_generation_prompt"};

}  // namespace

std::vector<std::string> unknown_openai_fields(const boost::json::object& obj,
                                               std::initializer_list<std::string_view> known) {
  std::vector<std::string> out = unknown_fields(obj, known);
  std::erase_if(out, [](const std::string& k) {
    return std::find(std::begin(kRefusedUnlessDefault), std::end(kRefusedUnlessDefault), k) !=
           std::end(kRefusedUnlessDefault);
  });
  return out;
}

std::optional<api_error> refuse_unimplemented(const boost::json::object& obj) {
  if (const auto* v = field(obj, "suffix"); v && !(v->is_string() && v->get_string().empty()))
    return not_implemented("suffix", "suffix (insertion after the completion)");
  if (const auto* v = field(obj, "best_of")) {
    int64_t n = 0;
    if (auto e = read_integer(*v, "best_of", n)) return e;
    if (n != 1) return not_implemented("best_of", "best_of = " + std::to_string(n) + " (only 1)");
  }
  if (const auto* v = field(obj, "response_format")) {
    const auto* o = v->if_object();
    const boost::json::value* type = o ? field(*o, "type") : nullptr;
    if (!(type && type->is_string() && type->get_string() == "text"))
      return not_implemented("response_format", "response_format other than {\"type\": \"text\"}");
  }
  for (const char* name : {"tools", "functions"}) {
    if (const auto* v = field(obj, name); v && !(v->is_array() && v->get_array().empty()))
      return not_implemented(name, std::string(name) + " (tool calling)");
  }
  for (const char* name : {"tool_choice", "function_call"}) {
    if (const auto* v = field(obj, name); v && !(v->is_string() && v->get_string() == "none"))
      return not_implemented(name, std::string(name) + " other than \"none\" (tool calling)");
  }
  // Parameters of other servers (vLLM, SGLang) and newer OpenAI ones that would change the
  // output: refused unless given their default value, never ignored.
  if (const auto* v = field(obj, "min_p"); v && !v->is_null() && !(v->is_number() && v->to_number<double>() == 0.0))
    return not_implemented("min_p", "min_p other than 0");
  if (const auto* v = field(obj, "use_beam_search"); v && !v->is_null() && !(v->is_bool() && !v->get_bool()))
    return not_implemented("use_beam_search", "beam search");
  if (const auto* v = field(obj, "include_stop_str_in_output"); v && !v->is_null() && !(v->is_bool() && !v->get_bool()))
    return not_implemented("include_stop_str_in_output", "include_stop_str_in_output: true");
  for (const char* name : {"prompt_logprobs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                           "structured_outputs", "allowed_token_ids", "truncate_prompt_tokens", "audio",
                           "chat_template"}) {
    if (const auto* v = field(obj, name); v && !v->is_null()) return not_implemented(name, name);
  }
  if (const auto* v = field(obj, "bad_words"); v && !v->is_null() && !(v->is_array() && v->get_array().empty()))
    return not_implemented("bad_words", "bad_words");
  if (const auto* v = field(obj, "modalities"); v && !v->is_null()) {
    const auto* a = v->if_array();
    if (!(a && a->size() == 1 && (*a)[0].is_string() && (*a)[0].get_string() == "text"))
      return not_implemented("modalities", "modalities other than [\"text\"]");
  }
  if (const auto* v = field(obj, "continue_final_message"); v && !v->is_null() && !(v->is_bool() && !v->get_bool()))
    return not_implemented("continue_final_message", "continue_final_message: true");
  if (const auto* v = field(obj, "add_generation_prompt"); v && !v->is_null() && !(v->is_bool() && v->get_bool()))
    return not_implemented("add_generation_prompt", "add_generation_prompt: false");
  return std::nullopt;
}

std::optional<api_error> check_context(size_t prompt_tokens, std::string_view prompt_param, const sampling_keys& keys,
                                       const model_info& info, bool max_new_tokens_given, sampling_params& sampling) {
  const int64_t limit = info.max_context;
  const int64_t prompt = static_cast<int64_t>(prompt_tokens);
  if (prompt > limit) {
    return invalid_param(std::string(prompt_param), "the prompt has " + std::to_string(prompt) +
                                                        " tokens, over the context limit of " +
                                                        std::to_string(limit) + " tokens");
  }
  const int64_t room = limit - prompt;
  if (sampling.max_new_tokens > room) {
    if (!max_new_tokens_given) {
      sampling.max_new_tokens = static_cast<int32_t>(room);
      if (sampling.min_tokens > sampling.max_new_tokens) {
        const std::string param = keys.param(keys.min_tokens);
        return invalid_param(param, param + " (" + std::to_string(sampling.min_tokens) + ") must be <= the " +
                                        std::to_string(sampling.max_new_tokens) + " tokens left in the context");
      }
      return std::nullopt;
    }
    const std::string param = keys.param(keys.max_new_tokens);
    return invalid_param(param, "the prompt (" + std::to_string(prompt) + " tokens) + " + keys.max_new_tokens + " (" +
                                    std::to_string(sampling.max_new_tokens) + ") = " +
                                    std::to_string(prompt + sampling.max_new_tokens) +
                                    " tokens is over the context limit of " + std::to_string(limit) + " tokens");
  }
  if (sampling.min_tokens > sampling.max_new_tokens) {
    const std::string param = keys.param(keys.min_tokens);
    return invalid_param(param, param + " (" + std::to_string(sampling.min_tokens) + ") must be <= " +
                                    keys.max_new_tokens + " (" + std::to_string(sampling.max_new_tokens) + ")");
  }
  return std::nullopt;
}

bool is_text_value(const boost::json::value& v) {
  if (v.is_string()) return true;
  if (!v.is_array() || v.get_array().empty()) return false;
  for (const auto& e : v.get_array()) {
    if (!e.is_string()) return false;
  }
  return true;
}

std::optional<api_error> read_stop_strings(const boost::json::value& v, std::string_view param,
                                           std::vector<std::string>& out) {
  const std::string p(param);
  if (v.is_string()) {
    if (v.get_string().empty()) return invalid_param(p, p + " must not be an empty string");
    out.emplace_back(v.get_string());
    return std::nullopt;
  }
  if (!v.is_array()) {
    return invalid_param(p, p + " must be a string or an array of strings, got " + std::string(json_kind_name(v)));
  }
  const auto& arr = v.get_array();
  for (size_t i = 0; i < arr.size(); ++i) {
    const std::string at = p + "[" + std::to_string(i) + "]";
    if (!arr[i].is_string()) {
      return invalid_param(p, at + " must be a string, got " + std::string(json_kind_name(arr[i])) + " (" +
                                  json_excerpt(arr[i]) + ")");
    }
    if (arr[i].get_string().empty()) return invalid_param(p, at + " must not be an empty string");
    out.emplace_back(arr[i].get_string());
  }
  return std::nullopt;
}

std::optional<api_error> encode_text(const tokenizer::bpe_tokenizer& tok, std::string_view text, std::string_view param,
                                     const tokenizer::encode_options& options, std::vector<int32_t>& out) {
  const std::string p(param);
  if (text.empty()) return invalid_param(p, p + " must not be empty");
  out.clear();
  try {
    tok.encode_into(text, out, options);
  } catch (const error& e) {
    return invalid_param(p, p + ": " + e.what());
  }
  if (out.empty()) return invalid_param(p, p + " encodes to no tokens");
  return std::nullopt;
}

}  // namespace hyserve::coordinator::api
