#include "hyserve/common/index_pool.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "hyserve/common/error.h"

namespace hyserve {

index_pool::index_pool(std::string what, int32_t size, int32_t first) : what_(std::move(what)), first_(first) {
  if (size < 0) throw invalid_argument_error(what_ + " pool size " + std::to_string(size) + " is negative");
  if (first < 0) throw invalid_argument_error(what_ + " pool first index " + std::to_string(first) + " is negative");
  // All free; an ascending array is already a valid min-heap.
  free_.resize(static_cast<size_t>(size));
  for (int32_t i = 0; i < size; ++i) free_[static_cast<size_t>(i)] = first + i;
  in_use_.assign(static_cast<size_t>(size), 0);
}

std::optional<int32_t> index_pool::alloc() {
  if (free_.empty()) return std::nullopt;
  std::pop_heap(free_.begin(), free_.end(), std::greater<>());
  const int32_t index = free_.back();
  free_.pop_back();
  in_use_[static_cast<size_t>(index - first_)] = 1;
  return index;
}

std::optional<std::vector<int32_t>> index_pool::alloc(int32_t n) {
  if (n < 0) throw invalid_argument_error(what_ + " count " + std::to_string(n) + " is negative");
  if (n > available()) return std::nullopt;
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) out.push_back(*alloc());
  return out;
}

bool index_pool::allocated(int32_t index) const {
  return index >= first_ && index - first_ < size() && in_use_[static_cast<size_t>(index - first_)];
}

void index_pool::check_release(int32_t index) const {
  if (index < first_ || index - first_ >= size())
    throw invalid_argument_error("cannot free " + what_ + " " + std::to_string(index) + ": outside [" +
                                 std::to_string(first_) + ", " + std::to_string(first_ + size()) + ")");
  if (!in_use_[static_cast<size_t>(index - first_)])
    throw invalid_argument_error("cannot free " + what_ + " " + std::to_string(index) +
                                 ": it is not allocated (double free)");
}

void index_pool::free(int32_t index) {
  check_release(index);
  in_use_[static_cast<size_t>(index - first_)] = 0;
  free_.push_back(index);
  std::push_heap(free_.begin(), free_.end(), std::greater<>());
}

void index_pool::free(const std::vector<int32_t>& indices) {
  std::vector<uint8_t> seen(in_use_.size(), 0);
  for (int32_t i : indices) {
    check_release(i);
    if (seen[static_cast<size_t>(i - first_)])
      throw invalid_argument_error("cannot free " + what_ + " " + std::to_string(i) + ": listed twice (double free)");
    seen[static_cast<size_t>(i - first_)] = 1;
  }
  for (int32_t i : indices) free(i);
}

}  // namespace hyserve
