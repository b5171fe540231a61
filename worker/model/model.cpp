#include "hyserve/worker/model.h"

#include "bamba.h"
#include "hyserve/common/error.h"
#include "qwen3_next.h"
#include "weights.h"

namespace hyserve::worker {

std::unique_ptr<model> make_model(const service_config& cfg, const model_config& mc, tp_placement tp,
                                  collective* comm, const kernels::exec_context& ctx) {
  mc.validate();
  std::unique_ptr<weight_source> weights = cfg.model.synthetic ? make_synthetic_weights(cfg.model.synthetic->seed)
                                                               : make_checkpoint_weights(cfg.model.path);
  switch (mc.arch) {
    case model_arch::kBamba:
      return make_bamba(mc, *weights, tp, comm, ctx);
    case model_arch::kQwen3Next:
      return make_qwen3_next(mc, *weights, tp, comm, ctx);
  }
  throw config_error("unknown model architecture");
}

}  // namespace hyserve::worker
