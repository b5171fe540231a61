// A device probe (not part of the build) for determinism: batch_invariant at many rows. A
// cuBLAS GEMM's bits for a row follow the algorithm its call's m picks (tile, split-K), which
// is why the invariant mode does not call cuBLAS. Questions, for bf16 A (activations, M × K)
// and W (weight, N × K), y = A·Wᵀ in f32 with f32 accumulation:
//   1. With the algorithm pinned (one cuBLASLt heuristic result for the largest m, split-K 1,
//      no reduction), is every row's result the same at every m (1 … 2048)?
//   2. Are those bits the ones of one mma.sync m16n8k16 chain per output over k in ascending
//      order (the arithmetic a custom small-m kernel can reproduce), with the activations as
//      the MMA's A operand and with the weight as A?
//   3. Unpinned (cublasGemmEx per m, as fast mode calls it): how many rows differ from m = 2048?
//   4. How fast is each pinned algorithm at each m (median of 10 runs)?
//   5. Per m, each of the heuristic's algorithms for that m with split-K forced to 1: the chain's
//      bits? (If so, an invariant GEMM may pick its algorithm by m.) And its time.
// Prints, per shape: each pinned algorithm's configuration and, per m, its time, the rows that
// differ from its own m = 2048 result, and the outputs that differ from each chain.
//   nvcc -O2 --generate-code=arch=compute_90a,code=[compute_90a,sm_90a] -std=c++17 \
//        bench/probes/cublaslt_invariance_probe.cu -lcublasLt -lcublas -o cublaslt_probe && ./cublaslt_probe
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#include "probe_check.h"

using bf16 = __nv_bfloat16;

__device__ __forceinline__ uint32_t ld32(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// One warp per 16 × 8 output tile, one chain over k (k16 steps from 0), fragments from global
// memory. weight_as_a: the MMA's 16 rows are weight rows and its 8 columns activation rows;
// else the reverse. y is [M][N].
__global__ void chain_kernel(const bf16* a, const bf16* w, float* y, int M, int N, int K, bool weight_as_a) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int rows16 = weight_as_a ? N : M, cols8 = weight_as_a ? M : N;
  const int64_t tiles_c = cols8 / 8;
  const int64_t tr = warp / tiles_c, tc = warp % tiles_c;
  if (tr * 16 >= rows16) return;
  const bf16* A = weight_as_a ? w : a;  // 16-row operand, [rows16][K]
  const bf16* B = weight_as_a ? a : w;  // 8-column operand, [cols8][K]
  const int64_t r0 = tr * 16, c0 = tc * 8;
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  for (int k0 = 0; k0 < K; k0 += 16) {
    const uint32_t af[4] = {ld32(A + (r0 + g) * K + k0 + 2 * t), ld32(A + (r0 + g + 8) * K + k0 + 2 * t),
                            ld32(A + (r0 + g) * K + k0 + 2 * t + 8), ld32(A + (r0 + g + 8) * K + k0 + 2 * t + 8)};
    const uint32_t bfr[2] = {ld32(B + (c0 + g) * K + k0 + 2 * t), ld32(B + (c0 + g) * K + k0 + 2 * t + 8)};
    mma16816(c, af, bfr);
  }
  // c[0], c[1]: row g, columns 2t, 2t + 1; c[2], c[3]: row g + 8.
  for (int e = 0; e < 4; ++e) {
    const int64_t r = r0 + g + (e >= 2 ? 8 : 0), col = c0 + 2 * t + (e & 1);
    if (weight_as_a)
      y[col * N + r] = c[e];
    else
      y[r * N + col] = c[e];
  }
}

struct shape {
  const char* name;
  int n, k;
};

int64_t count_diff(const std::vector<float>& x, const std::vector<float>& y, int64_t elems) {
  int64_t d = 0;
  for (int64_t i = 0; i < elems; ++i) d += std::memcmp(&x[i], &y[i], 4) != 0;
  return d;
}
int64_t rows_diff(const std::vector<float>& x, const std::vector<float>& y, int rows, int n) {
  int64_t d = 0;
  for (int r = 0; r < rows; ++r) d += std::memcmp(&x[int64_t{r} * n], &y[int64_t{r} * n], 4 * size_t(n)) != 0;
  return d;
}

template <class T>
T cfg(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS) return T(-1);
  return v;
}

