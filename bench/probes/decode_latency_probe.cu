// A device probe (not part of the build): what a batch-1 decode step's kernels pay on this GPU
// beyond their bytes, each effect alone, to weigh fewer, longer-lived kernels a layer against
// the kernel-per-op step (the families' batch-1 steps run 2–7 µs a kernel above their bytes).
//   1. hop: N = 256 dependent kernels in one CUDA graph, each reading what the one before wrote
//      (a block's values from another block's), with programmatic dependent launch (PDL) and
//      without, at 1, 32, 132 and 264 blocks of 128 threads, and as 16-block clusters: µs a hop;
//      and with every other hop asking 100 KB of dynamic shared memory (a carveout change at
//      every hop, as between the MoE decode kernels' rings and the kernels around them), with
//      the driver's carveout choice and with every hop preferring the largest (what
//      kernels.smem_carveout: 100 asks).
//   2. barrier: the same 256 hops inside one kernel of co-resident blocks (a cooperative launch),
//      separated by a grid barrier (an atomic arrival count and a spin on a generation word): µs a
//      hop. If a barrier costs what a kernel boundary does, a persistent decode kernel saves
//      nothing by itself.
//   3. stream: T bytes read by one block an SM through a ring of S bulk copies (cp.async.bulk)
//      of B bytes (a producer lane, 8 consumer warps summing the bf16 values of every stage), the
//      kernels/cuda/moe_decode_bulk.cuh design, against plain 16-byte loads by 2 blocks an SM of
//      8 warps (the fused linear kernel's); T as one contiguous run or as 4 MB chunks at random
//      2 MB-aligned offsets of a pool of several GB (the experts of a token: page-table misses),
//      each call on bytes no earlier call left in L2: µs a call, % of the copy bandwidth.
//   nvcc -O3 --generate-code=arch=compute_90a,code=[compute_90a,sm_90a] -std=c++17 -Ikernels/cuda -Icommon/include \
//        -Ikernels/include bench/probes/decode_latency_probe.cu -o decode_latency_probe && ./decode_latency_probe
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "async_copy.cuh"
#include "launch.cuh"
#include "probe_check.h"

namespace cd = hyserve::kernels::cuda_detail;

// ---- 1. hop ------------------------------------------------------------------------------------
// out[i] = in[(i + 128 · 7) mod n] + 1: each block reads values another block wrote.
__global__ void hop_kernel(const float* in, float* out, int n) {
  cd::pdl_wait();
  cd::pdl_launch_dependents();
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = in[(i + 128 * 7) % n] + 1.0f;
}

float time_graph_us(cudaGraphExec_t exec, cudaStream_t s, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaGraphLaunch(exec, s));  // warm-up
  CK(cudaEventRecord(a, s));
  for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(exec, s));
  CK(cudaEventRecord(b, s));
  CK(cudaEventSynchronize(b));
  float ms = 0.0f;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return 1000.0f * ms / static_cast<float>(reps);
}

