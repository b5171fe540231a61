// A device probe (not part of the build) for kernels/cuda/gemm_wgmma.cuh, the linear layer on
// warpgroup MMAs with tensor-copy weight streaming: is it right, and how fast is it against
// cuBLAS at 1 … 256 rows (and a few prefill sizes) on the 9B Bamba's linear shapes?
//   1. Correctness (up to 256 rows): the first 1024 columns of every row against a CUDA-core
//      reference (f32 sums of the same bf16 products, k ascending), |diff| <= 2e-3 + 1e-3·|ref|,
//      and every output written, for each shape, row count, variant and split.
//   2. Row invariance: with the splits fixed, a row's bits against the same row of 256 rows, for
//      several row counts (BN 8 … 256), both consumer counts, and 2048 rows with the splits
//      summed inside the blocks (kSumSplits, the invariant path above 256 rows) (printed, not a
//      failure).
//   3. Speed: median of 20 timed calls (cudaEvents) of the kernel (each split count of a small
//      set, the best printed, and its reduction included) and of cublasGemmEx (bf16 in, f32 out,
//      f32 compute, default algorithm); % of the device-to-device copy bandwidth measured here
//      (bytes: weights + activations + f32 outputs) and TFLOP/s.
//   nvcc -O3 --generate-code=arch=compute_90a,code=[compute_90a,sm_90a] -std=c++17 -Ikernels/cuda -Icommon/include -Ikernels/include \
//        bench/probes/wgmma_linear_probe.cu -lcublas -o wgmma_probe && ./wgmma_probe
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "gemm_wgmma.cuh"
#include "probe_check.h"

using bf16 = __nv_bfloat16;
namespace cd = hyserve::kernels::cuda_detail;

__global__ void fill(bf16* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    p[i] = __float2bfloat16((static_cast<float>(x & 0xFFFF) / 32768.0f) - 1.0f);
  }
}

// y[r][c] for c < n (the first n columns of the output: every row tile, the first weight tiles).
__global__ void reference(const bf16* x, const bf16* w, float* y, int64_t m, int64_t n, int64_t k) {
  const int64_t q = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (q >= m * n) return;
  const int64_t r = q / n, c = q % n;
  float acc = 0.0f;
  for (int64_t i = 0; i < k; ++i) acc = fmaf(__bfloat162float(x[r * k + i]), __bfloat162float(w[c * k + i]), acc);
  y[q] = acc;
}

struct shape {
  const char* name;
  int64_t n, k;
};

// kSum: every split of a tile summed inside its block (kSumSplits, the invariant path's many
// rows), grid y 1; else a block a split and the reduction.
template <int BN, int WG, bool kSum = false>
void launch(const CUtensorMap& tw, const CUtensorMap& tx, int64_t m, int64_t n, int64_t k, int splits, float* y,
            float* part, cudaStream_t st) {
  auto kernel = cd::wgmma_linear_kernel<BN, WG, kSum>;
  static bool init = false;
  if (!init) {
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, cd::wgmma_smem(BN, WG)));
    init = true;
  }
  const int kbs = static_cast<int>((k + 63) / 64);
  cd::wgmma_linear_args a;
  a.m = m;
  a.n = n;
  a.k = k;
  a.kb_per_split = (kbs + splits - 1) / splits;
  const int real_splits = (kbs + a.kb_per_split - 1) / a.kb_per_split;
  const bool reduce = !kSum && real_splits > 1;
  a.splits_per_block = kSum ? real_splits : 1;
  a.y = reduce ? part : y;
  a.ldy = n;
  const int rows = cd::wgmma_rows(WG);
  const dim3 grid(static_cast<unsigned>((n + rows - 1) / rows), static_cast<unsigned>(reduce ? real_splits : 1),
                  static_cast<unsigned>((m + BN - 1) / BN));
  kernel<<<grid, cd::wgmma_threads(WG), cd::wgmma_smem(BN, WG), st>>>(tw, tx, a);
  if (reduce) {
    const int64_t q = m * n / 4;
    cd::wgmma_reduce_splits<<<static_cast<unsigned>((q + 255) / 256), 256, 0, st>>>(part, y, m, n, n, real_splits, 0.0f);
  }
}

