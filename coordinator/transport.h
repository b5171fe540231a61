#pragma once
// How the scheduler reaches the data-parallel groups: send a step plan to a group's leader and
// poll for results. The MPI implementation is the service's; the scheduler does not know MPI.
#include <cstdint>
#include <memory>
#include <string>
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
  // Never blocks: the message is on its way (a group that stops reading shows as a step that
  // is not answered, which the scheduler's step timeout catches).
  virtual void send_plan(int group, const std::vector<uint8_t>& bytes) = 0;
  // A result from any group, if one has arrived (never blocks).
  virtual std::optional<std::pair<int, std::vector<uint8_t>>> poll_result() = 0;
  // Never blocks; wait_sent() bounds the wait for it.
  virtual void send_shutdown() = 0;
  // Waits up to timeout_s for every message sent so far to be taken by its receiver. False
  // when one was not (a hung or lost rank): the caller then ends the job instead of waiting.
  virtual bool wait_sent(double /*timeout_s*/) { return true; }
};

// Over MPI_COMM_WORLD with non-blocking sends; call only from the thread that owns MPI.
std::unique_ptr<transport> make_mpi_transport(const topology& topo);

// Waits for every group leader's hello (start-up), up to timeout_s. Throws error naming the
// groups that did not report.
std::vector<wire::hello> gather_hellos(const topology& topo, double timeout_s);

}  // namespace hyserve::coordinator
