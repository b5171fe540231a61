#include "hyserve/common/tensor.h"

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

void host_tensor::free_deleter::operator()(void* p) const { std::free(p); }

host_tensor::host_tensor(dtype type, shape_t shape) : type_(type), shape_(shape) {
  const size_t bytes = nbytes();
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = rounded ? std::aligned_alloc(64, rounded) : nullptr;
  if (rounded && !p) throw capacity_error("host allocation of " + std::to_string(bytes) + " bytes failed");
  if (p) std::memset(p, 0, rounded);
  data_.reset(p);
}

tensor_view host_tensor::view() const {
  tensor_view v;
  v.data = data_.get();
  v.type = type_;
  v.device = device_kind::kCpu;
  v.shape = shape_;
  v.strides = tensor_view::contiguous_strides(shape_);
  return v;
}

}  // namespace hyserve