int bn_for(int64_t m) {
  for (int b : {8, 16, 32, 64, 128}) if (m <= b) return b;
  return 256;
}

template <int WG>
void run_wg(int bn, const CUtensorMap& tw, const CUtensorMap& tx, int64_t m, int64_t n, int64_t k, int splits, float* y,
            float* part, cudaStream_t st) {
  switch (bn) {
    case 8: return launch<8, WG>(tw, tx, m, n, k, splits, y, part, st);
    case 16: return launch<16, WG>(tw, tx, m, n, k, splits, y, part, st);
    case 32: return launch<32, WG>(tw, tx, m, n, k, splits, y, part, st);
    case 64: return launch<64, WG>(tw, tx, m, n, k, splits, y, part, st);
    case 128: return launch<128, WG>(tw, tx, m, n, k, splits, y, part, st);
    default: return launch<256, WG>(tw, tx, m, n, k, splits, y, part, st);
  }
}
void run(int wg, int bn, const CUtensorMap& tw, const CUtensorMap& tx, int64_t m, int64_t n, int64_t k, int splits,
         float* y, float* part, cudaStream_t st) {
  if (wg == 2) run_wg<2>(bn, tw, tx, m, n, k, splits, y, part, st);
  else run_wg<1>(bn, tw, tx, m, n, k, splits, y, part, st);
}

template <class F>
double median_ms(F&& f, cudaStream_t st, int reps = 20) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  f();
  f();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a, st));
    f();
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return t[t.size() / 2];
}

