#pragma once
// Host → device streaming of large arrays from pageable memory (e.g. a memory-mapped
// checkpoint). The host gathers a piece into one of two pinned staging buffers while the
// asynchronous copy of the other buffer's piece runs; pieces of another element type than the
// destination land in a device scratch buffer and are converted there (f32, bf16, f16 → f32,
// bf16; f32 → bf16 rounds to nearest even, as f32_to_bf16). Free of CUDA headers; without the
// CUDA backend, constructing one throws hyserve::error.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "hyserve/common/dtype.h"

namespace hyserve::kernels {

class staged_upload {
 public:
  // Copies are ordered on `stream` (a cudaStream_t; null = the legacy default stream) of the
  // current device. staging_bytes: the size of each of the two pinned buffers.
  explicit staged_upload(void* stream, size_t staging_bytes = size_t{32} << 20);
  ~staged_upload();
  staged_upload(const staged_upload&) = delete;
  staged_upload& operator=(const staged_upload&) = delete;

  // `outer` runs of `width` elements: run o from src + o·src_stride (elements of src_type, host)
  // to dst + o·dst_stride (elements of dst_type, device). Returns once the source has been read
  // (the copies may still be in flight: see wait()).
  void copy_runs(void* dst, dtype dst_type, int64_t dst_stride, const void* src, dtype src_type, int64_t src_stride,
                 int64_t outer, int64_t width);
  // Blocks until every copy issued so far is complete on the device.
  void wait();
  // Source bytes read so far.
  uint64_t bytes_read() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace hyserve::kernels
