// Dense matrix multiply through cuBLAS. Row-major C = op(A)·op(B) is column-major
// Cᵀ = op(B)ᵀ·op(A)ᵀ, so the operands are passed swapped, each with its own transpose flag.
// Math mode is CUBLAS_DEFAULT_MATH: true fp32, no TF32, so results agree with the CPU op.
//
// bf16 B (a linear layer's weight): up to 8 rows of A (decode; a batch-1 verify with up to 7
// drafts) go through a bandwidth-bound skinny kernel with f32 A; otherwise op(A) is rounded to bf16 into a stream-ordered scratch
// buffer (compact, ld = its row length) and cublasGemmEx multiplies bf16 × bf16 into f32 C with
// f32 accumulation (CUBLAS_COMPUTE_32F) on the tensor cores.
//
// determinism: batch_invariant (kernel_paths::batch_invariant) takes cuBLAS out: its algorithm,
// tiling and split-K follow m, so a row's bits would depend on the rows beside it. bf16 weights
// then run the tensor-core skinny kernel for every m: groups of 8 rows, the activations rounded
// to bf16 (as cuBLAS takes them above 8 rows; one MMA per 16 k instead of the exact path's
// three), each row with the same arithmetic whatever m. f32 weights and other layouts run a
// fixed-order CUDA-core kernel.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <unordered_map>

#include "../cpu/dense_validate.h"
#include "../cpu/dtype_dispatch.h"
#include "async_copy.cuh"
#include "common.cuh"
#include "hyserve/common/error.h"
#include "hyserve/kernels/activation.h"
#include "hyserve/kernels/gemm.h"
#include "hyserve/kernels/paths.h"
#include "gemm_paths.h"
#include "stream_alloc.h"

namespace hyserve::kernels {
namespace cuda_detail {
namespace {

// Workspace of a cuBLAS call (the size cuBLAS recommends for Hopper). Set after every
// cublasSetStream (which resets it), so cuBLAS never allocates its own.
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// One cuBLAS handle and its workspace for eager calls; destroyed with its owner (errors
// logged, never thrown).
class cublas_handle {
 public:
  cublas_handle() {
    CUBLAS_CHECK(cublasCreate(&handle_));
    cublasStatus_t status = cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH);
    if (status == CUBLAS_STATUS_SUCCESS && cudaMalloc(&workspace_, kCublasWorkspaceBytes) != cudaSuccess) {
      cudaGetLastError();
      workspace_ = nullptr;  // cuBLAS keeps its default workspace
    }
    if (status != CUBLAS_STATUS_SUCCESS) {
      cublasDestroy(handle_);
      CUBLAS_CHECK(status);
    }
  }
  ~cublas_handle() {
    const cublasStatus_t status = cublasDestroy(handle_);
    if (status != CUBLAS_STATUS_SUCCESS) std::cerr << "cublasDestroy failed: " << cublasGetStatusString(status) << "\n";
    if (workspace_) cudaFree(workspace_);
  }
  cublas_handle(const cublas_handle&) = delete;
  cublas_handle& operator=(const cublas_handle&) = delete;
  cublasHandle_t get() const { return handle_; }
  // Points the handle at `stream` with `workspace` (null: this handle's own).
  void bind(cudaStream_t stream, void* workspace) const {
    CUBLAS_CHECK(cublasSetStream(handle_, stream));
    if (workspace == nullptr) workspace = workspace_;
    if (workspace) CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace, kCublasWorkspaceBytes));
  }

 private:
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
};

// cuBLAS handles are not thread-safe to share and belong to one device: one per (thread, device).
// A handle (the calling thread's on the current device) bound to `stream` for one call.
//
// Inside a graph capture, and in the warm-up that measures a capture's arena (arena_footprint),
// the call's workspace is op scratch (carved from the capture's arena, released after the call
// in stream order), not the handle's: a replayed GEMM then reads memory its graph owns. The
// handle's workspace dies with the thread that created it, and a graph may be replayed by
// another thread after the capturing one has exited (a runner outlives the service loops that
// drive it); a GEMM baked with that workspace read freed memory.
class blas_call {
 public:
  explicit blas_call(cudaStream_t stream) : stream_(stream) {
    thread_local std::unordered_map<int, std::unique_ptr<cublas_handle>> handles;
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    std::unique_ptr<cublas_handle>& h = handles[device];
    if (!h) h = std::make_unique<cublas_handle>();
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone || footprint_measuring())
      CUDA_CHECK(scratch_alloc(&workspace_, kCublasWorkspaceBytes, stream));
    h->bind(stream, workspace_);
    handle_ = h->get();
  }
  ~blas_call() {
    const cudaError_t status = scratch_free(workspace_, stream_);
    if (status != cudaSuccess) std::cerr << "cuBLAS workspace release failed: " << cudaGetErrorString(status) << "\n";
  }
  blas_call(const blas_call&) = delete;
  blas_call& operator=(const blas_call&) = delete;
  cublasHandle_t handle() const { return handle_; }

 private:
  cudaStream_t stream_;
  void* workspace_ = nullptr;
  cublasHandle_t handle_ = nullptr;
};

// determinism: batch_invariant (kernel_paths::batch_invariant): every GEMM row-invariant.
bool batch_invariant() { return current_paths().batch_invariant; }

// dst[r, c] = bf16(src[r · ld + c]) for r < rows, c < cols; dst compact.
__global__ void round_to_bf16_kernel(const float* __restrict__ src, __nv_bfloat16* __restrict__ dst, int64_t rows,
                                     int64_t cols, int64_t ld) {
  const int64_t n = rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    dst[i] = __float2bfloat16(src[r * ld + c]);
  }
}

