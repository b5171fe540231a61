#include "coordinator/api/validation.h"

#include <algorithm>
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
  s << v;
  return s.str();
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
    out.temperature = static_cast<float>(t);
  }
  if (const auto* v = field(obj, keys.top_p)) {
    const std::string param = keys.param(keys.top_p);
    double p = 0.0;
    if (auto e = read_number(*v, param, p)) return e;
    if (!(p > 0.0 && p <= 1.0)) return invalid_param(param, param + " must be in (0, 1], got " + number_text(p));
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
      return std::nullopt;
    }
    const std::string param = keys.param(keys.max_new_tokens);
    return invalid_param(param, "the prompt (" + std::to_string(prompt) + " tokens) + " + keys.max_new_tokens + " (" +
                                    std::to_string(sampling.max_new_tokens) + ") = " +
                                    std::to_string(prompt + sampling.max_new_tokens) +
                                    " tokens is over the context limit of " + std::to_string(limit) + " tokens");
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
