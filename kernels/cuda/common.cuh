#pragma once
// Shared by the CUDA kernels: element types, 16-byte packs, warp/block reductions, device
// properties and the host-side parameter checks (the CPU backend's, reused verbatim).
//
// Element types. Kernels are templates on T, the type of activations, caches and logits (x,
// out, q/k/v, B/C/dt/y, KV cache); weights and per-head parameters (norm and conv weights,
// A_log, D, dt_bias) and recurrent states stay float. Arithmetic is float. A dtype is added
// by appending X(type) to HYSERVE_CUDA_FOR_EACH_TYPE (to_float/from_float below already cover
// __nv_bfloat16) and giving it an entry point.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "../cpu/validate.h"
#include "check.h"

#define HYSERVE_CUDA_FOR_EACH_TYPE(X) X(float)

namespace hyserve::kernels::cuda_detail {

using cpu_detail::fail;
using cpu_detail::require_non_negative;
using cpu_detail::require_positive;
using cpu_detail::require_ptr;
using cpu_detail::require_stride;

inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A device pointer the kernels read with 16-byte vector accesses.
inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// The 16-byte vector path applies: every pointer 16-byte aligned and every length/stride
// (in elements) a multiple of the pack size.
inline bool vector_ok(std::initializer_list<const void*> ptrs, std::initializer_list<int64_t> lengths, int pack) {
  for (const void* ptr : ptrs)
    if (ptr != nullptr && !aligned16(ptr)) return false;
  for (int64_t n : lengths)
    if (n % pack != 0) return false;
  return true;
}

inline void require_aligned16(const void* ptr, const char* op, const char* field) {
  if (!aligned16(ptr)) fail(op, field, ptr, "must be 16-byte aligned (device allocations are)");
}

// Streaming multiprocessors and opt-in shared memory per block of the current device.
int sm_count();
int max_shared_per_block_optin();
// Lets kernel launch with `bytes` of dynamic shared memory (above the default 48 KB). The
// attribute is set once per (kernel, device), so steady-state launches, and launches being
// captured in a graph, make no extra runtime calls.
void reserve_dynamic_shared(const void* kernel, size_t bytes);
// Blocks of `kernel` (`threads` a block, `smem` bytes of dynamic shared memory) resident on one
// SM at once, at least 1: asked once per (kernel, threads, smem, device), so launches being
// captured make no extra runtime calls.
int resident_blocks_per_sm(const void* kernel, int threads, size_t smem);

// The exclusive prefix sum of each thread's `sum`, in thread order, over a block of 1024
// threads: a shuffle scan in each warp, then one over the warp totals (warp_tot: the block's
// __shared__ int[32]). Every thread of the block calls it (it synchronises the block).
__device__ __forceinline__ int block_exclusive_prefix(int sum, int lane, int warp, int* warp_tot) {
  int incl = sum;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) warp_tot[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int w = warp_tot[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += v;
    }
    warp_tot[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  return incl - sum + (warp > 0 ? warp_tot[warp - 1] : 0);
}

template <class T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}

// 16 bytes of T: the unit of vector loads and stores (4 floats, 8 bf16).
template <class T>
struct alignas(16) pack16 {
  static constexpr int kN = 16 / static_cast<int>(sizeof(T));
  T v[kN];
};

template <class T>
__device__ __forceinline__ pack16<T> load_pack(const T* p) {
  return *reinterpret_cast<const pack16<T>*>(p);
}

template <class T>
__device__ __forceinline__ void store_pack(T* p, const pack16<T>& v) {
  *reinterpret_cast<pack16<T>*>(p) = v;
}

// N consecutive floats from a 16-byte aligned address.
template <int N>
__device__ __forceinline__ void load_floats(const float* p, float (&out)[N]) {
  static_assert(N % 4 == 0, "whole float4s");
#pragma unroll
  for (int j = 0; j < N / 4; ++j) {
    const float4 v = reinterpret_cast<const float4*>(p)[j];
    out[4 * j] = v.x;
    out[4 * j + 1] = v.y;
    out[4 * j + 2] = v.z;
    out[4 * j + 3] = v.w;
  }
}

// Same threshold as torch.nn.functional.softplus (and the CPU ops).
__device__ __forceinline__ float softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

// Eight bf16 (one 16-byte load) as floats, exactly.
__device__ __forceinline__ void bf16x8_to_float(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Max (kMax) or min of an unsigned over the warp (full mask): one redux instruction from sm_80 on.
template <bool kMax>
__device__ __forceinline__ unsigned warp_extreme_u32(unsigned v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return kMax ? __reduce_max_sync(0xffffffffu, v) : __reduce_min_sync(0xffffffffu, v);
#else
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned u = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? max(v, u) : min(v, u);
  }
  return v;
#endif
}
__device__ __forceinline__ unsigned warp_max_u32(unsigned v) { return warp_extreme_u32<true>(v); }
__device__ __forceinline__ unsigned warp_min_u32(unsigned v) { return warp_extreme_u32<false>(v); }

// Sum over the block; every thread gets the result. blockDim.x is a multiple of 32 and at
// most 1024. Begins with a barrier so that back-to-back calls may reuse the scratch.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int n_warps = static_cast<int>(blockDim.x >> 5);
  v = lane < n_warps ? partial[lane] : 0.0f;
  return warp_sum(v);
}

__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

// (value, index) order of argmax: a larger value wins, equal values go to the lower index.
__device__ __forceinline__ bool argmax_better(float v1, int32_t i1, float v2, int32_t i2) {
  return v1 > v2 || (v1 == v2 && i1 < i2);
}

// Block-wide best (value, index) in argmax_better's order; every thread gets the result.
// blockDim.x is a multiple of 32 and at most 1024.
__device__ __forceinline__ void block_best(float& v, int32_t& i) {
  __shared__ float sv[32];
  __shared__ int32_t si[32];
  auto warp_best = [&] {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int32_t oi = __shfl_xor_sync(0xffffffffu, i, o);
      if (argmax_better(ov, oi, v, i)) {
        v = ov;
        i = oi;
      }
    }
  };
  warp_best();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_warps = static_cast<int>(blockDim.x >> 5);
  __syncthreads();
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = i;
  }
  __syncthreads();
  v = lane < n_warps ? sv[lane] : -INFINITY;
  i = lane < n_warps ? si[lane] : INT_MAX;
  warp_best();
}

// Sum in double over the block; every thread gets the result (as block_sum).
__device__ __forceinline__ double block_sum_double(double v) {
  __shared__ double partial[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_warps = static_cast<int>(blockDim.x >> 5);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < n_warps ? partial[lane] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Fetches the 128-byte line at ptr into L2 (no registers held, no result).
__device__ __forceinline__ void prefetch_l2(const void* ptr) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(ptr));
}

}  // namespace hyserve::kernels::cuda_detail
