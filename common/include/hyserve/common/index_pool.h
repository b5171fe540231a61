#pragma once
// A pool of the indices first .. first + size - 1 (KV pages, request slots, recurrent-state
// slots, prefix-cache checkpoint slots): the one allocator behind the worker's memory pools and
// the coordinator's memory bookkeeping. The lowest free index is handed out first, whatever
// order indices were freed in, so the same requests get the same indices on every rank and run.
// Freeing an index that is outside the pool or not allocated throws invalid_argument_error
// naming what the pool holds ("kv page", "mamba slot", ...); a list is checked whole before any
// of it is freed.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hyserve {

class index_pool {
 public:
  index_pool(std::string what, int32_t size, int32_t first = 0);

  std::optional<int32_t> alloc();                        // nullopt when none is free
  std::optional<std::vector<int32_t>> alloc(int32_t n);  // n indices, all or nothing
  void free(int32_t index);
  void free(const std::vector<int32_t>& indices);

  int32_t available() const { return static_cast<int32_t>(free_.size()); }
  int32_t size() const { return static_cast<int32_t>(in_use_.size()); }
  int32_t first() const { return first_; }
  bool allocated(int32_t index) const;

 private:
  void check_release(int32_t index) const;

  std::string what_;
  int32_t first_;
  std::vector<int32_t> free_;     // min-heap of free indices
  std::vector<uint8_t> in_use_;   // by index - first
};

}  // namespace hyserve
