#pragma once
// POST /v1/completions (OpenAI style), for a model served without a tokenizer.
//
// Request: prompt (token-id array, or an array holding one such array; strings are refused),
// max_tokens (default 16), temperature (default 1.0), top_p, seed, stop (token ids only; also
// accepted as the `stop_token_ids` extension), stream, n (1 only); extensions top_k,
// ignore_eos. Unknown fields are ignored.
// Response: {"id": "cmpl-<id>", "object": "text_completion", "created", "model",
//            "choices": [{"index": 0, "text": "", "token_ids": [...], "logprobs": null,
//                         "finish_reason": "stop"|"length"|"abort"|null}],
//            "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}}
// Stream chunks have the same shape with the new token ids; the last one carries the
// finish_reason and the usage.
#include <cstdint>
#include <span>
#include <string_view>

#include <boost/json/object.hpp>

#include "coordinator/api/api_error.h"
#include "coordinator/api/completion_call.h"

namespace hyserve::coordinator::api {

parse_result<completion_call> parse_completion(std::string_view body, const model_info& info);

boost::json::object completion_response(const completion_state& state);
boost::json::object completion_chunk(const completion_state& state, std::span<const int32_t> new_ids);

}  // namespace hyserve::coordinator::api
