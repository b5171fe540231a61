#pragma once
// The parts of an OpenAI-style answer that /v1/completions and /v1/chat/completions share:
// the envelope around the one choice, the usage block and the finish_reason value.
#include <string_view>

#include <boost/json.hpp>

#include "coordinator/api/completion_call.h"

namespace hyserve::coordinator::api {

// {"id": id_prefix + state.id, "object": object, "created", "model", "choices": [choice]}.
boost::json::object openai_envelope(const completion_state& state, std::string_view id_prefix, const char* object,
                                    boost::json::object choice);

// {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details": {"cached_tokens"}}.
boost::json::object openai_usage(const completion_state& state);

// "stop" | "length" | "abort" once the request has finished, else null.
boost::json::value finish_reason_value(const completion_state& state);

}  // namespace hyserve::coordinator::api
