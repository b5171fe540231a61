#include "hyserve/tokenizer/stop_string_matcher.h"

#include <algorithm>

namespace hyserve::tokenizer {

stop_string_matcher::stop_string_matcher(std::vector<std::string> stops) {
  for (size_t i = 0; i < stops.size(); ++i)
    if (!stops[i].empty()) stops_.push_back({std::move(stops[i]), i});
}

stop_string_matcher::result stop_string_matcher::push(std::string_view delta) {
  result out;
  if (stopped_) {
    out.stopped = true;
    out.stop_index = stop_index_;
    return out;
  }
  held_.append(delta);
  // Earliest occurrence of any stop string; on a tie the longer one (the text before is the
  // same either way, and the longer match is the one a reader would name).
  size_t best = std::string::npos;
  const stop* hit = nullptr;
  for (const stop& s : stops_) {
    const size_t pos = held_.find(s.text);
    if (pos == std::string::npos) continue;
    if (pos < best || (pos == best && s.text.size() > hit->text.size())) best = pos, hit = &s;
  }
  if (hit) {
    out.text = held_.substr(0, best);
    out.stopped = true;
    out.stop_index = hit->index;
    stopped_ = true;
    stop_index_ = hit->index;
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string. Text before it
  // can no longer be part of a stop: an occurrence starting there would make a longer suffix
  // a prefix too.
  size_t keep = 0;
  for (const stop& s : stops_) {
    for (size_t k = std::min(s.text.size() - 1, held_.size()); k > keep; --k) {
      if (held_.compare(held_.size() - k, k, s.text, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  out.text = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string stop_string_matcher::finish() {
  if (stopped_) return {};
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace hyserve::tokenizer