// Skinny GEMM with a bf16 weight (decode: m ≤ 8 rows of activations, C = α·A·Bᵀ + β·C with B
// [n, k] row-major): memory-bound on B, so each warp streams R rows of B as 16-byte loads,
// 8 / R of them per lane and row in flight, and dots them with the f32 rows of A (read through
// the read-only cache, shared by the block's warps); f32 accumulation, no rounding of A (the CPU
// op's arithmetic). One kernel instead of a rounding pass plus a tensor-core GEMM that a single
// row cannot fill. R (2, 4 or 8 rows of B per warp) grows with m: each A load serves R rows of
// B, so the A bytes a warp reads per B byte are 2m / R (8 at m = 8 with R = 2, which made the
// call bound by L1/L2 rather than by the weight stream); but R = 8 leaves a narrow weight
// (n = 4096) too few blocks to fill the device. skinny_rows_for holds the choice measured on the
// H200 (hyserve-bench-cuda skinny_gemm; bench/results). Row m's arithmetic (its own
// accumulators, the same chunk order — lane l takes chunks l, l + 32, … in order whatever R —
// and the same warp reduction) does not depend on how many rows the call has: a row's result
// is bitwise the same in a 1-row decode and in an 8-row verify.
constexpr int kSkinnyThreads = 256;
constexpr int kSkinnyInFlight = 8;  // 16-byte chunks per lane in flight (over R rows)
constexpr int64_t kSkinnyMaxM = 8;
// The largest R instantiated for m rows (R > 2m gains nothing).
__host__ __device__ constexpr int skinny_rows(int m) { return m <= 2 ? 2 : m <= 4 ? 4 : 8; }

// R for a call (measured, 9B shapes at m = 1..8: MLP gate/up fused, down, lm_head): 2 up to
// m = 3; 4 from m = 4; 8 from m = 7 for the fused gate/up (2 streams per output) and for wide
// weights (n >= 16384: enough blocks at 8 rows per warp).
int skinny_rows_for(int64_t m, int64_t n, bool swiglu) {
  if (m <= 3) return 2;
  if (m >= 7 && (swiglu || n >= 16384)) return 8;
  return 4;
}

__device__ __forceinline__ void bf16x8_to_float(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// What one skinny launch computes: c[m, row] for rows of b0 (R rows of b0 per warp), or with
// swiglu c[m, row] = silu(x·b0[row]) · (x·b1[row]) (R / 2 outputs per warp, each streaming its
// gate row of b0 and its up row of b1).
struct skinny_args {
  const float* a = nullptr;
  const __nv_bfloat16* b0 = nullptr;
  const __nv_bfloat16* b1 = nullptr;
  float* c = nullptr;
  int64_t n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  float alpha = 1.0f, beta = 0.0f;
};

template <int M, int R, bool kSwiglu>
__global__ void __launch_bounds__(kSkinnyThreads) skinny_bf16_kernel(const skinny_args p) {
  static_assert(R == 2 || R == 4 || R == 8, "rows of B streamed per warp");
  static_assert(R <= 8 && R <= skinny_rows(M), "instantiated up to skinny_rows(M)");
  constexpr int U = kSkinnyInFlight / R;       // chunks per lane and row in flight
  constexpr int kOutRows = kSwiglu ? R / 2 : R;  // outputs per warp
  const int lane = threadIdx.x & 31;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * (kSkinnyThreads / 32) + threadIdx.x / 32) * kOutRows;
  if (row0 >= p.n) return;
  const uint4* brow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t out = row0 + (kSwiglu ? r / 2 : r);
    const int64_t row = out < p.n ? out : p.n - 1;  // a duplicate row past the end, not stored
    brow[r] = reinterpret_cast<const uint4*>((kSwiglu && r % 2 == 1 ? p.b1 : p.b0) + row * p.ldb);
  }
  float acc[R][M] = {};
  const int64_t chunks = p.k / 8;
  for (int64_t c0 = lane; c0 < chunks; c0 += 32 * U) {
    uint4 w[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + 32 * u;
#pragma unroll
      for (int r = 0; r < R; ++r) w[u][r] = c < chunks ? __ldcs(brow[r] + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + 32 * u;
      if (c >= chunks) break;
      float wf[R][8];
#pragma unroll
      for (int r = 0; r < R; ++r) bf16x8_to_float(w[u][r], wf[r]);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const float4* ap = reinterpret_cast<const float4*>(p.a + m * p.lda + c * 8);
        const float4 x0 = __ldg(ap), x1 = __ldg(ap + 1);
        const float x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r][m] = fmaf(x[e], wf[r][e], acc[r][m]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);
  if (lane != 0) return;
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int o = 0; o < kOutRows; ++o) {
      if (row0 + o >= p.n) break;
      float* out = p.c + m * p.ldc + row0 + o;
      if constexpr (kSwiglu) {
        const float g = acc[2 * o][m];
        *out = g / (1.0f + expf(-g)) * acc[2 * o + 1][m];  // the swiglu op's formula
      } else {
        // Explicit roundings: left to the compiler, α·acc + β·c may contract into either fma,
        // differently per M instantiation (a row's result would then depend on the call's m).
        *out = p.beta != 0.0f ? __fmaf_rn(p.alpha, acc[o][m], __fmul_rn(p.beta, *out)) : __fmul_rn(p.alpha, acc[o][m]);
      }
    }
  }
}

