#include "device_buffer.h"

#include <cuda_runtime_api.h>

#include <iostream>
#include <string>
#include <utility>

#include "check.h"

namespace hyserve::kernels {

namespace {

void require_range(size_t offset, size_t bytes, size_t size) {
  if (offset > size || bytes > size - offset) {
    throw invalid_argument_error("device_buffer: range [" + std::to_string(offset) + ", +" + std::to_string(bytes) +
                                 ") exceeds the buffer of " + std::to_string(size) + " bytes");
  }
}

}  // namespace

device_buffer::device_buffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) CUDA_CHECK(cudaMalloc(&ptr_, bytes));
}

device_buffer::~device_buffer() {
  if (ptr_ == nullptr) return;
  const cudaError_t status = cudaFree(ptr_);
  if (status != cudaSuccess) {
    std::cerr << "device_buffer: cudaFree failed: " << cudaGetErrorString(status) << "\n";
  }
}

device_buffer::device_buffer(device_buffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

device_buffer& device_buffer::operator=(device_buffer&& other) noexcept {
  if (this != &other) {
    device_buffer old(std::move(*this));  // frees the current allocation on scope exit
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void device_buffer::upload(const void* src, size_t bytes, size_t offset) {
  require_range(offset, bytes, bytes_);
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpy(static_cast<char*>(ptr_) + offset, src, bytes, cudaMemcpyHostToDevice));
}

void device_buffer::download(void* dst, size_t bytes, size_t offset) const {
  require_range(offset, bytes, bytes_);
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpy(dst, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost));
}

void device_buffer::fill_bytes(uint8_t value) {
  if (bytes_ == 0) return;
  CUDA_CHECK(cudaMemset(ptr_, value, bytes_));
}

void device_synchronize() { CUDA_CHECK(cudaDeviceSynchronize()); }

}  // namespace hyserve::kernels
