#include "added_vocabulary.h"

#include "utf8_scan.h"

namespace hyserve::tokenizer {

namespace {

// Rust's char::is_whitespace (the Unicode White_Space property), which lstrip/rstrip use.
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Start of the character that ends right before `pos` (valid UTF-8, pos > 0).
size_t char_start_before(std::string_view s, size_t pos) {
  size_t i = pos - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

char32_t char_at(std::string_view s, size_t pos, uint32_t& len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + pos;
  len = utf8_lead_len(*p);
  return utf8_decode_valid(p, len);
}

}  // namespace

added_vocabulary::added_vocabulary(std::vector<added_token> tokens, std::shared_ptr<const split_pattern> word_char)
    : tokens_(std::move(tokens)), word_char_(std::move(word_char)) {
  root_.fill(-1);
  nodes_.emplace_back();  // node 0: the root (its children live in root_)
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& c = tokens_[t].content;
    int32_t cur = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      const uint8_t b = static_cast<uint8_t>(c[i]);
      int32_t nxt = child(cur, b);
      if (nxt < 0) {
        nxt = int32_t(nodes_.size());
        nodes_.emplace_back();
        if (cur == 0) {
          root_[b] = nxt;
        } else {
          nodes_[cur].next.emplace_back(b, nxt);
        }
      }
      cur = nxt;
    }
    // Two entries with the same content: the later one wins, like a map keyed by content.
    nodes_[cur].token = int32_t(t);
  }
}

int32_t added_vocabulary::child(int32_t node_index, uint8_t b) const {
  if (node_index == 0) return root_[b];
  for (const auto& [byte, idx] : nodes_[node_index].next)
    if (byte == b) return idx;
  return -1;
}

bool added_vocabulary::is_word_char_before(std::string_view text, size_t pos, match_scratch& match) const {
  if (pos == 0) return false;
  const size_t start = char_start_before(text, pos);
  return is_word_char_at(text, start, match);
}

bool added_vocabulary::is_word_char_at(std::string_view text, size_t pos, match_scratch& match) const {
  if (pos >= text.size() || !word_char_) return false;
  uint32_t len = 0;
  char_at(text, pos, len);
  text_range m{};
  return word_char_->find_next(text.substr(pos, len), 0, match, m);
}

void added_vocabulary::split(std::string_view text, bool match_special, match_scratch& match,
                             std::vector<text_segment>& out) const {
  out.clear();
  const size_t n = text.size();
  size_t segment_start = 0;  // start of the plain text not yet emitted
  size_t i = 0;
  while (i < n) {
    int32_t cur = root_[static_cast<uint8_t>(text[i])];
    if (cur < 0) {
      ++i;
      continue;
    }
    int32_t found = -1;
    size_t found_end = 0;
    for (size_t j = i + 1;; ++j) {
      if (nodes_[cur].token >= 0) found = nodes_[cur].token, found_end = j;
      if (j >= n) break;
      cur = child(cur, static_cast<uint8_t>(text[j]));
      if (cur < 0) break;
    }
    if (found < 0) {
      ++i;
      continue;
    }
    const added_token& tok = tokens_[found];
    const bool rejected =
        (tok.special && !match_special) ||
        (tok.single_word && (is_word_char_before(text, i, match) || is_word_char_at(text, found_end, match)));
    if (rejected) {
      // The match stays plain text; scanning resumes after it (matches never overlap).
      i = found_end;
      continue;
    }
    size_t start = i, end = found_end;
    if (tok.lstrip) {
      while (start > segment_start) {
        const size_t prev = char_start_before(text, start);
        uint32_t len = 0;
        if (!is_white_space(char_at(text, prev, len))) break;
        start = prev;
      }
    }
    if (tok.rstrip) {
      while (end < n) {
        uint32_t len = 0;
        if (!is_white_space(char_at(text, end, len))) break;
        end += len;
      }
    }
    if (start > segment_start) out.push_back({segment_start, start, -1});
    out.push_back({start, end, tok.id});
    segment_start = i = end;
  }
  if (segment_start < n) out.push_back({segment_start, n, -1});
}

}  // namespace hyserve::tokenizer
