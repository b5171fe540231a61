#pragma once
// Element-type conversion of a 2-D block on the device (staged_upload.cpp's converting path):
// rows × cols elements, src contiguous (pitch cols) → dst with row pitch dst_pitch (elements).
// Sources f32, bf16, f16; destinations f32, bf16 (f32 → bf16 rounds to nearest even). Free of
// CUDA headers; enqueued on `stream` (a cudaStream_t).
#include <cstdint>

#include "hyserve/common/dtype.h"

namespace hyserve::kernels::cuda_detail {

void convert_block(void* dst, dtype dst_type, int64_t dst_pitch, const void* src, dtype src_type, int64_t rows,
                   int64_t cols, void* stream);

}  // namespace hyserve::kernels::cuda_detail
