#pragma once
// Warp-level TF32 tensor-core products and asynchronous copies of the GDN chunked prefill
// (gdn_chunked.cuh): the TF32 operand split, mma.sync m16n8k8, the warp GEMMs over fragment
// accessors, cp.async.
#include <cstdint>

namespace hyserve::kernels::cuda_detail {
namespace gdn_tc {

// The TF32 operand(s) of x. The tensor core reads the top 19 bits of a .tf32 register and
// ignores the low 13. Split (3xTF32): hi = x with the low 13 bits cleared, lo = x − hi (exact in
// fp32), read truncated: |error| <= 2^-10·|lo| <= 2^-20·|x|. Plain: x + half a TF32 unit in the
// last place, read truncated = x rounded to nearest (ties away). One or two integer/fp32
// operations per element where cvt.rna.tf32.f32 takes more.
template <bool kSplit>
__device__ __forceinline__ void tf32_parts(float x, uint32_t& hi, uint32_t& lo) {
  if constexpr (kSplit) {
    hi = __float_as_uint(x) & 0xffffe000u;
    lo = __float_as_uint(x - __uint_as_float(hi));
  } else {
    hi = __float_as_uint(x) + 0x1000u;
    lo = 0u;
  }
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The shared steps of the two-product GEMMs below (same operations, same order): A fragments of
// both products split, B fragment pair split, and the MMAs of one n-tile (small terms first).
template <bool kSplit>
__device__ __forceinline__ void split_a_pair(const float (&a1)[4], const float (&a2)[4], uint32_t (&a1hi)[4],
                                             uint32_t (&a1lo)[4], uint32_t (&a2hi)[4], uint32_t (&a2lo)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    tf32_parts<kSplit>(a1[i], a1hi[i], a1lo[i]);
    tf32_parts<kSplit>(a2[i], a2hi[i], a2lo[i]);
  }
}

template <bool kSplit>
__device__ __forceinline__ void mma_pair(float (&acc1)[4], float (&acc2)[4], const uint32_t (&a1hi)[4],
                                         const uint32_t (&a1lo)[4], const uint32_t (&a2hi)[4],
                                         const uint32_t (&a2lo)[4], float b0, float b1) {
  uint32_t b0h, b0l, b1h, b1l;
  tf32_parts<kSplit>(b0, b0h, b0l);
  tf32_parts<kSplit>(b1, b1h, b1l);
  if constexpr (kSplit) {
    mma_tf32(acc1, a1lo, b0h, b1h);
    mma_tf32(acc1, a1hi, b0l, b1l);
    mma_tf32(acc2, a2lo, b0h, b1h);
    mma_tf32(acc2, a2hi, b0l, b1l);
  }
  mma_tf32(acc1, a1hi, b0h, b1h);
  mma_tf32(acc2, a2hi, b0h, b1h);
}

// One warp: acc[16 × 8·NT] += A[16 × k_end] · B[k_end × 8·NT] (k_end a multiple of 8).
// a_at(r, k), r in [0, 16), and b_at(k, n), n in [0, 8·NT), give fp32 elements. Fragments (PTX
// m16n8k8 .tf32), g = lane / 4, t = lane % 4:
//   A: (g, k+t) (g+8, k+t) (g, k+t+4) (g+8, k+t+4);  B: (k+t, 8·tile + g) (k+t+4, 8·tile + g);
//   acc[tile][e]: row g + 8·(e / 2), column 8·tile + 2t + e % 2.
// n-tiles n >= nt_end are skipped (left untouched).
template <bool kSplit, int NT, class FA, class FB>
__device__ __forceinline__ void warp_gemm(float (&acc)[NT][4], int k_end, FA a_at, FB b_at, int nt_end = NT) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll 2
  for (int k = 0; k < k_end; k += 8) {
    const float a[4] = {a_at(g, k + t), a_at(g + 8, k + t), a_at(g, k + t + 4), a_at(g + 8, k + t + 4)};
    uint32_t ahi[4], alo[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      tf32_parts<kSplit>(a[i], ahi[i], alo[i]);
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      if (n >= nt_end) continue;
      const float b0 = b_at(k + t, 8 * n + g), b1 = b_at(k + t + 4, 8 * n + g);
      uint32_t b0h, b0l, b1h, b1l;
      tf32_parts<kSplit>(b0, b0h, b0l);
      tf32_parts<kSplit>(b1, b1h, b1l);
      if constexpr (kSplit) {
        mma_tf32(acc[n], alo, b0h, b1h);  // small terms first
        mma_tf32(acc[n], ahi, b0l, b1l);
      }
      mma_tf32(acc[n], ahi, b0h, b1h);
    }
  }
}

// Two products sharing B, acc1 += A1 · B and acc2 += A2 · B (B read and split once), for
// operands contiguous along k (A rows and Bᵀ rows in shared memory): the k-slots
// t and t+4 of a fragment take the adjacent elements 2t and 2t+1 of each 8-wide k step (the
// same permutation for A and B leaves the product unchanged), so each fragment pair is one
// 8-byte load. a1_at2(r, k), a2_at2(r, k) and b_at2(k, n) return the float2 at (r or n, k..k+1),
// k even. Conflict-free for row strides ≡ 8 (mod 32) floats. (warp_gemm2 below is the same
// with element accessors; the loops stay apart so that each compiles to its own loads.)
template <bool kSplit, int NT, class FA1, class FA2, class FB>
__device__ __forceinline__ void warp_gemm2_kc(float (&acc1)[NT][4], float (&acc2)[NT][4], int k_end, FA1 a1_at2,
                                              FA2 a2_at2, FB b_at2, int nt_end = NT) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll 2
  for (int k = 0; k < k_end; k += 8) {
    const float2 p0 = a1_at2(g, k + 2 * t), p1 = a1_at2(g + 8, k + 2 * t);
    const float2 q0 = a2_at2(g, k + 2 * t), q1 = a2_at2(g + 8, k + 2 * t);
    const float a1[4] = {p0.x, p1.x, p0.y, p1.y};
    const float a2[4] = {q0.x, q1.x, q0.y, q1.y};
    uint32_t a1hi[4], a1lo[4], a2hi[4], a2lo[4];
    split_a_pair<kSplit>(a1, a2, a1hi, a1lo, a2hi, a2lo);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      if (n >= nt_end) continue;
      const float2 bb = b_at2(k + 2 * t, 8 * n + g);
      mma_pair<kSplit>(acc1[n], acc2[n], a1hi, a1lo, a2hi, a2lo, bb.x, bb.y);
    }
  }
}

