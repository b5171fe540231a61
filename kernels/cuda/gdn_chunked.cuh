#pragma once
// Gated DeltaNet chunked prefill on the tensor cores (the WY / UT-transform form of the delta
// rule, as the CPU op computes it): the decomposition, the constants, the workspace and the plan
// kernel here; the intra-chunk kernel in gdn_tc_intra.cuh, the state kernel in gdn_tc_state.cuh,
// the warp-level products in gdn_tc_mma.cuh. Three launches:
//
//   plan    one block: chunk offsets of the rows (ceil(len / 64) chunks per live row, none for
//           padding rows or empty sequences) and the overflow flag (more chunks than reserved);
//   intra   one block per (chunk, value head or pair of value heads sharing a key head), all
//           chunks at once: everything that does not depend on the state entering the chunk;
//   state   one block per (row, value head, slice of 32 value rows) walking the row's chunks in
//           order with its state slice in registers (state rows are independent in the delta
//           rule, so slices need no communication).
//
// Inside a chunk of n tokens (rows >= n are zeros) with c_i = Σ_{s<=i} g_s (double), q̂ = scale·q/|q|,
// k̂ = k/|k| and β = sigmoid(b), the intra kernel computes
//   A  = strictly-lower β_i (k̂_i·k̂_j) e^{c_i − c_j}         (tensor cores: K̂·K̂ᵀ)
//   T  = (I + A)⁻¹                                          (blocked forward substitution)
//   P  = lower-incl. (q̂_i·k̂_j) e^{c_i − c_j}                 (tensor cores: Q̂·K̂ᵀ)
// and per token the factors qs_i = e^{c_i}·scale/|q_i|, ks_j = e^{c_{n−1} − c_j}/|k_j|, β_j,
// xs_j = β_j e^{c_j}/|k_j| and the chunk decay G = e^{c_{n−1}}, and it writes T, R = P·T and
// the token factors to a workspace. With X = xs ⊙ k the CPU op's W = T·X and U = T·(β v), so for
// a state slice S_s [32 × K] the state kernel computes per chunk, on the tensor cores,
//   z   = β v_s − X · S_sᵀ                        ([64 × 32])
//   u   = T · z = U − W·S_sᵀ                      (the chunk's new values)
//   o   = (qs ⊙ q) · S_sᵀ + R · z                 (the chunk's outputs of the slice; R·z = P·u)
//   S_s ← G · S_s + uᵀ · (ks ⊙ k)
// reading q, k and v from the inputs (scaled as their fragments are read) and T, R and the
// token factors from the workspace.
//
// GEMMs run on mma.sync m16n8k8 TF32 with fp32 accumulation, either split 3xTF32
// (a = a_hi + a_lo, a·b ≈ a_lo·b_hi + a_hi·b_lo + a_hi·b_hi: fp32-level accuracy) or plain TF32
// (one product, about 5e-4 relative per product; faster). The intra kernel has 4 warps, warp w
// owning token rows [16w, 16w + 16) of its outputs; the state kernel 8 (see there).
//
// The bf16 path (kHalf) keeps the decomposition with bf16 operands: the intra kernel stages q
// and k as bf16 (16-byte aligned f32 rows normalised in registers on the way in, so q̂ and k̂ are
// rounded once), writes q̂ and k̂ (normalised) as bf16 tiles,
// takes its Gram products from them, and writes T and P (not R) as bf16 tiles (P straight from
// its registers) and the token factors without the norms (qs = e^{c}, ks = e^{c_{n−1} − c},
// xs = β e^{c}), field-major; its blocks take 73.5 KB of shared memory (T where q and k were
// staged), three to an SM (f32 rows that are not 16-byte aligned are staged as f32: two); its
// state kernel is gdn_wy16_state.cuh.
// Shared-memory row strides are ≡ 4 (mod 32) floats where a tile is read as row-major A
// fragments or transposed B fragments, ≡ 8 where it is read as k-major B fragments.
//
// The workspace holds cap = kernels.gdn_max_tokens / 64 + batch chunks (default 16384 tokens);
// a batch needing more is computed by the recurrent kernel instead, gated on the overflow flag
// on the device (no host synchronisation; graph-capturable).
#include <cstdint>

