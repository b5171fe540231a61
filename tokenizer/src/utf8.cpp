#include "hyserve/tokenizer/utf8.h"

#include "utf8_scan.h"

namespace hyserve::tokenizer {

size_t utf8_valid_prefix(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII runs dominate real text: skip eight bytes at a time while none has the high bit.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const utf8_step st = utf8_scan(p + i, n - i);
    if (st.kind != utf8_step::kind_t::kValid) return i;
    i += st.len;
  }
  return n;
}

void utf8_append_lossy(std::string_view bytes, std::string& out) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const size_t valid = utf8_valid_prefix(bytes.substr(i));
    out.append(bytes.data() + i, valid);
    i += valid;
    if (i >= n) break;
    // Invalid or truncated: one replacement for the maximal subpart.
    const utf8_step st = utf8_scan(p + i, n - i);
    out.append(kReplacementChar);
    i += st.len;
  }
}

size_t utf8_incomplete_tail(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  // A lead byte of an incomplete sequence is at most 3 bytes back from the end.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned char b = p[n - back];
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    if (b < 0x80) return 0;
    const utf8_step st = utf8_scan(p + n - back, back);
    return st.kind == utf8_step::kind_t::kTruncated && st.len == back ? back : 0;
  }
  return 0;
}

void utf8_append_code_point(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace hyserve::tokenizer
