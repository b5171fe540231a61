#include "comm/nccl_collective.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "hyserve/common/error.h"

namespace hyserve::worker {

namespace nccl_detail {

std::string where() {
  // Computed once: errors are raised on the failure path, where MPI may be unusable.
  static const std::string text = [] {
    int rank = -1, initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    if (initialised && !finalised) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) != 0) host[0] = '?';
    return "world rank " + std::to_string(rank) + " on host " + host;
  }();
  return text;
}

}  // namespace nccl_detail

namespace {

[[noreturn]] void throw_cuda(cudaError_t status, const char* stmt, const char* file, int line) {
  throw error(std::string("CUDA call failed: ") + stmt + " → " + cudaGetErrorName(status) + " (" +
              cudaGetErrorString(status) + ") on " + nccl_detail::where() + " at " + file + ":" + std::to_string(line));
}

[[noreturn]] void throw_nccl(ncclResult_t status, ncclComm_t comm, const char* stmt, const char* file, int line) {
  std::string detail = ncclGetErrorString(status);
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  if (last != nullptr && *last != '\0') detail += std::string("; ") + last;
  throw error(std::string("NCCL call failed: ") + stmt + " → " + detail + " on " + nccl_detail::where() + " at " +
              file + ":" + std::to_string(line));
}

}  // namespace

}  // namespace hyserve::worker

// Throw hyserve::error naming the statement, the error, the world rank, the host and file:line.
#define CUDA_CHECK(stmt)                                                                        \
  do {                                                                                          \
    const cudaError_t hyserve_cuda_status_ = (stmt);                                            \
    if (hyserve_cuda_status_ != cudaSuccess)                                                    \
      ::hyserve::worker::throw_cuda(hyserve_cuda_status_, #stmt, __FILE__, __LINE__);           \
  } while (0)

// ncclInProgress is not an error: the communicator is non-blocking and the caller waits for it.
#define NCCL_CHECK(comm, stmt)                                                                  \
  do {                                                                                          \
    const ncclResult_t hyserve_nccl_status_ = (stmt);                                           \
    if (hyserve_nccl_status_ != ncclSuccess && hyserve_nccl_status_ != ncclInProgress)          \
      ::hyserve::worker::throw_nccl(hyserve_nccl_status_, (comm), #stmt, __FILE__, __LINE__);   \
  } while (0)

#define MPI_CHECK(stmt)                                                                         \
  do {                                                                                          \
    const int hyserve_mpi_status_ = (stmt);                                                     \
    if (hyserve_mpi_status_ != MPI_SUCCESS)                                                     \
      throw ::hyserve::error(std::string("MPI call failed: ") + #stmt + " → code " +           \
                             std::to_string(hyserve_mpi_status_) + " on " +                    \
                             ::hyserve::worker::nccl_detail::where() + " at " + __FILE__ + ":" + \
                             std::to_string(__LINE__));                                         \
  } while (0)

namespace hyserve::worker {

namespace nccl_detail {

wait_result wait_stream(void* stream, void* comm, double timeout_s, std::string* comm_error) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(timeout_s));
  auto* s = static_cast<cudaStream_t>(stream);
  auto* c = static_cast<ncclComm_t>(comm);
  auto pause = std::chrono::microseconds(1);
  for (;;) {
    const cudaError_t q = cudaStreamQuery(s);
    if (q == cudaSuccess) return wait_result::kDone;
    if (q != cudaErrorNotReady) throw_cuda(q, "cudaStreamQuery(stream)", __FILE__, __LINE__);
    if (c != nullptr) {
      ncclResult_t async = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(c, &async);
      if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
        if (comm_error != nullptr) {
          const ncclResult_t bad = r != ncclSuccess ? r : async;
          *comm_error = ncclGetErrorString(bad);
          const char* last = ncclGetLastError(c);
          if (last != nullptr && *last != '\0') *comm_error += std::string("; ") + last;
        }
        return wait_result::kCommError;
      }
    }
    if (clock::now() >= deadline) return wait_result::kTimedOut;
    // Spin briefly for short collectives, then back off to at most 1 ms per poll.
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::milliseconds(1)) pause *= 2;
  }
}

namespace {

void CUDART_CB host_sleep(void* arg) {
  const auto* us = static_cast<const int64_t*>(arg);
  std::this_thread::sleep_for(std::chrono::microseconds(*us));
  delete us;
}

}  // namespace

