#pragma once
// Shared measurement helpers of the CUDA benchmark binaries (bench/cuda/*.cu): every figure is
// a ratio to the device-to-device copy bandwidth measured in the same run.
//   - median_ms: median of kReplays event-timed runs (after two warm-ups);
//   - copy_bandwidth: bytes read + written per second of a 1 GiB cudaMemcpyAsync;
//   - time_call_us: kCallsPerGraph calls rotating over n_sets input sets (so the working set
//     exceeds L2) captured in one CUDA graph, replayed; the median per call;
//   - random_device / random_device_hash: inputs from the host generator or, for gigabytes,
//     from a per-element hash on the device;
//   - bench_row / print_rows: the table every binary prints.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda/check.h"
#include "cuda/device_buffer.h"

namespace hyserve::kernels::bench {

constexpr int kCallsPerGraph = 32;
constexpr int kReplays = 10;
constexpr size_t kRotateBytes = size_t{256} << 20;  // > L2 (60 MB on H200) several times over

inline float median_ms(cudaStream_t stream, const std::function<void()>& fn) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> t;
  for (int r = 0; r < kReplays + 2; ++r) {
    CUDA_CHECK(cudaEventRecord(start, stream));
    fn();
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (r >= 2) t.push_back(ms);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

inline double copy_bandwidth(cudaStream_t stream) {
  const size_t bytes = size_t{1} << 30;
  device_buffer a(bytes), b(bytes);
  a.fill_bytes(1);
  const float ms = median_ms(stream, [&] {
    CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, stream));
  });
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3);
}

inline double time_call_us(cudaStream_t stream, int n_sets, const std::function<void(int)>& call) {
  for (int s = 0; s < n_sets; ++s) call(s);  // warm-up outside the capture
  CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  for (int i = 0; i < kCallsPerGraph; ++i) call(i % n_sets);
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const float ms = median_ms(stream, [&] { CUDA_CHECK(cudaGraphLaunch(exec, stream)); });
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  return 1e3 * ms / kCallsPerGraph;
}

inline int sets_for(size_t bytes_per_set) {
  return static_cast<int>(std::clamp<size_t>(kRotateBytes / std::max<size_t>(bytes_per_set, 1), 1, 64));
}

inline device_array<float> random_device(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& e : v) e = dist(gen);
  return device_array<float>(v);
}

__global__ inline void fill_hash_kernel(float* out, size_t n, uint32_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ static_cast<uint32_t>(i >> 32) ^ seed * 0x85EBCA77u;
    h ^= h >> 16;
    h *= 0x7FEB352Du;
    h ^= h >> 15;
    h *= 0x846CA68Bu;
    h ^= h >> 16;
    out[i] = lo + (hi - lo) * static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
  }
}

inline device_array<float> random_device_hash(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  device_array<float> a(n);
  fill_hash_kernel<<<1024, 256>>>(a.data(), n, seed, lo, hi);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  return a;
}

struct bench_row {
  std::string op, shape;
  int batch;
  double us, bytes;
};

inline void print_device(double copy_bw) {
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %.0f MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1048576.0);
  std::printf("device-to-device copy (1 GiB, read + write): %.1f GB/s\n\n", copy_bw / 1e9);
}

inline void print_rows(const std::vector<bench_row>& rows, double copy_bw) {
  std::printf("%-18s %-32s %6s %12s %12s %10s %8s\n", "op", "shape", "batch", "time_us", "MB_moved", "GB/s", "%copy");
  for (const bench_row& r : rows) {
    const double gbs = r.bytes / (r.us * 1e-6) / 1e9;
    std::printf("%-18s %-32s %6d %12.2f %12.2f %10.1f %7.1f%%\n", r.op.c_str(), r.shape.c_str(), r.batch, r.us,
                r.bytes / 1e6, gbs, 100.0 * gbs * 1e9 / copy_bw);
  }
}

}  // namespace hyserve::kernels::bench