void probe_hops(cudaStream_t s) {
  constexpr int kHops = 256;
  float *x, *y;
  CK(cudaMalloc(&x, 264 * 128 * sizeof(float)));
  CK(cudaMalloc(&y, 264 * 128 * sizeof(float)));
  CK(cudaMemset(x, 0, 264 * 128 * sizeof(float)));
  std::printf("== hop: %d dependent kernels in one graph (128 threads a block)\n", kHops);
  std::printf("%-8s %-10s %-8s %-12s %-10s %10s\n", "blocks", "cluster", "pdl", "odd smem KB", "carveout", "us/hop");
  struct variant {
    int blocks, cluster;
    bool pdl;
    int odd_smem_kb = 0;  // dynamic shared memory of every other hop
    int carveout = cudaSharedmemCarveoutDefault;
  };
  const variant vs[] = {{1, 1, false},      {1, 1, true},          {32, 1, false},        {32, 1, true},
                        {132, 1, false},    {132, 1, true},        {264, 1, true},        {32, 8, true},
                        {32, 16, false},    {32, 16, true},        {132, 1, true, 100},   {132, 1, true, 100, 100},
                        {132, 1, true, 0, 100}};
  CK(cudaFuncSetAttribute(hop_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024));
  for (const variant& v : vs) {
    CK(cudaFuncSetAttribute(hop_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, v.carveout));
    if (v.cluster > 1)
      CK(cudaFuncSetAttribute(hop_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    const int n = v.blocks * 128;
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cudaError_t launched = cudaSuccess;
    for (int h = 0; h < kHops && launched == cudaSuccess; ++h) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(v.blocks);
      cfg.blockDim = dim3(128);
      cfg.dynamicSmemBytes = (h & 1) ? static_cast<size_t>(v.odd_smem_kb) * 1024 : 0;
      cfg.stream = s;
      cudaLaunchAttribute attr[2];
      unsigned na = 0;
      if (v.pdl && h > 0) {  // the first node depends on nothing
        attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[na++].val.programmaticStreamSerializationAllowed = 1;
      }
      if (v.cluster > 1) {
        attr[na].id = cudaLaunchAttributeClusterDimension;
        attr[na].val.clusterDim.x = static_cast<unsigned>(v.cluster);
        attr[na].val.clusterDim.y = 1;
        attr[na++].val.clusterDim.z = 1;
      }
      cfg.attrs = attr;
      cfg.numAttrs = na;
      const float* in = (h & 1) ? y : x;
      float* out = (h & 1) ? x : y;
      launched = cudaLaunchKernelEx(&cfg, hop_kernel, in, out, n);
    }
    const cudaError_t ended = cudaStreamEndCapture(s, &g);
    if (launched != cudaSuccess || ended != cudaSuccess) {  // e.g. a cluster size the device refuses
      std::printf("%-8d %-10d %-8s %-12d %-10d %10s (%s)\n", v.blocks, v.cluster, v.pdl ? "yes" : "no", v.odd_smem_kb,
                  v.carveout, "-", cudaGetErrorString(launched != cudaSuccess ? launched : ended));
      (void)cudaGetLastError();
      if (ended == cudaSuccess) CK(cudaGraphDestroy(g));
      continue;
    }
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, g, 0));
    const float us = time_graph_us(exec, s, 20) / kHops;
    std::printf("%-8d %-10d %-8s %-12d %-10d %10.2f\n", v.blocks, v.cluster, v.pdl ? "yes" : "no", v.odd_smem_kb,
                v.carveout, us);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(g));
  }
  CK(cudaFree(x));
  CK(cudaFree(y));
}

// ---- 2. barrier ----------------------------------------------------------------------------------
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Every block of the grid (co-resident) arrives; the last one resets the count and publishes the
// next generation; the others spin on it.
__device__ __forceinline__ void grid_barrier(unsigned* count, unsigned* gen, unsigned& my_gen) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(count, 1u) == gridDim.x - 1) {
      *count = 0;
      __threadfence();
      atomicExch(gen, my_gen + 1);
    } else {
      while (ld_acquire(gen) == my_gen) {
      }
    }
  }
  my_gen += 1;
  __syncthreads();
}

__global__ void barrier_chain_kernel(float* x, float* y, int n, int hops, unsigned* count, unsigned* gen) {
  unsigned my_gen = ld_acquire(gen);  // before any block can arrive
  __syncthreads();
  for (int h = 0; h < hops; ++h) {
    const float* in = (h & 1) ? y : x;
    float* out = (h & 1) ? x : y;
    const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) out[i] = __ldcg(in + (i + 128 * 7) % n) + 1.0f;  // L2: other blocks' writes
    grid_barrier(count, gen, my_gen);
  }
}

void probe_barrier(cudaStream_t s) {
  constexpr int kHops = 256;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float *x, *y;
  unsigned* sync;
  CK(cudaMalloc(&x, 2 * sms * 128 * sizeof(float)));
  CK(cudaMalloc(&y, 2 * sms * 128 * sizeof(float)));
  CK(cudaMalloc(&sync, 2 * sizeof(unsigned)));
  CK(cudaMemset(sync, 0, 2 * sizeof(unsigned)));
  std::printf("\n== barrier: %d hops in one cooperative kernel (128 threads a block)\n", kHops);
  std::printf("%-8s %10s\n", "blocks", "us/hop");
  for (const int blocks : {32, sms, 2 * sms}) {
    int n = blocks * 128, hops = kHops;
    unsigned *count = sync, *gen = sync + 1;
    void* args[] = {&x, &y, &n, &hops, &count, &gen};
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(barrier_chain_kernel), dim3(blocks), dim3(128), args, 0, s));
    CK(cudaEventRecord(a, s));
    constexpr int kReps = 20;
    for (int r = 0; r < kReps; ++r)
      CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(barrier_chain_kernel), dim3(blocks), dim3(128), args, 0,
                                     s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0.0f;
    CK(cudaEventElapsedTime(&ms, a, b));
    std::printf("%-8d %10.2f\n", blocks, 1000.0f * ms / kReps / kHops);
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
  }
  CK(cudaFree(x));
  CK(cudaFree(y));
  CK(cudaFree(sync));
}

