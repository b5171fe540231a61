#pragma once
// The GPT-2 bytes<->unicode table of byte-level BPE: every byte maps to one printable code
// point (printable Latin-1 bytes to themselves, the other 68 bytes to U+0100..U+0143), so
// vocabulary strings are sequences of these characters. The tokenizer works on raw bytes
// internally and uses this table only to convert vocabulary strings at load time.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace hyserve::tokenizer {

class byte_level_table {
 public:
  static const byte_level_table& get();

  char32_t byte_to_char(uint8_t b) const { return byte_to_char_[b]; }

  // The byte a character stands for, or -1 when it is not one of the 256 characters.
  int byte_of(char32_t c) const { return c < char_to_byte_.size() ? char_to_byte_[c] : -1; }

  // Raw bytes of a vocabulary string, or nullopt when some character is not a byte character
  // (such a string cannot come out of byte-level BPE).
  std::optional<std::string> to_bytes(std::string_view token) const;

  // Byte-level form of raw bytes (for messages and tests).
  std::string to_chars(std::string_view bytes) const;

 private:
  byte_level_table();
  std::array<char32_t, 256> byte_to_char_{};
  std::array<int16_t, 324> char_to_byte_{};  // characters run up to U+0143
};

// The pre-tokenization pattern GPT-2 introduced, used by the ByteLevel pre-tokenizer when
// use_regex is true.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace hyserve::tokenizer
