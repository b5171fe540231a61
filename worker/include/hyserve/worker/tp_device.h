#pragma once
// Where a worker rank runs and how its tensor-parallel reductions travel (docs/ARCHITECTURE.md,
// Processes and the wire): the service's workers and the single-group tools (hyserve-bench-model
// under mpirun) place themselves the same way.
//
// device: cuda — worker w (its rank among the workers: dp_rank · tp + tp_rank) uses CUDA device
// w % cuda_device_count(), and caches sized from 1 / (ranks on that device) of the free memory.
// The model's reductions run on device memory through NCCL over the tensor-parallel communicator,
// which cannot put two ranks of one group on one device; with parallel.device_collective: host
// they are copied to the host and reduced with MPI instead, so several ranks may share a device.
// device: cpu — the MPI collective over the same communicator.
#include <memory>

#include <mpi.h>

#include "hyserve/common/config.h"
#include "hyserve/worker/collective.h"

namespace hyserve::worker {

struct device_placement {
  int ordinal = 0;           // CUDA device (0 on the CPU)
  int ranks_per_device = 1;  // workers on that device (each sizes its caches from its share)
};

// Worker `self` of `workers` in groups of `tp` ranks. config_error when NCCL would need two
// ranks of a group on one device.
device_placement place_worker(const service_config& cfg, int self, int workers, int tp);

// The collective the model's reductions use for a group of tp ranks over tp_comm (borrowed:
// the caller keeps it alive): nullptr when tp == 1 (the model needs none); MPI on the CPU; NCCL
// or the host-staged collective on CUDA (parallel.device_collective), every wait bounded by
// worker.step_timeout_s; under determinism: batch_invariant with tp > 2 wrapped in the
// rank-ordered all-reduce (collective.h). config_error when the build lacks what the config asks for.
std::unique_ptr<collective> make_model_collective(const service_config& cfg, MPI_Comm tp_comm, int tp, int ordinal);

}  // namespace hyserve::worker
