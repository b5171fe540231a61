#pragma once
// The row-invariant bf16 GEMM of up to 8 rows with cuBLASLt's bits (determinism: batch_invariant,
// kernels.invariant_gemm: chain; gemm.cu, the only includer). cuBLASLt with split-K 1
// (gemm_lt.cuh) computes each output as one MMA chain over k in ascending k16 steps;
// bench/probes/cublaslt_invariance_probe.cu found those bits equal, output for output, to one
// mma.sync m16n8k16 chain (bf16 operands, f32 accumulation, from zero) with either operand as
// the MMA's A. This kernel computes exactly that chain, so a row of a decode step (1-8 rows,
// here) has the bits of the same row in a verify or prefill call of more rows (cuBLASLt), while a
// decode step is one launch that streams its weight like the skinny kernels: cuBLASLt at one row
// reads the weight at a fraction of the copy bandwidth, after a rounding kernel.
//
// A warp owns 8 weight rows (the MMA's B, n = 8; the activations are its A, rows >= m zeros:
// run 28's first version had the weight as A, 16 rows a warp, and n = 4096 weights ran at ~50% of
// copy bandwidth on 256 warps) and runs their chain over the whole k. The weight streams through
// a ring of STAGES 64-wide k stages in shared memory per warp (cp.async, 16 bytes a lane and
// copy, chunk c of row r stored at chunk c ^ r so that ldmatrix's 8 rows fall on distinct
// banks); the first
// STAGES - 1 stages are issued before pdl_wait() (no earlier kernel writes a weight). The
// activations' m rows of a stage (f32, 64 k) ride in the same ring slot, copied with the weight's
// stage (run 28: read into registers one stage ahead, their global latency was exposed at every
// stage and the chain ran at 26-82% of copy bandwidth), and are rounded to bf16 (nearest even)
// where used: the bits of the rounding kernel the cuBLASLt path runs first. Epilogue: alpha 1 and
// beta 0 or 1 (acc, or acc + c in one rounding), or the SwiGLU formula of two chains (gate and
// up) for the fused projection.
// Used for k a multiple of 64, on the layouts the cuBLASLt path takes (both depend on the shape
// only, never on m).
#include <cuda_bf16.h>

#include <cstdint>

#include "async_copy.cuh"
#include "common.cuh"
#include "gemm_skinny.cuh"  // skinny_args, swiglu_out
#include "launch.cuh"
#include "mma_bf16.cuh"

namespace hyserve::kernels::cuda_detail {
namespace {

constexpr int kChainWarps = 2;  // warps (8-row weight tiles) per block
constexpr int kChainRows = 8;   // weight rows a warp
constexpr int kChainK = 64;     // k per stage
constexpr int kChainXStride = kChainK + 8;  // f32 per activation row of a stage (conflict-free float2 reads)
constexpr int64_t kChainMaxM = 8;

// Stages in a warp's ring: 12 × 1 KB for one weight, 8 × 2 KB for gate and up (plus m rows of
// activations each).
template <bool kSwiglu>
__host__ __device__ constexpr int chain_stages() {
  return kSwiglu ? 8 : 12;
}

// Bytes of one ring slot: the weight streams' 8 × 64 bf16 each, then m × kChainXStride f32.
template <bool kSwiglu>
__host__ __device__ constexpr int chain_slot_bytes(int m) {
  return (kSwiglu ? 2 : 1) * kChainRows * kChainK * 2 + m * kChainXStride * 4;
}

template <bool kSwiglu>
constexpr size_t chain_smem_bytes(int m) {
  return size_t{kChainWarps} * chain_stages<kSwiglu>() * chain_slot_bytes<kSwiglu>(m);
}

bool chain_shape_applies(int64_t k) { return k % kChainK == 0; }

template <bool kSwiglu>
__global__ void __launch_bounds__(32 * kChainWarps) chain_gemm_kernel(const skinny_args p, int m) {
  constexpr int S = kSwiglu ? 2 : 1;  // weight streams (gate, up)
  constexpr int ST = chain_stages<kSwiglu>();
  constexpr int kStage = kChainRows * kChainK;  // bf16 elements of one stream's stage
  extern __shared__ __align__(128) unsigned char chain_smem[];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kChainWarps + warp) * kChainRows;
  const bool live = row0 < p.n;  // warp-uniform; an idle warp still waits (below)
  const int slot_bytes = chain_slot_bytes<kSwiglu>(m);
  unsigned char* ring = chain_smem + static_cast<int64_t>(warp) * ST * slot_bytes;
  // This lane's copies of a weight stage: 16-byte chunks q = lane + 32 i of 8 rows × 8 chunks.
  const __nv_bfloat16* src[S][2];
  int dst[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int q = lane + 32 * i, r = q >> 3, c = q & 7;
    const int64_t row = row0 + r < p.n ? row0 + r : p.n - 1;  // a duplicate row past the end, not stored
#pragma unroll
    for (int s = 0; s < S; ++s) src[s][i] = (s == 1 ? p.b1 : p.b0) + row * p.ldb + c * 8;
    dst[i] = r * kChainK + ((c ^ r) * 8);
  }
  const int64_t stages = p.k / kChainK;
  const auto slot = [&](int64_t st) { return ring + static_cast<int64_t>(st % ST) * slot_bytes; };
  const auto issue_w = [&](int64_t st) {
    __nv_bfloat16* w = reinterpret_cast<__nv_bfloat16*>(slot(st));
#pragma unroll
    for (int s = 0; s < S; ++s)
#pragma unroll
      for (int i = 0; i < 2; ++i) cp_async16_zfill(w + s * kStage + dst[i], src[s][i] + st * kChainK, 16);
  };
  // The activations of a stage: chunks q = lane + 32 i of m rows × 16 chunks of 4 f32.
  const auto issue_x = [&](int64_t st) {
    float* x = reinterpret_cast<float*>(slot(st) + S * kStage * 2);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int q = lane + 32 * i, r = q >> 4, c = q & 15;
      if (r < m)
        cp_async16_zfill(x + r * kChainXStride + c * 4, p.a + static_cast<int64_t>(r) * p.lda + st * kChainK + c * 4, 16);
    }
  };
  // Stage st's weight and activations into its slot, then one commit (empty past the end: one
  // group per call keeps the wait below counting stages).
  const auto issue = [&](int64_t st) {
    if (st < stages) {
      issue_w(st);
      issue_x(st);
    }
    cp_async_commit_group();
  };
  if (live)
    for (int64_t st = 0; st < ST - 1 && st < stages; ++st) issue_w(st);
  pdl_begin();  // launched with programmatic dependent launch: the activations (and c) after it
  if (!live) return;
  for (int64_t st = 0; st < ST - 1 && st < stages; ++st) issue_x(st);
  cp_async_commit_group();  // the first ST - 1 stages, weights and activations: one group