// Row invariance (for determinism: batch_invariant): with the split count fixed, is a row's
// output the same bits whatever the number of rows (so BN, the MMA's N, 8 … 256) and the consumer
// warpgroups? Rows 0..m-1 of each m in ms against the same rows of m = 256, WG 2, s splits.
bool row_invariance(const shape& sh, const bf16* w, const bf16* x, float* y, float* part, cudaStream_t st) {
  const int64_t ms[] = {1, 8, 9, 17, 64, 100, 129, 256};
  // y for m rows on wg consumer warpgroups, s splits, copied to the host.
  auto rows_of = [&](int wg, int64_t m, int splits, std::vector<float>& out) {
    const int bn = bn_for(m);
    CUtensorMap tw, tx;
    if (!cd::wgmma_tensor_map(&tw, w, sh.n, sh.k, cd::wgmma_rows(wg)) || !cd::wgmma_tensor_map(&tx, x, m, sh.k, bn))
      return false;
    run(wg, bn, tw, tx, m, sh.n, sh.k, splits, y, part, st);
    CK(cudaGetLastError());
    out.resize(static_cast<size_t>(m * sh.n));
    CK(cudaMemcpyAsync(out.data(), y, out.size() * 4, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    return true;
  };
  bool ok = true;
  for (int splits : {1, 4}) {
    std::vector<float> base, got;
    if (!rows_of(2, 256, splits, base)) return false;
    int differ = 0, compared = 0;
    for (int wg : {2, 1})
      for (int64_t m : ms) {
        if (!rows_of(wg, m, splits, got)) return false;
        ++compared;
        if (std::memcmp(got.data(), base.data(), got.size() * 4) != 0) {
          ++differ;
          std::printf("    splits %d wg %d m %lld: rows differ in bits from m 256's\n", splits, wg,
                      static_cast<long long>(m));
        }
      }
    // 2048 rows with the splits summed inside the blocks (128-row tiles on two consumer
    // warpgroups, 64-row tiles on one): the first 256 rows against the reduction's.
    for (int wg : {2, 1}) {
      const int64_t m = 2048;
      const int bn = wg == 2 ? 128 : 64;
      CUtensorMap tw, tx;
      if (!cd::wgmma_tensor_map(&tw, w, sh.n, sh.k, cd::wgmma_rows(wg)) || !cd::wgmma_tensor_map(&tx, x, m, sh.k, bn))
        return false;
      if (wg == 2) launch<128, 2, true>(tw, tx, m, sh.n, sh.k, splits, y, part, st);
      else launch<64, 1, true>(tw, tx, m, sh.n, sh.k, splits, y, part, st);
      CK(cudaGetLastError());
      got.resize(static_cast<size_t>(256 * sh.n));
      CK(cudaMemcpyAsync(got.data(), y, got.size() * 4, cudaMemcpyDeviceToHost, st));
      CK(cudaStreamSynchronize(st));
      ++compared;
      if (std::memcmp(got.data(), base.data(), got.size() * 4) != 0) {
        ++differ;
        std::printf("    splits %d wg %d m 2048 summed in the blocks: rows differ in bits from m 256's\n", splits, wg);
      }
    }
    std::printf("  row invariance, splits %d: %d of %d (wg, m) runs bit-identical to m 256's rows\n", splits,
                compared - differ, compared);
    ok = ok && differ == 0;
  }
  return ok;
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  // Copy bandwidth: read + write of 1 GiB.
  double copy_bw = 0;
  {
    const size_t bytes = size_t{1} << 30;
    void *p, *q;
    CK(cudaMalloc(&p, bytes));
    CK(cudaMalloc(&q, bytes));
    const double ms = median_ms([&] { CK(cudaMemcpyAsync(q, p, bytes, cudaMemcpyDeviceToDevice, st)); }, st, 5);
    copy_bw = 2.0 * bytes / (ms * 1e-3);
    CK(cudaFree(p));
    CK(cudaFree(q));
  }
  std::printf("%s, %d SMs; device-to-device copy %.1f GB/s\n", prop.name, sms, copy_bw / 1e9);

  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
  cublasSetStream(h, st);

  const shape shapes[] = {{"in_proj", 16768, 4096}, {"out_proj", 4096, 8192}, {"gate_up", 14336, 4096},
                          {"down", 4096, 14336}};
  const int64_t ms_list[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 2048};
  const int64_t max_m = 2048;
  bool all_ok = true;
  for (const shape& sh : shapes) {
    bf16 *w, *x;
    float *y, *yref, *part;
    CK(cudaMalloc(&w, sh.n * sh.k * 2));
    CK(cudaMalloc(&x, max_m * sh.k * 2));
    CK(cudaMalloc(&y, max_m * sh.n * 4));
    CK(cudaMalloc(&yref, max_m * sh.n * 4));
    CK(cudaMalloc(&part, 16 * 256 * sh.n * 4));
    fill<<<1024, 256, 0, st>>>(w, sh.n * sh.k, 1234u);
    fill<<<1024, 256, 0, st>>>(x, max_m * sh.k, 99u);
    std::printf("\n%s n %lld k %lld (weights %.1f MB)\n", sh.name, static_cast<long long>(sh.n),
                static_cast<long long>(sh.k), sh.n * sh.k * 2 / 1e6);
    std::printf("  %5s %4s | %7s %6s %7s | %7s %6s %7s | %s\n", "rows", "BN", "wgmma us", "%copy", "TFLOP/s", "cublas",
                "%copy", "TFLOP/s", "per variant, splits:us (BAD: outside tolerance, ?: unchecked)");
    for (int64_t m : ms_list) {
      const int bn = bn_for(m);
      const bool check = m <= 256;
      const int64_t ref_n = std::min<int64_t>(sh.n, 1024);  // checked columns: 8 or 16 weight tiles
      std::vector<float> ref, got;
      if (check) {
        const int64_t q = m * ref_n;
        reference<<<static_cast<unsigned>((q + 255) / 256), 256, 0, st>>>(x, w, yref, m, ref_n, sh.k);
        ref.resize(static_cast<size_t>(q));
        CK(cudaMemcpyAsync(ref.data(), yref, ref.size() * 4, cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
      }
      double best = 1e30;
      int best_s = 1, best_wg = 2;
      char line[1024];
      int len = 0;
      for (int wg : {2, 1}) {
        CUtensorMap tw, tx;
        if (!cd::wgmma_tensor_map(&tw, w, sh.n, sh.k, cd::wgmma_rows(wg)) || !cd::wgmma_tensor_map(&tx, x, m, sh.k, bn)) {
          std::printf("tensor map failed\n");
          return 1;
        }
        const int64_t mtiles = (m + bn - 1) / bn, ntiles = (sh.n + cd::wgmma_rows(wg) - 1) / cd::wgmma_rows(wg);
        len += std::snprintf(line + len, sizeof(line) - len, " wg%d", wg);
        for (int splits : {1, 2, 3, 4, 5, 6, 7, 8}) {
          if (splits > 1 && ntiles * mtiles * splits > 8 * sms) continue;
          if (splits > 1 && m > 256) continue;
          CK(cudaMemsetAsync(y, 0xFF, m * sh.n * 4, st));
          run(wg, bn, tw, tx, m, sh.n, sh.k, splits, y, part, st);
          CK(cudaGetLastError());
          int bad = 0;
          if (check) {
            got.resize(static_cast<size_t>(m * sh.n));
            CK(cudaMemcpyAsync(got.data(), y, got.size() * 4, cudaMemcpyDeviceToHost, st));
            CK(cudaStreamSynchronize(st));
            for (size_t i = 0; i < ref.size(); ++i) {
              const int64_t r = static_cast<int64_t>(i) / ref_n, c = static_cast<int64_t>(i) % ref_n;
              const float g = got[static_cast<size_t>(r * sh.n + c)];
              if (!(std::abs(g - ref[i]) <= 2e-3f + 1e-3f * std::abs(ref[i]))) {
                if (bad < 3)
                  std::printf("    mismatch m %lld wg %d splits %d at row %lld col %lld: %g vs %g\n",
                              static_cast<long long>(m), wg, splits, static_cast<long long>(r),
                              static_cast<long long>(c), g, ref[i]);
                ++bad;
              }
            }
            // Rows and columns past the checked ones: written (the poison, NaN, is gone).
            for (size_t i = 0; i < got.size(); ++i)
              if (std::isnan(got[i])) {
                if (bad < 3) std::printf("    unwritten output m %lld wg %d splits %d at %zu\n", static_cast<long long>(m), wg, splits, i);
                ++bad;
              }
            if (bad) all_ok = false;
          }
          const double t = median_ms([&] { run(wg, bn, tw, tx, m, sh.n, sh.k, splits, y, part, st); }, st);
          if (t < best) {
            best = t;
            best_s = splits;
            best_wg = wg;
          }
          len += std::snprintf(line + len, sizeof(line) - len, " %d:%.1f%s", splits, t * 1e3,
                               check ? (bad ? "BAD" : "") : "?");
        }
      }
      const float alpha = 1.0f, beta = 0.0f;
      // y[m × n] row-major = (w · xᵀ) in column-major terms: C (n × m) = Wᵀ(k × n)ᵀ · X(k × m).
      auto cublas = [&] {
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(sh.n), static_cast<int>(m), static_cast<int>(sh.k),
                     &alpha, w, CUDA_R_16BF, static_cast<int>(sh.k), x, CUDA_R_16BF, static_cast<int>(sh.k), &beta, y,
                     CUDA_R_32F, static_cast<int>(sh.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      };
      const double tc = median_ms(cublas, st);
      const double bytes = static_cast<double>(sh.n * sh.k * 2 + m * sh.k * 2 + m * sh.n * 4);
      const double flops = 2.0 * m * sh.n * sh.k;
      const cd::wgmma_plan plan = cd::wgmma_plan_for(m, sh.n, sh.k, bn, sms);
      const cd::wgmma_plan inv = cd::wgmma_invariant_plan(sh.n, sh.k, sms);
      std::printf("  %5lld %4d | %7.1f %5.1f%% %7.1f | %7.1f %5.1f%% %7.1f | best wg%d s%d, plan wg%d s%d, invariant wg%d s%d |%s\n",
                  static_cast<long long>(m), bn, best * 1e3, 100.0 * bytes / (best * 1e-3) / copy_bw,
                  flops / (best * 1e-3) / 1e12, tc * 1e3, 100.0 * bytes / (tc * 1e-3) / copy_bw,
                  flops / (tc * 1e-3) / 1e12, best_wg, best_s, plan.wg, plan.splits, inv.wg, inv.splits, line);
    }
    // Not a failure of the probe (fast mode does not need it): printed for the invariant path.
    row_invariance(sh, w, x, y, part, st);
    CK(cudaFree(w));
    CK(cudaFree(x));
    CK(cudaFree(y));
    CK(cudaFree(yref));
    CK(cudaFree(part));
  }
  std::printf("\n%s\n", all_ok ? "all outputs within tolerance" : "MISMATCHES");
  return all_ok ? 0 : 2;
}
