#pragma once
// One step of UTF-8 decoding shared by the validators, the lossy converter and the byte-level
// tables. Internal to the tokenizer library.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace hyserve::tokenizer {

struct utf8_step {
  enum class kind_t : uint8_t { kValid, kInvalid, kTruncated };
  // kValid: length of the sequence; kInvalid: length of the maximal invalid subpart (>= 1);
  // kTruncated: bytes available, all a valid prefix of a longer sequence.
  uint32_t len;
  kind_t kind;
};

// Classifies the sequence starting at p[0]; n >= 1 bytes are readable.
inline utf8_step utf8_scan(const unsigned char* p, size_t n) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) return {1, utf8_step::kind_t::kValid};
  uint32_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Table 3-7)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 == 0xE0) {
    need = 2, lo = 0xA0;
  } else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) {
    need = 2;
  } else if (b0 == 0xED) {
    need = 2, hi = 0x9F;
  } else if (b0 == 0xF0) {
    need = 3, lo = 0x90;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    need = 3;
  } else if (b0 == 0xF4) {
    need = 3, hi = 0x8F;
  } else {
    return {1, utf8_step::kind_t::kInvalid};
  }
  for (uint32_t k = 1; k <= need; ++k) {
    if (k >= n) return {k, utf8_step::kind_t::kTruncated};
    if (p[k] < lo || p[k] > hi) return {k, utf8_step::kind_t::kInvalid};
    lo = 0x80, hi = 0xBF;
  }
  return {need + 1, utf8_step::kind_t::kValid};
}

// Decodes the code point of a valid sequence of `len` bytes at p.
inline char32_t utf8_decode_valid(const unsigned char* p, uint32_t len) {
  switch (len) {
    case 1: return p[0];
    case 2: return (char32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    case 3: return (char32_t(p[0] & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    default:
      return (char32_t(p[0] & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) | (char32_t(p[2] & 0x3F) << 6) |
             (p[3] & 0x3F);
  }
}

// Length in bytes of the sequence whose lead byte is b (1 for continuation or invalid bytes,
// so callers that step through valid text never stall).
inline uint32_t utf8_lead_len(unsigned char b) {
  if (b < 0xC0) return 1;
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  return 4;
}

}  // namespace hyserve::tokenizer