// ---- The tensor-core skinny path (m <= 8 rows of f32 A, bf16 B [n, k]) ----
//
// C[:, rows]ᵀ = B[rows, :] · Aᵀ as mma.sync m16n8k16 (bf16 in, f32 accumulate): the 16 rows of
// the MMA's A operand are 16 rows of the weight, its 8 columns of the B operand the (up to 8)
// rows of activations (columns >= m read zeros). The activations are not rounded: each f32 x
// is split exactly into three bf16 terms (x = hi + mid + lo: truncations to the top 16 bits of
// what is left, 3 × 8 significant bits = f32's 24), and the weight fragment is multiplied by
// each (products of bf16 are exact in f32). A block of WARPS warps owns 16·TILES weight
// rows; warp w takes the 32-element k blocks w, w + WARPS, …; their partial sums are added
// in warp order through shared memory. A fixed permutation of k inside each 32-element block
// lets every lane load its fragments as 16-byte chunks: lane (g = lane / 4, t = lane % 4) reads
// chunk t of the block (8 consecutive k) of weight rows g and g + 8 and of activation row g, and
// MMA j (0, 1) of the block takes elements 4j .. 4j + 3 of each lane's chunk as its k positions
// 2t, 2t + 1, 2t + 8, 2t + 9. An output's arithmetic depends only on n, k and its own column
// (the MMA's columns are independent; the k split and the warp order do not depend on m), so a
// row's result is bitwise the same in a 1-row decode and an 8-row verify. TILES (1 or 2, by n
// only) changes only how many row tiles share a block's activation loads, not any result.
constexpr int kMmaUnroll = 4;  // k blocks per warp in flight

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two f32 as three bf16x2 terms (hi, mid, lo), element e0 in the low halves; exact (barring
// subnormal remainders): each term is the top 16 bits of what the terms before it leave.
__device__ __forceinline__ void split3_bf16x2(float e0, float e1, uint32_t (&t)[3]) {
  uint32_t u0 = __float_as_uint(e0), u1 = __float_as_uint(e1);
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    t[i] = __byte_perm(u0, u1, 0x7632);
    const float h0 = __uint_as_float(u0 & 0xffff0000u), h1 = __uint_as_float(u1 & 0xffff0000u);
    u0 = __float_as_uint(__uint_as_float(u0) - h0);
    u1 = __float_as_uint(__uint_as_float(u1) - h1);
  }
}

// Two f32 as one bf16x2 (round to nearest even), element e0 in the low half.
__device__ __forceinline__ uint32_t round_bf16x2(float e0, float e1) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(e0, e1);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// silu(g)·u, the swiglu op's formula, compiled once for every tensor-core kernel: inlined, its
// addition could contract into an FMA with expf's last product differently per instantiation,
// and a row's bits would follow the kernel (and so the call's m).
__device__ __noinline__ float swiglu_out(float g, float u) { return g / (1.0f + expf(-g)) * u; }

//
// TERMS: 3 multiplies the weights by f32 activations split exactly as above (kernels.skinny:
// mma, m <= 8); 1 rounds the activations to bf16 and makes one MMA per 16 k (determinism:
// batch_invariant, every m: the activations as cuBLAS takes them, a third of the MMAs).
// Any m (batch_invariant): groups of 8 activation rows are the MMA's columns, CG groups per
// block (they share the block's weight loads: each weight fragment is multiplied by every
// group's activations), blockIdx.y the block's first group. A group's arithmetic is the one
// above, so row r of an m-row call has the bits of the same row in a 1-row call for every m.
template <int WARPS, int TILES, int CG, int TERMS, bool kSwiglu>
__global__ void __launch_bounds__(32 * WARPS, TILES == 1 && CG == 1 ? 1024 / (32 * WARPS) : 0)
    skinny_mma_kernel(const skinny_args p, int64_t m) {
  static_assert(TERMS == 1 || TERMS == 3, "activation terms");
  constexpr int S = kSwiglu ? 2 : 1;  // weight streams per output row (gate, up)
  __shared__ float part[WARPS][TILES][S][32][4];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row_base = static_cast<int64_t>(blockIdx.x) * 16 * TILES;
  const uint4* wrow[TILES][S][2];
#pragma unroll
  for (int ti = 0; ti < TILES; ++ti)
#pragma unroll
    for (int s = 0; s < S; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t out = row_base + 16 * ti + g + 8 * h;
        const int64_t row = out < p.n ? out : p.n - 1;  // a duplicate row past the end, not stored
        wrow[ti][s][h] = reinterpret_cast<const uint4*>((s == 1 ? p.b1 : p.b0) + row * p.ldb);
      }
  // The block's activation rows: group cg holds rows col0 + 8·cg .. + 7; lane (g, t) reads row
  // col0 + 8·cg + g (rows past m read zeros).
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * 8 * CG;
  bool x_live[CG];
  const float4* xrow[CG];
#pragma unroll
  for (int cg = 0; cg < CG; ++cg) {
    const int64_t r = col0 + 8 * cg + g;
    x_live[cg] = r < m;
    xrow[cg] = reinterpret_cast<const float4*>(p.a + (x_live[cg] ? r : 0) * p.lda);
  }
  float acc[CG][TILES][S][4] = {};
  const int64_t chunks = p.k / 8, kblocks = ceil_div(chunks, int64_t{4});
  for (int64_t kb0 = warp; kb0 < kblocks; kb0 += WARPS * kMmaUnroll) {
    uint4 w[kMmaUnroll][TILES][S][2];
    float4 x[kMmaUnroll][2];  // group 0's activations (the others' are loaded where used)
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      const int64_t c = (kb0 + u * WARPS) * 4 + t;
      const bool live = c < chunks;
#pragma unroll
      for (int ti = 0; ti < TILES; ++ti)
#pragma unroll
        for (int s = 0; s < S; ++s)
#pragma unroll
          for (int h = 0; h < 2; ++h) w[u][ti][s][h] = live ? __ldcs(wrow[ti][s][h] + c) : make_uint4(0, 0, 0, 0);
      x[u][0] = live && x_live[0] ? __ldg(xrow[0] + 2 * c) : make_float4(0, 0, 0, 0);
      x[u][1] = live && x_live[0] ? __ldg(xrow[0] + 2 * c + 1) : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      const int64_t c = (kb0 + u * WARPS) * 4 + t;
      const bool live = c < chunks;
#pragma unroll
      for (int cg = 0; cg < CG; ++cg) {
        float4 xc[2];
        if (cg == 0) {
          xc[0] = x[u][0];
          xc[1] = x[u][1];
        } else {
          xc[0] = live && x_live[cg] ? __ldg(xrow[cg] + 2 * c) : make_float4(0, 0, 0, 0);
          xc[1] = live && x_live[cg] ? __ldg(xrow[cg] + 2 * c + 1) : make_float4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          uint32_t b0[3], b1[3];
          if constexpr (TERMS == 3) {
            split3_bf16x2(xc[j].x, xc[j].y, b0);
            split3_bf16x2(xc[j].z, xc[j].w, b1);
          } else {
            b0[0] = round_bf16x2(xc[j].x, xc[j].y);
            b1[0] = round_bf16x2(xc[j].z, xc[j].w);
          }
#pragma unroll
          for (int ti = 0; ti < TILES; ++ti)
#pragma unroll
            for (int s = 0; s < S; ++s) {
              const uint4& r0 = w[u][ti][s][0];
              const uint4& r1 = w[u][ti][s][1];
              const uint32_t a[4] = {j == 0 ? r0.x : r0.z, j == 0 ? r1.x : r1.z, j == 0 ? r0.y : r0.w,
                                     j == 0 ? r1.y : r1.w};
#pragma unroll
              for (int i = TERMS - 1; i >= 0; --i) mma_bf16_16816(acc[cg][ti][s], a, b0[i], b1[i]);  // smallest term first
            }
        }
      }
    }
  }
