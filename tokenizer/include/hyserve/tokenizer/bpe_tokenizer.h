#pragma once
// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (GPT-2, Llama-3, Qwen,
// Granite and Nemotron families). Encoding reproduces the `tokenizers` library: added tokens
// are matched first (longest match at the leftmost position, never split), the rest goes
// through the normalizer, the pre-tokenizer (Split / ByteLevel / Digits steps) and BPE merges
// by rank; the post-processor template adds its special tokens when asked.
//
// Supported components (anything else is a format_error naming the field at load):
//   model          BPE: vocab, merges as "a b" strings or ["a", "b"] pairs, unk_token (fuse_unk),
//                  ignore_merges; byte_fallback must be false, dropout null or 0, no subword
//                  prefix/suffix.
//   normalizer     null, Sequence, Prepend, Replace (String or Regex pattern). Unicode
//                  normalization forms (NFC, NFD, NFKC, NFKD) are refused.
//   pre_tokenizer  ByteLevel (add_prefix_space, use_regex with the GPT-2 pattern), Split (Regex
//                  or String pattern, every behavior, invert), Digits, Sequence of these. A
//                  ByteLevel step is required and must come last.
//   post_processor null, ByteLevel (offsets only: no effect on ids), TemplateProcessing (the
//                  "single" template: special tokens before and after the sequence),
//                  RobertaProcessing / BertProcessing (cls before, sep after), Sequence.
//   decoder        ByteLevel, or a Sequence of ByteLevel.
//   added_tokens   special and not; lstrip, rstrip, single_word honoured; all matched against
//                  the raw text ("normalized": true tokens too: with the supported normalizers
//                  this only differs when a Prepend/Replace normalizer creates the token).
// truncation and padding are ignored: encode never truncates or pads; the "pair" template is
// ignored (only single sequences are encoded).
//
// Known differences from `tokenizers`: regexes run on PCRE2 rather than Oniguruma (same
// syntax for the patterns these families ship; PCRE2's \s also matches U+180E); added tokens
// decode to their content verbatim rather than through the ByteLevel decoder (which would
// garble Latin-1 characters in their content); single_word uses [\p{L}\p{N}] as word
// characters.
//
// Thread safety: a loaded tokenizer is immutable apart from an internal word cache guarded by
// its own locks; encode and decode may run concurrently from any number of threads.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hyserve/common/error.h"

namespace hyserve::tokenizer {

struct encode_options {
  // Apply the post-processor template (e.g. a BOS token before the text), as `tokenizers`
  // does by default.
  bool add_special_tokens = true;
  // Recognise special added tokens written in the text ("<|im_start|>"). When false their
  // text is tokenized like any other (the `split_special_tokens` option of `tokenizers`);
  // non-special added tokens are always recognised.
  bool match_special_tokens = true;
};

struct decode_options {
  // Drop special added tokens from the text (the usual choice for generated output).
  bool skip_special_tokens = true;
};

class bpe_tokenizer {
 public:
  // Loads tokenizer.json. Throws format_error naming the file and the field for malformed or
  // unsupported content, and when the file cannot be read.
  static bpe_tokenizer from_file(const std::string& path);
  // Same from the JSON text; `source` names it in error messages.
  static bpe_tokenizer from_json(std::string_view json_text, const std::string& source = "tokenizer.json");

  bpe_tokenizer(bpe_tokenizer&&) noexcept;
  bpe_tokenizer& operator=(bpe_tokenizer&&) noexcept;
  ~bpe_tokenizer();

  // Token ids of `text`. Throws invalid_argument_error when `text` is not valid UTF-8.
  std::vector<int32_t> encode(std::string_view text, const encode_options& options = {}) const;
  // Appends the ids to `out` (reuses its storage across calls).
  void encode_into(std::string_view text, std::vector<int32_t>& out, const encode_options& options = {}) const;

  // The words the BPE model sees for `text`, as raw bytes, in order: the text between added
  // tokens after normalization and pre-tokenization (the added tokens themselves are not
  // listed). For inspecting Split patterns; encode does not go through it.
  std::vector<std::string> pre_tokenize(std::string_view text, const encode_options& options = {}) const;

  // Text of `ids`: token bytes joined, invalid UTF-8 replaced by U+FFFD. Ids that name no
  // token (negative, or in the padding past the vocabulary) are skipped, as `tokenizers` does.
  std::string decode(std::span<const int32_t> ids, const decode_options& options = {}) const;

  // Raw bytes token `id` stands for (possibly a partial UTF-8 character); empty for ids that
  // name no token.
  std::string_view token_bytes(int32_t id) const;
  // True for ids that name a token (vocabulary or added).
  bool is_known(int32_t id) const;
  // True for added tokens marked "special".
  bool is_special(int32_t id) const;

  // Id of a token given as written in tokenizer.json (vocabulary strings are in byte-level
  // form, e.g. "Ġthe"; added tokens as their content).
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The tokenizer.json string of `id`; empty for ids that name no token.
  std::string_view id_to_token(int32_t id) const;

  // One past the largest token id (vocabulary and added tokens).
  int32_t vocab_size() const;
  // Ids the post-processor puts before and after the text when add_special_tokens is set.
  std::span<const int32_t> template_prefix() const;
  std::span<const int32_t> template_suffix() const;

  struct impl;

 private:
  explicit bpe_tokenizer(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace hyserve::tokenizer
