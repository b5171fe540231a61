// staged_upload in a build without the CUDA backend: constructing one is an error.
#include "hyserve/kernels/staged_upload.h"

#include "hyserve/common/error.h"

namespace hyserve::kernels {

struct staged_upload::impl {};

staged_upload::staged_upload(void* /*stream*/, size_t /*staging_bytes*/) {
  throw error("staged_upload: this build has no CUDA backend (configure with HYSERVE_ENABLE_CUDA=ON)");
}
staged_upload::~staged_upload() = default;
void staged_upload::copy_runs(void*, dtype, int64_t, const void*, dtype, int64_t, int64_t, int64_t) {}
void staged_upload::wait() {}
uint64_t staged_upload::bytes_read() const { return 0; }

}  // namespace hyserve::kernels
