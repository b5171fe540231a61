#pragma once
// Device discovery, device memory and streams, and the execution context of the op
// dispatch. Free of CUDA headers and always declared; without the CUDA backend
// cuda_device_count() returns 0 and everything that needs a device throws hyserve::error.
#include <cstddef>
#include <cstdint>

#include "hyserve/common/device_kind.h"
#include "hyserve/common/kernel_paths.h"

namespace hyserve::kernels {

// Number of usable CUDA devices (0 when the backend is not built or no driver/device exists).
int cuda_device_count();
// True when this build has the CUDA backend (a device may still be missing).
bool cuda_built();

// Makes `ordinal` the calling thread's current CUDA device; throws when the backend is not
// built or ordinal is outside [0, cuda_device_count()).
void cuda_set_device(int ordinal);
// Free and total memory of the current CUDA device, in bytes.
struct device_memory_info {
  size_t free_bytes = 0, total_bytes = 0;
};
device_memory_info cuda_memory_info();

// Raw device memory (the CUDA allocator of hyserve::tensor uses these). Copies and memset are
// synchronous with respect to the host; device_free logs failures and never throws.
void* device_alloc(size_t bytes);
void device_free(void* p) noexcept;
void device_memset(void* p, int value, size_t bytes);
void device_copy_h2d(void* dst, const void* src, size_t bytes);
void device_copy_d2h(void* dst, const void* src, size_t bytes);
void device_copy_d2d(void* dst, const void* src, size_t bytes);
// rows × width bytes, each row from src + r·src_pitch to dst + r·dst_pitch (device to device).
void device_copy_d2d_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows);
// Bytes this process has copied device → host so far, through the copies above, tensors and
// copy_d2h_async (graph.h): what a step costs in transfers (0 without the CUDA backend).
uint64_t device_to_host_bytes();

// Streams: an opaque cudaStream_t. null is the legacy default stream, which orders with the
// synchronous copies above.
void* stream_create();
void stream_destroy(void* stream) noexcept;
void stream_synchronize(void* stream);

// While a scope lives, the CUDA tensors this thread allocates and frees are ordered on `stream`
// (cudaMallocAsync / zero-fill / cudaFreeAsync on it) instead of the legacy default stream; under
// stream capture they become graph memory nodes. Scopes nest; a tensor allocated inside a scope
// must be released inside it (or after its stream has been synchronised). zero_fill = false
// drops the zero-fill of the tensors allocated in the scope (stream capture: no memset node per
// activation); the code in the scope must then write every element before reading it.
class allocation_stream_scope {
 public:
  explicit allocation_stream_scope(void* stream, bool zero_fill = true);
  ~allocation_stream_scope();
  allocation_stream_scope(const allocation_stream_scope&) = delete;
  allocation_stream_scope& operator=(const allocation_stream_scope&) = delete;

 private:
  void* previous_ = nullptr;
  bool previous_set_ = false;
  bool previous_zero_ = true;
};

// Registers the CUDA allocator with hyserve::tensor (set_device_allocator). Idempotent; a no-op
// without the CUDA backend (tensors on kCuda then fail to allocate with a clear error).
void install_device_allocators();

// Where an op runs: routed by kernels::run (dispatch.h). stream is a cudaStream_t for kCuda
// (null = default stream) and ignored for kCpu. paths: the kernel variants the CUDA launchers
// take (the config's `kernels:` section; kernels/paths.h says how they reach the launchers);
// a context made from another keeps its paths (copy it and change the stream).
struct exec_context {
  device_kind device = device_kind::kCpu;
  void* stream = nullptr;
  kernel_paths paths;
};

// The context for `kind` on CUDA device `ordinal`: checks that the backend is built and the
// device exists (config_error naming the problem otherwise), makes the device current and
// installs the allocator. kCpu needs nothing and ignores ordinal. The context carries `paths`.
exec_context open_device(device_kind kind, int ordinal = 0, const kernel_paths& paths = {});

}  // namespace hyserve::kernels
