#pragma once
// What the GDN translation units share (gdn.cu: the recurrent kernel, the checks and the path
// choice; the generated gdn_tc_<split>_<half>_<K>.cu: the tensor-core prefill per key dim).
#include <cuda_runtime.h>

#include <cstdint>

#include "hyserve/kernels/gdn.h"

namespace hyserve::kernels::cuda_detail {

// The CPU op's checks of the host-visible fields, and the CUDA kernels' limits.
void check_gdn_common(const gdn_common_params& p, const char* op);

// The recurrent kernel (gdn.cu) over token ranges qsl (null: decode, one token per row) with
// initial-state flags has_init (null: none); gate: null, or a device flag the kernel waits to be
// nonzero for (the tensor-core prefill's overflow flag).
void launch_gdn(const gdn_common_params& p, const int32_t* qsl, const uint8_t* has_init, const char* op,
                cudaStream_t stream, const int* gate = nullptr);

// Tokens the tensor-core prefill reserves its workspace for (HYSERVE_GDN_MAX_TOKENS, default 16384).
int64_t gdn_tc_max_tokens();

// The tensor-core prefill for key dim K: 3xTF32 (kSplit), plain TF32, or bf16 products (kHalf,
// gdn_wy16_state.cuh), up to `stages` launches (gdn_tc_launch.cuh).
template <bool kSplit, int K, bool kHalf>
void launch_gdn_tc_k(const gdn_chunk_scan_params& p, cudaStream_t stream, int stages);

#define HYSERVE_GDN_TC_EXTERN(split, k, half) \
  extern template void launch_gdn_tc_k<split, k, half>(const gdn_chunk_scan_params&, cudaStream_t, int);
HYSERVE_GDN_TC_EXTERN(true, 32, false)
HYSERVE_GDN_TC_EXTERN(true, 64, false)
HYSERVE_GDN_TC_EXTERN(true, 128, false)
HYSERVE_GDN_TC_EXTERN(false, 32, false)
HYSERVE_GDN_TC_EXTERN(false, 64, false)
HYSERVE_GDN_TC_EXTERN(false, 128, false)
HYSERVE_GDN_TC_EXTERN(false, 32, true)
HYSERVE_GDN_TC_EXTERN(false, 64, true)
HYSERVE_GDN_TC_EXTERN(false, 128, true)
#undef HYSERVE_GDN_TC_EXTERN

}  // namespace hyserve::kernels::cuda_detail
