#pragma once
// The per-request state of one model instance: the req→token table, the KV pages and the
// recurrent (conv + SSM/GDN) state, sized once from the cache config and, on a GPU, from free
// device memory. The offline engine and the plan runner both own one.
#include <cstdint>
#include <memory>

#include "hyserve/common/config.h"
#include "hyserve/worker/collective.h"
#include "hyserve/worker/memory_pools.h"
#include "hyserve/worker/model.h"

namespace hyserve::worker {

struct state_pools {
  std::unique_ptr<req_to_token_pool> req_to_token;
  std::unique_ptr<kv_cache> kv;
  std::unique_ptr<mamba_state_cache> recurrent;
  int32_t num_pages = 0;

  model_context context() const { return model_context{req_to_token.get(), kv.get(), recurrent.get()}; }
};

// Allocates the pools on the model's device. With comm set (a tensor-parallel group), the ranks
// agree on the smallest page count, so the coordinator's page numbers are valid on every rank.
state_pools make_state_pools(const model& m, const cache_section& cache, collective* comm);

}  // namespace hyserve::worker
