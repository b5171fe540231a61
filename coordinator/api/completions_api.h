#pragma once
// POST /v1/completions (OpenAI style).
//
// Request: prompt (a string, or an array holding one string, when the model has a tokenizer;
// a token-id array, or an array holding one such array), max_tokens (default 16), temperature
// (default 1.0), top_p, seed, stop (a string or strings, with a tokenizer; or token ids, also
// accepted as the `stop_token_ids` extension), stream, n (1 only); extensions top_k,
// ignore_eos. Unknown fields are ignored.
// Response: {"id": "cmpl-<id>", "object": "text_completion", "created", "model",
//            "choices": [{"index": 0, "text": "...", "token_ids": [...], "logprobs": null,
//                         "finish_reason": "stop"|"length"|"abort"|null}],
//            "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}}
// "text" is the output text (stop strings trimmed); "" when the model has no tokenizer.
// Stream chunks have the same shape with the new token ids and the new text; the last one
// carries the finish_reason and the usage.
#include <cstdint>
#include <span>
#include <string_view>

#include <boost/json/object.hpp>

#include "coordinator/api/api_error.h"
#include "coordinator/api/completion_call.h"
#include "coordinator/api/text_support.h"

namespace hyserve::coordinator::api {

parse_result<completion_call> parse_completion(std::string_view body, const model_info& info, const text_support& text);

boost::json::object completion_response(const completion_state& state);
// `new_text`: the text that became final with these ids; `output`: they are the last output ids
// of the state (false for the echoed prompt), whose logprobs the chunk carries when asked.
boost::json::object completion_chunk(const completion_state& state, std::span<const int32_t> new_ids,
                                     std::string_view new_text, bool output = true);

}  // namespace hyserve::coordinator::api