#pragma unroll
  for (int cg = 0; cg < CG; ++cg) {
    if (cg > 0) __syncthreads();  // the previous group's sums are read
#pragma unroll
    for (int ti = 0; ti < TILES; ++ti)
#pragma unroll
      for (int s = 0; s < S; ++s)
#pragma unroll
        for (int r = 0; r < 4; ++r) part[warp][ti][s][lane][r] = acc[cg][ti][s][r];
    __syncthreads();
    // One output (tile, row, column) per thread: the warps' partial sums in warp order.
    for (int o = static_cast<int>(threadIdx.x); o < TILES * 16 * 8; o += 32 * WARPS) {
      const int ti = o / 128, row = (o / 8) % 16, col = o % 8;
      const int src_lane = (row % 8) * 4 + col / 2, src_reg = (row / 8) * 2 + col % 2;
      const int64_t out_row = row_base + 16 * ti + row;
      const int64_t out_col = col0 + 8 * cg + col;
      if (out_col >= m || out_row >= p.n) continue;
      float v[S];
#pragma unroll
      for (int s = 0; s < S; ++s) {
        v[s] = part[0][ti][s][src_lane][src_reg];
#pragma unroll
        for (int w2 = 1; w2 < WARPS; ++w2) v[s] += part[w2][ti][s][src_lane][src_reg];
      }
      float* out = p.c + out_col * p.ldc + out_row;
      if constexpr (kSwiglu) {
        *out = swiglu_out(v[0], v[1]);
      } else {
        *out = p.beta != 0.0f ? __fmaf_rn(p.alpha, v[0], __fmul_rn(p.beta, *out)) : __fmul_rn(p.alpha, v[0]);
      }
    }
  }
}

// Groups of 8 activation rows per block: 1 up to 8 rows (the decode kernel, bounded to 64
// registers per thread), 2 up to 16, else 4 (more groups per weight load, fewer re-reads of
// the weight by the blocks of other groups). Speed only: every choice gives the same bits.
constexpr int kMaxRowGroups = 4;
int skinny_row_groups(int64_t m) { return m <= 8 ? 1 : m <= 16 ? 2 : kMaxRowGroups; }

// exact (kernels.skinny: mma, m <= 8): f32 activations in three terms; else (batch_invariant)
// bf16-rounded activations, any m.
template <int WARPS, int TILES, bool kSwiglu>
void launch_skinny_mma_w(const skinny_args& a, int64_t m, bool exact, cudaStream_t stream) {
  const auto tiles = static_cast<unsigned>(ceil_div(a.n, int64_t{16} * TILES));
  if (exact) {
    skinny_mma_kernel<WARPS, TILES, 1, 3, kSwiglu><<<tiles, 32 * WARPS, 0, stream>>>(a, m);
    return;
  }
  const int cg = skinny_row_groups(m);
  const int64_t ygrid = ceil_div(m, int64_t{8} * cg);
  if (ygrid > 65535) fail("gemm", "m", m, "exceeds the row-invariant kernel's grid (65535 blocks of 32 rows)");
  const dim3 grid(tiles, static_cast<unsigned>(ygrid));
  if (cg == 1) skinny_mma_kernel<WARPS, TILES, 1, 1, kSwiglu><<<grid, 32 * WARPS, 0, stream>>>(a, m);
  else if (cg == 2) skinny_mma_kernel<WARPS, TILES, 2, 1, kSwiglu><<<grid, 32 * WARPS, 0, stream>>>(a, m);
  else skinny_mma_kernel<WARPS, TILES, kMaxRowGroups, 1, kSwiglu><<<grid, 32 * WARPS, 0, stream>>>(a, m);
}

// Blocks of the one-group kernel resident on the whole device at once (read once per
// instantiation). It alone sizes the k split (warps per block) for every m.
template <int WARPS, int TILES, bool kSwiglu>
int64_t skinny_mma_slots() {
  static const int64_t slots = [] {
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, skinny_mma_kernel<WARPS, TILES, 1, 3, kSwiglu>,
                                                             32 * WARPS, 0));
    return int64_t{per_sm} * sm_count();
  }();
  return slots;
}

