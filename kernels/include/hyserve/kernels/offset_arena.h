#pragma once
// First-fit placement of blocks inside one range of memory, by byte offset: the plan behind the
// graph arenas (graph.h), pure host logic (no device, tested on the CPU).
//
// Free space is the holes below `top` (the end of the highest live block) plus everything from
// `top` on; an allocation takes the lowest hole that holds it, else extends `top`. Releases
// coalesce with neighbouring holes, and a hole that reaches `top` lowers it. The placement
// therefore depends only on the sequence of allocate/release calls, never on the capacity, as
// long as every allocation fits: replaying a sequence whose peak() was measured unbounded into
// an arena of capacity ≥ that peak yields the same offsets and never fails.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>

namespace hyserve::kernels {

class offset_arena {
 public:
  static constexpr size_t kAlignment = 256;  // what cudaMalloc guarantees; every offset is a multiple
  static constexpr size_t npos = SIZE_MAX;
  static constexpr size_t kUnbounded = SIZE_MAX / 2;

  explicit offset_arena(size_t capacity = kUnbounded) : capacity_(capacity) {}

  // Bytes a request of `bytes` occupies (at least one alignment unit).
  static size_t rounded(size_t bytes) {
    return bytes == 0 ? kAlignment : (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }

  // The offset of a new block of rounded(bytes) bytes, or npos when no free range of the
  // capacity holds it (nothing changes then).
  size_t allocate(size_t bytes) {
    if (bytes > kUnbounded) return npos;
    const size_t n = rounded(bytes);
    for (auto it = holes_.begin(); it != holes_.end(); ++it) {
      if (it->second < n) continue;
      const size_t at = it->first, left = it->second - n;
      holes_.erase(it);
      if (left > 0) holes_.emplace(at + n, left);
      live_.emplace(at, n);
      live_bytes_ += n;
      return at;
    }
    if (n > capacity_ || top_ > capacity_ - n) return npos;
    const size_t at = top_;
    top_ += n;
    peak_ = std::max(peak_, top_);
    live_.emplace(at, n);
    live_bytes_ += n;
    return at;
  }

  // Returns the block that starts at `offset`; false (nothing changes) when none does.
  bool release(size_t offset) {
    const auto it = live_.find(offset);
    if (it == live_.end()) return false;
    size_t at = it->first, n = it->second;
    live_bytes_ -= n;
    live_.erase(it);
    // Coalesce with the hole after, then the hole before.
    if (auto next = holes_.find(at + n); next != holes_.end()) {
      n += next->second;
      holes_.erase(next);
    }
    if (auto next = holes_.lower_bound(at); next != holes_.begin()) {
      const auto prev = std::prev(next);
      if (prev->first + prev->second == at) {
        at = prev->first;
        n += prev->second;
        holes_.erase(prev);
      }
    }
    if (at + n == top_) {
      top_ = at;  // free space from here on
    } else {
      holes_.emplace(at, n);
    }
    return true;
  }

  // Whether a live block starts at `offset`.
  bool owns(size_t offset) const { return live_.count(offset) != 0; }

  size_t capacity() const { return capacity_; }
  size_t peak() const { return peak_; }  // the highest end of a block so far: the capacity needed
  size_t live_bytes() const { return live_bytes_; }
  size_t live_blocks() const { return live_.size(); }
  size_t holes() const { return holes_.size(); }

 private:
  size_t capacity_;
  size_t top_ = 0, peak_ = 0, live_bytes_ = 0;
  std::map<size_t, size_t> holes_;  // offset → bytes; disjoint, never adjacent, all below top_
  std::map<size_t, size_t> live_;   // offset → bytes
};

}  // namespace hyserve::kernels
