#include "hyserve/common/tensor.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "hyserve/common/error.h"

namespace hyserve {

shape_t::shape_t(std::initializer_list<int64_t> d) : shape_t(std::span<const int64_t>(d.begin(), d.size())) {}

shape_t::shape_t(std::span<const int64_t> d) {
  if (d.size() > static_cast<size_t>(kMaxDims))
    throw invalid_argument_error("tensor rank " + std::to_string(d.size()) + " exceeds " + std::to_string(kMaxDims));
  ndim = static_cast<int>(d.size());
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] < 0) throw invalid_argument_error("negative tensor dimension " + std::to_string(d[i]));
    dims[i] = d[i];
  }
}

int64_t shape_t::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= dims[static_cast<size_t>(i)];
  return n;
}

bool shape_t::operator==(const shape_t& o) const {
  if (ndim != o.ndim) return false;
  for (int i = 0; i < ndim; ++i)
    if (dims[static_cast<size_t>(i)] != o.dims[static_cast<size_t>(i)]) return false;
  return true;
}

std::string shape_t::str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[static_cast<size_t>(i)]);
  }
  return s + "]";
}

std::array<int64_t, kMaxDims> tensor_view::contiguous_strides(const shape_t& s) {
  std::array<int64_t, kMaxDims> st{};
  int64_t acc = 1;
  for (int i = s.ndim - 1; i >= 0; --i) {
    st[static_cast<size_t>(i)] = acc;
    acc *= s[i];
  }
  return st;
}

bool tensor_view::is_contiguous() const {
  const auto c = contiguous_strides(shape);
  for (int i = 0; i < shape.ndim; ++i)
    if (shape[i] > 1 && strides[static_cast<size_t>(i)] != c[static_cast<size_t>(i)]) return false;
  return true;
}

namespace {

class cpu_allocator final : public device_allocator {
 public:
  void* alloc(size_t bytes) override {
    const size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded == 0) return nullptr;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw capacity_error("host allocation of " + std::to_string(bytes) + " bytes failed");
    std::memset(p, 0, rounded);
    return p;
  }
  void release(void* p) noexcept override { std::free(p); }
  void zero(void* p, size_t bytes) override {
    if (bytes) std::memset(p, 0, bytes);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy_within(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }

 private:
  static void copy(void* dst, const void* src, size_t bytes) {
    if (bytes) std::memmove(dst, src, bytes);
  }
};

cpu_allocator g_cpu_allocator;
std::atomic<device_allocator*> g_cuda_allocator{nullptr};

void require_range(size_t offset, size_t bytes, size_t size) {
  if (offset > size || bytes > size - offset)
    throw invalid_argument_error("tensor copy: range [" + std::to_string(offset) + ", +" + std::to_string(bytes) +
                                 ") exceeds the tensor of " + std::to_string(size) + " bytes");
}

}  // namespace

const char* device_name(device_kind kind) {
  switch (kind) {
    case device_kind::kCpu:
      return "cpu";
    case device_kind::kCuda:
      return "cuda";
  }
  return "unknown";
}

void set_device_allocator(device_kind kind, device_allocator* a) {
  if (kind == device_kind::kCpu) throw invalid_argument_error("the CPU allocator cannot be replaced");
  g_cuda_allocator.store(a);
}

device_allocator& allocator_of(device_kind kind) {
  if (kind == device_kind::kCpu) return g_cpu_allocator;
  device_allocator* a = g_cuda_allocator.load();
  if (!a)
    throw error(std::string("no allocator for device ") + device_name(kind) +
                ": this build has no CUDA backend, or kernels::install_device_allocators() was not called");
  return *a;
}

void tensor_release::operator()(void* p) const { allocator_of(device).release(p); }

tensor::tensor(dtype type, shape_t shape, device_kind device)
    : type_(type), device_(device), shape_(shape), data_(nullptr, tensor_release{device}) {
  const size_t bytes = nbytes();
  if (bytes) data_.reset(allocator_of(device).alloc(bytes));
}

tensor tensor::copy_of(const tensor& src, device_kind device) {
  if (src.data() == nullptr) {  // a default-constructed tensor (rank 0, no storage) stays one
    tensor out;
    out.type_ = src.type_;
    out.shape_ = src.shape_;
    out.device_ = device;
    out.data_ = std::unique_ptr<void, tensor_release>(nullptr, tensor_release{device});
    return out;
  }
  tensor out(src.type_, src.shape_, device);
  const size_t bytes = src.nbytes();
  if (bytes == 0) return out;
  if (src.device_ == device) {
    allocator_of(device).copy_within(out.data(), src.data(), bytes);
  } else if (src.device_ == device_kind::kCpu) {
    allocator_of(device).copy_from_host(out.data(), src.data(), bytes);
  } else if (device == device_kind::kCpu) {
    allocator_of(src.device_).copy_to_host(out.data(), src.data(), bytes);
  } else {
    throw invalid_argument_error("tensor copy between two non-CPU devices");
  }
  return out;
}

tensor tensor::from_host(const void* src, dtype type, int64_t n, device_kind device) {
  tensor out(type, {n}, device);
  out.copy_from_host(src, out.nbytes());
  return out;
}

void tensor::reshape(shape_t shape) {
  if (shape.numel() != numel())
    throw invalid_argument_error("reshape " + shape_.str() + " → " + shape.str() + " changes the element count");
  shape_ = shape;
}

void tensor::zero() { allocator_of(device_).zero(data(), nbytes()); }

void tensor::zero_range(size_t offset, size_t bytes) {
  require_range(offset, bytes, nbytes());
  if (bytes) allocator_of(device_).zero(static_cast<char*>(data()) + offset, bytes);
}

void tensor::copy_from_host(const void* src, size_t bytes, size_t offset) {
  require_range(offset, bytes, nbytes());
  if (bytes) allocator_of(device_).copy_from_host(static_cast<char*>(data()) + offset, src, bytes);
}

void tensor::copy_to_host(void* dst, size_t bytes, size_t offset) const {
  require_range(offset, bytes, nbytes());
  if (bytes) allocator_of(device_).copy_to_host(dst, static_cast<const char*>(data()) + offset, bytes);
}

tensor_view tensor::view() const {
  tensor_view v;
  v.data = data_.get();
  v.type = type_;
  v.device = device_;
  v.shape = shape_;
  v.strides = tensor_view::contiguous_strides(shape_);
  return v;
}

}  // namespace hyserve
