#pragma once
// Pieces shared by the SSD chunk scan and the decode state update.
#include <string>

#include "../cpu/ssm_dtype.h"
#include "../cpu/ssm_validate.h"
#include "common.cuh"
#include "hyserve/kernels/ssm.h"

namespace hyserve::kernels::cuda_detail {

// Step size of head h from the raw projection output: bias, softplus, clamp to the limits.
__device__ __forceinline__ float step_size(const ssm_common_params& p, float raw, int64_t h) {
  float v = raw + (p.dt_bias != nullptr ? p.dt_bias[h] : 0.0f);
  if (p.dt_softplus) v = softplus(v);
  return fminf(fmaxf(v, p.dt_min), p.dt_max);
}

// The checks both backends share (cpu/ssm_validate.h), then the CUDA kernels' own limits;
// state_indices (device memory) are not read: a slot < 0 is a padding row.
inline void check_ssm_common(const ssm_common_params& p, const char* op) {
  cpu_detail::check_ssm_common_fields(p, op);
  // CUDA-specific limits: grid dimensions and the 16-byte state accesses.
  if (p.batch > 65535) fail(op, "batch", p.batch, "exceeds the CUDA grid (65535)");
  if (p.heads > 0x7fffffff) fail(op, "heads", p.heads, "exceeds the CUDA grid");
  if (p.head_dim > 0x7fffffff) fail(op, "head_dim", p.head_dim, "exceeds the int range");
  if (p.d_state % 4 != 0) fail(op, "d_state", p.d_state, "must be a multiple of 4 for the CUDA kernels");
  require_aligned16(p.ssm_states, op, "ssm_states");
}

template <class T>
struct type_tag {
  using type = T;
};

// Calls f(type_tag<IO>{}, type_tag<State>{}) for the params' element types (f32 → float,
// bf16 → __nv_bfloat16; require_ssm_dtypes has rejected the rest).
template <class F>
void dispatch_ssm_types(const ssm_common_params& p, F&& f) {
  auto with_state = [&](auto io) {
    if (p.state_dtype == dtype::kBF16) f(io, type_tag<__nv_bfloat16>{});
    else f(io, type_tag<float>{});
  };
  if (p.io_dtype == dtype::kBF16) with_state(type_tag<__nv_bfloat16>{});
  else with_state(type_tag<float>{});
}

// 16 bytes of T as floats, and back (bf16 rounded to nearest even).
template <class T>
struct pack_traits;
template <>
struct pack_traits<float> {
  static constexpr int kN = 4;
  __device__ __forceinline__ static void unpack(uint4 v, float (&f)[4]) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
  }
  __device__ __forceinline__ static uint4 pack(const float (&f)[4]) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
  }
};
template <>
struct pack_traits<__nv_bfloat16> {
  static constexpr int kN = 8;
  __device__ __forceinline__ static float2 unpack2(uint32_t w) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
  }
  __device__ __forceinline__ static uint32_t pack2(float a, float b) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  __device__ __forceinline__ static void unpack(uint4 v, float (&f)[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 t = unpack2(w[i]);
      f[2 * i] = t.x;
      f[2 * i + 1] = t.y;
    }
  }
  __device__ __forceinline__ static uint4 pack(const float (&f)[8]) {
    return make_uint4(pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7]));
  }
};

// Two consecutive state elements as floats (8-byte aligned for float, 4 for bf16), and back.
__device__ __forceinline__ float2 load_state2(const float* p) { return __ldcg(reinterpret_cast<const float2*>(p)); }
__device__ __forceinline__ float2 load_state2(const __nv_bfloat16* p) {
  return pack_traits<__nv_bfloat16>::unpack2(__ldcg(reinterpret_cast<const unsigned int*>(p)));
}
__device__ __forceinline__ void store_state2(float* p, float2 v) { __stcg(reinterpret_cast<float2*>(p), v); }
__device__ __forceinline__ void store_state2(__nv_bfloat16* p, float2 v) {
  __stcg(reinterpret_cast<unsigned int*>(p), pack_traits<__nv_bfloat16>::pack2(v.x, v.y));
}

}  // namespace hyserve::kernels::cuda_detail
