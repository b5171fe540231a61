#pragma once
// Stream-ordered device memory of the CUDA backend (device_memory.cpp). The tensor allocator's
// storage and the ops' scratch both come through here, so that while a thread captures a graph
// with an arena (graph.h: captured_graph::capture_begin) every allocation of the captured code
// is carved from the arena (no graph memory-alloc / memory-free node), and an arena_footprint
// sees every allocation it must size an arena for.
//
// Reuse inside an arena follows the same rule as the stream-ordered pool on one stream: a
// released range may be handed out again to a later allocation of the capture, whose work is
// ordered after every use of the range on the capture stream (and, with programmatic dependent
// launch, after griddepcontrol.wait, which kernels call before touching global memory).
#include <cuda_runtime_api.h>

#include <cstddef>

namespace hyserve::kernels::cuda_detail {

// Scratch of an op, ordered on `stream`: cudaMallocAsync / cudaFreeAsync on it, or the calling
// thread's capture arena while one is bound. Same statuses as cudaMallocAsync /
// cudaFreeAsync; 0 bytes give a null pointer, and releasing null does nothing.
cudaError_t scratch_alloc(void** p, size_t bytes, cudaStream_t stream);
cudaError_t scratch_free(void* p, cudaStream_t stream);

// The calling thread's allocations are carved from [base, base + bytes) until arena_unbind;
// those that do not fit fall back to cudaMallocAsync (graph memory nodes under capture).
void arena_bind(void* base, size_t bytes);
struct arena_result {
  size_t live_blocks = 0;  // blocks still allocated at unbind (allocations that outlive the capture)
  size_t overflow = 0;     // allocations that did not fit
  size_t peak = 0;         // the highest byte of the arena used
};
arena_result arena_unbind() noexcept;
bool arena_bound();
// Whether an arena_footprint (graph.h) measures this thread's allocations.
bool footprint_measuring();

}  // namespace hyserve::kernels::cuda_detail