// Warps per block (the k split): the most of 16, 8, 4 with which every row tile's block is
// resident at once, so no partial last wave idles most of the device (a 4096-row weight: 256
// tiles, 16 warps; the fused 14336-row gate/up: 896 tiles, 4 warps); with more tiles than
// that, 8. By n (and the device) only: the k split fixes the summation order, which must not
// depend on m.
template <int TILES, bool kSwiglu>
int skinny_mma_warps(int64_t n) {
  const int64_t tiles = ceil_div(n, int64_t{16} * TILES);
  if (tiles <= skinny_mma_slots<16, TILES, kSwiglu>()) return 16;
  if (tiles <= skinny_mma_slots<8, TILES, kSwiglu>()) return 8;
  if (tiles <= skinny_mma_slots<4, TILES, kSwiglu>()) return 4;
  return 8;
}

template <int TILES, bool kSwiglu>
void launch_skinny_mma_t(const skinny_args& a, int64_t m, bool exact, cudaStream_t stream) {
  switch (skinny_mma_warps<TILES, kSwiglu>(a.n)) {
    case 16: return launch_skinny_mma_w<16, TILES, kSwiglu>(a, m, exact, stream);
    case 4: return launch_skinny_mma_w<4, TILES, kSwiglu>(a, m, exact, stream);
    default: return launch_skinny_mma_w<8, TILES, kSwiglu>(a, m, exact, stream);
  }
}

// Row tiles per block: 2 for wide plain weights (half the activation reads per weight byte),
// else 1. One-tile blocks are bounded to 64 registers per thread (1024 threads per SM), so
// that small blocks can all be resident.
// ---- The tiled row-invariant kernel (determinism: batch_invariant, many activation rows) ----
//
// The batch-invariant skinny kernel's arithmetic (TERMS = 1) for a prefill's many rows, where
// the skinny kernel would re-read the activations for every 16 weight rows: a block owns 128
// weight rows × BM activation rows (BM = 64, 32 for the fused SwiGLU's two weights), 8 warps as
// 4 (weight rows) × 2 (activation rows), each warp 2 MMA row tiles × BM / 16 column tiles; the
// 32-element k blocks go through shared memory by cp.async, double-buffered. The order of the
// arithmetic is the skinny kernel's, output by output: the k blocks in the order of the
// skinny kernel's W warps (w = 0, 1, …; each w's blocks w, w + W, … ascending), each block's two
// MMAs with the same permutation of k and the same bf16 rounding of the activations, one
// partial sum per w, and the partial sums added in w order (W: the skinny kernel's choice for
// n). So a row's bits are the same whichever kernel ran its call (kTiledMinRows: speed only).
constexpr int kTiledThreads = 256;
constexpr int kTiledBn = 128;  // weight rows per block: 4 warps × 2 row tiles of 16
int64_t g_tiled_min_rows = 0;  // set_invariant_tiled_rows (benchmarks): 0 = kTiledMinRows
constexpr int64_t kTiledMinRows = 256;

template <int BM, bool kSwiglu>
__global__ void __launch_bounds__(kTiledThreads) invariant_tiled_kernel(const skinny_args p, int64_t m, int warps_w) {
  constexpr int S = kSwiglu ? 2 : 1;
  constexpr int CT = BM / 16;         // column tiles (8 activation rows) per warp
  constexpr int kXld = 32 + 4;        // floats per staged activation row (+16 bytes: no bank conflicts)
  __shared__ __align__(16) __nv_bfloat16 ws[2][S][kTiledBn][32];
  __shared__ __align__(16) float xs[2][BM][kXld];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int wn = warp & 3, wm = warp >> 2;
  const int64_t row_base = static_cast<int64_t>(blockIdx.x) * kTiledBn;
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * BM;
  const int64_t chunks = p.k / 8, kblocks = ceil_div(chunks, int64_t{4});

  auto load = [&](int stage, int64_t kb) {
    for (int i = tid; i < S * kTiledBn * 4; i += kTiledThreads) {
      const int s = i / (kTiledBn * 4), r = (i / 4) % kTiledBn, q = i % 4;
      const int64_t row = row_base + r, c = kb * 4 + q;
      const bool live = row < p.n && c < chunks;
      const __nv_bfloat16* src = (s == 1 ? p.b1 : p.b0) + (live ? row * p.ldb + c * 8 : 0);
      cp_async16_zfill(&ws[stage][s][r][q * 8], src, live ? 16u : 0u);
    }
    for (int i = tid; i < BM * 8; i += kTiledThreads) {
      const int r = i / 8, q = i % 8;  // q: 4 floats
      const int64_t row = col0 + r, c = kb * 4 + q / 2;
      const bool live = row < m && c < chunks;
      const float* src = p.a + (live ? row * p.lda + kb * 32 + q * 4 : 0);
      cp_async16_zfill(&xs[stage][r][q * 4], src, live ? 16u : 0u);
    }
  };
  // The k blocks in the skinny kernel's warp order.
  const auto advance = [&](int64_t& kb, int& w) {
    kb += warps_w;
    if (kb >= kblocks) kb = ++w;
  };

  float cur[2][CT][S][4] = {}, tot[2][CT][S][4] = {};
  int64_t ld_kb = 0, c_kb = 0;
  int ld_w = 0, c_w = 0;
  if (kblocks > 0) {
    load(0, ld_kb);
    advance(ld_kb, ld_w);
  }
  cp_async_commit_group();
  for (int64_t step = 0; step < kblocks; ++step) {
    if (step + 1 < kblocks) {
      load(static_cast<int>((step + 1) & 1), ld_kb);
      advance(ld_kb, ld_w);
    }
    cp_async_commit_group();
    cp_async_wait_group<1>();
    __syncthreads();
    const int st = static_cast<int>(step & 1);
    uint4 r0[2][S], r1[2][S];
#pragma unroll
    for (int rt = 0; rt < 2; ++rt)
#pragma unroll
      for (int s = 0; s < S; ++s) {
        r0[rt][s] = *reinterpret_cast<const uint4*>(&ws[st][s][wn * 32 + rt * 16 + g][t * 8]);
        r1[rt][s] = *reinterpret_cast<const uint4*>(&ws[st][s][wn * 32 + rt * 16 + g + 8][t * 8]);
      }
#pragma unroll
    for (int ct = 0; ct < CT; ++ct) {
      const float* xr = &xs[st][wm * (BM / 2) + ct * 8 + g][t * 8];
      const float4 xv[2] = {*reinterpret_cast<const float4*>(xr), *reinterpret_cast<const float4*>(xr + 4)};
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint32_t b0 = round_bf16x2(xv[j].x, xv[j].y), b1 = round_bf16x2(xv[j].z, xv[j].w);
#pragma unroll
        for (int rt = 0; rt < 2; ++rt)
#pragma unroll
          for (int s = 0; s < S; ++s) {
            const uint4& a0 = r0[rt][s];
            const uint4& a1 = r1[rt][s];
            const uint32_t a[4] = {j == 0 ? a0.x : a0.z, j == 0 ? a1.x : a1.z, j == 0 ? a0.y : a0.w,
                                   j == 0 ? a1.y : a1.w};
            mma_bf16_16816(cur[rt][ct][s], a, b0, b1);
          }
      }
    }
    // The last k block of partial sum w: add it to the total in w order (the skinny kernel's
    // shared-memory reduction), start the next one.
    int64_t next_kb = c_kb;
    int next_w = c_w;
    advance(next_kb, next_w);
    if (next_w != c_w) {
#pragma unroll
      for (int rt = 0; rt < 2; ++rt)
#pragma unroll
        for (int ct = 0; ct < CT; ++ct)
#pragma unroll
          for (int s = 0; s < S; ++s)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              tot[rt][ct][s][e] = c_w == 0 ? cur[rt][ct][s][e] : __fadd_rn(tot[rt][ct][s][e], cur[rt][ct][s][e]);
              cur[rt][ct][s][e] = 0.0f;
            }
    }
    c_kb = next_kb;
    c_w = next_w;
    __syncthreads();  // the stage is refilled by the next step's load
  }
  // Element e of an MMA tile: weight row g (+8 for e >= 2), activation row 2t (+1 for odd e).
