#include "hyserve/kernels/activation.h"
#include "hyserve/kernels/gemm.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "dtype_dispatch.h"
#include "dense_validate.h"
#include "validate.h"

namespace hyserve::kernels {

using namespace cpu_detail;

namespace {

// The CPU GEMM is row-invariant: C[i, j] is the same bits whatever m is and whatever the other
// rows of A hold, so a request's result does not depend on its batch (docs/ARCHITECTURE.md,
// Batch invariance). BLAS libraries do not promise that (OpenBLAS's sgemm switches kernels with
// m: a row's result at m = 7 differs from m = 1), so the product is computed here with one fixed
// order per element: eight lanes, lane l summing the products at k ≡ l (mod 8) in increasing k,
// then a fixed tree over the lanes; alpha, then beta · C, last. Every tile shape runs the same
// per-element arithmetic (this file is compiled without floating-point contraction).
using v8 = float __attribute__((vector_size(32)));
constexpr int64_t kLanes = 8;
constexpr int kTileRows = 2, kTileCols = 4;
// Columns of C per block: their rows of B (widened / transposed to f32 [cols, k]) stay in cache
// while every row of A passes over them (about 256 KiB).
constexpr int64_t kBlockBytes = int64_t{1} << 18;
// Multiply-adds from which a product is split over the OpenMP threads (about a millisecond).
constexpr double kThreadedMacs = 1 << 24;

[[gnu::always_inline]] inline v8 load8(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

[[gnu::always_inline]] inline v8 load_tail(const float* p, int64_t n) {
  v8 v = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < n; ++i) v[i] = p[i];
  return v;
}

[[gnu::always_inline]] inline float reduce8(v8 v) { return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7])); }

// R rows of A (row stride lda) times C columns held as rows of bt ([cols, k], contiguous).
template <int R, int C>
[[gnu::always_inline]] inline void tile(const float* a, int64_t lda, const float* bt, int64_t k, float* c, int64_t ldc, float alpha, float beta) {
  v8 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) acc[r][j] = v8{0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t k8 = k / kLanes * kLanes;
  for (int64_t kk = 0; kk < k8; kk += kLanes) {
    v8 bv[C];
    for (int j = 0; j < C; ++j) bv[j] = load8(bt + j * k + kk);
    for (int r = 0; r < R; ++r) {
      const v8 av = load8(a + r * lda + kk);
      for (int j = 0; j < C; ++j) acc[r][j] += av * bv[j];
    }
  }
  if (k8 < k) {
    v8 bv[C];
    for (int j = 0; j < C; ++j) bv[j] = load_tail(bt + j * k + k8, k - k8);
    for (int r = 0; r < R; ++r) {
      const v8 av = load_tail(a + r * lda + k8, k - k8);
      for (int j = 0; j < C; ++j) acc[r][j] += av * bv[j];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) {
      float& out = c[r * ldc + j];
      const float v = alpha * reduce8(acc[r][j]);
      out = beta == 0.0f ? v : v + beta * out;
    }
}

template <int R>
[[gnu::always_inline]] inline void tile_cols(int64_t cols, const float* a, int64_t lda, const float* bt, int64_t k, float* c, int64_t ldc,
               float alpha, float beta) {
  int64_t j = 0;
  for (; j + kTileCols <= cols; j += kTileCols) tile<R, kTileCols>(a, lda, bt + j * k, k, c + j, ldc, alpha, beta);
  for (; j < cols; ++j) tile<R, 1>(a, lda, bt + j * k, k, c + j, ldc, alpha, beta);
}

// Columns n0 .. n0 + cols of op(B) as f32 rows [cols, k] (exact: bf16 widens exactly).
template <typename T>
void load_block(const gemm_params& p, const T* b, int64_t n0, int64_t cols, float* bt) {
  auto f32 = [](T v) {
    if constexpr (std::is_same_v<T, float>) return v;
    else return bf16_to_f32(v);
  };
  if (p.trans_b) {
    for (int64_t j = 0; j < cols; ++j)
      for (int64_t i = 0; i < p.k; ++i) bt[j * p.k + i] = f32(b[(n0 + j) * p.ldb + i]);
  } else {
    for (int64_t i = 0; i < p.k; ++i)
      for (int64_t j = 0; j < cols; ++j) bt[j * p.k + i] = f32(b[i * p.ldb + n0 + j]);
  }
}

// Every row of A against one block of columns (bt: [cols, k]). Compiled for AVX2 and for the
// baseline, chosen at load time: the same IEEE operations per lane in both (no FMA), so the
// bits do not depend on the machine's vector width either.
__attribute__((target_clones("avx2", "default"))) void block_rows(const gemm_params& p, const float* a, int64_t lda,
                                                                  const float* bt, int64_t n0, int64_t cols) {
  int64_t i = 0;
  for (; i + kTileRows <= p.m; i += kTileRows)
    tile_cols<kTileRows>(cols, a + i * lda, lda, bt, p.k, p.c + i * p.ldc + n0, p.ldc, p.alpha, p.beta);
  for (; i < p.m; ++i) tile_cols<1>(cols, a + i * lda, lda, bt, p.k, p.c + i * p.ldc + n0, p.ldc, p.alpha, p.beta);
}

template <typename T>
void gemm_rows(const gemm_params& p, const float* a, int64_t lda) {
  const auto* b = static_cast<const T*>(p.b);
  const int64_t nb = std::min(p.n, std::max<int64_t>(kBlockBytes / (p.k * static_cast<int64_t>(sizeof(float))), kTileCols));
  const int64_t blocks = (p.n + nb - 1) / nb;
  // A contiguous f32 weight in [n, k] layout is used in place; anything else is staged per block.
  const bool in_place = std::is_same_v<T, float> && p.trans_b && p.ldb == p.k;
  // Threads only for products worth a fork (a tiny model's GEMMs run faster on one thread, and
  // idle OpenMP threads spinning beside other processes cost more than they save).
  const bool threaded = blocks > 1 && static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k) >= kThreadedMacs;
#pragma omp parallel if (threaded)
  {
    std::vector<float> staged(in_place ? 0 : static_cast<size_t>(nb * p.k));
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t n0 = blk * nb, cols = std::min(nb, p.n - n0);
      const float* bt = nullptr;
      if constexpr (std::is_same_v<T, float>) {
        if (in_place) bt = b + n0 * p.k;
      }
      if (bt == nullptr) {
        load_block(p, b, n0, cols, staged.data());
        bt = staged.data();
      }
      block_rows(p, a, lda, bt, n0, cols);
    }
  }
}

}  // namespace

