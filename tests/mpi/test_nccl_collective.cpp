// The NCCL collective under real mpirun, one GPU per rank (rank r on device r): all-reduce,
// all-gather and broadcast on device buffers of 4 KiB .. 64 MiB against exact expected values
// (small multiples of 0.25, so every fp32 sum is exact), and the deadline path: a stream held
// by a sleeping host function makes the wait time out, abort the communicator and name the
// rank, the host and the operation. Skips when the ranks outnumber the visible GPUs (two ranks
// cannot share one GPU through NCCL).
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "comm/nccl_collective.h"
#include "cuda/device_buffer.h"
#include "hyserve/common/error.h"
#include "hyserve/kernels/device.h"

namespace hyserve {
namespace {

using kernels::device_array;
using worker::nccl_collective;

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

// Why this run cannot test NCCL, or empty. Every rank sees the same device count, so every rank
// skips alike.
std::string skip_reason() {
  const int devices = kernels::cuda_device_count();
  if (devices == 0) return "no CUDA device";
  if (devices < world_size())
    return std::to_string(world_size()) + " ranks but " + std::to_string(devices) + " CUDA device(s)";
  return {};
}

#define HYSERVE_SKIP_WITHOUT_GPUS()                          \
  do {                                                       \
    const std::string why_ = skip_reason();                  \
    if (!why_.empty()) GTEST_SKIP() << why_;                 \
  } while (0)

constexpr double kTimeoutS = 60.0;

// Element counts of 4 KiB .. 64 MiB of floats, plus a tail size that is no power of two.
std::vector<int64_t> sizes() { return {1024, 1024 + 1, 16 * 1024, 256 * 1024, 4 * 1024 * 1024, 16 * 1024 * 1024}; }

float pattern(int64_t i) { return static_cast<float>(i % 1000) * 0.25f; }

// One communicator for the tests that expect success (init costs about a second).
class NcclCollective : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!skip_reason().empty()) return;
    comm_ = std::make_unique<nccl_collective>(MPI_COMM_WORLD, kTimeoutS, world_rank());
  }
  static void TearDownTestSuite() { comm_.reset(); }
  static std::unique_ptr<nccl_collective> comm_;
};

std::unique_ptr<nccl_collective> NcclCollective::comm_;

TEST_F(NcclCollective, RankAndSizeMatchTheMpiCommunicator) {
  HYSERVE_SKIP_WITHOUT_GPUS();
  EXPECT_EQ(comm_->rank(), world_rank());
  EXPECT_EQ(comm_->size(), world_size());
  // NVLink multicast stays off unless the user chose otherwise before start.
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  ASSERT_NE(nvls, nullptr);
}

TEST_F(NcclCollective, AllReduceSumOverSizes) {
  HYSERVE_SKIP_WITHOUT_GPUS();
  const int r = world_rank(), w = world_size();
  for (int64_t n : sizes()) {
    std::vector<float> host(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) host[static_cast<size_t>(i)] = static_cast<float>(r + 1) * pattern(i);
    device_array<float> d(host);
    comm_->all_reduce_sum(d.data(), n);
    const std::vector<float> got = d.download();
    const float ranks_sum = static_cast<float>(w * (w + 1) / 2);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; ++i) {
      if (got[static_cast<size_t>(i)] != ranks_sum * pattern(i)) {
        if (first < 0) first = i;
        ++bad;
      }
    }
    EXPECT_EQ(bad, 0) << "n = " << n << " floats on rank " << r << "; first bad element " << first;
  }
  comm_->all_reduce_sum(nullptr, 0);  // an empty reduction is a no-op
}

TEST_F(NcclCollective, AllGatherOverSizes) {
  HYSERVE_SKIP_WITHOUT_GPUS();
  const int r = world_rank(), w = world_size();
  for (int64_t n : sizes()) {
    if (n * w > 16 * 1024 * 1024) continue;  // the gathered buffer stays at 64 MiB
    std::vector<float> host(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) host[static_cast<size_t>(i)] = static_cast<float>(r) * 1000.0f + pattern(i);
    device_array<float> in(host);
    device_array<float> out(static_cast<size_t>(n * w));
    out.fill_bytes(0xff);
    comm_->all_gather(in.data(), out.data(), n);
    // In place: this rank's part already sits at its offset of the output.
    device_array<float> inplace(static_cast<size_t>(n * w));
    inplace.fill_bytes(0xff);
    std::vector<float> full(static_cast<size_t>(n * w), -1.0f);
    std::copy(host.begin(), host.end(), full.begin() + static_cast<ptrdiff_t>(r * n));
    inplace.upload(full);
    comm_->all_gather(inplace.data() + r * n, inplace.data(), n);
    for (const auto* buf : {&out, &inplace}) {
      const std::vector<float> got = buf->download();
      int64_t bad = 0;
      for (int64_t src = 0; src < w; ++src)
        for (int64_t i = 0; i < n; ++i)
          if (got[static_cast<size_t>(src * n + i)] != static_cast<float>(src) * 1000.0f + pattern(i)) ++bad;
      EXPECT_EQ(bad, 0) << "n_per_rank = " << n << (buf == &out ? " (out of place)" : " (in place)") << " on rank "
                        << r;
    }
  }
}

