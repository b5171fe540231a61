#pragma once
// Collective operations over the tensor-parallel group of one DP group (docs/ARCHITECTURE.md, Processes and the wire). The
// model calls these; implementations: local (tp = 1), MPI (CPU), NCCL (CUDA).
#include <cstddef>
#include <cstdint>
#include <memory>

namespace hyserve::worker {

class collective {
 public:
  virtual ~collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In-place sum over ranks of n floats.
  virtual void all_reduce_sum(float* data, int64_t n) = 0;
  // out[r·n_per_rank .. (r+1)·n_per_rank) = in of rank r.
  virtual void all_gather(const float* in, float* out, int64_t n_per_rank) = 0;
  // Copies `bytes` bytes from root's buffer to every rank's buffer.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
};

// The single-rank group: every operation is the identity.
std::unique_ptr<collective> make_local_collective();

}  // namespace hyserve::worker
