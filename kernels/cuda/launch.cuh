#pragma once
// Programmatic dependent launch (PDL) of the decode-path kernels and of the GDN prefill's. A
// kernel launched through launch_pdl may start while the kernel before it on the stream is
// still running (its blocks scheduled as soon as every block of the previous kernel has
// started, or exited); it must therefore call pdl_wait() before its first global memory access
// that reads what earlier work wrote, or writes what earlier work reads (griddepcontrol.wait
// returns once the previous grid has completed and its writes are visible; since that grid
// waited for its own predecessor, all earlier work has). Kernels here call pdl_wait() first
// thing, then pdl_launch_dependents() so that the next kernel's launch overlaps their run. Only
// kernels that call pdl_wait() may be launched with launch_pdl (never cuBLAS's).
//
// In a stream capture the attribute becomes a programmatic graph edge, which CUDA allows only
// between kernel nodes: launch_pdl sets it only when every node the launch will depend on is a
// kernel node, and never on the legacy default stream. kernels.pdl: false disables it everywhere
// (plain launches, the kernels' griddepcontrol instructions are then no-ops).
#include <cuda_runtime.h>

#include <utility>

#include "check.h"

namespace hyserve::kernels::cuda_detail {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The prologue of most decode-path kernels: wait for the previous kernel, then let the next one
// launch (work that touches no memory earlier kernels write may come before it).
__device__ __forceinline__ void pdl_begin() {
  pdl_wait();
  pdl_launch_dependents();
}

// Whether a launch on `stream` now may carry the programmatic-serialization attribute.
bool pdl_applies(cudaStream_t stream);

// kernels.smem_carveout: sets the kernel's preferred shared-memory carveout to the configured
// percent (or back to the driver's choice when it is default), once per kernel and value.
void prefer_carveout(const void* kernel);

// kernel<<<grid, block, smem, stream>>>(args...), with PDL where pdl_applies(stream), in
// thread-block clusters of `cluster` blocks along x when cluster > 1 (gridDim.x a multiple of it).
template <class... KernelArgs, class... Args>
void launch_pdl_cluster(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, int cluster,
                        cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl_applies(stream)) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = static_cast<unsigned>(cluster);
    attr[n].val.clusterDim.y = 1;
    attr[n++].val.clusterDim.z = 1;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  prefer_carveout(reinterpret_cast<const void*>(kernel));
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// kernel<<<grid, block, smem, stream>>>(args...), with PDL where pdl_applies(stream).
template <class... KernelArgs, class... Args>
void launch_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  launch_pdl_cluster(kernel, grid, block, smem, 1, stream, std::forward<Args>(args)...);
}

}  // namespace hyserve::kernels::cuda_detail
