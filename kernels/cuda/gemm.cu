// Dense matrix multiply through cuBLAS. Row-major C = op(A)·op(B) is column-major
// Cᵀ = op(B)ᵀ·op(A)ᵀ, so the operands are passed swapped, each with its own transpose flag.
// Math mode is CUBLAS_DEFAULT_MATH: true fp32, no TF32, so results agree with the CPU op.
//
// bf16 B (a linear layer's weight): up to 8 rows of A (decode; a batch-1 verify with up to 7
// drafts) go through a bandwidth-bound skinny kernel with f32 A; otherwise op(A) is rounded to bf16 into a stream-ordered scratch
// buffer (compact, ld = its row length) and cublasGemmEx multiplies bf16 × bf16 into f32 C with
// f32 accumulation (CUBLAS_COMPUTE_32F) on the tensor cores; or, kernels.linear_wgmma, 9..256 rows
// on hyserve's warpgroup-MMA kernel (gemm_wgmma.cuh, launched by gemm_wgmma_launch.cuh).
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
#include "common.cuh"
#include "hyserve/common/error.h"
#include "hyserve/kernels/activation.h"
#include "hyserve/kernels/gemm.h"
#include "hyserve/kernels/paths.h"
#include "gemm_invariant.cuh"
#include "gemm_paths.h"
#include "gemm_skinny.cuh"
#include "gemm_lt.cuh"
#include "gemm_wgmma_launch.cuh"
#include "launch.cuh"
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

// src [rows, cols] (row stride ld) rounded to bf16 into a compact scratch block (freed by the
// caller with scratch_free, in stream order after its readers).
__nv_bfloat16* rounded_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld, cudaStream_t stream) {
  __nv_bfloat16* dst = nullptr;
  CUDA_CHECK(scratch_alloc(reinterpret_cast<void**>(&dst), static_cast<size_t>(rows * cols) * 2, stream));
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(rows * cols, 256), 4 * int64_t{sm_count()} * 8));
  round_to_bf16_kernel<<<blocks, 256, 0, stream>>>(src, dst, rows, cols, ld);
  HYSERVE_CUDA_CHECK_LAUNCH();
  return dst;
}

invariant_gemm_backend g_invariant_backend = invariant_gemm_backend::kCublasLt;

// determinism: batch_invariant on cuBLASLt (kernels.invariant_gemm: cublaslt or
// set_invariant_gemm_backend): the activations rounded to bf16 as for the tiled kernel, then one
// split-K-1 GEMM (two and the SwiGLU formula for the fused projection). False, with nothing
// launched, when the layout is not one lt_shape_applies takes or the call scales its output
// other than alpha 1, beta 0 or 1; both depend on the call's shape, never on m.
template <bool kSwiglu>
bool launch_invariant_lt(const skinny_args& a, int64_t m, cudaStream_t stream) {
  // alpha 1 and beta 0 or 1 (the residual added in the epilogue): round(acc + c) whatever
  // formula the epilogue uses.
  if (!kSwiglu && (a.alpha != 1.0f || (a.beta != 0.0f && a.beta != 1.0f))) return false;
  if (!lt_shape_applies(a.n, a.k, a.ldb, kSwiglu ? a.n : a.ldc)) return false;  // by layout, never by m
  __nv_bfloat16* a16 = rounded_bf16(a.a, m, a.k, a.lda, stream);
  bool done = false;
  if constexpr (kSwiglu) {
    float* gu = nullptr;
    CUDA_CHECK(scratch_alloc(reinterpret_cast<void**>(&gu), static_cast<size_t>(2 * m * a.n) * sizeof(float), stream));
    float* up = gu + m * a.n;
    done = lt_invariant_gemm(a16, a.b0, a.ldb, gu, a.n, m, a.n, a.k, 0.0f, stream) &&
           lt_invariant_gemm(a16, a.b1, a.ldb, up, a.n, m, a.n, a.k, 0.0f, stream);
    if (done) {
      const auto eb = static_cast<unsigned>(std::min<int64_t>(ceil_div(m * a.n, 256), 4 * int64_t{sm_count()} * 8));
      lt_swiglu_kernel<<<eb, 256, 0, stream>>>(gu, up, a.c, m, a.n, a.ldc);
      HYSERVE_CUDA_CHECK_LAUNCH();
    }
    CUDA_CHECK(scratch_free(gu, stream));
  } else {
    done = lt_invariant_gemm(a16, a.b0, a.ldb, a.c, a.ldc, m, a.n, a.k, a.beta, stream);
  }
  CUDA_CHECK(scratch_free(a16, stream));  // stream-ordered: after the GEMMs
  return done;
}

