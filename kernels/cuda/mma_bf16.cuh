#pragma once
// Warp-level bf16 tensor-core operations shared by the kernels that use them: ldmatrix (plain
// and transposed), mma.sync m16n8k16 with bf16 operands and f32 accumulation, and bf16x2 packing.
// Fragment layouts (PTX m16n8k16 bf16), g = lane / 4, t = lane % 4:
//   A (16 × 16): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B (16 × 8):  b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g)
//   C (16 × 8):  c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1)
// ldmatrix lane addresses (lane l):
//   A stored row-major [m][k]:                      row m0 + (l & 15), column k0 + 8·(l >> 4)
//   A stored transposed [k][m] (.trans):            row k0 + (l & 7) + 8·(l >> 4), column m0 + 8·((l >> 3) & 1)
//   B for two n-tiles stored [n][k] (k contiguous): row n0 + (l & 7) + 8·(l >> 4), column k0 + 8·((l >> 3) & 1)
//   B for two n-tiles stored [k][n] (.trans):       row k0 + (l & 15), column n0 + 8·(l >> 4)
//   (x4 results: B tile n0 = {r0, r1}, tile n0 + 8 = {r2, r3}.)
#include <cuda_bf16.h>

#include <cstdint>

namespace hyserve::kernels::cuda_detail {
namespace mma16 {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16* ptr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(ptr)));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const bf16* ptr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(ptr)));
}

// The same at a shared-memory address (state-space byte address, e.g. from smem_u32 plus an offset).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// (a, b) rounded to nearest even as one bf16x2 word, a in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// (x0, x1) as two bf16x2 words, x0 in the low halves: hi = round(x), lo = round(x − hi)
// (|x − hi − lo| <= 2^-17 |x|: two MMAs carry f32-level products).
__device__ __forceinline__ void split_bf16x2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - __low2float(h), x1 - __high2float(h));
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

__device__ __forceinline__ float2 unpack_bf16x2(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

}  // namespace mma16
}  // namespace hyserve::kernels::cuda_detail
