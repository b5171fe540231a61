#include "coordinator/transport.h"

#include <mpi.h>

#include <chrono>
#include <deque>
#include <string>
#include <thread>

#include "hyserve/common/error.h"

namespace hyserve::coordinator {
namespace {

class mpi_transport final : public transport {
 public:
  explicit mpi_transport(const topology& t) : topo_(t) {}
  int num_groups() const override { return topo_.dp; }

  // Non-blocking: a plan larger than MPI's eager limit would otherwise hold the scheduler thread
  // until the worker posts its receive (while it prepares or waits for its step). The bytes
  // stay alive until the send completes; sends to one rank keep their order.
  void send_plan(int group, const std::vector<uint8_t>& bytes) override {
    pending& p = sends_.emplace_back();
    p.bytes = bytes;
    MPI_Isend(p.bytes.data(), static_cast<int>(p.bytes.size()), MPI_BYTE, topo_.leader_of(group),
              static_cast<int>(mpi_tag::kPlan), MPI_COMM_WORLD, &p.request);
    reap();
  }

  std::optional<std::pair<int, std::vector<uint8_t>>> poll_result() override {
    reap();
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, static_cast<int>(mpi_tag::kResult), MPI_COMM_WORLD, &flag, &st);
    if (!flag) return std::nullopt;
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    std::vector<uint8_t> bytes(static_cast<size_t>(count));
    MPI_Recv(bytes.data(), count, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    return std::make_pair((st.MPI_SOURCE - 1) / topo_.tp, std::move(bytes));
  }

  void send_shutdown() override {
    // The plans still on their way first (a worker that is gone would keep them forever: the
    // wait is bounded, then they are dropped).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!sends_.empty() && std::chrono::steady_clock::now() < until) {
      reap();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const std::vector<uint8_t> bytes = wire::encode_shutdown();
    for (int g = 0; g < topo_.dp; ++g)
      MPI_Send(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, topo_.leader_of(g),
               static_cast<int>(mpi_tag::kShutdown), MPI_COMM_WORLD);
  }

 private:
  struct pending {
    std::vector<uint8_t> bytes;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  // Frees the sends that have completed, oldest first (a deque keeps the others' buffers put).
  void reap() {
    while (!sends_.empty()) {
      int done = 0;
      MPI_Test(&sends_.front().request, &done, MPI_STATUS_IGNORE);
      if (!done) return;
      sends_.pop_front();
    }
  }

  topology topo_;
  std::deque<pending> sends_;
};

}  // namespace

std::unique_ptr<transport> make_mpi_transport(const topology& topo) { return std::make_unique<mpi_transport>(topo); }

std::vector<wire::hello> gather_hellos(const topology& topo, double timeout_s) {
  std::vector<wire::hello> hellos(static_cast<size_t>(topo.dp));
  std::vector<bool> got(static_cast<size_t>(topo.dp), false);
  int remaining = topo.dp;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (remaining > 0) {
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, static_cast<int>(mpi_tag::kHello), MPI_COMM_WORLD, &flag, &st);
    if (flag) {
      int count = 0;
      MPI_Get_count(&st, MPI_BYTE, &count);
      std::vector<uint8_t> bytes(static_cast<size_t>(count));
      MPI_Recv(bytes.data(), count, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      const int g = (st.MPI_SOURCE - 1) / topo.tp;
      hellos[static_cast<size_t>(g)] = wire::decode_hello(bytes);
      if (!got[static_cast<size_t>(g)]) --remaining;
      got[static_cast<size_t>(g)] = true;
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::string missing;
      for (int g = 0; g < topo.dp; ++g)
        if (!got[static_cast<size_t>(g)]) missing += " " + std::to_string(g) + " (rank " + std::to_string(topo.leader_of(g)) + ")";
      throw error("data-parallel groups did not report within " + std::to_string(timeout_s) + " s:" + missing);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return hellos;
}

}  // namespace hyserve::coordinator