// ---- 3. stream -----------------------------------------------------------------------------------
// The bytes a call reads: `chunks` runs of chunk_bytes at base[i] (a multiple of the stage bytes).
struct runs {
  const uint4* base[64];
  int chunks;
  int64_t chunk_bytes;
  __device__ const uint4* at(int64_t off) const {
    return base[off / chunk_bytes] + (off % chunk_bytes) / 16;
  }
};

__device__ __forceinline__ float sum_bf16x8(uint4 v) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    s += f.x + f.y;
  }
  return s;
}

constexpr int kMaxStages = 8;

// Block b takes the stages [total · b / G, total · (b + 1) / G) of stage_bytes each.
__global__ void __launch_bounds__(288, 1) ring_stream_kernel(const runs r, int stages_in_ring, int stage_bytes,
                                                              float* out) {
  extern __shared__ __align__(128) uint4 ring[];
  __shared__ __align__(8) uint64_t full[kMaxStages], empty[kMaxStages];
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int S = stages_in_ring;
  const int64_t total = static_cast<int64_t>(r.chunks) * r.chunk_bytes / stage_bytes;
  const int64_t g0 = total * blockIdx.x / gridDim.x, n = total * (blockIdx.x + 1) / gridDim.x - g0;
  const int stage_chunks = stage_bytes / 16;
  if (threadIdx.x == 0) {
    for (int i = 0; i < S; ++i) {
      cd::mbar_init(&full[i], 1);
      cd::mbar_init(&empty[i], 8);
    }
    cd::fence_mbar_init();
  }
  __syncthreads();
  if (warp == 8) {
    if (lane == 0)
      for (int64_t i = 0; i < n; ++i) {
        const int slot = static_cast<int>(i % S);
        if (i >= S) cd::mbar_wait(&empty[slot], static_cast<uint32_t>((i / S - 1) & 1));
        cd::mbar_arrive_expect_tx(&full[slot], static_cast<uint32_t>(stage_bytes));
        cd::bulk_copy(ring + slot * stage_chunks, r.at((g0 + i) * stage_bytes), static_cast<uint32_t>(stage_bytes),
                      &full[slot]);
      }
    return;
  }
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const int slot = static_cast<int>(i % S);
    cd::mbar_wait(&full[slot], static_cast<uint32_t>((i / S) & 1));
    const uint4* st = ring + slot * stage_chunks;
    for (int c = warp * 32 + lane; c < stage_chunks; c += 256) acc += sum_bf16x8(st[c]);
    __syncwarp();
    if (lane == 0) cd::mbar_arrive(&empty[slot]);
  }
  if (acc == 12345.678f) out[0] = acc;  // keeps the sums
}

// Warp w of the grid takes 16-byte chunks w·32 + lane, + all warps' 32 lanes, …, 8 at a time.
__global__ void __launch_bounds__(256) plain_stream_kernel(const runs r, float* out) {
  const int64_t total = static_cast<int64_t>(r.chunks) * r.chunk_bytes / 16;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  float acc = 0.0f;
  for (int64_t c0 = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c0 < total; c0 += 8 * step) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = c0 + u * step < total ? __ldcs(r.at((c0 + u * step) * 16)) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < 8; ++u) acc += sum_bf16x8(v[u]);
  }
  if (acc == 12345.678f) out[0] = acc;
}

__global__ void copy_kernel(const uint4* a, uint4* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    b[i] = a[i];
}

