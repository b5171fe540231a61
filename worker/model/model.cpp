#include "hyserve/worker/model.h"

#include <string>

#include "bamba.h"
#include "hyserve/common/error.h"
#include "qwen3_next.h"
#include "weights.h"

namespace hyserve::worker {

std::unique_ptr<model> make_model(const service_config& cfg, const model_config& mc, tp_placement tp,
                                  collective* comm, const kernels::exec_context& ctx) {
  mc.validate();
  // model.dtype: the storage of linear-layer weights, embeddings and lm_head (norm and conv
  // weights, A_log, D and dt_bias stay float32). Checked before any weight is read.
  const dtype weight_type = cfg.model.weight_dtype;
  if (weight_type != dtype::kF32 && weight_type != dtype::kBF16)
    throw config_error("model.dtype: " + std::string(dtype_name(weight_type)) +
                       " is not supported by the model (supported: float32, bfloat16)");
  std::unique_ptr<weight_source> weights = cfg.model.synthetic ? make_synthetic_weights(cfg.model.synthetic->seed)
                                                               : make_checkpoint_weights(cfg.model.path);
  switch (mc.arch) {
    case model_arch::kBamba:
      return make_bamba(mc, *weights, tp, comm, ctx, weight_type, cfg.sparsity);
    case model_arch::kQwen3Next:
      return make_qwen3_next(mc, *weights, tp, comm, ctx, weight_type, cfg.sparsity);
  }
  throw config_error("unknown model architecture");
}

}  // namespace hyserve::worker
