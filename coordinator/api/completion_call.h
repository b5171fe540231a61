#pragma once
// A validated generation call, whichever API it came through, and the progress of one being
// answered. The API modules parse bodies into completion_call and render completion_state.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/request.h"
#include "hyserve/tokenizer/bpe_tokenizer.h"

namespace hyserve::coordinator::api {

enum class api_kind : uint8_t {
  kGenerate,     // POST /generate (SGLang style)
  kCompletions,  // POST /v1/completions (OpenAI style)
  kChat,         // POST /v1/chat/completions (OpenAI style)
};

struct completion_call {
  api_kind kind = api_kind::kGenerate;
  std::vector<int32_t> input_ids;  // non-empty, every id < vocab_size
  sampling_params sampling;        // validated; prompt + max_new_tokens <= max_context
  bool stream = false;
  // /generate `stream_options.incremental`: each streamed chunk carries only its new ids and
  // text (SGLang's incremental streaming) instead of the whole output so far.
  bool incremental_stream = false;
  std::vector<std::string> stop_strings;  // end the output before any of these (needs a tokenizer)
  // OpenAI routes: request fields the server does not know (ignored, but never silently).
  std::vector<std::string> ignored_fields;
  // /v1/completions `echo`: the prompt goes before the completion in the answer.
  bool echo = false;
  std::string echo_text;            // the prompt as text (decoded when given as token ids)
  std::vector<int32_t> echo_ids;    // the prompt's token ids
};

struct completion_state {
  uint64_t id = 0;
  std::string model;
  int64_t created = 0;  // unix seconds at arrival
  int32_t prompt_tokens = 0;
  std::vector<int32_t> output_ids;  // all generated so far (up to the one that completed a stop string)
  bool has_text = false;            // the model has a tokenizer: responses carry text
  std::string text;                 // output text so far (final: held-back bytes excluded)
  std::optional<finish_reason> finished;
  double latency_ms = 0.0;  // since arrival
  // /v1/completions with echo: the prompt, put before the output in the final answer.
  std::optional<std::string> echo_text;
  std::vector<int32_t> echo_ids;
  int64_t spec_drafted = 0;
  int64_t spec_accepted = 0;
  bool incremental_stream = false;  // completion_call::incremental_stream
  // sampling_params.logprobs / top_logprobs: one entry per output id (README, Sampling
  // parameters), and how the API reports them.
  bool logprobs = false;
  int32_t top_logprobs = 0;
  std::vector<float> output_logprobs;
  std::vector<std::vector<std::pair<int32_t, float>>> output_top_logprobs;
  const tokenizer::bpe_tokenizer* tokenizer = nullptr;  // token strings (null: "token_id:N")
  size_t logprobs_sent = 0;  // chat streams: output tokens whose logprobs went out
  int32_t cached_tokens = 0;  // prompt tokens served from the prefix cache (final event)
};

// "stop" | "length" | "abort"
inline const char* finish_reason_name(finish_reason reason) {
  switch (reason) {
    case finish_reason::kStop: return "stop";
    case finish_reason::kLength: return "length";
    case finish_reason::kAbort: return "abort";
  }
  return "abort";
}

}  // namespace hyserve::coordinator::api