void probe_stream(cudaStream_t s) {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  size_t free_b = 0, total_b = 0;
  CK(cudaMemGetInfo(&free_b, &total_b));
  const size_t pool_bytes = std::min<size_t>(size_t{24} << 30, free_b / 2) & ~((size_t{2} << 20) - 1);
  char* pool;
  CK(cudaMalloc(&pool, pool_bytes));
  CK(cudaMemset(pool, 0, pool_bytes));
  float* out;
  CK(cudaMalloc(&out, sizeof(float)));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));

  // The copy bandwidth (read + write of 1 GiB, as the benchmarks define it).
  const int64_t copy_n = (int64_t{1} << 30) / 16;
  copy_kernel<<<sms * 8, 256, 0, s>>>(reinterpret_cast<const uint4*>(pool), reinterpret_cast<uint4*>(pool) + copy_n, copy_n);
  CK(cudaEventRecord(a, s));
  for (int r = 0; r < 5; ++r)
    copy_kernel<<<sms * 8, 256, 0, s>>>(reinterpret_cast<const uint4*>(pool), reinterpret_cast<uint4*>(pool) + copy_n, copy_n);
  CK(cudaEventRecord(b, s));
  CK(cudaEventSynchronize(b));
  float ms = 0.0f;
  CK(cudaEventElapsedTime(&ms, a, b));
  const double copy_gbs = 2.0 * (1 << 30) * 5 / (ms * 1e-3) / 1e9;
  std::printf("\n== stream (pool %.1f GB; copy bandwidth %.1f GB/s, read + write of 1 GiB)\n", pool_bytes / 1e9, copy_gbs);
  std::printf("%-6s %-8s %7s %7s %9s %10s %9s %7s\n", "kernel", "layout", "stages", "stageKB", "totalMB", "us", "GB/s",
              "%copy");

  std::mt19937_64 rng(7);
  const int64_t chunk = int64_t{4} << 20;
  const int64_t slots = static_cast<int64_t>(pool_bytes) / chunk;
  int64_t next = 0;  // contiguous calls walk the pool, so no call reads bytes an earlier left in L2
  auto make_runs = [&](int64_t bytes, bool random) {
    runs r{};
    r.chunk_bytes = chunk;
    r.chunks = static_cast<int>(bytes / chunk);
    if (random) {
      for (int i = 0; i < r.chunks; ++i) {  // 2 MB-aligned, anywhere in the pool
        const int64_t off = static_cast<int64_t>(rng() % static_cast<uint64_t>(2 * slots - 2)) * (chunk / 2);
        r.base[i] = reinterpret_cast<const uint4*>(pool + off);
      }
    } else {
      if ((next + r.chunks) > slots) next = 0;
      for (int i = 0; i < r.chunks; ++i) r.base[i] = reinterpret_cast<const uint4*>(pool + (next + i) * chunk);
      next += r.chunks;
    }
    return r;
  };
  // Each configuration: kCalls calls captured in one graph (no PDL: a call's time includes the
  // gap between two kernels), replayed; 30 calls read at least 120 MB, so no call finds its
  // bytes in L2 from the replay before.
  constexpr int kCalls = 30;
  auto graph_us = [&](auto launch_all) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    launch_all();
    CK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t e;
    CK(cudaGraphInstantiate(&e, g, 0));
    const float us = time_graph_us(e, s, 3) / kCalls;
    CK(cudaGraphExecDestroy(e));
    CK(cudaGraphDestroy(g));
    return us;
  };
  auto report = [&](const char* kernel, bool random, int stages, int stage_kb, int64_t bytes, float us) {
    const double gbs = bytes / (us * 1e-6) / 1e9;
    std::printf("%-6s %-8s %7d %7d %9.1f %10.2f %9.1f %6.1f%%\n", kernel, random ? "random" : "contig", stages, stage_kb,
                bytes / 1e6, us, gbs, 100.0 * gbs / copy_gbs);
  };
  for (const int64_t mb : {4, 16, 40}) {
    const int64_t bytes = mb << 20;
    for (const bool random : {false, true}) {
      std::vector<runs> calls;
      for (int c = 0; c < kCalls; ++c) calls.push_back(make_runs(bytes, random));
      // Plain loads: 2 blocks an SM.
      report("plain", random, 0, 0, bytes, graph_us([&] {
               for (const runs& r : calls) plain_stream_kernel<<<2 * sms, 256, 0, s>>>(r, out);
             }));
      for (const int stage_kb : {8, 16, 32}) {
        for (const int stages : {2, 4, 6, 8}) {
          const size_t smem = static_cast<size_t>(stages) * stage_kb * 1024;
          if (smem > 200 * 1024) continue;
          CK(cudaFuncSetAttribute(ring_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
          report("ring", random, stages, stage_kb, bytes, graph_us([&] {
                   for (const runs& r : calls) ring_stream_kernel<<<sms, 288, smem, s>>>(r, stages, stage_kb * 1024, out);
                 }));
        }
      }
    }
  }
  CK(cudaGetLastError());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  CK(cudaFree(out));
  CK(cudaFree(pool));
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs\n\n", prop.name, prop.multiProcessorCount);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  probe_hops(s);
  probe_barrier(s);
  probe_stream(s);
  CK(cudaStreamDestroy(s));
  return 0;
}
