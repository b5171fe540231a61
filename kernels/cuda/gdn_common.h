#pragma once
// What the GDN translation units share (gdn.cu: the recurrent kernel, the checks and the path
// choice; the generated gdn_tc_<split>_<half>_<io>_<K>.cu: the tensor-core prefill per
// key dim).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "hyserve/kernels/gdn.h"

namespace hyserve::kernels::cuda_detail {

// The CPU op's checks of the host-visible fields, and the CUDA kernels' limits (f32_io: q, k, v
// and out are the f32 pointers; the chunked prefill's bf16 io checks its own).
void check_gdn_common(const gdn_common_params& p, const char* op, bool f32_io = true);
void check_gdn_chunk_scan(const gdn_chunk_scan_params& p, const char* op);

// The rows one call reads and writes, of element type In.
template <class In>
struct gdn_io {
  const In* q;
  const In* k;
  const In* v;
  In* out;
};

inline gdn_io<__nv_bfloat16> bf16_io(const gdn_chunk_scan_params& p) {
  return {reinterpret_cast<const __nv_bfloat16*>(p.q_bf16), reinterpret_cast<const __nv_bfloat16*>(p.k_bf16),
          reinterpret_cast<const __nv_bfloat16*>(p.v_bf16), reinterpret_cast<__nv_bfloat16*>(p.out_bf16)};
}

inline gdn_io<float> f32_io(const gdn_common_params& p) { return {p.q, p.k, p.v, p.out}; }

// The recurrent kernel (gdn.cu) over token ranges qsl (null: decode, one token per row) with
// initial-state flags has_init (null: none); gate: null, or a device flag the kernel waits to be
// nonzero for (the tensor-core prefill's overflow flag); bf16: the rows in bf16 (null: p's f32 rows).
void launch_gdn(const gdn_common_params& p, const int32_t* qsl, const uint8_t* has_init, const char* op,
                cudaStream_t stream, const int* gate = nullptr, const gdn_io<__nv_bfloat16>* bf16 = nullptr);

// Tokens the tensor-core prefill reserves its workspace for (kernels.gdn_max_tokens, default 16384).
int64_t gdn_tc_max_tokens();

// The tensor-core prefill for key dim K: 3xTF32 (kSplit), plain TF32, or bf16 products (kHalf,
// gdn_wy16_state.cuh), up to `stages` launches (gdn_tc_launch.cuh); In: the element type of q, k,
// v and out (bf16 for the bf16 path only).
template <bool kSplit, int K, bool kHalf, class In>
void launch_gdn_tc_k(const gdn_chunk_scan_params& p, cudaStream_t stream, int stages);

#define HYSERVE_GDN_TC_EXTERN(split, k, half, in) \
  extern template void launch_gdn_tc_k<split, k, half, in>(const gdn_chunk_scan_params&, cudaStream_t, int);
HYSERVE_GDN_TC_EXTERN(true, 32, false, float)
HYSERVE_GDN_TC_EXTERN(true, 64, false, float)
HYSERVE_GDN_TC_EXTERN(true, 128, false, float)
HYSERVE_GDN_TC_EXTERN(false, 32, false, float)
HYSERVE_GDN_TC_EXTERN(false, 64, false, float)
HYSERVE_GDN_TC_EXTERN(false, 128, false, float)
HYSERVE_GDN_TC_EXTERN(false, 32, true, float)
HYSERVE_GDN_TC_EXTERN(false, 64, true, float)
HYSERVE_GDN_TC_EXTERN(false, 128, true, float)
HYSERVE_GDN_TC_EXTERN(false, 32, true, __nv_bfloat16)
HYSERVE_GDN_TC_EXTERN(false, 64, true, __nv_bfloat16)
HYSERVE_GDN_TC_EXTERN(false, 128, true, __nv_bfloat16)
#undef HYSERVE_GDN_TC_EXTERN

}  // namespace hyserve::kernels::cuda_detail
