#pragma once
// Validation shared by /generate and /v1/completions: sampling fields and context limits.
// The two APIs spell the fields differently, so the readers take the field names.
#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/object.hpp>

#include "coordinator/api/api_error.h"
#include "coordinator/request.h"
#include "hyserve/tokenizer/bpe_tokenizer.h"

namespace hyserve::coordinator::api {

// Where the sampling fields sit in a request: `prefix` + key is the param path reported in
// errors ("sampling_params." for /generate, "" for /v1/completions).
struct sampling_keys {
  std::string prefix;
  std::string max_new_tokens = "max_new_tokens";
  std::string temperature = "temperature";
  std::string top_p = "top_p";
  std::string top_k = "top_k";
  std::string seed = "seed";
  std::string stop_token_ids = "stop_token_ids";
  std::string ignore_eos = "ignore_eos";
  std::string sparse = "sparse";  // false: this request's decode attention stays dense
  std::string repetition_penalty = "repetition_penalty";
  std::string presence_penalty = "presence_penalty";
  std::string frequency_penalty = "frequency_penalty";
  std::string min_tokens = "min_tokens";  // /generate: min_new_tokens
  std::string logit_bias = "logit_bias";

  std::string param(std::string_view key) const { return prefix + std::string(key); }
};

inline constexpr int kMaxLogitBias = 300;           // logit_bias entries per request
inline constexpr double kMaxRepetitionPenalty = 100.0;
inline constexpr int kMaxTopLogprobs = 20;         // logprobs / top_logprobs

// Reads the sampling fields present in `obj` over the defaults already in `out`. Sets
// `max_new_tokens_given` when the request set it. Checks, in the types the worker uses (float
// sampling values): max_new_tokens in [0, max_context], temperature 0 or a normal float
// ([1.17549435e-38, 3.40282347e+38]), top_p in (0, 1] and a normal float, top_k >= -1, stop ids
// inside the vocabulary, ignore_eos and sparse booleans; repetition_penalty in (0, kMaxRepetitionPenalty],
// presence_penalty and frequency_penalty in [-2, 2], min_tokens >= 0 (and <= max_new_tokens,
// checked by check_context), logit_bias an object of at most kMaxLogitBias token-id keys with
// values in [-100, 100].
std::optional<api_error> read_sampling(const boost::json::object& obj, const sampling_keys& keys, const model_info& info,
                                       sampling_params& out, bool& max_new_tokens_given);

// The fields of `obj` not in `known`, in the object's order.
std::vector<std::string> unknown_fields(const boost::json::object& obj, std::initializer_list<std::string_view> known);

// OpenAI parameters that change the output and that this server does not implement: a 400
// naming the parameter when one is given a value other than its default (suffix, best_of > 1,
// response_format other than text, tools / tool_choice / functions; other servers' min_p,
// use_beam_search, prompt_logprobs, guided_*, structured_outputs, bad_words, allowed_token_ids,
// include_stop_str_in_output, truncate_prompt_tokens, chat_template, continue_final_message,
// add_generation_prompt: false; OpenAI's audio and modalities other than ["text"]).
std::optional<api_error> refuse_unimplemented(const boost::json::object& obj);

// unknown_fields for an OpenAI route: the fields refuse_unimplemented reads are known too.
std::vector<std::string> unknown_openai_fields(const boost::json::object& obj,
                                               std::initializer_list<std::string_view> known);

// Checks the prompt against the context limit and fits max_new_tokens: an explicit value over
// the limit is an error naming both numbers and the limit; a default is reduced to what fits.
// Then min_tokens must not exceed max_new_tokens.
std::optional<api_error> check_context(size_t prompt_tokens, std::string_view prompt_param, const sampling_keys& keys,
                                       const model_info& info, bool max_new_tokens_given, sampling_params& sampling);

// Stop strings: a string or an array of strings (none empty), appended to `out`.
std::optional<api_error> read_stop_strings(const boost::json::value& v, std::string_view param,
                                           std::vector<std::string>& out);

// An integer number of top logprobs in [0, kMaxTopLogprobs] (`param` names it in errors).
std::optional<api_error> read_top_logprobs(const boost::json::value& v, std::string_view param, int32_t& out);

// True for a string, or a non-empty array of strings: text where token ids could also go.
bool is_text_value(const boost::json::value& v);

// Token ids of `text` (special tokens written in it are recognised, as the `tokenizers`
// library does by default). Empty results are refused.
std::optional<api_error> encode_text(const tokenizer::bpe_tokenizer& tok, std::string_view text, std::string_view param,
                                     const tokenizer::encode_options& options, std::vector<int32_t>& out);

}  // namespace hyserve::coordinator::api
