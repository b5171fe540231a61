#pragma once
// Streaming decode: ids arrive one at a time and text leaves as soon as it is complete UTF-8.
// A byte-level token may end in the middle of a character (an emoji is often 2-4 tokens), so
// the bytes of an incomplete trailing character are held back until the next token completes
// them. Every delta is valid UTF-8, and the deltas concatenated (plus finish()) equal
// bpe_tokenizer::decode of all the ids: invalid bytes become U+FFFD exactly as there.
#include <cstdint>
#include <string>

#include "hyserve/tokenizer/bpe_tokenizer.h"

namespace hyserve::tokenizer {

class incremental_detokenizer {
 public:
  // `tok` must outlive the detokenizer.
  explicit incremental_detokenizer(const bpe_tokenizer& tok, const decode_options& options = {});

  // Adds one generated id; returns the text that became complete (often empty mid-character).
  std::string push(int32_t id);
  // Same, appending to `out`; returns the number of bytes appended.
  size_t push(int32_t id, std::string& out);

  // End of the stream: returns the held-back bytes as U+FFFD (empty when nothing is held).
  std::string finish();

  // Bytes held back (0..3) waiting for the rest of a character.
  size_t held_bytes() const { return pending_.size(); }

 private:
  const bpe_tokenizer* tok_;
  decode_options options_;
  std::string pending_;  // undecoded bytes: at most an incomplete character between calls
};

}  // namespace hyserve::tokenizer
