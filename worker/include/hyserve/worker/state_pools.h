#pragma once
// The per-request state of one model instance: the req→token table, the KV pages and the
// recurrent (conv + SSM/GDN) state, sized once from the cache config and, on a GPU, from free
// device memory. The offline engine and the plan runner both own one.
#include <cstdint>
#include <memory>
#include <vector>

#include "hyserve/common/config.h"
#include "hyserve/common/wire.h"
#include "hyserve/worker/collective.h"
#include "hyserve/worker/memory_pools.h"
#include "hyserve/worker/model.h"

namespace hyserve::worker {

struct state_pools {
  std::unique_ptr<req_to_token_pool> req_to_token;
  std::unique_ptr<kv_cache> kv;
  std::unique_ptr<mamba_state_cache> recurrent;
  int32_t num_pages = 0;
  int32_t request_slots = 0;  // recurrent slots of requests; checkpoint slots (prefix cache) follow
  // Per-step SSM/conv states of TargetVerify and Draft steps: [rows · steps] entries per layer,
  // read by the commit of the next plan. Allocated up front for cache.spec_step_slots() (the
  // rows speculative.max_batch allows, num_draft_tokens + 1 states each; counted in the page
  // plan); grown by ensure_steps only beyond that.
  std::unique_ptr<mamba_state_cache> steps;
  int32_t step_rows = 0, step_cols = 0;
  int32_t recurrent_layers = 0;
  int32_t attn_layers = 0;  // layout of the last verify/draft step that wrote them
  tensor last_tokens;       // i32 [mamba slots] on the device: model_context::last_tokens

  model_context context() const {
    return model_context{req_to_token.get(), kv.get(), recurrent.get(), steps.get(),
                         last_tokens.as<int32_t>(), last_tokens.numel()};
  }
  // Makes room for rows × cols per-step states and records that layout.
  void ensure_steps(int32_t rows, int32_t cols, device_kind device);
  // Copies step `step` of row `row` (of the last verify/draft layout) into each slot, every layer.
  void commit_steps(const std::vector<int32_t>& slots, const std::vector<int32_t>& rows,
                    const std::vector<int32_t>& step, const kernels::exec_context& ctx);
  // Prefix caching: copies recurrent-state slots (SSM / GDN state and conv window, every layer)
  // src → dst, all pairs in one kernel launch on ctx's stream. No slot may be both a source and
  // a destination of the same call.
  void copy_slots(const std::vector<wire::state_copy_op>& ops, const kernels::exec_context& ctx);
  // Copies the K and V of token position `from` of request slot req_slot to position `to`, in
  // every attention layer (tree drafts: the accepted path moves to its depths).
  void move_kv(int32_t req_slot, int32_t from, int32_t to, const kernels::exec_context& ctx);

 private:
  // The state-commit kernel over every recurrent layer: slot slots[i] takes column
  // steps_taken[i] of row rows[i] of `source` (`steps` columns a row). One launch.
  void run_commit(mamba_state_cache& source, int32_t steps, const std::vector<int32_t>& slots,
                  const std::vector<int32_t>& rows, const std::vector<int32_t>& steps_taken,
                  const kernels::exec_context& ctx);
};

// Allocates the pools on the model's device. With comm set (a tensor-parallel group), the ranks
// agree on the smallest page count, so the coordinator's page numbers are valid on every rank.
// draft: a draft model whose pools will mirror these (same pages and slots; resident already):
// the page count is planned for both, so its caches do not come out of the memory left for the
// steps' activations.
state_pools make_state_pools(const model& m, const cache_section& cache, collective* comm,
                             const model* draft = nullptr);

}  // namespace hyserve::worker
