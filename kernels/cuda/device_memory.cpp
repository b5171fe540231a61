// Device memory, streams and device selection of the CUDA backend (declared CUDA-free in
// hyserve/kernels/device.h), and the CUDA allocator behind hyserve::tensor.
#include <cuda_runtime_api.h>

#include <cstdint>

#include <iostream>
#include <string>

#include "check.h"
#include "hyserve/common/tensor.h"
#include "hyserve/kernels/device.h"

namespace hyserve::kernels {

namespace {

// The stream this thread's tensor allocations are ordered on (allocation_stream_scope);
// unset: the legacy default stream.
thread_local cudaStream_t t_alloc_stream = nullptr;
thread_local bool t_alloc_stream_set = false;
thread_local bool t_alloc_zero_fill = true;

cudaStream_t alloc_stream() { return t_alloc_stream_set ? t_alloc_stream : cudaStreamLegacy; }

// The allocator behind hyserve::tensor on kCuda: stream-ordered (cudaMallocAsync /
// cudaFreeAsync on the legacy default stream, which every eager op of the model runs on or
// synchronises with; on the scope's stream inside an allocation_stream_scope) from the device's default memory pool, which keeps freed blocks cached
// (release threshold: unlimited). Per-step activations therefore cost no cudaMalloc/cudaFree
// and no host synchronisation; the zero-fill is asynchronous too.
class cuda_allocator final : public device_allocator {
 public:
  void* alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    const cudaStream_t stream = alloc_stream();
    const cudaError_t status = cudaMallocAsync(&p, bytes, stream);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw capacity_error("device allocation of " + std::to_string(bytes) + " bytes failed: out of device memory");
    }
    CUDA_CHECK(status);
    if (t_alloc_zero_fill) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream));
    return p;
  }
  void release(void* p) noexcept override {
    if (p == nullptr) return;
    const cudaError_t status = cudaFreeAsync(p, alloc_stream());
    if (status != cudaSuccess) std::cerr << "tensor free: cudaFreeAsync failed: " << cudaGetErrorString(status) << "\n";
  }
  void zero(void* p, size_t bytes) override { device_memset(p, 0, bytes); }
  void copy_from_host(void* dst, const void* src, size_t bytes) override { device_copy_h2d(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { device_copy_d2h(dst, src, bytes); }
  void copy_within(void* dst, const void* src, size_t bytes) override { device_copy_d2d(dst, src, bytes); }
};

}  // namespace

allocation_stream_scope::allocation_stream_scope(void* stream, bool zero_fill)
    : previous_(t_alloc_stream), previous_set_(t_alloc_stream_set), previous_zero_(t_alloc_zero_fill) {
  t_alloc_stream = static_cast<cudaStream_t>(stream);
  t_alloc_stream_set = true;
  t_alloc_zero_fill = zero_fill;
}

allocation_stream_scope::~allocation_stream_scope() {
  t_alloc_stream = static_cast<cudaStream_t>(previous_);
  t_alloc_stream_set = previous_set_;
  t_alloc_zero_fill = previous_zero_;
}

bool cuda_built() { return true; }

void cuda_set_device(int ordinal) {
  const int n = cuda_device_count();
  if (ordinal < 0 || ordinal >= n)
    throw error("CUDA device " + std::to_string(ordinal) + " is outside [0, " + std::to_string(n) + ")");
  CUDA_CHECK(cudaSetDevice(ordinal));
}

device_memory_info cuda_memory_info() {
  device_memory_info info;
  CUDA_CHECK(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
  return info;
}

void* device_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  const cudaError_t status = cudaMalloc(&p, bytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear it: running out of memory is an expected failure
    throw capacity_error("device allocation of " + std::to_string(bytes) + " bytes failed: out of device memory");
  }
  CUDA_CHECK(status);
  return p;
}

void device_free(void* p) noexcept {
  if (p == nullptr) return;
  const cudaError_t status = cudaFree(p);
  if (status != cudaSuccess) std::cerr << "device_free: cudaFree failed: " << cudaGetErrorString(status) << "\n";
}

void device_memset(void* p, int value, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemset(p, value, bytes));
}

void device_copy_h2d(void* dst, const void* src, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

void device_copy_d2h(void* dst, const void* src, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

void device_copy_d2d(void* dst, const void* src, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}

void* stream_create() {
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void stream_destroy(void* stream) noexcept {
  if (stream == nullptr) return;
  const cudaError_t status = cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  if (status != cudaSuccess) std::cerr << "stream_destroy: " << cudaGetErrorString(status) << "\n";
}

void stream_synchronize(void* stream) { CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream))); }

void install_device_allocators() {
  static cuda_allocator allocator;  // lives until exit, after every tensor of the program
  // Keep freed blocks in the current device's pool instead of returning them at every
  // synchronisation (the default threshold is 0).
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaMemPool_t pool = nullptr;
  CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t threshold = UINT64_MAX;
  CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  set_device_allocator(device_kind::kCuda, &allocator);
}

exec_context open_device(device_kind kind, int ordinal) {
  if (kind == device_kind::kCpu) return exec_context{kind, nullptr};
  const int n = cuda_device_count();
  if (n == 0) throw config_error("device: cuda, but no CUDA device is visible (no GPU or no driver)");
  if (ordinal < 0 || ordinal >= n)
    throw config_error("device: cuda, but device " + std::to_string(ordinal) + " is outside [0, " + std::to_string(n) +
                       ")");
  cuda_set_device(ordinal);
  install_device_allocators();
  return exec_context{kind, nullptr};
}

}  // namespace hyserve::kernels