template <int NT>
__device__ __forceinline__ void zero(float (&acc)[NT][4]) {
#pragma unroll
  for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

// A 16-byte shared-memory load (p 16-byte aligned), kept as one instruction: the compiler splits
// a plain float4 load of an unrolled loop into four scalar loads.
__device__ __forceinline__ float4 lds128(const float* p) {
  float4 v;
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a));
  return v;
}

// 16-byte asynchronous copies to shared memory (full = false: the 16 bytes are zero-filled,
// nothing is read).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool full) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(full ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait0() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// Two products sharing B: acc1 += A1·B and acc2 += A2·B over k < k_end (fragments as in
// warp_gemm; B read and split once).
template <bool kSplit, int NT, class FA1, class FA2, class FB>
__device__ __forceinline__ void warp_gemm2(float (&acc1)[NT][4], float (&acc2)[NT][4], int k_end, FA1 a1_at,
                                           FA2 a2_at, FB b_at) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll 2
  for (int k = 0; k < k_end; k += 8) {
    const float a1[4] = {a1_at(g, k + t), a1_at(g + 8, k + t), a1_at(g, k + t + 4), a1_at(g + 8, k + t + 4)};
    const float a2[4] = {a2_at(g, k + t), a2_at(g + 8, k + t), a2_at(g, k + t + 4), a2_at(g + 8, k + t + 4)};
    uint32_t a1hi[4], a1lo[4], a2hi[4], a2lo[4];
    split_a_pair<kSplit>(a1, a2, a1hi, a1lo, a2hi, a2lo);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const float b0 = b_at(k + t, 8 * n + g), b1 = b_at(k + t + 4, 8 * n + g);
      mma_pair<kSplit>(acc1[n], acc2[n], a1hi, a1lo, a2hi, a2lo, b0, b1);
    }
  }
}

}  // namespace gdn_tc
}  // namespace hyserve::kernels::cuda_detail
