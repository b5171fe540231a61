#pragma once
// How the scheduler reaches the data-parallel groups: send a step plan to a group's leader and
// poll for results. The MPI implementation is the service's; the scheduler does not know MPI.
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "hyserve/common/topology.h"
#include "hyserve/common/wire.h"

namespace hyserve::coordinator {

class transport {
 public:
  virtual ~transport() = default;
  virtual int num_groups() const = 0;
  virtual void send_plan(int group, const std::vector<uint8_t>& bytes) = 0;
  // A result from any group, if one has arrived (never blocks).
  virtual std::optional<std::pair<int, std::vector<uint8_t>>> poll_result() = 0;
  virtual void send_shutdown() = 0;
};

// Over MPI_COMM_WORLD; call only from the thread that owns MPI.
std::unique_ptr<transport> make_mpi_transport(const topology& topo);

// Waits for every group leader's hello (start-up), up to timeout_s. Throws error naming the
// groups that did not report.
std::vector<wire::hello> gather_hellos(const topology& topo, double timeout_s);

}  // namespace hyserve::coordinator