// determinism: batch_invariant on the warpgroup-MMA kernel (kernels.invariant_gemm: wgmma;
// gemm_wgmma_launch.cuh): the activations rounded to bf16, then one call (two and the SwiGLU
// formula for the fused projection), its splits by the weight's shape. False, with nothing
// launched, where the layout or the scaling (alpha 1, beta 0 or 1) is not one it takes: by the
// call's shape, never by m.
template <bool kSwiglu>
bool launch_invariant_wgmma(const skinny_args& a, int64_t m, cudaStream_t stream) {
  if (!kSwiglu && (a.alpha != 1.0f || (a.beta != 0.0f && a.beta != 1.0f))) return false;
  wgmma_call c;
  c.w = a.b0;
  c.ldw = a.ldb;
  c.y = a.c;
  c.ldy = a.ldc;
  c.m = m;
  c.n = a.n;
  c.k = a.k;
  c.beta = kSwiglu ? 0.0f : a.beta;
  if (!wgmma_layout_applies(c) || (kSwiglu && !aligned16(a.b1))) return false;
  __nv_bfloat16* a16 = rounded_bf16(a.a, m, a.k, a.lda, stream);
  if constexpr (kSwiglu) {
    float* gu = nullptr;
    CUDA_CHECK(scratch_alloc(reinterpret_cast<void**>(&gu), static_cast<size_t>(2 * m * a.n) * sizeof(float), stream));
    c.y = gu;
    c.ldy = a.n;
    launch_wgmma_invariant(c, a16, stream);
    c.w = a.b1;
    c.y = gu + m * a.n;
    launch_wgmma_invariant(c, a16, stream);
    const auto eb = static_cast<unsigned>(std::min<int64_t>(ceil_div(m * a.n, 256), 4 * int64_t{sm_count()} * 8));
    lt_swiglu_kernel<<<eb, 256, 0, stream>>>(gu, gu + m * a.n, a.c, m, a.n, a.ldc);
    HYSERVE_CUDA_CHECK_LAUNCH();
    CUDA_CHECK(scratch_free(gu, stream));
  } else {
    launch_wgmma_invariant(c, a16, stream);
  }
  CUDA_CHECK(scratch_free(a16, stream));  // stream-ordered: after the GEMMs
  return true;
}

template <bool kSwiglu>
void launch_skinny_mma(const skinny_args& a, int64_t m, cudaStream_t stream) {
  const bool exact = !batch_invariant();
  // kernels.invariant_gemm when the config names one, else the process default (cuBLASLt;
  // set_invariant_gemm_backend).
  const auto chosen = current_paths().invariant_gemm;
  const bool lt = chosen == kernel_paths::invariant_gemm_kind::kCublasLt ||
                  (chosen == kernel_paths::invariant_gemm_kind::kDefault &&
                   g_invariant_backend == invariant_gemm_backend::kCublasLt);
  if (!exact && lt && launch_invariant_lt<kSwiglu>(a, m, stream)) return;
  const bool wgmma = chosen == kernel_paths::invariant_gemm_kind::kWgmma ||
                     (chosen == kernel_paths::invariant_gemm_kind::kDefault &&
                      g_invariant_backend == invariant_gemm_backend::kWgmma);
  if (!exact && wgmma && launch_invariant_wgmma<kSwiglu>(a, m, stream)) return;
  // Row tiles per block (and so the k split's table) as the skinny kernel takes them for n.
  const bool two_tiles = !kSwiglu && a.n >= 16384;
  const bool tiled = !exact && m >= (g_tiled_min_rows > 0 ? g_tiled_min_rows : kTiledMinRows);
  // The tiled kernel, and the skinny one above 16 rows, read bf16 activations rounded here once
  // (skinny_args::a16).
  skinny_args r = a;
  if (tiled || (!exact && skinny_row_groups(m) == kMaxRowGroups)) r.a16 = rounded_bf16(a.a, m, a.k, a.lda, stream);
  bool done = false;
  if (tiled) {
    const int w = two_tiles ? skinny_mma_warps<2, kSwiglu>(a.n) : skinny_mma_warps<1, kSwiglu>(a.n);
    launch_invariant_tiled<kSwiglu>(r, m, w, stream);
    done = true;
  }
  if constexpr (!kSwiglu) {
    if (!done && two_tiles) {
      launch_skinny_mma_t<2, kSwiglu>(r, m, exact, stream);
      done = true;
    }
  }
  if (!done) launch_skinny_mma_t<1, kSwiglu>(r, m, exact, stream);
  if (r.a16 != nullptr) CUDA_CHECK(scratch_free(const_cast<__nv_bfloat16*>(r.a16), stream));  // after the kernel, in stream order
}

// The layouts the skinny kernels read (B [n, k] row-major, 16-byte rows of A and B).
bool skinny_layout_applies(const gemm_params& p) {
  return !p.trans_a && p.trans_b && p.k % 8 == 0 && p.ldb % 8 == 0 && p.lda % 4 == 0 && aligned16(p.a) &&
         aligned16(p.b);
}

bool skinny_bf16_applies(const gemm_params& p) { return p.m <= kSkinnyMaxM && skinny_layout_applies(p); }


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
  __nv_bfloat16* a16 = rounded_bf16(p.a, a_rows, a_cols, p.lda, stream);
  if (wgmma_linear_applies(p)) {
    launch_wgmma_linear(p, a16, stream);
    CUDA_CHECK(scratch_free(a16, stream));
    return;
  }
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

void set_invariant_gemm_backend(invariant_gemm_backend backend) { cuda_detail::g_invariant_backend = backend; }
invariant_gemm_backend current_invariant_gemm_backend() { return cuda_detail::g_invariant_backend; }

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
