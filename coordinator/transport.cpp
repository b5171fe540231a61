#include "coordinator/transport.h"

#include <mpi.h>

#include <chrono>
#include <iterator>
#include <list>
#include <string>
#include <thread>

#include "hyserve/common/error.h"

namespace hyserve::coordinator {
namespace {

class mpi_transport final : public transport {
 public:
  explicit mpi_transport(const topology& t) : topo_(t) {}
  ~mpi_transport() override {
    // Sends a receiver never took (a hung rank at a fatal fault) are left to MPI_Abort; cancel
    // them so that no request outlives its buffer.
    for (pending& p : pending_) {
      MPI_Cancel(&p.request);
      MPI_Request_free(&p.request);
    }
  }
  int num_groups() const override { return topo_.dp; }

  void send_plan(int group, const std::vector<uint8_t>& bytes) override {
    isend(topo_.leader_of(group), static_cast<int>(mpi_tag::kPlan), bytes);
  }

  std::optional<std::pair<int, std::vector<uint8_t>>> poll_result() override {
    progress();
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, static_cast<int>(mpi_tag::kResult), MPI_COMM_WORLD, &flag, &st);
    if (!flag) return std::nullopt;
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    std::vector<uint8_t> bytes(static_cast<size_t>(count));
    // The message is here (probed): this receive completes at once.
    MPI_Recv(bytes.data(), count, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    return std::make_pair((st.MPI_SOURCE - 1) / topo_.tp, std::move(bytes));
  }

  void send_shutdown() override {
    const std::vector<uint8_t> bytes = wire::encode_shutdown();
    for (int g = 0; g < topo_.dp; ++g) isend(topo_.leader_of(g), static_cast<int>(mpi_tag::kShutdown), bytes);
  }

  bool wait_sent(double timeout_s) override {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (true) {
      progress();
      if (pending_.empty()) return true;
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

 private:
  struct pending {
    MPI_Request request = MPI_REQUEST_NULL;
    std::vector<uint8_t> bytes;  // kept alive until the send completes
  };

  void isend(int rank, int tag, const std::vector<uint8_t>& bytes) {
    pending p;
    p.bytes = bytes;
    // The buffer of a std::vector does not move when the vector does (list nodes stay put too).
    pending_.push_back(std::move(p));
    pending& q = pending_.back();
    MPI_Isend(q.bytes.data(), static_cast<int>(q.bytes.size()), MPI_BYTE, rank, tag, MPI_COMM_WORLD, &q.request);
    progress();
  }

  // Completes the sends whose receiver has taken them (never waits).
  void progress() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      int done = 0;
      MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
      it = done ? pending_.erase(it) : std::next(it);
    }
  }

  topology topo_;
  std::list<pending> pending_;
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
