#pragma once
// Text in and out of the generation APIs: the tokenizer (when the model has one), the chat
// prompt format, and text_stream, which turns a request's generated ids into text deltas,
// holding back incomplete UTF-8 and anything that may still become a stop string.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "hyserve/tokenizer/bpe_tokenizer.h"
#include "hyserve/tokenizer/incremental_detokenizer.h"
#include "hyserve/tokenizer/stop_string_matcher.h"

namespace hyserve::coordinator::api {

// How /v1/chat/completions renders messages (see service_config::chat_section):
//   bos + message_template(m1) + ... + message_template(mn) + generation_prompt
struct chat_format {
  std::string message_template;  // "{role}" and "{content}" are replaced
  std::string generation_prompt;
  std::string bos;
  std::vector<std::string> stop;        // stop strings of every chat request
  std::vector<int32_t> stop_token_ids;  // e.g. the id of "<|im_end|>"
};

struct chat_message {
  std::string role;
  std::string content;
};

struct text_support {
  std::shared_ptr<const tokenizer::bpe_tokenizer> tokenizer;  // null: token ids only
  std::optional<chat_format> chat;                            // null: no chat endpoint
};

// The prompt text of a conversation, ending with the generation prompt.
std::string render_chat(const chat_format& format, std::span<const chat_message> messages);

// The token ids of render_chat(format, messages): only the format's own text (bos, template,
// generation prompt) may hold special tokens; roles and message content are tokenized with
// special-token matching off, so a user who writes "<|im_end|>" gets those characters, not the
// turn-ending token. Throws invalid_argument_error for text that is not valid UTF-8.
std::vector<int32_t> encode_chat(const tokenizer::bpe_tokenizer& tok, const chat_format& format,
                                 std::span<const chat_message> messages);

// One request's output text. push() takes generated ids in order and returns the text that is
// final: complete UTF-8, before any stop string, and not a prefix of one.
class text_stream {
 public:
  // `tok` must outlive the stream. The text of the first `min_tokens` ids is never searched for
  // stop strings (sampling_params.min_tokens, as vLLM: no stop before that many tokens).
  text_stream(const tokenizer::bpe_tokenizer& tok, std::vector<std::string> stop_strings, int32_t min_tokens = 0);

  struct update {
    std::string delta;     // text that became final
    bool stopped = false;  // a stop string matched: the text ends before it
    size_t consumed = 0;   // ids taken from the pushed span (all, unless stopped earlier)
  };

  // Adds ids; after a stop, the rest of `ids` is not consumed.
  update push(std::span<const int32_t> ids);
  // End of generation (no stop string): the held-back text.
  std::string finish();

  bool stopped() const { return matcher_.stopped(); }
  const std::string& text() const { return text_; }  // everything emitted so far

 private:
  tokenizer::incremental_detokenizer detok_;
  tokenizer::stop_string_matcher matcher_;
  std::string text_;
  int32_t min_tokens_ = 0;
  int64_t pushed_ = 0;
};

}  // namespace hyserve::coordinator::api
