#pragma once
// The state behind bpe_tokenizer: what the loader builds and encode/decode read.
#include <string>
#include <unordered_map>
#include <vector>

#include "added_vocabulary.h"
#include "bpe_model.h"
#include "hyserve/tokenizer/bpe_tokenizer.h"
#include "pre_tokenizer.h"

namespace hyserve::tokenizer {

struct bpe_tokenizer::impl {
  impl(bpe_model m, added_vocabulary a) : model(std::move(m)), added(std::move(a)) {}

  bpe_model model;
  added_vocabulary added;
  std::vector<normalize_step> normalizers;
  std::vector<pre_split_step> pre_steps;  // the last one is the ByteLevel step
  std::vector<int32_t> prefix_ids;        // post-processor template before the text
  std::vector<int32_t> suffix_ids;        // ... and after it

  // Per id (size vocab_size): raw bytes it decodes to, its tokenizer.json string, flags.
  enum : uint8_t { kKnown = 1, kSpecial = 2 };
  std::vector<std::string> id_bytes;
  std::vector<std::string> id_strings;
  std::vector<uint8_t> id_flags;
  token_id_map string_to_id;  // vocabulary, then added tokens (they win)
};

}  // namespace hyserve::tokenizer
