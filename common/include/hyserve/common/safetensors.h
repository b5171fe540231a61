#pragma once
// Read-only safetensors file, memory-mapped. Opening validates the whole header: 8-byte length
// inside the file, JSON object, known dtype per tensor, shape × dtype size == byte range,
// ranges inside the data section and not overlapping. Errors are format_error naming the file
// and tensor.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hyserve/common/tensor.h"

namespace hyserve {

struct tensor_info {
  std::string name;
  dtype type = dtype::kF32;
  shape_t shape;
  uint64_t begin = 0, end = 0;  // byte offsets inside the data section
};

class safetensors_file {
 public:
  static safetensors_file open(const std::string& path);
  safetensors_file(safetensors_file&&) noexcept;
  safetensors_file& operator=(safetensors_file&&) noexcept;
  ~safetensors_file();

  const std::string& path() const;
  bool contains(const std::string& name) const;
  const tensor_info& info(const std::string& name) const;  // format_error when missing
  std::vector<std::string> names() const;                  // sorted

  // Raw bytes of a tensor inside the mapping (valid while this object lives).
  const void* data(const std::string& name) const;

  // Loads a float tensor converted to f32 (from f32, bf16 or f16). Throws format_error when the
  // tensor is missing, has another dtype class, or its shape differs from `expected`.
  host_tensor load_f32(const std::string& name, const shape_t& expected) const;

  // Loads rows [begin, end) of dimension `dim` of a tensor whose full shape must equal
  // `expected_full` (tensor-parallel shards read only their slice).
  host_tensor load_f32_slice(const std::string& name, const shape_t& expected_full, int dim, int64_t begin,
                             int64_t end) const;

 private:
  struct impl;
  explicit safetensors_file(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

// A checkpoint directory: every *.safetensors file in it (model.safetensors or sharded files
// listed by model.safetensors.index.json), looked up by tensor name.
class checkpoint {
 public:
  static checkpoint open_dir(const std::string& dir);
  bool contains(const std::string& name) const;
  const safetensors_file& file_of(const std::string& name) const;  // format_error when missing
  host_tensor load_f32(const std::string& name, const shape_t& expected) const;
  host_tensor load_f32_slice(const std::string& name, const shape_t& expected_full, int dim, int64_t begin,
                             int64_t end) const;

 private:
  std::vector<safetensors_file> files_;
};

}  // namespace hyserve
