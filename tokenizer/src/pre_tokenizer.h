#pragma once
// Normalizer and pre-tokenizer steps, flattened from tokenizer.json's nested Sequences into
// lists applied in order. Splitting streams: pieces are handed on as the matches are found,
// so a 10 MB text never materialises millions of ranges. Internal to the tokenizer library.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pattern.h"

namespace hyserve::tokenizer {

// What Split does with the matches (the `tokenizers` SplitDelimiterBehavior).
enum class split_behavior : uint8_t {
  kRemoved,             // drop matches, keep the text between them
  kIsolated,            // matches and the text between them, each its own piece
  kMergedWithPrevious,  // a match joins the piece before it
  kMergedWithNext,      // a match joins the piece after it
  kContiguous,          // runs of matches (or of non-matches) form one piece
};

// One pre-tokenization step, applied to every piece the previous steps produced.
struct pre_split_step {
  std::shared_ptr<const split_pattern> pattern;  // null: the piece is not split
  split_behavior behavior = split_behavior::kIsolated;
  bool invert = false;        // split on what does not match
  bool prefix_space = false;  // ByteLevel add_prefix_space: " " before a piece not starting with one
};

// Mirrors NormalizedString::split of `tokenizers`: `subject` is cut into alternating
// non-match / match parts, the behaviour merges or drops parts, and empty pieces vanish.
// The batch algorithm there only ever edits the last piece it produced (for MergedWithNext,
// scanning backwards), so one pending piece is enough to stream it. Calls emit(begin, end)
// for every piece, left to right.
template <class Emit>
void split_piece(const pre_split_step& step, std::string_view subject, match_scratch& match, Emit&& emit) {
  const size_t n = subject.size();
  if (n == 0) return;
  if (!step.pattern) {
    emit(size_t{0}, n);
    return;
  }
  const split_behavior behavior = step.behavior;
  // Pending piece of the merging behaviours.
  bool has_pending = false;
  size_t pending_begin = 0, pending_end = 0;
  bool previous_match = false;

  const auto part = [&](size_t b, size_t e, bool is_match) {
    switch (behavior) {
      case split_behavior::kIsolated:
        emit(b, e);
        return;
      case split_behavior::kRemoved:
        if (!is_match) emit(b, e);
        return;
      case split_behavior::kMergedWithPrevious:
      case split_behavior::kContiguous: {
        const bool merge = behavior == split_behavior::kContiguous ? is_match == previous_match
                                                                   : is_match && !previous_match;
        if (merge && has_pending) {
          pending_end = e;
        } else {
          if (has_pending) emit(pending_begin, pending_end);
          has_pending = true, pending_begin = b, pending_end = e;
        }
        previous_match = is_match;
        return;
      }
      case split_behavior::kMergedWithNext:
        // A match immediately followed by a non-match becomes the start of that piece.
        if (has_pending) {
          if (!is_match) {
            emit(pending_begin, e);
            has_pending = false;
            return;
          }
          emit(pending_begin, pending_end);
          has_pending = false;
        }
        if (is_match) {
          has_pending = true, pending_begin = b, pending_end = e;
        } else {
          emit(b, e);
        }
        return;
    }
  };

  size_t prev = 0;
  text_range m{};
  while (prev < n && step.pattern->find_next(subject, prev, match, m)) {
    if (m.begin > prev) part(prev, m.begin, step.invert);
    part(m.begin, m.end, !step.invert);
    prev = m.end;
  }
  if (prev < n) part(prev, n, step.invert);
  if (has_pending) emit(pending_begin, pending_end);
}

// One normalizer step.
struct normalize_step {
  enum class kind_t : uint8_t { kPrepend, kReplace };
  kind_t kind = kind_t::kPrepend;
  std::string text;                              // Prepend: the prefix; Replace: the content
  std::shared_ptr<const split_pattern> pattern;  // Replace only
};

// Applies the steps to `text` and returns the normalized string.
std::string normalize(const std::vector<normalize_step>& steps, std::string_view text, match_scratch& match);

}  // namespace hyserve::tokenizer
