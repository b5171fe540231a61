#pragma once
// Process layout of one job (docs/ARCHITECTURE.md, Processes and the wire): world rank 0 is the coordinator, ranks 1..W the
// workers (W = dp · tp); worker w has dp_rank = (w-1) / tp and tp_rank = (w-1) % tp.
#include <cstdint>
#include <string>

namespace hyserve {

// MPI tags of the control plane.
enum class mpi_tag : int { kHello = 1, kPlan = 2, kResult = 3, kShutdown = 4 };

struct topology {
  int world_rank = 0;
  int world_size = 1;
  int dp = 1, tp = 1;
  bool is_coordinator() const { return world_rank == 0; }
  int dp_rank() const { return (world_rank - 1) / tp; }
  int tp_rank() const { return (world_rank - 1) % tp; }
  bool is_leader() const { return !is_coordinator() && tp_rank() == 0; }
  int leader_of(int dp_group) const { return 1 + dp_group * tp; }
  int expected_world_size() const { return 1 + dp * tp; }
  // Empty when the world matches the configuration, else the message every rank prints.
  std::string mismatch() const {
    if (world_size == expected_world_size()) return {};
    return "world size " + std::to_string(world_size) + " does not match the configuration: 1 coordinator + dp·tp = 1 + " +
           std::to_string(dp) + "·" + std::to_string(tp) + " = " + std::to_string(expected_world_size()) +
           " ranks (launch with: mpirun -np 1 coordinator CONFIG : -np " + std::to_string(dp * tp) + " worker CONFIG)";
  }
};

}  // namespace hyserve
