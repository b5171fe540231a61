#pragma once
// Collective operations over the tensor-parallel group of one DP group (docs/ARCHITECTURE.md, Processes and the wire). The
// model calls these; implementations: local (tp = 1), MPI (CPU), NCCL (CUDA).
#include <cstddef>
#include <cstdint>
#include <memory>

#include "hyserve/common/device_kind.h"

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

// determinism: batch_invariant at more than 2 ranks: all_reduce_sum gathers every rank's n
// floats (inner's all_gather, [size · n] scratch on `device`) and sums each element in rank
// order, ((x0 + x1) + x2) + ..., with the row_add op on that device. NCCL and MPI cut an
// all-reduce by the message's size (ring chunks, algorithm thresholds), so there an element's
// order of addition follows where it falls in the message, i.e. the batch; at 2 ranks it is
// one commutative add either way. Costs size / 2(size - 1) times the bytes of a ring
// all-reduce per rank. all_gather and broadcast are inner's.
std::unique_ptr<collective> make_rank_ordered_collective(std::unique_ptr<collective> inner, device_kind device);

}  // namespace hyserve::worker