TEST_F(NcclCollective, BroadcastOverSizesAndRoots) {
  HYSERVE_SKIP_WITHOUT_GPUS();
  const int r = world_rank(), w = world_size();
  for (int root : {0, w - 1}) {
    for (int64_t n : sizes()) {
      const auto bytes = static_cast<size_t>(n) * sizeof(float) + 3;  // byte counts need not be whole floats
      std::vector<uint8_t> want(bytes);
      for (size_t i = 0; i < bytes; ++i) want[i] = static_cast<uint8_t>((i * 7 + static_cast<size_t>(root)) & 0xff);
      device_array<uint8_t> d(bytes);
      if (r == root) {
        d.upload(want);
      } else {
        d.fill_bytes(0);
      }
      comm_->broadcast(d.data(), bytes, root);
      EXPECT_EQ(d.download(), want) << bytes << " bytes from root " << root << " on rank " << r;
    }
  }
}

TEST_F(NcclCollective, BroadcastRootOutsideTheGroupIsAnError) {
  HYSERVE_SKIP_WITHOUT_GPUS();
  device_array<uint8_t> d(16);
  EXPECT_THROW(comm_->broadcast(d.data(), 16, world_size()), invalid_argument_error);
  EXPECT_THROW(comm_->broadcast(d.data(), 16, -1), invalid_argument_error);
}

// The polling helper alone: a stream held by a host function that sleeps past the deadline
// reports kTimedOut near the deadline, not when the sleep ends; with a longer deadline, kDone.
TEST(NcclDeadline, WaitStreamTimesOutOnABlockedStream) {
  HYSERVE_SKIP_WITHOUT_GPUS();
  nccl_collective comm(MPI_COMM_WORLD, kTimeoutS, world_rank());
  using clock = std::chrono::steady_clock;
  worker::nccl_detail::enqueue_host_sleep(comm.stream(), 2.0);
  const auto t0 = clock::now();
  const auto r = worker::nccl_detail::wait_stream(comm.stream(), comm.nccl_comm(), 0.25);
  const double waited = std::chrono::duration<double>(clock::now() - t0).count();
  EXPECT_EQ(r, worker::nccl_detail::wait_result::kTimedOut);
  EXPECT_GE(waited, 0.25);
  EXPECT_LT(waited, 1.5) << "the wait must end at its deadline, not when the stream drains";
  EXPECT_EQ(worker::nccl_detail::wait_stream(comm.stream(), comm.nccl_comm(), 30.0),
            worker::nccl_detail::wait_result::kDone);
  EXPECT_FALSE(comm.aborted());
}

// The whole path: an operation queued behind the sleeping host function misses its deadline;
// the communicator is aborted and the error names the rank, the host and the operation. Later
// calls fail at once.
TEST(NcclDeadline, TimeoutAbortsTheCommunicatorAndNamesRankHostAndOperation) {
  HYSERVE_SKIP_WITHOUT_GPUS();
  const int r = world_rank();
  nccl_collective comm(MPI_COMM_WORLD, kTimeoutS, r);  // the init gets the long deadline
  comm.set_timeout(0.3);
  device_array<float> d(1024);
  d.fill_bytes(0);
  worker::nccl_detail::enqueue_host_sleep(comm.stream(), 2.0);
  std::string message;
  try {
    comm.all_reduce_sum(d.data(), 1024);
    ADD_FAILURE() << "expected the all-reduce to time out";
  } catch (const error& e) {
    message = e.what();
  }
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  EXPECT_NE(message.find("all_reduce_sum"), std::string::npos) << message;
  EXPECT_NE(message.find("timed out"), std::string::npos) << message;
  EXPECT_NE(message.find("world rank " + std::to_string(r)), std::string::npos) << message;
  EXPECT_NE(message.find(host), std::string::npos) << message;
  EXPECT_TRUE(comm.aborted());
  EXPECT_EQ(comm.nccl_comm(), nullptr);
  EXPECT_THROW(comm.all_gather(d.data(), d.data(), 1), error);
}

}  // namespace
}  // namespace hyserve

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {  // one rank reports; every rank still runs and asserts
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS();
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return failed;
}
