// Device API of a build without the CUDA backend: no devices, and every device request is an
// error naming the missing backend.
#include <string>

#include "hyserve/common/error.h"
#include "hyserve/kernels/device.h"

namespace hyserve::kernels {

namespace {

[[noreturn]] void no_cuda(const char* what) {
  throw error(std::string(what) + ": this build has no CUDA backend (configure with HYSERVE_ENABLE_CUDA=ON)");
}

}  // namespace

int cuda_device_count() { return 0; }
bool cuda_built() { return false; }
uint64_t device_to_host_bytes() { return 0; }
void cuda_set_device(int /*ordinal*/) { no_cuda("cuda_set_device"); }
device_memory_info cuda_memory_info() { no_cuda("cuda_memory_info"); }
void* device_alloc(size_t /*bytes*/) { no_cuda("device_alloc"); }
void device_free(void* /*p*/) noexcept {}
void device_memset(void* /*p*/, int /*value*/, size_t /*bytes*/) { no_cuda("device_memset"); }
void device_copy_h2d(void* /*dst*/, const void* /*src*/, size_t /*bytes*/) { no_cuda("device_copy_h2d"); }
void device_copy_d2h(void* /*dst*/, const void* /*src*/, size_t /*bytes*/) { no_cuda("device_copy_d2h"); }
void device_copy_d2d(void* /*dst*/, const void* /*src*/, size_t /*bytes*/) { no_cuda("device_copy_d2d"); }
void device_copy_d2d_2d(void* /*dst*/, size_t /*dst_pitch*/, const void* /*src*/, size_t /*src_pitch*/, size_t /*width*/,
                        size_t /*rows*/) {
  no_cuda("device_copy_d2d_2d");
}
void* stream_create() { no_cuda("stream_create"); }
void stream_destroy(void* /*stream*/) noexcept {}
void stream_synchronize(void* /*stream*/) { no_cuda("stream_synchronize"); }
void install_device_allocators() {}
allocation_stream_scope::allocation_stream_scope(void* stream, bool zero_fill)
    : previous_(stream), previous_zero_(zero_fill) {}
allocation_stream_scope::~allocation_stream_scope() = default;

exec_context open_device(device_kind kind, int /*ordinal*/, const kernel_paths& paths) {
  if (kind == device_kind::kCuda)
    throw config_error("device: cuda, but this build has no CUDA backend (configure with HYSERVE_ENABLE_CUDA=ON)");
  exec_context ctx;
  ctx.device = kind;
  ctx.paths = paths;
  return ctx;
}

}  // namespace hyserve::kernels
