#pragma once
// Stop strings over streamed text. Deltas go in as they are decoded; out comes the text that
// is safe to show: everything before the first stop string, never the stop string itself, and
// never a suffix that could still turn into one when more text arrives (so a stop string split
// across tokens, "\n" + "\nUser:", is caught before any of it is emitted).
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace hyserve::tokenizer {

class stop_string_matcher {
 public:
  // Empty strings are ignored (they would stop before the first character).
  explicit stop_string_matcher(std::vector<std::string> stops);

  struct result {
    std::string text;         // safe to emit now
    bool stopped = false;     // a stop string was found; text ends right before it
    size_t stop_index = 0;    // which stop string (index into the constructor's list)
  };

  // Adds newly decoded text. After a stop, further calls return empty results with
  // stopped set.
  result push(std::string_view delta);

  // End of generation without a stop: releases the held-back text.
  std::string finish();

  bool stopped() const { return stopped_; }
  // Text held back because it is a prefix of some stop string.
  const std::string& held() const { return held_; }

 private:
  struct stop {
    std::string text;
    size_t index;  // position in the constructor's list
  };
  std::vector<stop> stops_;
  std::string held_;
  bool stopped_ = false;
  size_t stop_index_ = 0;
};

}  // namespace hyserve::tokenizer