#pragma unroll
  for (int rt = 0; rt < 2; ++rt)
#pragma unroll
    for (int ct = 0; ct < CT; ++ct)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t n_out = row_base + wn * 32 + rt * 16 + g + (e >= 2 ? 8 : 0);
        const int64_t m_out = col0 + wm * (BM / 2) + ct * 8 + 2 * t + (e & 1);
        if (n_out >= p.n || m_out >= m) continue;
        float* out = p.c + m_out * p.ldc + n_out;
        if constexpr (kSwiglu) {
          *out = swiglu_out(tot[rt][ct][0][e], tot[rt][ct][1][e]);
        } else {
          const float v = tot[rt][ct][0][e];
          *out = p.beta != 0.0f ? __fmaf_rn(p.alpha, v, __fmul_rn(p.beta, *out)) : __fmul_rn(p.alpha, v);
        }
      }
}

template <bool kSwiglu>
void launch_invariant_tiled(const skinny_args& a, int64_t m, int warps_w, cudaStream_t stream) {
  constexpr int BM = kSwiglu ? 32 : 64;
  const int64_t gy = ceil_div(m, int64_t{BM});
  if (gy > 65535) fail("gemm", "m", m, "exceeds the row-invariant tiled kernel's grid (65535 tiles of rows)");
  const dim3 grid(static_cast<unsigned>(ceil_div(a.n, int64_t{kTiledBn})), static_cast<unsigned>(gy));
  invariant_tiled_kernel<BM, kSwiglu><<<grid, kTiledThreads, 0, stream>>>(a, m, warps_w);
}

template <bool kSwiglu>
void launch_skinny_mma(const skinny_args& a, int64_t m, cudaStream_t stream) {
  const bool exact = !batch_invariant();
  // Row tiles per block (and so the k split's table) as the skinny kernel takes them for n.
  const bool two_tiles = !kSwiglu && a.n >= 16384;
  if (!exact && m >= (g_tiled_min_rows > 0 ? g_tiled_min_rows : kTiledMinRows)) {
    const int w = two_tiles ? skinny_mma_warps<2, kSwiglu>(a.n) : skinny_mma_warps<1, kSwiglu>(a.n);
    return launch_invariant_tiled<kSwiglu>(a, m, w, stream);
  }
  if constexpr (!kSwiglu) {
    if (two_tiles) return launch_skinny_mma_t<2, kSwiglu>(a, m, exact, stream);
  }
  launch_skinny_mma_t<1, kSwiglu>(a, m, exact, stream);
}

// The layouts the skinny kernels read (B [n, k] row-major, 16-byte rows of A and B).
bool skinny_layout_applies(const gemm_params& p) {
  return !p.trans_a && p.trans_b && p.k % 8 == 0 && p.ldb % 8 == 0 && p.lda % 4 == 0 && aligned16(p.a) &&
         aligned16(p.b);
}

bool skinny_bf16_applies(const gemm_params& p) { return p.m <= kSkinnyMaxM && skinny_layout_applies(p); }


// ---- The row-invariant CUDA-core GEMM (determinism: batch_invariant) ----
//
// f32 weights, and bf16 weights in layouts the tensor-core skinny kernel does not read (trans_a,
// unaligned rows): C = α·op(A)·op(B) + β·C on 64 × 64 output tiles, 256 threads with 4 × 4
// outputs each, op(A) and op(B) staged through shared memory 16 k at a time (zeros past m, n
// and k). Every output is one fmaf chain over k = 0, 1, … in order (the zeros past k leave it
// unchanged), then scaled with explicit roundings: its bits depend on its row of op(A) and
// column of op(B) alone, whatever m and wherever the row sits in the call. Not the fast path
// for f32 (cuBLAS is, with determinism: fast); it exists so that an f32 model's tokens do not
// depend on its batch either.
constexpr int kInvTile = 64, kInvK = 16, kInvThreads = 256;

