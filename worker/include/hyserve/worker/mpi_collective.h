#pragma once
// Collective over an MPI communicator (the tensor-parallel group on the CPU backend).
#include <memory>

#include <mpi.h>

#include "hyserve/worker/collective.h"

namespace hyserve::worker {

// The communicator is borrowed: the caller keeps it alive (and frees it) after the collective.
std::unique_ptr<collective> make_mpi_collective(MPI_Comm comm);

}  // namespace hyserve::worker