  float acc[S][4] = {};
  const bool x_live = g < m;  // the A fragment's row g: activation row g (rows >= m and g + 8: zeros)
  // ldmatrix.x4 of two k16 steps: lane l gives weight row l % 8, chunk 4·pair + l / 8; registers
  // 0, 1 are the B fragment of the first step, 2, 3 of the second.
  const int lr = lane & 7, lc = lane >> 3;
  const uint32_t ring_addr = mma16::smem_u32(ring);
  constexpr int KS = kChainK / 16;
  for (int64_t st = 0; st < stages; ++st) {
    // This lane's copies of stage st have landed: at the first step the whole first group; after
    // it, stage st's group is ST - 2 groups behind the newest.
    if (st == 0) {
      cp_async_wait_group<0>();
    } else {
      cp_async_wait_group<ST - 2>();
    }
    __syncwarp();  // and every lane's; the slot refilled next was read last step
    issue(st + ST - 1);
    const uint32_t slot_addr = ring_addr + static_cast<uint32_t>((st % ST) * slot_bytes);
    const float* xs = reinterpret_cast<const float*>(slot(st) + S * kStage * 2) + g * kChainXStride + 2 * t;
#pragma unroll
    for (int pair = 0; pair < KS / 2; ++pair) {
      uint32_t b[S][4];
      const int c = 4 * pair + lc;
#pragma unroll
      for (int s = 0; s < S; ++s)
        mma16::ldsm_x4(b[s], slot_addr + static_cast<uint32_t>((s * kStage + lr * kChainK + ((c ^ lr) * 8)) * 2));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int kk = 2 * pair + h;
        // A fragment: row g, k 2t, 2t + 1 (a0) and 2t + 8, 2t + 9 (a2); rows g + 8 (a1, a3) zero.
        const float2 x0 = x_live ? *reinterpret_cast<const float2*>(xs + kk * 16) : make_float2(0.0f, 0.0f);
        const float2 x1 = x_live ? *reinterpret_cast<const float2*>(xs + kk * 16 + 8) : make_float2(0.0f, 0.0f);
        const uint32_t a[4] = {mma16::pack_bf16x2(x0.x, x0.y), 0u, mma16::pack_bf16x2(x1.x, x1.y), 0u};
#pragma unroll
        for (int s = 0; s < S; ++s) mma16::mma_bf16(acc[s], a, b[s][2 * h], b[s][2 * h + 1]);
      }
    }
  }
  // acc[s][e], e < 2: activation row g, weight row row0 + 2t + e (e >= 2: the zero rows g + 8).
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int64_t wr = row0 + 2 * t + e;
    if (g >= m || wr >= p.n) continue;
    float* out = p.c + static_cast<int64_t>(g) * p.ldc + wr;
    if constexpr (kSwiglu) {
      *out = swiglu_out(acc[0][e], acc[1][e]);
    } else {
      *out = p.beta != 0.0f ? __fadd_rn(acc[0][e], *out) : acc[0][e];
    }
  }
}

// The chain kernel over a's m <= kChainMaxM rows (the caller checked the shape: alpha 1, beta 0
// or 1, the cuBLASLt path's layout, chain_shape_applies).
template <bool kSwiglu>
void launch_chain_gemm(const skinny_args& a, int64_t m, cudaStream_t stream) {
  const int64_t tiles = ceil_div(a.n, int64_t{kChainRows});
  const auto blocks = static_cast<unsigned>(ceil_div(tiles, int64_t{kChainWarps}));
  constexpr size_t most = chain_smem_bytes<kSwiglu>(static_cast<int>(kChainMaxM));
  if (most > 48 * 1024) reserve_dynamic_shared(reinterpret_cast<const void*>(&chain_gemm_kernel<kSwiglu>), most);
  const size_t smem = chain_smem_bytes<kSwiglu>(static_cast<int>(m));
  launch_pdl(chain_gemm_kernel<kSwiglu>, dim3(blocks), dim3(32 * kChainWarps), smem, stream, a, static_cast<int>(m));
}

}  // namespace
}  // namespace hyserve::kernels::cuda_detail
