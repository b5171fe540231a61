#include "byte_level.h"

#include "hyserve/tokenizer/utf8.h"
#include "utf8_scan.h"

namespace hyserve::tokenizer {

const byte_level_table& byte_level_table::get() {
  static const byte_level_table table;
  return table;
}

byte_level_table::byte_level_table() {
  char_to_byte_.fill(-1);
  const auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); };
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const char32_t c = printable(b) ? char32_t(b) : next++;
    byte_to_char_[b] = c;
    char_to_byte_[c] = static_cast<int16_t>(b);
  }
}

std::optional<std::string> byte_level_table::to_bytes(std::string_view token) const {
  std::string out;
  out.reserve(token.size());
  const auto* p = reinterpret_cast<const unsigned char*>(token.data());
  size_t i = 0;
  while (i < token.size()) {
    const utf8_step st = utf8_scan(p + i, token.size() - i);
    if (st.kind != utf8_step::kind_t::kValid) return std::nullopt;
    const int b = byte_of(utf8_decode_valid(p + i, st.len));
    if (b < 0) return std::nullopt;
    out.push_back(static_cast<char>(b));
    i += st.len;
  }
  return out;
}

std::string byte_level_table::to_chars(std::string_view bytes) const {
  std::string out;
  for (const char ch : bytes) utf8_append_code_point(byte_to_char_[static_cast<uint8_t>(ch)], out);
  return out;
}

}  // namespace hyserve::tokenizer
