#pragma once
// Tensor views (non-owning: data pointer, dtype, device, shape, strides in elements) and a
// host tensor that owns its storage. Kernels take raw pointers through params structs; these
// types are for the code that builds those structs.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "hyserve/common/dtype.h"

namespace hyserve {

enum class device_kind : uint8_t { kCpu, kCuda };

inline constexpr int kMaxDims = 6;

struct shape_t {
  std::array<int64_t, kMaxDims> dims{};
  int ndim = 0;

  shape_t() = default;
  shape_t(std::initializer_list<int64_t> d);
  explicit shape_t(std::span<const int64_t> d);
  int64_t operator[](int i) const { return dims[static_cast<size_t>(i)]; }
  int64_t& operator[](int i) { return dims[static_cast<size_t>(i)]; }
  int64_t numel() const;
  bool operator==(const shape_t& o) const;
  std::string str() const;  // "[2, 3, 4]"
};

struct tensor_view {
  void* data = nullptr;
  dtype type = dtype::kF32;
  device_kind device = device_kind::kCpu;
  shape_t shape;
  std::array<int64_t, kMaxDims> strides{};  // in elements

  int64_t numel() const { return shape.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(type); }
  bool is_contiguous() const;
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
  static std::array<int64_t, kMaxDims> contiguous_strides(const shape_t& s);
};

// Owning host tensor, 64-byte aligned, zero-initialised.
class host_tensor {
 public:
  host_tensor() = default;
  host_tensor(dtype type, shape_t shape);
  static host_tensor f32(shape_t shape) { return host_tensor(dtype::kF32, shape); }
  static host_tensor i32(shape_t shape) { return host_tensor(dtype::kI32, shape); }

  tensor_view view() const;
  const shape_t& shape() const { return shape_; }
  dtype type() const { return type_; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(type_); }
  void* data() const { return data_.get(); }
  template <typename T>
  T* as() const { return static_cast<T*>(data_.get()); }
  bool empty() const { return numel() == 0; }

 private:
  struct free_deleter {
    void operator()(void* p) const;
  };
  dtype type_ = dtype::kF32;
  shape_t shape_;
  std::unique_ptr<void, free_deleter> data_;
};

}  // namespace hyserve
