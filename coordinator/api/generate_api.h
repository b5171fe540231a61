#pragma once
// POST /generate (SGLang style).
//
// Request: {"input_ids": [int...] | "text": str (400 when the model has no tokenizer),
//           "sampling_params": {max_new_tokens, temperature, top_p, top_k, seed, stop_token_ids,
//                               stop (string or strings; needs a tokenizer), ignore_eos},
//           "stream": bool}
// Response: {"output_ids": [...], "text"?, "meta_info": {"id", "prompt_tokens", "completion_tokens",
//            "finish_reason": {"type": "stop"|"length"|"abort"} | null, "latency_ms",
//            "spec_accept_rate"?}}
// "text" (the output text, stop strings trimmed) is there whenever the model has a tokenizer.
// Stream chunk: {"output_ids": [all so far], "new_ids": [...], "text"? (all so far),
//                "meta_info": {...}}
// Unknown top-level fields are ignored.
#include <cstdint>
#include <span>
#include <string_view>

#include <boost/json/object.hpp>

#include "coordinator/api/api_error.h"
#include "coordinator/api/completion_call.h"
#include "coordinator/api/text_support.h"

namespace hyserve::coordinator::api {

parse_result<completion_call> parse_generate(std::string_view body, const model_info& info, const text_support& text);

boost::json::object generate_response(const completion_state& state);
// A streamed chunk: new_ids, and the whole output so far (output_ids, text: SGLang's format),
// or with state.incremental_stream only this chunk's ids and text (output_ids = new_ids, text =
// new_text), so that a chunk's size does not grow with the output.
boost::json::object generate_chunk(const completion_state& state, std::span<const int32_t> new_ids,
                                   std::string_view new_text);

}  // namespace hyserve::coordinator::api
