#include "hyserve/worker/tp_device.h"

#include <algorithm>
#include <string>

#include "hyserve/common/error.h"
#include "hyserve/kernels/device.h"
#include "hyserve/worker/host_collective.h"
#include "hyserve/worker/mpi_collective.h"
#if HYSERVE_HAVE_NCCL
#include "comm/nccl_collective.h"
#endif

namespace hyserve::worker {

device_placement place_worker(const service_config& cfg, int self, int workers, int tp) {
  device_placement p;
  if (cfg.device != device_kind::kCuda) return p;
  const int devices = std::max(1, kernels::cuda_device_count());
  p.ordinal = self % devices;
  p.ranks_per_device = (workers - 1 - p.ordinal) / devices + 1;  // workers w with w % devices == ordinal
  if (tp > 1 && tp > devices && cfg.parallel.device_collective == device_collective_kind::kNccl)
    throw config_error("parallel.tp = " + std::to_string(tp) + " ranks on " + std::to_string(devices) +
                       " CUDA device(s): NCCL cannot put two ranks of one group on one device; set "
                       "parallel.device_collective: host to run them there");
  return p;
}

namespace {

std::unique_ptr<collective> transport(const service_config& cfg, MPI_Comm tp_comm, int ordinal) {
  if (cfg.device != device_kind::kCuda) return make_mpi_collective(tp_comm);
  if (cfg.parallel.device_collective == device_collective_kind::kHost)
    return make_host_staged_collective(tp_comm, cfg.device, cfg.worker.step_timeout_s);
#if HYSERVE_HAVE_NCCL
  return make_nccl_collective(tp_comm, cfg.worker.step_timeout_s, ordinal);
#else
  (void)ordinal;
  throw config_error("device: cuda with parallel.tp > 1 needs NCCL, which this build does not have "
                     "(or parallel.device_collective: host)");
#endif
}

}  // namespace

std::unique_ptr<collective> make_model_collective(const service_config& cfg, MPI_Comm tp_comm, int tp, int ordinal) {
  if (tp <= 1) return nullptr;
  std::unique_ptr<collective> c = transport(cfg, tp_comm, ordinal);
  // Above 2 ranks the transport's all-reduce order depends on the message size (collective.h).
  if (cfg.kernels.batch_invariant && tp > 2) return make_rank_ordered_collective(std::move(c), cfg.device);
  return c;
}

}  // namespace hyserve::worker