__device__ __forceinline__ float load_f(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_f(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }

template <class TB>
__global__ void __launch_bounds__(kInvThreads) invariant_gemm_kernel(const gemm_params p) {
  __shared__ float as[kInvK][kInvTile + 1];
  __shared__ float bs[kInvK][kInvTile + 1];
  const TB* b = static_cast<const TB*>(p.b);
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kInvTile, n0 = static_cast<int64_t>(blockIdx.x) * kInvTile;
  const int tx = static_cast<int>(threadIdx.x) % 16, ty = static_cast<int>(threadIdx.x) / 16;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < p.k; k0 += kInvK) {
    for (int e = static_cast<int>(threadIdx.x); e < kInvTile * kInvK; e += kInvThreads) {
      // Consecutive threads along the stored rows (coalesced): k for A [m, k], m for A [k, m].
      const int r = p.trans_a ? e % kInvTile : e / kInvK, kk = p.trans_a ? e / kInvTile : e % kInvK;
      const int64_t gi = m0 + r, gk = k0 + kk;
      as[kk][r] = gi < p.m && gk < p.k ? (p.trans_a ? p.a[gk * p.lda + gi] : p.a[gi * p.lda + gk]) : 0.0f;
      // op(B)[k, n]: B [n, k] when trans_b (consecutive threads along k), else B [k, n].
      const int c = p.trans_b ? e / kInvK : e % kInvTile, kb = p.trans_b ? e % kInvK : e / kInvTile;
      const int64_t gn = n0 + c, gkb = k0 + kb;
      bs[kb][c] = gn < p.n && gkb < p.k ? load_f(b, p.trans_b ? gn * p.ldb + gkb : gkb * p.ldb + gn) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kInvK; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = as[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = bs[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = m0 + ty + 16 * i;
    if (row >= p.m) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t col = n0 + tx + 16 * j;
      if (col >= p.n) continue;
      float* out = p.c + row * p.ldc + col;
      *out = p.beta != 0.0f ? __fmaf_rn(p.alpha, acc[i][j], __fmul_rn(p.beta, *out)) : __fmul_rn(p.alpha, acc[i][j]);
    }
  }
}

template <class TB>
void invariant_gemm(const gemm_params& p, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return;
  const int64_t gy = ceil_div(p.m, int64_t{kInvTile}), gx = ceil_div(p.n, int64_t{kInvTile});
  if (gy > 65535) fail("gemm", "m", p.m, "exceeds the row-invariant CUDA-core kernel's grid (65535 tiles of 64 rows)");
  if (gx > 0x7fffffff) fail("gemm", "n", p.n, "exceeds the row-invariant CUDA-core kernel's grid");
  invariant_gemm_kernel<TB><<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), kInvThreads, 0, stream>>>(p);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

int g_skinny_rows = 0;  // set_skinny_rows (benchmarks): 0 = skinny_rows_for
skinny_path g_skinny_path = skinny_path::kDefault;  // set_skinny_path

template <int M, int R, bool kSwiglu>
void launch_skinny_mr(const skinny_args& a, cudaStream_t stream) {
  const int64_t out_rows = kSwiglu ? R / 2 : R;
  const int64_t warps = ceil_div(a.n, out_rows);
  const auto blocks = static_cast<unsigned>(ceil_div(warps, int64_t{kSkinnyThreads / 32}));
  skinny_bf16_kernel<M, R, kSwiglu><<<blocks, kSkinnyThreads, 0, stream>>>(a);
}

// R = skinny_rows_for(M, n), or the one set_skinny_rows forces (at most skinny_rows(M)).
template <int M, bool kSwiglu>
void launch_skinny_m(const skinny_args& a, cudaStream_t stream) {
  const int r = g_skinny_rows != 0 ? g_skinny_rows : skinny_rows_for(M, a.n, kSwiglu);
  if constexpr (skinny_rows(M) >= 8) {
    if (r >= 8) return launch_skinny_mr<M, 8, kSwiglu>(a, stream);
  }
  if constexpr (skinny_rows(M) >= 4) {
    if (r >= 4) return launch_skinny_mr<M, 4, kSwiglu>(a, stream);
  }
  launch_skinny_mr<M, 2, kSwiglu>(a, stream);
}

template <bool kSwiglu>
void launch_skinny(const skinny_args& a, int64_t m, cudaStream_t stream) {
  if (skinny_uses_mma()) {
    launch_skinny_mma<kSwiglu>(a, m, stream);
    HYSERVE_CUDA_CHECK_LAUNCH();
    return;
  }
  switch (m) {
    case 1: launch_skinny_m<1, kSwiglu>(a, stream); break;
    case 2: launch_skinny_m<2, kSwiglu>(a, stream); break;
    case 3: launch_skinny_m<3, kSwiglu>(a, stream); break;
    case 4: launch_skinny_m<4, kSwiglu>(a, stream); break;
    case 5: launch_skinny_m<5, kSwiglu>(a, stream); break;
    case 6: launch_skinny_m<6, kSwiglu>(a, stream); break;
    case 7: launch_skinny_m<7, kSwiglu>(a, stream); break;
    default: launch_skinny_m<8, kSwiglu>(a, stream); break;
  }
  HYSERVE_CUDA_CHECK_LAUNCH();
}

void skinny_bf16(const gemm_params& p, cudaStream_t stream) {
  skinny_args a;
  a.a = p.a;
  a.b0 = static_cast<const __nv_bfloat16*>(p.b);
  a.c = p.c;
  a.n = p.n;
  a.k = p.k;
  a.lda = p.lda;
  a.ldb = p.ldb;
  a.ldc = p.ldc;
  a.alpha = p.alpha;
  a.beta = p.beta;
  launch_skinny<false>(a, p.m, stream);
}

void gemm_bf16_b(const gemm_params& p, cudaStream_t stream) {
  if (skinny_bf16_applies(p)) {
    skinny_bf16(p, stream);
    return;
  }
  if (batch_invariant()) {
    // Any m on the tensor-core skinny kernel's arithmetic (skinny_uses_mma() is true), other
    // layouts on the CUDA-core one.
    if (p.m == 0) return;
    if (skinny_layout_applies(p)) skinny_bf16(p, stream);
    else invariant_gemm<__nv_bfloat16>(p, stream);
    return;
  }
  // op(A) as stored: [m, k] (ld lda), or [k, m] when trans_a.
  const int64_t a_rows = p.trans_a ? p.k : p.m, a_cols = p.trans_a ? p.m : p.k;
  __nv_bfloat16* a16 = nullptr;
  CUDA_CHECK(scratch_alloc(reinterpret_cast<void**>(&a16), static_cast<size_t>(a_rows * a_cols) * 2, stream));
  const int64_t n = a_rows * a_cols;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(n, 256), 4 * int64_t{sm_count()} * 8));
  round_to_bf16_kernel<<<blocks, 256, 0, stream>>>(p.a, a16, a_rows, a_cols, p.lda);
  HYSERVE_CUDA_CHECK_LAUNCH();
  const blas_call blas(stream);
  const cublasStatus_t status =
      cublasGemmEx(blas.handle(), p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                   static_cast<int>(p.n), static_cast<int>(p.m), static_cast<int>(p.k), &p.alpha, p.b, CUDA_R_16BF,
                   static_cast<int>(p.ldb), a16, CUDA_R_16BF, static_cast<int>(a_cols), &p.beta, p.c, CUDA_R_32F,
                   static_cast<int>(p.ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  CUDA_CHECK(scratch_free(a16, stream));  // stream-ordered: freed after the GEMM has read it
  CUBLAS_CHECK(status);
}

}  // namespace
}  // namespace cuda_detail

