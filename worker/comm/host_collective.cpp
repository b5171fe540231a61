#include "hyserve/worker/host_collective.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "hyserve/common/error.h"
#include "hyserve/kernels/device.h"

namespace hyserve::worker {
namespace {

std::string where() {
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return "world rank " + std::to_string(rank) + " on host " + host;
}

class host_staged_collective final : public collective {
 public:
  host_staged_collective(MPI_Comm comm, device_kind device, double timeout_s)
      : comm_(comm), device_(device), timeout_s_(timeout_s) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(float* data, int64_t n) override {
    check_usable("all_reduce_sum");
    if (n <= 0) return;
    if (n > INT_MAX) throw invalid_argument_error("all_reduce_sum: " + std::to_string(n) + " floats (at most INT_MAX)");
    float* buf = stage_in(data, n);
    MPI_Request req;
    MPI_Iallreduce(MPI_IN_PLACE, buf, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm_, &req);
    wait(req, "all_reduce_sum");
    stage_out(data, buf, n);
  }

  void all_gather(const float* in, float* out, int64_t n_per_rank) override {
    check_usable("all_gather");
    if (n_per_rank <= 0) return;
    if (n_per_rank * size_ > INT_MAX) throw invalid_argument_error("all_gather: message too large");
    const float* src = in;
    std::vector<float>& staged_in = scratch_in_;
    if (device_ == device_kind::kCuda) {
      staged_in.resize(static_cast<size_t>(n_per_rank));
      kernels::device_copy_d2h(staged_in.data(), in, static_cast<size_t>(n_per_rank) * sizeof(float));
      src = staged_in.data();
    }
    float* dst = out;
    if (device_ == device_kind::kCuda) {
      scratch_.resize(static_cast<size_t>(n_per_rank * size_));
      dst = scratch_.data();
    }
    MPI_Request req;
    MPI_Iallgather(src, static_cast<int>(n_per_rank), MPI_FLOAT, dst, static_cast<int>(n_per_rank), MPI_FLOAT, comm_,
                   &req);
    wait(req, "all_gather");
    if (device_ == device_kind::kCuda)
      kernels::device_copy_h2d(out, dst, static_cast<size_t>(n_per_rank * size_) * sizeof(float));
  }

  void broadcast(void* data, size_t bytes, int root) override {
    check_usable("broadcast");
    if (bytes == 0) return;
    if (bytes > INT_MAX) throw invalid_argument_error("broadcast: message too large");
    void* buf = data;
    if (device_ == device_kind::kCuda) {
      bytes_.resize(bytes);
      if (rank_ == root) kernels::device_copy_d2h(bytes_.data(), data, bytes);
      buf = bytes_.data();
    }
    MPI_Request req;
    MPI_Ibcast(buf, static_cast<int>(bytes), MPI_BYTE, root, comm_, &req);
    wait(req, "broadcast");
    if (device_ == device_kind::kCuda && rank_ != root) kernels::device_copy_h2d(data, buf, bytes);
  }

 private:
  void check_usable(const char* op) const {
    if (failed_)
      throw error("host collective " + std::string(op) + " on " + where() +
                  ": the collective failed earlier (a timed-out operation); the worker must restart");
  }

  float* stage_in(float* data, int64_t n) {
    if (device_ != device_kind::kCuda) return data;
    scratch_.resize(static_cast<size_t>(n));
    kernels::device_copy_d2h(scratch_.data(), data, static_cast<size_t>(n) * sizeof(float));
    return scratch_.data();
  }
  void stage_out(float* data, const float* buf, int64_t n) {
    if (device_ == device_kind::kCuda) kernels::device_copy_h2d(data, buf, static_cast<size_t>(n) * sizeof(float));
  }

  // Polls the request until it completes or the deadline passes (then the collective is failed).
  void wait(MPI_Request& req, const char* op) {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                      std::chrono::duration<double>(timeout_s_));
    auto pause = std::chrono::microseconds(0);
    while (true) {
      int done = 0;
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (done) return;
      if (std::chrono::steady_clock::now() > deadline) {
        failed_ = true;
        throw error("host collective " + std::string(op) + " on " + where() + " (tp rank " + std::to_string(rank_) +
                    " of " + std::to_string(size_) + ") did not complete within " + std::to_string(timeout_s_) + " s");
      }
      // A non-blocking collective advances only inside MPI_Test: a large message moves in many
      // fragments, each needing a call (sleeping between calls made a 32 MB all-reduce take
      // ~1 s). Poll continuously for the first 200 ms, yielding the core; past that the peer is
      // late (or gone) and polls back off up to 1 ms.
      const auto waited = std::chrono::steady_clock::now() - start;
      if (waited < std::chrono::milliseconds(200)) {
        std::this_thread::yield();
      } else {
        pause = std::min(std::max(pause * 2, std::chrono::microseconds(10)), std::chrono::microseconds(1000));
        std::this_thread::sleep_for(pause);
      }
    }
  }

  MPI_Comm comm_;
  device_kind device_;
  double timeout_s_;
  int rank_ = 0, size_ = 1;
  bool failed_ = false;
  std::vector<float> scratch_, scratch_in_;
  std::vector<unsigned char> bytes_;
};

}  // namespace

std::unique_ptr<collective> make_host_staged_collective(MPI_Comm comm, device_kind device, double timeout_s) {
  if (!(timeout_s > 0)) throw invalid_argument_error("host collective: timeout_s must be > 0");
  return std::make_unique<host_staged_collective>(comm, device, timeout_s);
}

}  // namespace hyserve::worker
