#pragma once
// Added tokens (special or not) are found in the raw text before anything else and never
// split: at the leftmost position where some token matches, the longest token wins (the
// leftmost-longest Aho-Corasick semantics of `tokenizers`). Internal to the tokenizer library.
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pattern.h"

namespace hyserve::tokenizer {

struct added_token {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;       // swallow whitespace before the match
  bool rstrip = false;       // swallow whitespace after the match
  bool single_word = false;  // match only when not inside a word
};

// A piece of the input: plain text to tokenize, or one added token.
struct text_segment {
  size_t begin;
  size_t end;
  int32_t token_id;  // -1 for plain text
};

class added_vocabulary {
 public:
  // `word_char` is a pattern matching one letter or digit; needed only when some token is
  // single_word (may be null otherwise).
  added_vocabulary(std::vector<added_token> tokens, std::shared_ptr<const split_pattern> word_char);

  bool empty() const { return tokens_.empty(); }
  const std::vector<added_token>& tokens() const { return tokens_; }

  // Cuts `text` into plain-text segments and added tokens, in order; plain segments are
  // never empty. Special tokens are skipped (left in the text) when match_special is false.
  void split(std::string_view text, bool match_special, match_scratch& match, std::vector<text_segment>& out) const;

 private:
  // Trie over the token contents; the root fans out through a 256-entry table.
  struct node {
    std::vector<std::pair<uint8_t, int32_t>> next;  // (byte, child node)
    int32_t token = -1;                             // index in tokens_ ending here
  };
  int32_t child(int32_t node_index, uint8_t b) const;
  bool is_word_char_before(std::string_view text, size_t pos, match_scratch& match) const;
  bool is_word_char_at(std::string_view text, size_t pos, match_scratch& match) const;

  std::vector<added_token> tokens_;
  std::vector<node> nodes_;
  std::array<int32_t, 256> root_{};
  std::shared_ptr<const split_pattern> word_char_;
};

}  // namespace hyserve::tokenizer