void enqueue_host_sleep(void* stream, double seconds) {
  auto* us = new int64_t(static_cast<int64_t>(seconds * 1e6));
  const cudaError_t rc = cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), host_sleep, us);
  if (rc != cudaSuccess) {
    delete us;
    throw_cuda(rc, "cudaLaunchHostFunc(stream, host_sleep, us)", __FILE__, __LINE__);
  }
}

}  // namespace nccl_detail

namespace {

// One owner per handle. Destructors log to stderr and never throw.
class stream_owner {
 public:
  stream_owner() { CUDA_CHECK(cudaStreamCreate(&s_)); }  // blocking: ordered with the legacy default stream
  ~stream_owner() {
    if (s_ == nullptr) return;
    const cudaError_t rc = cudaStreamDestroy(s_);
    if (rc != cudaSuccess)
      std::fprintf(stderr, "nccl_collective: cudaStreamDestroy failed: %s on %s\n", cudaGetErrorString(rc),
                   nccl_detail::where().c_str());
  }
  stream_owner(const stream_owner&) = delete;
  stream_owner& operator=(const stream_owner&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

class nccl_comm_owner {
 public:
  nccl_comm_owner() = default;
  ~nccl_comm_owner() { abort(); }
  nccl_comm_owner(const nccl_comm_owner&) = delete;
  nccl_comm_owner& operator=(const nccl_comm_owner&) = delete;

  ncclComm_t get() const { return c_; }
  ncclComm_t* out() { return &c_; }
  // Tears the communicator down without waiting for peers: the only safe exit once a wait
  // has failed.
  void abort() noexcept { end(ncclCommAbort, "ncclCommAbort"); }
  // Orderly teardown, once the stream has drained.
  void destroy() noexcept { end(ncclCommDestroy, "ncclCommDestroy"); }

 private:
  // Ends the communicator (if any) through `how`, a failure logged under `name`.
  void end(ncclResult_t (*how)(ncclComm_t), const char* name) noexcept {
    if (c_ == nullptr) return;
    const ncclResult_t rc = how(c_);
    if (rc != ncclSuccess)
      std::fprintf(stderr, "nccl_collective: %s failed: %s on %s\n", name, ncclGetErrorString(rc),
                   nccl_detail::where().c_str());
    c_ = nullptr;
  }

  ncclComm_t c_ = nullptr;
};

// NVLink multicast stays off unless the user asked otherwise (see the header).
void disable_nvls_unless_set() { setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0); }

}  // namespace

struct nccl_collective::state {
  int rank = 0, size = 1, device = 0;
  double timeout_s = kNcclDefaultTimeoutS;
  bool aborted = false;
  stream_owner stream;  // declared before comm: the comm is torn down first
  nccl_comm_owner comm;

  // Waits for a non-blocking NCCL call to settle (the operation is then queued on the stream)
  // and, with stream_too, for the stream to drain; on timeout or an asynchronous error aborts
  // the communicator and throws.
  void wait(const char* op, bool stream_too = true) {
    using nccl_detail::wait_result;
    std::string comm_error;
    wait_result r = wait_comm(comm_error);
    if (r == wait_result::kDone && stream_too)
      r = nccl_detail::wait_stream(stream.get(), comm.get(), timeout_s, &comm_error);
    if (r == wait_result::kDone) return;
    comm.abort();
    aborted = true;
    const std::string why = r == wait_result::kTimedOut
                                ? "timed out after " + std::to_string(timeout_s) + " s"
                                : "failed asynchronously (" + comm_error + ")";
    throw error("NCCL " + std::string(op) + " on tp rank " + std::to_string(rank) + " of " + std::to_string(size) +
                " " + why + " on " + nccl_detail::where() + "; the communicator was aborted");
  }

