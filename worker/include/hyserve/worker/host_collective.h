#pragma once
// The tensor-parallel collective of `parallel.device_collective: host`: buffers on the model's
// device (CUDA) are copied to the host, combined with non-blocking MPI over the tensor-parallel
// communicator, and the result is copied back. Slower than NCCL, but several ranks may share one
// device (NCCL refuses two ranks on the same GPU), so the sharded CUDA path runs on one GPU.
//
// Copies are the synchronous device copies of the legacy default stream (kernels/device.h),
// which order with the eager ops the model launches there. Every MPI wait polls with a deadline
// (timeout_s, the worker's step timeout): when it passes, the collective is marked failed and
// hyserve::error names the world rank, the host and the operation; every later call throws
// (the worker exits instead of reusing a communicator left mid-operation). On the CPU the
// buffers are host memory and nothing is copied.
#include <memory>

#include <mpi.h>

#include "hyserve/common/device_kind.h"
#include "hyserve/worker/collective.h"

namespace hyserve::worker {

// The communicator is borrowed: the caller keeps it alive after the collective.
std::unique_ptr<collective> make_host_staged_collective(MPI_Comm comm, device_kind device, double timeout_s);

}  // namespace hyserve::worker
