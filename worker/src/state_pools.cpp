#include "hyserve/worker/state_pools.h"

#include <algorithm>
#include <string>
#include <vector>

#include "hyserve/common/error.h"
#include "hyserve/kernels/ssm.h"

namespace hyserve::worker {

namespace {

// The Mamba2 kernels take a bf16 SSM state when their params carry state_dtype.
template <class P>
constexpr bool ssm_params_have_state_dtype = requires(P& p) { p.state_dtype; };

// cache.ssm_state_dtype against what the model's recurrent layers support.
void check_state_dtype(const model_config& mc, dtype state_type) {
  if (state_type == dtype::kF32) return;
  if (mc.num_layers_of(layer_kind::kGatedDeltaNet) > 0)
    throw config_error("cache.ssm_state_dtype: bfloat16 is not supported by Gated DeltaNet layers (their state "
                       "stays float32); use float32 for this model");
  if constexpr (!ssm_params_have_state_dtype<kernels::ssm_common_params>) {
    throw config_error("cache.ssm_state_dtype: bfloat16 needs the bf16 Mamba2 state kernels, which this build "
                       "does not have; use float32");
  }
}

}  // namespace

state_pools make_state_pools(const model& m, const cache_section& cache, collective* comm) {
  const model_config& mc = m.config();
  const device_kind device = m.exec().device;
  check_state_dtype(mc, cache.ssm_state_dtype);
  const auto attn_layers = static_cast<int32_t>(mc.num_layers_of(layer_kind::kAttention));
  const auto recurrent_layers = static_cast<int32_t>(mc.num_recurrent_layers());
  state_pools p;
  int64_t page_bytes = kv_cache::bytes_per_page(attn_layers, cache.page_size, m.kv_heads_local(),
                                                static_cast<int32_t>(mc.head_dim), cache.kv_dtype);
  // Sparse Top-K keeps f32 key_min/key_max [kv_heads, head_dim] per page and attention layer.
  if (m.sparsity().algorithm == sparsity_algorithm::kQuest)
    page_bytes += int64_t{attn_layers} * 2 * m.kv_heads_local() * mc.head_dim * static_cast<int64_t>(sizeof(float));
  p.num_pages = plan_kv_pages(cache, device, page_bytes,
                              mamba_state_cache::bytes_per_slot(recurrent_layers, m.mamba_shape(), cache.ssm_state_dtype) *
                                  (int64_t{cache.max_requests} + 1));
  // Ranks measuring free device memory may disagree.
  if (device != device_kind::kCpu && comm && comm->size() > 1) {
    std::vector<float> all(static_cast<size_t>(comm->size()));
    const auto mine = static_cast<float>(p.num_pages);
    comm->all_gather(&mine, all.data(), 1);
    p.num_pages = static_cast<int32_t>(*std::min_element(all.begin(), all.end()));
  }
  p.req_to_token = std::make_unique<req_to_token_pool>(cache.max_requests, cache.max_context);
  p.kv = std::make_unique<kv_cache>(attn_layers, p.num_pages, cache.page_size, m.kv_heads_local(),
                                    static_cast<int32_t>(mc.head_dim), device, cache.kv_dtype);
  p.recurrent = std::make_unique<mamba_state_cache>(recurrent_layers, cache.max_requests, m.mamba_shape(), device,
                                                    cache.ssm_state_dtype);
  return p;
}

}  // namespace hyserve::worker
