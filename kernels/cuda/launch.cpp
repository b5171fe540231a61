// When a launch may carry the programmatic-serialization attribute, and the launches' shared-memory
// carveout (launch.cuh).
#include <cuda_runtime_api.h>

#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include "check.h"
#include "hyserve/kernels/paths.h"

namespace hyserve::kernels::cuda_detail {

bool pdl_applies(cudaStream_t stream) {
  if (!current_paths().pdl || stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* deps = nullptr;
  const cudaGraphEdgeData* edges = nullptr;
  size_t n = 0;
#if CUDART_VERSION >= 13000
  CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, nullptr, nullptr, &deps, &edges, &n));
#else
  CUDA_CHECK(cudaStreamGetCaptureInfo_v3(stream, &status, nullptr, nullptr, &deps, &edges, &n));
#endif
  // Not capturing: a launch after anything but a kernel is serialised as usual.
  if (status != cudaStreamCaptureStatusActive) return status == cudaStreamCaptureStatusNone;
  // Capturing: programmatic edges only from kernel nodes (not from memory, copy or event nodes).
  if (n == 0) return false;
  for (size_t i = 0; i < n; ++i) {
    cudaGraphNodeType type{};
    CUDA_CHECK(cudaGraphNodeGetType(deps[i], &type));
    if (type != cudaGraphNodeTypeKernel) return false;
  }
  return true;
}

void prefer_carveout(const void* kernel) {
  const int want = current_paths().smem_carveout > 0 ? current_paths().smem_carveout : cudaSharedmemCarveoutDefault;
  static std::atomic<bool> any{false};  // whether any kernel was ever given a preference
  if (want == cudaSharedmemCarveoutDefault && !any.load(std::memory_order_acquire)) return;  // the default's launches
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> set;  // (kernel, device) → what it was last given
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = set.find({kernel, device});
  if (it == set.end() ? want == cudaSharedmemCarveoutDefault : it->second == want) return;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, want));
  set[{kernel, device}] = want;
  any.store(true, std::memory_order_release);
}

}  // namespace hyserve::kernels::cuda_detail