int main() {
  const int kMaxM = 2048;
  const std::vector<int> ms = {1, 2, 8, 16, 17, 64, 128, 256, 1000, 2048};
  const std::vector<shape> shapes = {{"in_proj", 16768, 4096}, {"out_proj", 4096, 8192}};
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s\n", prop.name);
  cublasLtHandle_t lt;
  CB(cublasLtCreate(&lt));
  cublasHandle_t blas;
  CB(cublasCreate(&blas));
  const size_t ws_bytes = size_t{64} << 20;
  void* ws = nullptr;
  CK(cudaMalloc(&ws, ws_bytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  // Median of 10 timed runs of a call, in microseconds.
  auto median_us = [&](const auto& run) {
    std::vector<float> t(10);
    for (float& v : t) {
      CK(cudaEventRecord(e0));
      run();
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      CK(cudaEventElapsedTime(&v, e0, e1));
    }
    std::sort(t.begin(), t.end());
    return t[5] * 1000.f;
  };
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);

  for (const shape& s : shapes) {
    const int N = s.n, K = s.k;
    std::printf("\n== %s: N %d, K %d\n", s.name, N, K);
    std::vector<bf16> ha(size_t(kMaxM) * K), hw(size_t(N) * K);
    for (auto& v : ha) v = __float2bfloat16(nd(rng));
    for (auto& v : hw) v = __float2bfloat16(nd(rng) * 0.02f);
    bf16 *da, *dw;
    float* dy;
    CK(cudaMalloc(&da, ha.size() * 2));
    CK(cudaMalloc(&dw, hw.size() * 2));
    CK(cudaMalloc(&dy, size_t(kMaxM) * N * 4));
    CK(cudaMemcpy(da, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    const int64_t all = int64_t{kMaxM} * N;
    auto fetch = [&](int rows) {
      std::vector<float> h(size_t(rows) * N);
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(h.data(), dy, h.size() * 4, cudaMemcpyDeviceToHost));
      return h;
    };

    // The two chains over all rows.
    std::vector<float> chain[2];
    for (int v = 0; v < 2; ++v) {
      CK(cudaMemset(dy, 0xff, size_t(all) * 4));
      const int64_t warps = (int64_t{kMaxM} / 16) * (N / 8);
      chain_kernel<<<static_cast<unsigned>((warps * 32 + 255) / 256), 256>>>(da, dw, dy, kMaxM, N, K, v == 1);
      CK(cudaGetLastError());
      chain[v] = fetch(kMaxM);
    }
    std::printf("chains: activations-as-A vs weight-as-A: %lld of %lld outputs differ\n",
                (long long)count_diff(chain[0], chain[1], all), (long long)all);

    cublasLtMatmulDesc_t op;
    CB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof(tA)));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof(tB)));
    cublasLtMatrixLayout_t wd;
    CB(cublasLtMatrixLayoutCreate(&wd, CUDA_R_16BF, K, N, K));  // W as k × n (transposed by TRANSA)
    auto act_layout = [&](int m) {
      cublasLtMatrixLayout_t l;
      CB(cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, K, m, K));
      return l;
    };
    auto out_layout = [&](int m) {
      cublasLtMatrixLayout_t l;
      CB(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, N, m, N));
      return l;
    };
    cublasLtMatmulPreference_t pref;
    CB(cublasLtMatmulPreferenceCreate(&pref));
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                            sizeof(ws_bytes)));
    cublasLtMatrixLayout_t ad_max = act_layout(kMaxM), cd_max = out_layout(kMaxM);
    cublasLtMatmulHeuristicResult_t res[4];
    int nres = 0;
    CB(cublasLtMatmulAlgoGetHeuristic(lt, op, wd, ad_max, cd_max, cd_max, pref, 4, res, &nres));
    const float alpha = 1.f, beta = 0.f;

    for (int h = 0; h < nres; ++h) {
      cublasLtMatmulAlgo_t algo = res[h].algo;
      const int32_t one = 1;
      const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
      CB(cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof(one)));
      CB(cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none, sizeof(none)));
      std::printf("pinned algorithm %d: id %d tile %u stages %u splitk %d (heuristic %d) swizzle %u custom %u inner %u "
                  "cluster %u\n",
                  h, cfg<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID), cfg<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                  cfg<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID), cfg<int32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                  cfg<int32_t>(res[h].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                  cfg<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                  cfg<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
                  unsigned(cfg<uint16_t>(algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID)),
                  unsigned(cfg<uint16_t>(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)));
      std::vector<float> at_max;
      std::vector<std::vector<float>> per_m(ms.size());
      std::vector<float> us(ms.size(), -1.f);
      for (size_t i = 0; i < ms.size(); ++i) {
        const int m = ms[i];
        cublasLtMatrixLayout_t ad = act_layout(m), cd = out_layout(m);
        cublasLtMatmulHeuristicResult_t check{};
        if (cublasLtMatmulAlgoCheck(lt, op, wd, ad, cd, cd, &algo, &check) != CUBLAS_STATUS_SUCCESS) {
          std::printf("  m %5d: the pinned algorithm does not take this m\n", m);
          continue;
        }
        auto run = [&] {
          CB(cublasLtMatmul(lt, op, &alpha, dw, wd, da, ad, &beta, dy, cd, dy, cd, &algo, ws, ws_bytes, nullptr));
        };
        CK(cudaMemset(dy, 0xff, size_t(m) * N * 4));
        run();
        per_m[i] = fetch(m);
        us[i] = median_us(run);
        CB(cublasLtMatrixLayoutDestroy(ad));
        CB(cublasLtMatrixLayoutDestroy(cd));
      }
      at_max = per_m.back();
      for (size_t i = 0; i < ms.size(); ++i) {
        if (per_m[i].empty()) continue;
        const int m = ms[i];
        const double gbs = (double(N) * K * 2 + double(m) * K * 2 + double(m) * N * 4) / (us[i] * 1e3);
        std::printf("  m %5d: %9.2f us (%7.1f GB/s, %6.1f TFLOP/s); rows differing from m = %d: %lld of %d; outputs "
                    "differing from the chain (act as A / weight as A): %lld / %lld of %lld\n",
                    m, us[i], gbs, 2.0 * m * N * K / (us[i] * 1e6), kMaxM,
                    at_max.empty() ? -1LL : (long long)rows_diff(per_m[i], at_max, m, N), m,
                    (long long)count_diff(per_m[i], chain[0], int64_t{m} * N),
                    (long long)count_diff(per_m[i], chain[1], int64_t{m} * N), (long long)int64_t{m} * N);
      }
    }

    // Per m, each of the heuristic's algorithms for that m with split-K forced to 1: if every
    // one gives the chain's bits, an invariant GEMM may pick its algorithm by m.
    for (size_t i = 0; i < ms.size(); ++i) {
      const int m = ms[i];
      cublasLtMatrixLayout_t ad = act_layout(m), cd = out_layout(m);
      cublasLtMatmulHeuristicResult_t mres[4];
      int mn = 0;
      CB(cublasLtMatmulAlgoGetHeuristic(lt, op, wd, ad, cd, cd, pref, 4, mres, &mn));
      for (int h = 0; h < mn; ++h) {
        cublasLtMatmulAlgo_t algo = mres[h].algo;
        const int32_t split = cfg<int32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
        const int32_t one = 1;
        const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
        cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof(one));
        cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none, sizeof(none));
        cublasLtMatmulHeuristicResult_t check{};
        if (cublasLtMatmulAlgoCheck(lt, op, wd, ad, cd, cd, &algo, &check) != CUBLAS_STATUS_SUCCESS) {
          std::printf("per-m m %5d algorithm %d (id %d tile %u, split-k %d): refuses split-k 1\n", m, h,
                      cfg<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID), cfg<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                      split);
          continue;
        }
        auto run = [&] {
          CB(cublasLtMatmul(lt, op, &alpha, dw, wd, da, ad, &beta, dy, cd, dy, cd, &algo, ws, ws_bytes, nullptr));
        };
        CK(cudaMemset(dy, 0xff, size_t(m) * N * 4));
        run();
        const std::vector<float> got = fetch(m);
        const float t_us = median_us(run);
        std::printf("per-m m %5d algorithm %d (id %d tile %u stages %u, heuristic split-k %d, run at 1): %9.2f us; "
                    "outputs differing from the chain (act as A / weight as A): %lld / %lld of %lld\n",
                    m, h, cfg<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID), cfg<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                    cfg<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID), split, t_us,
                    (long long)count_diff(got, chain[0], int64_t{m} * N),
                    (long long)count_diff(got, chain[1], int64_t{m} * N), (long long)int64_t{m} * N);
      }
      CB(cublasLtMatrixLayoutDestroy(ad));
      CB(cublasLtMatrixLayoutDestroy(cd));
    }

    // Unpinned: cublasGemmEx per m, the fast mode's call.
    std::vector<std::vector<float>> gemm_ex(ms.size());
    for (size_t i = 0; i < ms.size(); ++i) {
      const int m = ms[i];
      CK(cudaMemset(dy, 0xff, size_t(m) * N * 4));
      CB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, N, m, K, &alpha, dw, CUDA_R_16BF, K, da, CUDA_R_16BF, K, &beta,
                      dy, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      gemm_ex[i] = fetch(m);
    }
    for (size_t i = 0; i < ms.size(); ++i)
      std::printf("unpinned cublasGemmEx m %5d: rows differing from its m = %d result: %lld of %d; outputs differing "
                  "from the chain (act as A): %lld\n",
                  ms[i], kMaxM, (long long)rows_diff(gemm_ex[i], gemm_ex.back(), ms[i], N), ms[i],
                  (long long)count_diff(gemm_ex[i], chain[0], int64_t{ms[i]} * N));

    CB(cublasLtMatrixLayoutDestroy(ad_max));
    CB(cublasLtMatrixLayoutDestroy(cd_max));
    CB(cublasLtMatrixLayoutDestroy(wd));
    CB(cublasLtMatmulPreferenceDestroy(pref));
    CB(cublasLtMatmulDescDestroy(op));
    CK(cudaFree(da));
    CK(cudaFree(dw));
    CK(cudaFree(dy));
  }
  return 0;
}
