#pragma once
// Finds the worker ranks that run on the coordinator's own host and tells when one of their
// processes is gone. mpirun (or the node's daemon) starts the ranks of a node as children of one
// process, each with OMPI_COMM_WORLD_RANK in its environment; a sibling of the coordinator with
// that variable is a local rank. Ranks on other hosts are not seen here: for them the step
// timeout is the detector. Linux (/proc) only; elsewhere it finds no rank.
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace hyserve::coordinator {

class rank_monitor {
 public:
  struct rank_process {
    int world_rank = -1;
    pid_t pid = 0;
  };

  // Scans once for the local ranks in [first_rank, last_rank] (call after every rank started).
  rank_monitor(int first_rank, int last_rank);

  const std::vector<rank_process>& ranks() const { return ranks_; }
  // The first watched rank whose process has exited (or is a zombie), if any.
  std::optional<rank_process> lost() const;

 private:
  std::vector<rank_process> ranks_;
};

// This host's name (for log lines).
std::string host_name();

}  // namespace hyserve::coordinator
