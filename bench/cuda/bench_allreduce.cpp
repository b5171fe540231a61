// All-reduce over the tensor-parallel group: the NCCL collective (worker/comm) against raw
// ncclAllReduce, in the same run, one rank per GPU (rank r on device r).
//
// For each size from 4 KiB to 256 MiB (fp32 sum, in place): a few warm-up calls, then the
// median wall-clock time of kIters calls, each call waited for to completion (the collective:
// all_reduce_sum, which polls its stream under its deadline; raw: ncclAllReduce on a stream of
// its own blocking communicator, then cudaStreamSynchronize). Reported per size: the median
// latency of each, algorithm bandwidth (bytes / time), bus bandwidth as nccl-tests defines it
// (algbw · 2(n−1)/n, 0 on one rank) and the collective's time as a ratio of raw NCCL's.
//
//   mpirun -np N hyserve-bench-allreduce [max_bytes]
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/nccl_collective.h"
#include "cuda/device_buffer.h"
#include "hyserve/common/error.h"
#include "hyserve/kernels/device.h"

namespace {

#define BENCH_CUDA(stmt)                                                                                   \
  do {                                                                                                     \
    const cudaError_t rc_ = (stmt);                                                                        \
    if (rc_ != cudaSuccess) throw hyserve::error(std::string(#stmt) + ": " + cudaGetErrorString(rc_));     \
  } while (0)
#define BENCH_NCCL(stmt)                                                                                   \
  do {                                                                                                     \
    const ncclResult_t rc_ = (stmt);                                                                       \
    if (rc_ != ncclSuccess) throw hyserve::error(std::string(#stmt) + ": " + ncclGetErrorString(rc_));     \
  } while (0)

constexpr int kWarmup = 5;
constexpr int kIters = 20;

template <class Fn>
double median_us(Fn&& fn) {
  for (int i = 0; i < kWarmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < kIters; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  // The slowest rank sets the pace of a collective.
  double med = t[t.size() / 2];
  MPI_Allreduce(MPI_IN_PLACE, &med, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return med;
}

int run(int argc, char** argv) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int devices = hyserve::kernels::cuda_device_count();
  if (devices < world) {
    if (rank == 0) std::fprintf(stderr, "need one CUDA device per rank: %d ranks, %d devices\n", world, devices);
    return devices == 0 ? 0 : 1;
  }
  const size_t max_bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : size_t{256} << 20;

  hyserve::worker::nccl_collective coll(MPI_COMM_WORLD, hyserve::worker::kNcclDefaultTimeoutS, rank);

  // Raw NCCL: a blocking communicator of its own over the same ranks.
  ncclUniqueId id{};
  if (rank == 0) BENCH_NCCL(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t raw = nullptr;
  BENCH_NCCL(ncclCommInitRank(&raw, world, id, rank));
  cudaStream_t stream = nullptr;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  hyserve::kernels::device_array<float> buf(max_bytes / sizeof(float));
  buf.fill_bytes(0);
  if (rank == 0) {
    cudaDeviceProp prop{};
    BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
    std::printf("all-reduce fp32 sum, in place: %d rank(s), %s; median of %d calls each, waited to completion\n",
                world, prop.name, kIters);
    std::printf("%12s %14s %12s %12s %14s %12s %12s %8s\n", "bytes", "collective_us", "algbw_GB/s", "busbw_GB/s",
                "raw_nccl_us", "algbw_GB/s", "busbw_GB/s", "ratio");
  }
  const double bus_factor = world > 1 ? 2.0 * (world - 1) / world : 0.0;
  for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    const auto n = static_cast<int64_t>(bytes / sizeof(float));
    const double coll_us = median_us([&] { coll.all_reduce_sum(buf.data(), n); });
    const double raw_us = median_us([&] {
      BENCH_NCCL(ncclAllReduce(buf.data(), buf.data(), static_cast<size_t>(n), ncclFloat, ncclSum, raw, stream));
      BENCH_CUDA(cudaStreamSynchronize(stream));
    });
    if (rank == 0) {
      const double coll_alg = static_cast<double>(bytes) / coll_us * 1e-3;  // GB/s
      const double raw_alg = static_cast<double>(bytes) / raw_us * 1e-3;
      std::printf("%12zu %14.2f %12.2f %12.2f %14.2f %12.2f %12.2f %8.3f\n", bytes, coll_us, coll_alg,
                  coll_alg * bus_factor, raw_us, raw_alg, raw_alg * bus_factor, coll_us / raw_us);
    }
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));
  BENCH_CUDA(cudaStreamDestroy(stream));
  BENCH_NCCL(ncclCommDestroy(raw));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    rc = run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hyserve-bench-allreduce: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
