// The central switch of kernels::run (run.h): routes each params struct to the backend of the
// context's device. An op family has a CUDA route exactly when its header declares run_cuda
// for the struct and the CUDA backend is built.
#include <string>

#include "hyserve/common/error.h"
#include "hyserve/kernels/activation.h"
#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/causal_conv1d.h"
#include "hyserve/kernels/embedding.h"
#include "hyserve/kernels/gdn.h"
#include "hyserve/kernels/gemm.h"
#include "hyserve/kernels/logits_processing.h"
#include "hyserve/kernels/moe.h"
#include "hyserve/kernels/norm.h"
#include "hyserve/kernels/paths.h"
#include "hyserve/kernels/rope.h"
#include "hyserve/kernels/row_ops.h"
#include "hyserve/kernels/run.h"
#include "hyserve/kernels/sampling.h"
#include "hyserve/kernels/sparse_attention.h"
#include "hyserve/kernels/ssm.h"
#include "hyserve/kernels/synthetic.h"

#ifndef HYSERVE_HAVE_CUDA
#define HYSERVE_HAVE_CUDA 0
#endif

namespace hyserve::kernels {

// Exact-type match: a derived params struct must not reach its base's run_cuda.
template <class Params>
concept declares_run_cuda = requires {
  static_cast<void (*)(const Params&, void*)>(&run_cuda);
};

template <class Params>
const char* op_name();  // specialised by HYSERVE_INSTANTIATE_RUN

template <class Params>
bool has_cuda() {
  if constexpr (declares_run_cuda<Params>) return HYSERVE_HAVE_CUDA != 0;
  return false;
}

template <class Params>
void run(const Params& p, const exec_context& ctx) {
  switch (ctx.device) {
    case device_kind::kCpu:
      run_cpu(p);
      return;
    case device_kind::kCuda:
#if HYSERVE_HAVE_CUDA
      if constexpr (declares_run_cuda<Params>) {
        const paths_scope paths(ctx.paths);  // the launchers' variant choices (paths.h)
        run_cuda(p, ctx.stream);
        return;
      } else {
        throw error(std::string("op ") + op_name<Params>() + " has no CUDA implementation");
      }
#else
      throw error(std::string("op ") + op_name<Params>() +
                  " on device cuda: this build has no CUDA backend (configure with HYSERVE_ENABLE_CUDA=ON)");
#endif
  }
  throw error("kernels::run: unknown device kind");
}

#define HYSERVE_INSTANTIATE_RUN(P)                           \
  template <>                                                 \
  const char* op_name<P>() {                                  \
    return #P;                                                \
  }                                                           \
  template void run<P>(const P& p, const exec_context& ctx); \
  template bool has_cuda<P>();

HYSERVE_INSTANTIATE_RUN(gemm_params)
HYSERVE_INSTANTIATE_RUN(swiglu_linear_params)
HYSERVE_INSTANTIATE_RUN(embedding_params)
HYSERVE_INSTANTIATE_RUN(rmsnorm_params)
HYSERVE_INSTANTIATE_RUN(gated_rmsnorm_params)
HYSERVE_INSTANTIATE_RUN(rmsnorm_linear_params)
HYSERVE_INSTANTIATE_RUN(rope_params)
HYSERVE_INSTANTIATE_RUN(swiglu_params)
HYSERVE_INSTANTIATE_RUN(relu2_params)
HYSERVE_INSTANTIATE_RUN(row_add_params)
HYSERVE_INSTANTIATE_RUN(moe_route_params)
HYSERVE_INSTANTIATE_RUN(moe_experts_params)
HYSERVE_INSTANTIATE_RUN(sigmoid_mul_params)
HYSERVE_INSTANTIATE_RUN(kv_write_params)
HYSERVE_INSTANTIATE_RUN(paged_attention_params)
HYSERVE_INSTANTIATE_RUN(page_summary_update_params)
HYSERVE_INSTANTIATE_RUN(sparse_select_params)
HYSERVE_INSTANTIATE_RUN(conv1d_varlen_params)
HYSERVE_INSTANTIATE_RUN(conv1d_update_params)
HYSERVE_INSTANTIATE_RUN(ssd_chunk_scan_params)
HYSERVE_INSTANTIATE_RUN(selective_state_update_params)
HYSERVE_INSTANTIATE_RUN(gdn_chunk_scan_params)
HYSERVE_INSTANTIATE_RUN(gdn_state_update_params)
HYSERVE_INSTANTIATE_RUN(argmax_params)
HYSERVE_INSTANTIATE_RUN(sample_rows_params)
HYSERVE_INSTANTIATE_RUN(last_token_scatter_params)
HYSERVE_INSTANTIATE_RUN(token_resolve_params)
HYSERVE_INSTANTIATE_RUN(logits_process_params)
HYSERVE_INSTANTIATE_RUN(token_count_params)
HYSERVE_INSTANTIATE_RUN(selective_state_update_multi_params)
HYSERVE_INSTANTIATE_RUN(conv1d_update_multi_params)
HYSERVE_INSTANTIATE_RUN(gdn_state_update_multi_params)
HYSERVE_INSTANTIATE_RUN(state_commit_params)
HYSERVE_INSTANTIATE_RUN(paged_attention_tree_params)
HYSERVE_INSTANTIATE_RUN(synthetic_fill_params)

}  // namespace hyserve::kernels
