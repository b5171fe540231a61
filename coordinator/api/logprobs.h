#pragma once
// Logprobs in the shapes of each API (README, Sampling parameters): the OpenAI completions
// object {tokens, token_logprobs, top_logprobs, text_offset}, the OpenAI chat object
// {content: [{token, logprob, bytes, top_logprobs}]}, and /generate's meta_info fields
// output_token_logprobs [[logprob, id], …] and output_top_logprobs [[[logprob, id], …], …].
// A logprob the worker could not give (none) is null.
#include <cstddef>
#include <string>

#include <boost/json/object.hpp>

#include "coordinator/api/completion_call.h"

namespace hyserve::coordinator::api {

// The text of token `id`: its bytes when they are valid UTF-8, else "bytes:\xNN…" (as vLLM
// writes partial characters); "token_id:N" without a tokenizer.
std::string token_text(const completion_state& state, int32_t id);

// Output tokens [from, to) of the state as the completions `logprobs` object. text_offset
// counts bytes of the answer's text (after the echoed prompt when echo is on).
boost::json::object completion_logprobs(const completion_state& state, size_t from, size_t to);

// Output tokens [from, to) as the chat `logprobs` object.
boost::json::object chat_logprobs(const completion_state& state, size_t from, size_t to);

// Adds output_token_logprobs (and output_top_logprobs) of every output token to meta_info.
void add_generate_logprobs(const completion_state& state, boost::json::object& meta);

}  // namespace hyserve::coordinator::api
