#pragma once
// Collective over NCCL on device pointers: the tensor-parallel group on the CUDA backend
// (docs/ARCHITECTURE.md, Processes and the wire). Free of CUDA and NCCL headers: streams and communicators cross this header as
// void* (a cudaStream_t, an ncclComm_t).
//
// Construction is collective over the MPI communicator (the tp group): rank 0 creates the NCCL
// unique id and broadcasts it over MPI, then every rank joins with ncclCommInitRank on the
// current CUDA device. Each operation is queued on the collective's own stream and waited for
// under a deadline: the wait polls cudaStreamQuery and ncclCommGetAsyncError, and on timeout or
// an asynchronous NCCL error the communicator is aborted (ncclCommAbort) and hyserve::error is
// thrown naming the world rank, the host and the operation. An aborted collective throws on
// every later call; it must be rebuilt (the worker exits instead).
//
// Ordering: the collective's stream is a blocking stream, so each operation starts after the
// work queued earlier on the legacy default stream (where run_cuda(p, nullptr) launches), and
// returns once its result is in place. Work on other streams must be synchronised by the caller
// first, or queued on stream().
//
// NVLink multicast (NVLS) stays off: before the communicator is created, NCCL_NVLS_ENABLE=0 is
// put in the process environment unless the user has set NCCL_NVLS_ENABLE already. Multicast
// objects on a shared host can take its GPUs out of service; nothing here needs them.
#include <mpi.h>

#include <memory>
#include <string>

#include "hyserve/worker/collective.h"

namespace hyserve::worker {

// Default deadline of one wait (init or one operation), in seconds.
inline constexpr double kNcclDefaultTimeoutS = 300.0;

class nccl_collective final : public collective {
 public:
  // Collective over comm (borrowed: the caller keeps it alive) on CUDA device `device`, made
  // current on the calling thread (-1: the device already current). timeout_s >= 0 bounds
  // every wait, the init included.
  explicit nccl_collective(MPI_Comm comm, double timeout_s = kNcclDefaultTimeoutS, int device = -1);
  ~nccl_collective() override;
  nccl_collective(const nccl_collective&) = delete;
  nccl_collective& operator=(const nccl_collective&) = delete;

  int rank() const override;
  int size() const override;
  // All pointers are device pointers on this collective's device.
  void all_reduce_sum(float* data, int64_t n) override;
  void all_gather(const float* in, float* out, int64_t n_per_rank) override;
  void broadcast(void* data, size_t bytes, int root) override;

  // Deadline of every later wait, in seconds (>= 0).
  void set_timeout(double timeout_s);

  // The dedicated stream (a cudaStream_t) the operations run on.
  void* stream() const;
  // The communicator (an ncclComm_t); null once aborted.
  void* nccl_comm() const;
  bool aborted() const;

 private:
  struct state;
  std::unique_ptr<state> s_;
};

// Factory behind the collective interface; see nccl_collective.
std::unique_ptr<collective> make_nccl_collective(MPI_Comm comm, double timeout_s = kNcclDefaultTimeoutS,
                                                 int device = -1);

namespace nccl_detail {

enum class wait_result { kDone, kTimedOut, kCommError };

// Polls until every operation queued on `stream` (a cudaStream_t) has finished (kDone), the
// communicator `comm` (an ncclComm_t; null = none) reports an asynchronous error (kCommError,
// its message in *comm_error when given), or timeout_s seconds pass (kTimedOut). A CUDA error
// reported by the stream throws hyserve::error. Never aborts anything itself.
wait_result wait_stream(void* stream, void* comm, double timeout_s, std::string* comm_error = nullptr);

// Test support: queues on `stream` a host function that sleeps `seconds`, so that every later
// operation on the stream waits behind it.
void enqueue_host_sleep(void* stream, double seconds);

// "world rank R on host H": how errors name the process.
std::string where();

}  // namespace nccl_detail

}  // namespace hyserve::worker