void run_cpu(const gemm_params& p) {
  constexpr const char* op = "gemm";
  check_gemm(p, op);
  if (p.m == 0 || p.n == 0) return;
  if (p.k == 0) {  // C = beta · C
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t j = 0; j < p.n; ++j) {
        float& out = p.c[i * p.ldc + j];
        out = p.beta == 0.0f ? 0.0f : p.beta * out;
      }
    return;
  }
  // op(A) as rows of k: A itself, or A^T staged (trans_a).
  std::vector<float> at;
  const float* a = p.a;
  int64_t lda = p.lda;
  if (p.trans_a) {
    at.resize(static_cast<size_t>(p.m * p.k));
    for (int64_t kk = 0; kk < p.k; ++kk)
      for (int64_t i = 0; i < p.m; ++i) at[static_cast<size_t>(i * p.k + kk)] = p.a[kk * p.lda + i];
    a = at.data();
    lda = p.k;
  }
  dispatch_storage(p.b_dtype, op, "b_dtype", [&](auto tag) {
    if constexpr (decltype(tag)::value == dtype::kF32) gemm_rows<float>(p, a, lda);
    else gemm_rows<uint16_t>(p, a, lda);
  });
}

void run_cpu(const swiglu_linear_params& p) {
  constexpr const char* op = "swiglu_linear";
  check_swiglu_linear(p, op);
  if (p.m == 0) return;
  std::vector<float> up(static_cast<size_t>(p.m * p.n));
  gemm_params g = swiglu_linear_gate_gemm(p);
  run_cpu(g);
  g.b = p.up_w;
  g.c = up.data();
  g.ldc = p.n;
  run_cpu(g);
  swiglu_params s;
  s.gate = p.out;
  s.up = up.data();
  s.out = p.out;
  s.rows = p.m;
  s.cols = p.n;
  s.gate_stride = s.out_stride = p.out_stride;
  s.up_stride = p.n;
  run_cpu(s);
}

void linear_cpu(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k, bool accumulate) {
  linear_cpu(x, w, dtype::kF32, y, m, n, k, accumulate);
}

void linear_cpu(const float* x, const void* w, dtype w_dtype, float* y, int64_t m, int64_t n, int64_t k,
                bool accumulate) {
  gemm_params p;
  p.a = x;
  p.b = w;
  p.b_dtype = w_dtype;
  p.c = y;
  p.m = m;
  p.n = n;
  p.k = k;
  p.lda = k;
  p.ldb = k;
  p.ldc = n;
  p.trans_b = true;
  p.beta = accumulate ? 1.0f : 0.0f;
  run_cpu(p);
}

}  // namespace hyserve::kernels
