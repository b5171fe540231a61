// staged_upload.h: two pinned staging buffers alternate; the host gathers the next piece into
// one while the previous piece's copy (and conversion) runs on the stream from the other.
#include "hyserve/kernels/staged_upload.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <string>

#include "check.h"
#include "convert.h"

namespace hyserve::kernels {

namespace {

bool is_float_source(dtype t) { return t == dtype::kF32 || t == dtype::kBF16 || t == dtype::kF16; }

// rows × row_bytes from src (row pitch src_pitch bytes) packed into dst, spread over the host's
// threads: the source is typically a memory-mapped file whose pages fault in as they are read.
void gather(uint8_t* dst, const uint8_t* src, int64_t rows, size_t row_bytes, size_t src_pitch) {
  constexpr size_t kBlock = size_t{1} << 20;
  if (rows == 1) {
    const auto blocks = static_cast<int64_t>((row_bytes + kBlock - 1) / kBlock);
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (int64_t b = 0; b < blocks; ++b) {
      const size_t at = static_cast<size_t>(b) * kBlock;
      std::memcpy(dst + at, src + at, std::min(kBlock, row_bytes - at));
    }
    return;
  }
#pragma omp parallel for schedule(static) if (static_cast<size_t>(rows) * row_bytes > kBlock)
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + static_cast<size_t>(r) * row_bytes, src + static_cast<size_t>(r) * src_pitch, row_bytes);
}

}  // namespace

struct staged_upload::impl {
  cudaStream_t stream = nullptr;
  size_t staging = 0;
  void* pinned[2] = {nullptr, nullptr};
  void* scratch[2] = {nullptr, nullptr};  // device; allocated on the first converting copy
  cudaEvent_t done[2] = {nullptr, nullptr};
  bool in_flight[2] = {false, false};
  int next = 0;
  uint64_t bytes = 0;

  ~impl() {
    if (stream || done[0]) cudaStreamSynchronize(stream);
    for (int b = 0; b < 2; ++b) {
      if (pinned[b]) cudaFreeHost(pinned[b]);
      if (scratch[b]) cudaFree(scratch[b]);
      if (done[b]) cudaEventDestroy(done[b]);
    }
    cudaGetLastError();  // teardown failures are not the error of whatever checks next
  }

  // Rows [row0, row0 + rows) × columns [col0, col0 + cols) of the runs (rows == 1 when a run
  // does not fit the staging buffer).
  void piece(uint8_t* dst, dtype dst_type, int64_t dst_stride, const uint8_t* src, dtype src_type, int64_t src_stride,
             int64_t row0, int64_t col0, int64_t rows, int64_t cols) {
    const size_t se = dtype_size(src_type), de = dtype_size(dst_type);
    const int b = next;
    next ^= 1;
    if (in_flight[b]) CUDA_CHECK(cudaEventSynchronize(done[b]));
    in_flight[b] = false;
    auto* stage = static_cast<uint8_t*>(pinned[b]);
    const size_t row_bytes = static_cast<size_t>(cols) * se;
    gather(stage, src + (static_cast<size_t>(row0 * src_stride + col0)) * se, rows, row_bytes,
           static_cast<size_t>(src_stride) * se);
    uint8_t* to = dst + static_cast<size_t>(row0 * dst_stride + col0) * de;
    if (src_type == dst_type) {
      if (rows == 1)
        CUDA_CHECK(cudaMemcpyAsync(to, stage, row_bytes, cudaMemcpyHostToDevice, stream));
      else
        CUDA_CHECK(cudaMemcpy2DAsync(to, static_cast<size_t>(dst_stride) * de, stage, row_bytes, row_bytes,
                                     static_cast<size_t>(rows), cudaMemcpyHostToDevice, stream));
    } else {
      if (!scratch[b]) CUDA_CHECK(cudaMalloc(&scratch[b], staging));
      CUDA_CHECK(cudaMemcpyAsync(scratch[b], stage, static_cast<size_t>(rows) * row_bytes, cudaMemcpyHostToDevice,
                                 stream));
      cuda_detail::convert_block(to, dst_type, dst_stride, scratch[b], src_type, rows, cols, stream);
    }
    CUDA_CHECK(cudaEventRecord(done[b], stream));
    in_flight[b] = true;
    bytes += static_cast<uint64_t>(rows) * row_bytes;
  }
};

staged_upload::staged_upload(void* stream, size_t staging_bytes) : impl_(std::make_unique<impl>()) {
  if (staging_bytes < 16)
    throw invalid_argument_error("staged_upload: staging_bytes = " + std::to_string(staging_bytes) +
                                 " (must be >= 16)");
  impl_->stream = static_cast<cudaStream_t>(stream);
  impl_->staging = staging_bytes;
  for (int b = 0; b < 2; ++b) {
    CUDA_CHECK(cudaHostAlloc(&impl_->pinned[b], staging_bytes, cudaHostAllocDefault));
    CUDA_CHECK(cudaEventCreateWithFlags(&impl_->done[b], cudaEventDisableTiming));
  }
}

staged_upload::~staged_upload() = default;

void staged_upload::copy_runs(void* dst, dtype dst_type, int64_t dst_stride, const void* src, dtype src_type,
                              int64_t src_stride, int64_t outer, int64_t width) {
  constexpr const char* op = "staged_upload";
  if (!is_float_source(src_type))
    throw invalid_argument_error(std::string(op) + ": src_type = " + std::string(dtype_name(src_type)) +
                                 " (supported: f32, bf16, f16)");
  if (dst_type != dtype::kF32 && dst_type != dtype::kBF16)
    throw invalid_argument_error(std::string(op) + ": dst_type = " + std::string(dtype_name(dst_type)) +
                                 " (supported: f32, bf16)");
  if (outer < 0 || width < 0 || (outer > 1 && (src_stride < width || dst_stride < width)))
    throw invalid_argument_error(std::string(op) + ": bad runs (outer " + std::to_string(outer) + ", width " +
                                 std::to_string(width) + ", strides " + std::to_string(src_stride) + " / " +
                                 std::to_string(dst_stride) + ")");
  if (outer == 0 || width == 0) return;
  if (outer == 1) src_stride = dst_stride = width;
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  const auto cap = static_cast<int64_t>(impl_->staging / dtype_size(src_type));  // elements per piece
  if (width <= cap) {
    const int64_t rows_per = std::max<int64_t>(1, cap / width);
    for (int64_t o = 0; o < outer; o += rows_per)
      impl_->piece(d, dst_type, dst_stride, s, src_type, src_stride, o, 0, std::min(rows_per, outer - o), width);
  } else {
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t c = 0; c < width; c += cap)
        impl_->piece(d, dst_type, dst_stride, s, src_type, src_stride, o, c, 1, std::min(cap, width - c));
  }
}

void staged_upload::wait() {
  for (int b = 0; b < 2; ++b)
    if (impl_->in_flight[b]) {
      CUDA_CHECK(cudaEventSynchronize(impl_->done[b]));
      impl_->in_flight[b] = false;
    }
}

uint64_t staged_upload::bytes_read() const { return impl_->bytes; }

}  // namespace hyserve::kernels
