#pragma once
// RAII device memory for tests, benches and workspaces. Free of CUDA headers, so plain C++
// (the tests) can hold device data and pass it to the run_cuda ops. Copies are synchronous
// (cudaMemcpy on the legacy default stream) and every failure throws hyserve::error.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace hyserve::kernels {

// One cudaMalloc'd allocation on the device current at construction; freed on destruction
// (a failing free is logged to stderr, never thrown).
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(size_t bytes);
  ~device_buffer();
  device_buffer(device_buffer&& other) noexcept;
  device_buffer& operator=(device_buffer&& other) noexcept;
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  // Byte-range copies; offset + bytes must lie within the buffer.
  void upload(const void* src, size_t bytes, size_t offset = 0);
  void download(void* dst, size_t bytes, size_t offset = 0) const;
  void fill_bytes(uint8_t value);  // every byte set to value (0xff makes every float a NaN)

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// n elements of trivially copyable T.
template <class T>
class device_array {
 public:
  device_array() = default;
  explicit device_array(size_t n) : buf_(n * sizeof(T)), n_(n) {}
  explicit device_array(const std::vector<T>& host) : device_array(host.size()) { upload(host); }

  T* data() const { return static_cast<T*>(buf_.data()); }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) { upload(host.data(), host.size()); }
  void upload(const T* host, size_t n) { buf_.upload(host, n * sizeof(T)); }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    buf_.download(host.data(), n_ * sizeof(T));
    return host;
  }
  void fill_bytes(uint8_t value) { buf_.fill_bytes(value); }

 private:
  device_buffer buf_;
  size_t n_ = 0;
};

// Waits for all work on the current device; throws the first asynchronous error (a fault
// inside a kernel) as hyserve::error.
void device_synchronize();

}  // namespace hyserve::kernels
