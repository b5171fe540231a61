#pragma once
// Row-invariant bf16 GEMM through cuBLASLt (determinism: batch_invariant; gemm.cu, the only
// includer; selected by kernels.invariant_gemm: cublaslt or set_invariant_gemm_backend): c[r, :] = a16[r, :] · bᵀ for r < m, a16
// the activations rounded to bf16 (compact [m, k]), b the weight [n, k] (ld ldb), c f32 (ld ldc),
// f32 accumulation. The algorithm is cuBLASLt's heuristic choice for the call's shape with its
// split-K forced to 1 and no reduction: each output is then one MMA chain over k in ascending
// order whatever the tile. bench/probes/cublaslt_invariance_probe.cu measured this on an H100
// (2026-12-06, bench/results): every such algorithm the heuristic offered, at every m from 1 to
// 2048, gave the bits of one mma.sync k16 chain in ascending k, for the 9B model's in_proj and
// out_proj. The heuristic is given a workspace (kLtWorkspaceBytes, one per device and thread):
// without one it offers only slow kernels (2.1 ms instead of 0.37 ms at m = 2048). Plans are
// cached per (device, m, n, k, ldb, ldc). Whether a shape takes this path depends on its layout
// only (lt_shape_applies), never on m: a row's bits must come from one arithmetic for every m.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "check.h"
#include "common.cuh"
#include "gemm_skinny.cuh"  // swiglu_out

namespace hyserve::kernels::cuda_detail {
namespace {

constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;

// The layouts this path takes, whatever m: 16-byte rows of the weight and of the activations,
// and of the output.
bool lt_shape_applies(int64_t n, int64_t k, int64_t ldb, int64_t ldc) {
  return n % 8 == 0 && k % 8 == 0 && ldb % 8 == 0 && ldc % 4 == 0;
}

// One planned shape: the descriptors and the algorithm (valid false: no split-K-1 algorithm).
struct lt_plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t b = nullptr, a = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool valid = false;
  lt_plan() = default;
  lt_plan(const lt_plan&) = delete;
  lt_plan& operator=(const lt_plan&) = delete;
  ~lt_plan() {
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

// The handle and the plans of one device; per thread, like gemm.cu's cuBLAS handles.
class lt_context {
 public:
  lt_context() {
    CUBLAS_CHECK(cublasLtCreate(&handle_));
    CUDA_CHECK(cudaMalloc(&workspace_, kLtWorkspaceBytes));
  }
  ~lt_context() {
    plans_.clear();
    cudaFree(workspace_);
    cublasLtDestroy(handle_);
  }
  lt_context(const lt_context&) = delete;
  lt_context& operator=(const lt_context&) = delete;
  cublasLtHandle_t handle() const { return handle_; }
  void* workspace() const { return workspace_; }

  const lt_plan& plan(int64_t m, int64_t n, int64_t k, int64_t ldb, int64_t ldc) {
    std::unique_ptr<lt_plan>& p = plans_[std::make_tuple(m, n, k, ldb, ldc)];
    if (!p) p = make_plan(m, n, k, ldb, ldc);
    return *p;
  }

 private:
  // cuBLAS is column-major: c as an n × m matrix (ld ldc) = op(W) · A16 with W stored k × n
  // (ld ldb, transposed) and A16 stored k × m (ld k).
  std::unique_ptr<lt_plan> make_plan(int64_t m, int64_t n, int64_t k, int64_t ldb, int64_t ldc) const {
    auto p = std::make_unique<lt_plan>();
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, static_cast<uint64_t>(k), static_cast<uint64_t>(n), ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, static_cast<uint64_t>(k), static_cast<uint64_t>(m), k));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, static_cast<uint64_t>(n), static_cast<uint64_t>(m), ldc));
    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t workspace = kLtWorkspaceBytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                         sizeof(workspace));
    constexpr int kCandidates = 8;
    cublasLtMatmulHeuristicResult_t res[kCandidates];
    int found = 0;
    const cublasStatus_t h =
        cublasLtMatmulAlgoGetHeuristic(handle_, p->op, p->b, p->a, p->c, p->c, pref, kCandidates, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (h != CUBLAS_STATUS_SUCCESS) return p;
    // The first candidate (heuristic order) that takes split-K 1 without a reduction.
    for (int i = 0; i < found && !p->valid; ++i) {
      cublasLtMatmulAlgo_t algo = res[i].algo;
      const int32_t one = 1;
      const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
      if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof(one)) !=
              CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none, sizeof(none)) !=
              CUBLAS_STATUS_SUCCESS)
        continue;
      cublasLtMatmulHeuristicResult_t check{};
      if (cublasLtMatmulAlgoCheck(handle_, p->op, p->b, p->a, p->c, p->c, &algo, &check) != CUBLAS_STATUS_SUCCESS ||
          check.workspaceSize > kLtWorkspaceBytes)
        continue;
      p->algo = algo;
      p->valid = true;
    }
    return p;
  }

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;  // the stream's GEMMs run one after the other: one workspace is enough
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>, std::unique_ptr<lt_plan>> plans_;
};

lt_context& lt_for_device() {
  thread_local std::map<int, std::unique_ptr<lt_context>> contexts;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  std::unique_ptr<lt_context>& c = contexts[device];
  if (!c) c = std::make_unique<lt_context>();
  return *c;
}

// c = a16 · bᵀ + beta · c (beta 0 or 1). False (nothing launched) when the shape's layout is not one
// this path takes; a shape it takes with no split-K-1 algorithm at this m is an error (the
// shape's other rows counts would have another arithmetic).
bool lt_invariant_gemm(const __nv_bfloat16* a16, const __nv_bfloat16* b, int64_t ldb, float* c, int64_t ldc, int64_t m,
                       int64_t n, int64_t k, float beta, cudaStream_t stream) {
  if (!lt_shape_applies(n, k, ldb, ldc)) return false;
  lt_context& lt = lt_for_device();
  const lt_plan& p = lt.plan(m, n, k, ldb, ldc);
  HYSERVE_CHECK(p.valid, "batch_invariant GEMM on cuBLASLt: no split-K-1 algorithm for m " + std::to_string(m) +
                             ", n " + std::to_string(n) + ", k " + std::to_string(k));
  const float alpha = 1.0f;
  CUBLAS_CHECK(cublasLtMatmul(lt.handle(), p.op, &alpha, b, p.b, a16, p.a, &beta, c, p.c, c, p.c, &p.algo,
                              lt.workspace(), kLtWorkspaceBytes, stream));
  return true;
}

// out[r, j] = swiglu_out(gate[r, j], up[r, j]) (the skinny kernels' formula, compiled once).
__global__ void lt_swiglu_kernel(const float* __restrict__ gate, const float* __restrict__ up, float* __restrict__ out,
                                 int64_t m, int64_t n, int64_t ldo) {
  const int64_t total = m * n;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, j = i - r * n;
    out[r * ldo + j] = swiglu_out(gate[i], up[i]);
  }
}

}  // namespace
}  // namespace hyserve::kernels::cuda_detail