  // Polls ncclCommGetAsyncError until the communicator leaves ncclInProgress.
  nccl_detail::wait_result wait_comm(std::string& comm_error) {
    using clock = std::chrono::steady_clock;
    const auto deadline =
        clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(timeout_s));
    for (;;) {
      ncclResult_t async = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm.get(), &async);
      if (r == ncclSuccess && async == ncclSuccess) return nccl_detail::wait_result::kDone;
      if (r != ncclSuccess || async != ncclInProgress) {
        comm_error = ncclGetErrorString(r != ncclSuccess ? r : async);
        return nccl_detail::wait_result::kCommError;
      }
      if (clock::now() >= deadline) return nccl_detail::wait_result::kTimedOut;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  void check_usable(const char* op) const {
    if (aborted)
      throw error("NCCL " + std::string(op) + " on " + nccl_detail::where() +
                  ": the communicator was aborted by an earlier failure");
  }
};

nccl_collective::nccl_collective(MPI_Comm comm, double timeout_s, int device) {
  if (!(timeout_s >= 0.0)) throw invalid_argument_error("nccl_collective: timeout_s must be >= 0");
  if (device >= 0) CUDA_CHECK(cudaSetDevice(device));  // before the stream is created on it
  s_ = std::make_unique<state>();
  s_->timeout_s = timeout_s;
  MPI_CHECK(MPI_Comm_rank(comm, &s_->rank));
  MPI_CHECK(MPI_Comm_size(comm, &s_->size));
  CUDA_CHECK(cudaGetDevice(&s_->device));

  ncclUniqueId id{};
  if (s_->rank == 0) NCCL_CHECK(nullptr, ncclGetUniqueId(&id));
  MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm));

  disable_nvls_unless_set();
  // Non-blocking: the init, like every operation after it, is waited for under the deadline.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  NCCL_CHECK(nullptr, ncclCommInitRankConfig(s_->comm.out(), s_->size, id, s_->rank, &config));
  s_->wait("init", /*stream_too=*/false);
}

nccl_collective::~nccl_collective() {
  if (!s_->aborted && s_->comm.get() != nullptr) {
    // Drain under the deadline, then tear down in order; abort when that fails (the peers may
    // be gone). Nothing escapes a destructor.
    try {
      std::string ignored;
      if (nccl_detail::wait_stream(s_->stream.get(), s_->comm.get(), s_->timeout_s, &ignored) ==
          nccl_detail::wait_result::kDone) {
        s_->comm.destroy();
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "nccl_collective: %s\n", e.what());
    }
  }
  s_->comm.abort();  // no-op after destroy()
}

int nccl_collective::rank() const { return s_->rank; }
int nccl_collective::size() const { return s_->size; }
void* nccl_collective::stream() const { return s_->stream.get(); }
void* nccl_collective::nccl_comm() const { return s_->comm.get(); }
bool nccl_collective::aborted() const { return s_->aborted; }

void nccl_collective::set_timeout(double timeout_s) {
  if (!(timeout_s >= 0.0)) throw invalid_argument_error("nccl_collective: timeout_s must be >= 0");
  s_->timeout_s = timeout_s;
}

void nccl_collective::all_reduce_sum(float* data, int64_t n) {
  constexpr const char* op = "all_reduce_sum";
  s_->check_usable(op);
  if (n < 0) throw invalid_argument_error("all_reduce_sum: n must be >= 0");
  CUDA_CHECK(cudaSetDevice(s_->device));
  NCCL_CHECK(s_->comm.get(), ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat, ncclSum, s_->comm.get(),
                                           s_->stream.get()));
  s_->wait(op);
}

void nccl_collective::all_gather(const float* in, float* out, int64_t n_per_rank) {
  constexpr const char* op = "all_gather";
  s_->check_usable(op);
  if (n_per_rank < 0) throw invalid_argument_error("all_gather: n_per_rank must be >= 0");
  CUDA_CHECK(cudaSetDevice(s_->device));
  NCCL_CHECK(s_->comm.get(),
             ncclAllGather(in, out, static_cast<size_t>(n_per_rank), ncclFloat, s_->comm.get(), s_->stream.get()));
  s_->wait(op);
}

void nccl_collective::broadcast(void* data, size_t bytes, int root) {
  constexpr const char* op = "broadcast";
  s_->check_usable(op);
  if (root < 0 || root >= s_->size)
    throw invalid_argument_error("broadcast: root " + std::to_string(root) + " outside the group of " +
                                 std::to_string(s_->size));
  CUDA_CHECK(cudaSetDevice(s_->device));
  NCCL_CHECK(s_->comm.get(),
             ncclBroadcast(data, data, bytes, ncclUint8, root, s_->comm.get(), s_->stream.get()));
  s_->wait(op);
}

std::unique_ptr<collective> make_nccl_collective(MPI_Comm comm, double timeout_s, int device) {
  return std::make_unique<nccl_collective>(comm, timeout_s, device);
}

}  // namespace hyserve::worker