void set_skinny_rows(int rows) {
  if (rows != 0 && rows != 2 && rows != 4 && rows != 8)
    throw invalid_argument_error("set_skinny_rows: rows must be 0, 2, 4 or 8, got " + std::to_string(rows));
  cuda_detail::g_skinny_rows = rows;
}

void set_skinny_path(skinny_path path) { cuda_detail::g_skinny_path = path; }

void set_invariant_tiled_rows(int64_t min_rows) {
  if (min_rows < 0) throw invalid_argument_error("set_invariant_tiled_rows: must be >= 0, got " + std::to_string(min_rows));
  cuda_detail::g_tiled_min_rows = min_rows;
}

bool skinny_uses_mma() {
  // Row-invariant GEMMs of every m run the tensor-core arithmetic (the FMA kernel stops at 8 rows).
  if (cuda_detail::batch_invariant()) return true;
  skinny_path p = cuda_detail::g_skinny_path;
  if (p == skinny_path::kDefault) {
    switch (current_paths().skinny) {
      case kernel_paths::skinny_kind::kDefault: p = kSkinnyDefaultPath; break;
      case kernel_paths::skinny_kind::kFma: p = skinny_path::kFma; break;
      case kernel_paths::skinny_kind::kMma: p = skinny_path::kMma; break;
    }
  }
  return p == skinny_path::kMma;
}

using namespace cuda_detail;

void run_cuda(const gemm_params& p, void* stream) {
  constexpr const char* op = "gemm";
  cpu_detail::check_gemm(p, op);
  if (p.b_dtype == dtype::kBF16) {
    gemm_bf16_b(p, as_stream(stream));
    return;
  }
  if (batch_invariant()) {
    invariant_gemm<float>(p, as_stream(stream));
    return;
  }

  const blas_call blas(as_stream(stream));
  CUBLAS_CHECK(cublasSgemm(blas.handle(), p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                           static_cast<int>(p.n), static_cast<int>(p.m), static_cast<int>(p.k), &p.alpha,
                           static_cast<const float*>(p.b), static_cast<int>(p.ldb), p.a, static_cast<int>(p.lda), &p.beta, p.c,
                           static_cast<int>(p.ldc)));
}

void run_cuda(const swiglu_linear_params& p, void* stream) {
  constexpr const char* op = "swiglu_linear";
  cpu_detail::check_swiglu_linear(p, op);
  if (p.m == 0) return;
  gemm_params g = swiglu_linear_gate_gemm(p);
  const cudaStream_t s = as_stream(stream);
  if (p.w_dtype == dtype::kBF16 && aligned16(p.up_w) &&
      (skinny_bf16_applies(g) || (batch_invariant() && skinny_layout_applies(g)))) {
    skinny_args a;
    a.a = p.x;
    a.b0 = static_cast<const __nv_bfloat16*>(p.gate_w);
    a.b1 = static_cast<const __nv_bfloat16*>(p.up_w);
    a.c = p.out;
    a.n = p.n;
    a.k = p.k;
    a.lda = p.x_stride;
    a.ldb = p.w_stride;
    a.ldc = p.out_stride;
    launch_skinny<true>(a, p.m, s);
    return;
  }
  // Two gemm ops into out and a scratch up, then the swiglu op.
  float* up = nullptr;
  CUDA_CHECK(scratch_alloc(reinterpret_cast<void**>(&up), static_cast<size_t>(p.m * p.n) * sizeof(float), s));
  run_cuda(g, stream);
  g.b = p.up_w;
  g.c = up;
  g.ldc = p.n;
  run_cuda(g, stream);
  swiglu_params w;
  w.gate = p.out;
  w.up = up;
  w.out = p.out;
  w.rows = p.m;
  w.cols = p.n;
  w.gate_stride = w.out_stride = p.out_stride;
  w.up_stride = p.n;
  run_cuda(w, stream);
  CUDA_CHECK(scratch_free(up, s));
}

}  // namespace hyserve::kernels
