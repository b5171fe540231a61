// The host-staged collective (parallel.device_collective: host) under real mpirun: all-reduce,
// all-gather and broadcast against exact expected values (small multiples of 0.25, so every
// fp32 sum is exact) on host buffers (the CPU path) and, with a CUDA device, on device buffers of
// ranks that all share device 0 (what NCCL refuses); and the deadline: a rank that never joins
// makes the others' wait time out naming the operation, and the collective refuses later calls.
// Also the rank-ordered all-reduce of determinism: batch_invariant (collective.h) over it.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "hyserve/common/error.h"
#include "hyserve/common/tensor.h"
#include "hyserve/kernels/device.h"
#include "hyserve/worker/collective.h"
#include "hyserve/worker/host_collective.h"

namespace hyserve {
namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// Rank r's value at element i: (r + 1) · 0.25 + (i % 7) · 0.5 (exact in fp32, and so are sums).
float value(int r, int64_t i) { return static_cast<float>(r + 1) * 0.25f + static_cast<float>(i % 7) * 0.5f; }

// comm's all_reduce_sum of `mine` in a buffer on `device`, read back.
std::vector<float> all_reduced(worker::collective& comm, const std::vector<float>& mine, device_kind device) {
  const auto n = static_cast<int64_t>(mine.size());
  tensor buf = tensor::from_host(mine.data(), dtype::kF32, n, device);
  comm.all_reduce_sum(buf.as<float>(), n);
  std::vector<float> got(mine.size());
  buf.copy_to_host(got.data(), got.size() * sizeof(float));
  return got;
}

// Runs the three operations on n floats, in buffers on `device`, and checks every element.
void check_operations(device_kind device, int64_t n) {
  const int rank = world_rank(), size = world_size();
  auto comm = worker::make_host_staged_collective(MPI_COMM_WORLD, device, 30.0);
  ASSERT_EQ(comm->rank(), rank);
  ASSERT_EQ(comm->size(), size);
  std::vector<float> mine(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) mine[static_cast<size_t>(i)] = value(rank, i);

  const std::vector<float> got = all_reduced(*comm, mine, device);
  for (int64_t i = 0; i < n; ++i) {
    float want = 0;
    for (int r = 0; r < size; ++r) want += value(r, i);
    ASSERT_EQ(got[static_cast<size_t>(i)], want) << "all_reduce_sum element " << i;
  }

  const tensor in = tensor::from_host(mine.data(), dtype::kF32, n, device);
  tensor out = tensor::f32({n * size}, device);
  comm->all_gather(in.as<float>(), out.as<float>(), n);
  std::vector<float> gathered(static_cast<size_t>(n * size));
  out.copy_to_host(gathered.data(), gathered.size() * sizeof(float));
  for (int r = 0; r < size; ++r)
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(gathered[static_cast<size_t>(r * n + i)], value(r, i)) << "all_gather rank " << r << " element " << i;

  const int root = size - 1;
  tensor b = tensor::from_host(mine.data(), dtype::kF32, n, device);
  comm->broadcast(b.data(), static_cast<size_t>(n) * sizeof(float), root);
  std::vector<float> cast(static_cast<size_t>(n));
  b.copy_to_host(cast.data(), cast.size() * sizeof(float));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(cast[static_cast<size_t>(i)], value(root, i)) << "broadcast element " << i;
}

TEST(HostCollective, HostBuffersExactValues) {
  for (int64_t n : {1, 1000, 1 << 20}) check_operations(device_kind::kCpu, n);
}

TEST(HostCollective, DeviceBuffersOfRanksSharingOneGpu) {
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  (void)kernels::open_device(device_kind::kCuda, 0);  // every rank on device 0
  for (int64_t n : {1, 4096 + 3, 1 << 22}) check_operations(device_kind::kCuda, n);
}

// A rank's value at element i whose sums depend on their order (not exact in fp32).
float rough_value(int r, int64_t i) {
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ static_cast<uint32_t>(r + 1) * 40503u;
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  return (static_cast<float>(h % 2000001u) - 1000000.0f) * 1.37e-3f * static_cast<float>(1 + (h % 7));
}

// determinism: batch_invariant above 2 ranks (collective.h): every element is ((x0 + x1) + x2)
// + ..., in rank order, whatever the message's size and the element's place in it.
void check_rank_ordered(device_kind device) {
  const int size = world_size(), rank = world_rank();
  auto comm = worker::make_rank_ordered_collective(worker::make_host_staged_collective(MPI_COMM_WORLD, device, 30.0),
                                                   device);
  for (int64_t n : {int64_t{1}, int64_t{4096} + 3, int64_t{1} << 20}) {
    std::vector<float> mine(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) mine[static_cast<size_t>(i)] = rough_value(rank, i);
    const std::vector<float> got = all_reduced(*comm, mine, device);
    for (int64_t i = 0; i < n; ++i) {
      float want = rough_value(0, i);
      for (int r = 1; r < size; ++r) want += rough_value(r, i);
      ASSERT_EQ(got[static_cast<size_t>(i)], want) << "n " << n << " element " << i;
    }
  }
}

TEST(RankOrderedCollective, EveryElementSumsInRankOrderOnHostBuffers) { check_rank_ordered(device_kind::kCpu); }

TEST(RankOrderedCollective, EveryElementSumsInRankOrderOnDeviceBuffers) {
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  (void)kernels::open_device(device_kind::kCuda, 0);  // every rank on device 0
  check_rank_ordered(device_kind::kCuda);
}

TEST(HostCollective, AMissingRankTimesOutNamingTheOperation) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks";
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  auto c = worker::make_host_staged_collective(comm, device_kind::kCpu, 0.5);
  // The timed-out all-reduce stays posted on the other ranks until rank 0 joins below, and MPI
  // completes it during a later call (after this test returns): its buffer must outlive the test.
  static float x;
  x = 1.0f;
  if (world_rank() != 0) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c->all_reduce_sum(&x, 1);
      ADD_FAILURE() << "rank 0 never joins: the all-reduce must time out";
    } catch (const error& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_NE(std::string(e.what()).find("all_reduce_sum"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("did not complete within"), std::string::npos) << e.what();
      EXPECT_GE(s, 0.5);
      EXPECT_LT(s, 5.0);
    }
    try {
      c->broadcast(&x, sizeof x, 0);
      ADD_FAILURE() << "a failed collective must refuse later calls";
    } catch (const error& e) {
      EXPECT_NE(std::string(e.what()).find("failed earlier"), std::string::npos) << e.what();
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // Rank 0 joins late (non-blocking, as a non-blocking collective never matches a blocking
  // one), so the abandoned operation completes and MPI finalises cleanly.
  if (world_rank() == 0) {
    MPI_Request req;
    MPI_Iallreduce(MPI_IN_PLACE, &x, 1, MPI_FLOAT, MPI_SUM, comm, &req);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
  }
}

}  // namespace
}  // namespace hyserve

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (hyserve::world_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
