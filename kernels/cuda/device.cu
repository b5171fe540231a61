#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "common.cuh"
#include "hyserve/kernels/device.h"

namespace hyserve::kernels {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return n;
}

namespace cuda_detail {

namespace {

struct device_limits {
  int sm_count = 0;
  int max_shared_optin = 0;
};

// Read once per device (launchers ask every step); returned by value because the cache grows.
device_limits limits_of_current_device() {
  static std::mutex mutex;
  static std::vector<device_limits> cache;  // by device ordinal; sm_count 0 = not read yet
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  if (cache.size() <= static_cast<size_t>(device)) cache.resize(static_cast<size_t>(device) + 1);
  device_limits& l = cache[static_cast<size_t>(device)];
  if (l.sm_count == 0) {
    CUDA_CHECK(cudaDeviceGetAttribute(&l.max_shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&l.sm_count, cudaDevAttrMultiProcessorCount, device));
  }
  return l;
}

}  // namespace

int sm_count() { return limits_of_current_device().sm_count; }

int resident_blocks_per_sm(const void* kernel, int threads, size_t smem) {
  struct entry {
    const void* kernel;
    int threads;
    size_t smem;
    int device;
    int blocks;
  };
  static std::mutex mutex;
  static std::vector<entry> cache;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  for (const entry& e : cache)
    if (e.kernel == kernel && e.threads == threads && e.smem == smem && e.device == device) return e.blocks;
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  cache.push_back(entry{kernel, threads, smem, device, std::max(per_sm, 1)});
  return cache.back().blocks;
}

void reserve_dynamic_shared(const void* kernel, size_t bytes) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, size_t> reserved;  // (kernel, device) → bytes
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  size_t& r = reserved[{kernel, device}];
  if (bytes <= r) return;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  r = bytes;
}
int max_shared_per_block_optin() { return limits_of_current_device().max_shared_optin; }

}  // namespace cuda_detail
}  // namespace hyserve::kernels
