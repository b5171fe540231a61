#pragma once
// POST /v1/chat/completions (OpenAI style). Needs a tokenizer and a chat format (config `chat`).
//
// Request: messages [{role, content}] (content a string, or an array of {"type": "text",
// "text"} parts), max_tokens or max_completion_tokens (default: what fits the context),
// temperature (default 1.0), top_p, seed, stop (a string or strings), stream, n (1 only);
// extensions top_k, ignore_eos, stop_token_ids. Unknown fields (model, stream_options, ...) are
// ignored.
// Response: {"id": "chatcmpl-<id>", "object": "chat.completion", "created", "model",
//            "choices": [{"index": 0, "message": {"role": "assistant", "content": "..."},
//                         "logprobs": null, "finish_reason": "stop"|"length"|"abort"}],
//            "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}}
// Streaming: "chat.completion.chunk" objects: first delta {"role": "assistant", "content": ""},
// then {"content": "..."} deltas, then an empty delta with the finish_reason and the usage.
#include <string_view>

#include <boost/json/object.hpp>

#include "coordinator/api/api_error.h"
#include "coordinator/api/completion_call.h"
#include "coordinator/api/text_support.h"

namespace hyserve::coordinator::api {

parse_result<completion_call> parse_chat(std::string_view body, const model_info& info, const text_support& text);

boost::json::object chat_response(const completion_state& state);
boost::json::object chat_role_chunk(const completion_state& state);
// With logprobs on, the chunks carry the logprobs of output tokens [lp_from, lp_to).
boost::json::object chat_content_chunk(const completion_state& state, std::string_view content, size_t lp_from = 0,
                                       size_t lp_to = 0);
boost::json::object chat_final_chunk(const completion_state& state, size_t lp_from = 0, size_t lp_to = 0);

}  // namespace hyserve::coordinator::api
