#pragma once
// Tensor views (non-owning: data pointer, dtype, device, shape, strides in elements) and an
// owning tensor on the CPU or a CUDA device. Kernels take raw pointers through params structs; these
// types are for the code that builds those structs.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "hyserve/common/device_kind.h"
#include "hyserve/common/dtype.h"

namespace hyserve {

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

// Where a tensor's storage comes from. The CPU allocator is built in; the CUDA one is
// installed by the kernels library (kernels::install_device_allocators(), kernels/device.h), so
// common never depends on CUDA. Every allocation is zero-initialised. Copies are synchronous
// with respect to the host (device work queued before them has finished when they return).
class device_allocator {
 public:
  virtual ~device_allocator() = default;
  virtual void* alloc(size_t bytes) = 0;            // zeroed; throws capacity_error when out of memory
  virtual void release(void* p) noexcept = 0;       // logs, never throws
  virtual void zero(void* p, size_t bytes) = 0;
  // Copies host → device, device → host, and device → device.
  virtual void copy_from_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_within(void* dst, const void* src, size_t bytes) = 0;
};

// Installs the allocator of `kind` (the object must outlive every tensor on it). The CPU
// allocator cannot be replaced.
void set_device_allocator(device_kind kind, device_allocator* a);
// The allocator of `kind`; throws hyserve::error when none is installed (a build without
// the CUDA backend, or a program that never installed it).
device_allocator& allocator_of(device_kind kind);
const char* device_name(device_kind kind);

// Frees a tensor's storage through the allocator of its device.
struct tensor_release {
  device_kind device = device_kind::kCpu;
  void operator()(void* p) const;
};

// Owning tensor on one device (contiguous, zero-initialised; host storage 64-byte aligned).
// data() / as<T>() return a pointer of the tensor's device: only kernels of that device, and
// the copy helpers below, may dereference a CUDA tensor's data.
class tensor {
 public:
  tensor() = default;
  tensor(dtype type, shape_t shape, device_kind device = device_kind::kCpu);
  static tensor f32(shape_t shape, device_kind device = device_kind::kCpu) { return tensor(dtype::kF32, shape, device); }
  static tensor i32(shape_t shape, device_kind device = device_kind::kCpu) { return tensor(dtype::kI32, shape, device); }
  // A copy of `src` on `device` (a plain copy when both are the same device).
  static tensor copy_of(const tensor& src, device_kind device);
  // A 1-D tensor holding `n` elements of `type` read from host memory.
  static tensor from_host(const void* src, dtype type, int64_t n, device_kind device);

  tensor_view view() const;
  const shape_t& shape() const { return shape_; }
  dtype type() const { return type_; }
  device_kind device() const { return device_; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(type_); }
  void* data() const { return data_.get(); }
  template <typename T>
  T* as() const { return static_cast<T*>(data_.get()); }
  bool empty() const { return !data_ || numel() == 0; }  // no storage (default) or no elements

  // Same storage, new shape of the same element count.
  void reshape(shape_t shape);
  void zero();
  void zero_range(size_t offset, size_t bytes);  // bytes [offset, offset + bytes)
  // Byte ranges between this tensor and host memory; offset + bytes must lie within nbytes().
  void copy_from_host(const void* src, size_t bytes, size_t offset = 0);
  void copy_to_host(void* dst, size_t bytes, size_t offset = 0) const;
  // The whole tensor as a CPU tensor (a copy).
  tensor to_host() const { return copy_of(*this, device_kind::kCpu); }

 private:
  dtype type_ = dtype::kF32;
  device_kind device_ = device_kind::kCpu;
  shape_t shape_;
  std::unique_ptr<void, tensor_release> data_;
};

// The historic name: most code holds CPU tensors (weights as loaded, test data, logits).
using host_tensor = tensor;

}  // namespace hyserve
