// Device memory, streams and device selection of the CUDA backend (declared CUDA-free in
// hyserve/kernels/device.h), and the CUDA allocator behind hyserve::tensor.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

#include <iostream>
#include <optional>
#include <string>
#include <unordered_map>

#include "check.h"
#include "hyserve/common/tensor.h"
#include "hyserve/kernels/device.h"
#include "hyserve/kernels/graph.h"
#include "hyserve/kernels/offset_arena.h"
#include "stream_alloc.h"

namespace hyserve::kernels {

namespace {

// The stream this thread's tensor allocations are ordered on (allocation_stream_scope);
// unset: the legacy default stream.
thread_local cudaStream_t t_alloc_stream = nullptr;
thread_local bool t_alloc_stream_set = false;
thread_local bool t_alloc_zero_fill = true;

cudaStream_t alloc_stream() { return t_alloc_stream_set ? t_alloc_stream : cudaStreamLegacy; }

// The capture arena bound to this thread (stream_alloc.h), if any.
struct arena_binding {
  char* base = nullptr;
  offset_arena plan;
  size_t overflow = 0;
};
thread_local std::optional<arena_binding> t_arena;

// The arena_footprint measuring this thread's allocations, if any: each allocation made while
// it lives is placed in an unbounded offset_arena, keyed by its pointer until released.
struct footprint_state {
  offset_arena plan;
  std::unordered_map<const void*, size_t> offsets;
};
thread_local footprint_state* t_footprint = nullptr;

bool in_arena(const void* p) {
  const auto* c = static_cast<const char*>(p);
  return t_arena && c >= t_arena->base && c < t_arena->base + t_arena->plan.capacity();
}

// Every stream-ordered allocation of the backend (tensors and op scratch).
cudaError_t ordered_alloc(void** p, size_t bytes, cudaStream_t stream) {
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  bool placed = false;
  if (t_arena) {
    const size_t at = t_arena->plan.allocate(bytes);
    if (at != offset_arena::npos) {
      *p = t_arena->base + at;
      placed = true;
    } else {
      ++t_arena->overflow;
    }
  }
  if (!placed) {
    const cudaError_t status = cudaMallocAsync(p, bytes, stream);
    if (status != cudaSuccess) return status;
  }
  if (t_footprint) t_footprint->offsets[*p] = t_footprint->plan.allocate(bytes);
  return cudaSuccess;
}

cudaError_t ordered_free(void* p, cudaStream_t stream) {
  if (p == nullptr) return cudaSuccess;
  if (t_footprint) {
    if (auto it = t_footprint->offsets.find(p); it != t_footprint->offsets.end()) {
      t_footprint->plan.release(it->second);
      t_footprint->offsets.erase(it);
    }
  }
  if (in_arena(p)) {
    // Host order is stream order here: the range is reused only by later work of the capture.
    return t_arena->plan.release(static_cast<size_t>(static_cast<char*>(p) - t_arena->base)) ? cudaSuccess
                                                                                            : cudaErrorInvalidValue;
  }
  return cudaFreeAsync(p, stream);
}

// The allocator behind hyserve::tensor on kCuda: stream-ordered (cudaMallocAsync /
// cudaFreeAsync on the legacy default stream, which every eager op of the model runs on or
// synchronises with; on the scope's stream inside an allocation_stream_scope) from the device's
// default memory pool, which keeps freed blocks cached (release threshold: unlimited). Per-step
// activations therefore cost no cudaMalloc/cudaFree and no host synchronisation; the zero-fill
// is asynchronous too. While the thread captures with an arena, from the arena (stream_alloc.h).
class cuda_allocator final : public device_allocator {
 public:
  void* alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    const cudaStream_t stream = alloc_stream();
    const cudaError_t status = ordered_alloc(&p, bytes, stream);
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
    const cudaError_t status = ordered_free(p, alloc_stream());
    if (status != cudaSuccess) {
      std::cerr << "tensor free: cudaFreeAsync failed: " << cudaGetErrorString(status) << "\n";
      cudaGetLastError();  // logged: not the error of whatever checks next
    }
  }
  void zero(void* p, size_t bytes) override { device_memset(p, 0, bytes); }
  void copy_from_host(void* dst, const void* src, size_t bytes) override { device_copy_h2d(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { device_copy_d2h(dst, src, bytes); }
  void copy_within(void* dst, const void* src, size_t bytes) override { device_copy_d2d(dst, src, bytes); }
};

}  // namespace

namespace cuda_detail {

std::atomic<uint64_t> d2h_bytes{0};

void count_device_to_host(size_t bytes) { d2h_bytes.fetch_add(bytes, std::memory_order_relaxed); }

cudaError_t scratch_alloc(void** p, size_t bytes, cudaStream_t stream) { return ordered_alloc(p, bytes, stream); }
cudaError_t scratch_free(void* p, cudaStream_t stream) { return ordered_free(p, stream); }

void arena_bind(void* base, size_t bytes) {
  HYSERVE_CHECK(!t_arena, "arena_bind: this thread already allocates from an arena");
  HYSERVE_CHECK(base != nullptr || bytes == 0, "arena_bind: no memory");
  arena_binding b{static_cast<char*>(base), offset_arena(bytes), 0};
  t_arena.emplace(std::move(b));
}

arena_result arena_unbind() noexcept {
  arena_result r;
  if (!t_arena) return r;
  r.live_blocks = t_arena->plan.live_blocks();
  r.overflow = t_arena->overflow;
  r.peak = t_arena->plan.peak();
  t_arena.reset();
  return r;
}

bool arena_bound() { return t_arena.has_value(); }
bool footprint_measuring() { return t_footprint != nullptr; }

}  // namespace cuda_detail

arena_footprint::arena_footprint() {
  HYSERVE_CHECK(t_footprint == nullptr, "arena_footprint: this thread is already measuring");
  auto* s = new footprint_state();
  state_ = s;
  t_footprint = s;
}

arena_footprint::~arena_footprint() {
  auto* s = static_cast<footprint_state*>(state_);
  if (t_footprint == s) t_footprint = nullptr;
  delete s;
}

size_t arena_footprint::bytes() const { return static_cast<const footprint_state*>(state_)->plan.peak(); }

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
  cuda_detail::count_device_to_host(bytes);
}

uint64_t device_to_host_bytes() { return cuda_detail::d2h_bytes.load(std::memory_order_relaxed); }

void device_copy_d2d(void* dst, const void* src, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}

void device_copy_d2d_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows) {
  if (width && rows)
    CUDA_CHECK(cudaMemcpy2D(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice));
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

exec_context open_device(device_kind kind, int ordinal, const kernel_paths& paths) {
  exec_context ctx;
  ctx.device = kind;
  ctx.paths = paths;
  if (kind == device_kind::kCpu) return ctx;
  const int n = cuda_device_count();
  if (n == 0) throw config_error("device: cuda, but no CUDA device is visible (no GPU or no driver)");
  if (ordinal < 0 || ordinal >= n)
    throw config_error("device: cuda, but device " + std::to_string(ordinal) + " is outside [0, " + std::to_string(n) +
                       ")");
  cuda_set_device(ordinal);
  install_device_allocators();
  return ctx;
}

}  // namespace hyserve::kernels