#include "common.cuh"
#include "gdn_tc_mma.cuh"
#include "launch.cuh"
#include "mma_bf16.cuh"
#include "hyserve/kernels/gdn.h"

namespace hyserve::kernels::cuda_detail {
namespace gdn_tc {

constexpr int kChunk = 64;
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kSlice = 32;  // value rows per state block
constexpr float kL2Eps = 1e-6f;
constexpr int kTokFields = 8;  // per token: qs, ks, beta, G (every row), xs, 3 unused

// ---- workspace and plan ----------------------------------------------------------------------

struct workspace {
  int* chunk_off = nullptr;  // [batch + 1] first global chunk of each row
  int* overflow = nullptr;   // [1] 1: more chunks than cap (the recurrent kernel runs instead)
  float* R = nullptr;        // [cap, HV, 64, 64] P·T                           (tc, tf32)
  float* T = nullptr;        // [cap, HV, 64, 64]                               (tc, tf32)
  float* tok = nullptr;      // [cap, HV, 64, kTokFields]
  // bf16 path (gdn_wy16_state.cuh): 16-bit tiles in the swizzled layout of swz16, each copied
  // whole into shared memory by one bulk copy.
  __nv_bfloat16* qk16 = nullptr;  // [cap, HK, 2, 64, K] q̂ (scale included), then k̂
  __nv_bfloat16* tp16 = nullptr;  // [cap, HV, 2, 64, 64] T, then P
  int cap = 0;
};

// Offset of element (r, c) in a 16-bit tile of rows of L elements (L/8 16-byte units, L >= 32):
// unit c/8 of row r is stored at unit (c/8) ^ (r mod min(8, L/8)), so that the 8 rows an
// ldmatrix reads at one column unit fall in distinct bank groups (L >= 64; 2-way at L = 32).
template <int L>
__host__ __device__ constexpr int swz16(int r, int c) {
  constexpr int kMask = (L / 8 < 8 ? L / 8 : 8) - 1;
  return r * L + ((((c >> 3) ^ (r & kMask))) << 3) + (c & 7);
}

__device__ __forceinline__ int row_chunks(const gdn_chunk_scan_params& p, int64_t b) {
  if (p.state_indices[b] < 0) return 0;
  const int len = p.query_start_loc[b + 1] - p.query_start_loc[b];
  return (len + kChunk - 1) / kChunk;
}

static __global__ void __launch_bounds__(1024) plan_kernel(const gdn_chunk_scan_params p, workspace ws) {
  pdl_launch_dependents();  // the intra kernel (launched with PDL) waits for this grid's end
  __shared__ int warp_tot[32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t per = ceil_div(p.batch, 1024);
  const int64_t b0 = tid * per, b1 = min(p.batch, b0 + per);
  int sum = 0;
  for (int64_t b = b0; b < b1; ++b) sum += row_chunks(p, b);
  int run = block_exclusive_prefix(sum, lane, warp, warp_tot);  // exclusive prefix of this thread
  for (int64_t b = b0; b < b1; ++b) {
    ws.chunk_off[b] = run;
    run += row_chunks(p, b);
  }
  if (tid == 1023) {  // the last thread's running sum is the total (threads past the batch add 0)
    ws.chunk_off[p.batch] = run;
    *ws.overflow = run > ws.cap ? 1 : 0;
  }
}

// Stages a [ROWS × COLS] tile: kU loads in flight per thread before the stores.
template <int ROWS, int COLS, class Load, class Store>
__device__ __forceinline__ void stage(Load load, Store store) {
  constexpr int kN = ROWS * COLS, kU = kN / kThreads < 8 ? kN / kThreads : 8;
  static_assert(kU > 0 && kN % (kThreads * kU) == 0, "whole batches");
  const int tid = threadIdx.x;
  for (int e0 = 0; e0 < kN; e0 += kThreads * kU) {
    decltype(load(0, 0)) v[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int e = e0 + u * kThreads + tid;
      v[u] = load(e / COLS, e % COLS);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int e = e0 + u * kThreads + tid;
      store(e / COLS, e % COLS, v[u]);
    }
  }
}

}  // namespace gdn_tc
}  // namespace hyserve::kernels::cuda_detail
