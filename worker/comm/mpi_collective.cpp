#include "hyserve/worker/mpi_collective.h"

#include <algorithm>
#include <climits>
#include <string>

#include "hyserve/common/error.h"

namespace hyserve::worker {
namespace {

void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  throw error(std::string(what) + " failed on world rank " + std::to_string(rank) + ": " + std::string(msg, static_cast<size_t>(len)));
}

class mpi_collective final : public collective {
 public:
  explicit mpi_collective(MPI_Comm comm) : comm_(comm) {
    mpi_check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    mpi_check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(float* data, int64_t n) override {
    // Counts are int in MPI: large buffers go in pieces.
    for (int64_t at = 0; at < n; at += INT_MAX) {
      const int count = static_cast<int>(std::min<int64_t>(INT_MAX, n - at));
      mpi_check(MPI_Allreduce(MPI_IN_PLACE, data + at, count, MPI_FLOAT, MPI_SUM, comm_), "MPI_Allreduce");
    }
  }
  void all_gather(const float* in, float* out, int64_t n_per_rank) override {
    if (n_per_rank > INT_MAX) throw invalid_argument_error("all_gather: message too large");
    mpi_check(MPI_Allgather(in, static_cast<int>(n_per_rank), MPI_FLOAT, out, static_cast<int>(n_per_rank),
                            MPI_FLOAT, comm_),
              "MPI_Allgather");
  }
  void broadcast(void* data, size_t bytes, int root) override {
    if (bytes > INT_MAX) throw invalid_argument_error("broadcast: message too large");
    mpi_check(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_), "MPI_Bcast");
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<collective> make_mpi_collective(MPI_Comm comm) { return std::make_unique<mpi_collective>(comm); }

}  // namespace hyserve::worker
