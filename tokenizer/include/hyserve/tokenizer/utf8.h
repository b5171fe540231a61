#pragma once
// UTF-8 helpers for tokenizer input and streamed output. Validity follows Unicode Table 3-7
// (no overlongs, no surrogates, nothing above U+10FFFF); replacement follows the "maximal
// subpart" rule (one U+FFFD per maximal invalid subpart, as Rust's from_utf8_lossy and the
// WHATWG decoder do), which gives the same text whether bytes arrive at once or in pieces.
#include <cstddef>
#include <string>
#include <string_view>

namespace hyserve::tokenizer {

// U+FFFD REPLACEMENT CHARACTER in UTF-8.
inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

// Byte offset of the first byte that does not start a complete valid sequence, or s.size()
// when the whole string is valid.
size_t utf8_valid_prefix(std::string_view s);

inline bool utf8_is_valid(std::string_view s) { return utf8_valid_prefix(s) == s.size(); }

// Appends `bytes` to `out`, replacing every maximal invalid subpart (and a truncated sequence
// at the end) with U+FFFD.
void utf8_append_lossy(std::string_view bytes, std::string& out);

// Number of bytes (0..3) at the end of `s` that are a valid but incomplete sequence: more
// bytes could still complete it. Zero when `s` ends on a boundary or with invalid bytes.
size_t utf8_incomplete_tail(std::string_view s);

// Appends the UTF-8 encoding of code point `cp` (must be a Unicode scalar value).
void utf8_append_code_point(char32_t cp, std::string& out);

}  // namespace hyserve::tokenizer
