#pragma once
// Split/Replace patterns of tokenizer.json: {"Regex": "..."} compiled with PCRE2 (UTF + Unicode
// properties, JIT when the library has it) or {"String": "..."} matched literally. Internal to
// the tokenizer library; nothing outside src/ sees PCRE2.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace hyserve::tokenizer {

// Half-open byte range [begin, end) into a subject string.
struct text_range {
  size_t begin;
  size_t end;
};

// Per-call matching state (PCRE2 match data and, when a long match needs it, a larger JIT
// stack). One per encode call: compiled patterns are shared between threads, scratch is not.
class match_scratch {
 public:
  match_scratch();
  ~match_scratch();
  match_scratch(const match_scratch&) = delete;
  match_scratch& operator=(const match_scratch&) = delete;

  struct state;
  state& get();

 private:
  std::unique_ptr<state> state_;
};

class split_pattern {
 public:
  // Regex pattern; on a compile error returns nullptr and sets `error` to PCRE2's message
  // with the offset in the pattern.
  static std::unique_ptr<split_pattern> regex(std::string_view pattern, std::string& error);
  static std::unique_ptr<split_pattern> literal(std::string_view text);
  ~split_pattern();
  split_pattern(const split_pattern&) = delete;
  split_pattern& operator=(const split_pattern&) = delete;

  // Finds the first non-empty match starting at or after byte `offset` of `subject` (empty
  // matches delimit nothing and are skipped); false when there is none. Calling it again from
  // the end of each match enumerates the non-overlapping matches left to right. `subject`
  // must be valid UTF-8 and `offset` on a character boundary. Throws
  // hyserve::invalid_argument_error when the regex engine gives up (resource limits).
  bool find_next(std::string_view subject, size_t offset, match_scratch& scratch, text_range& out) const;

  const std::string& source() const { return source_; }

 private:
  split_pattern() = default;
  struct regex_code;
  std::unique_ptr<regex_code> code_;  // null for literal patterns
  std::string source_;
};

}  // namespace hyserve::tokenizer
