#pragma once
// Single-process engine: one model (tp = 1) driven step by step with every logit back, for the
// model tests and tools that compare logits or hidden states (hyserve-generate --logits). It is
// the service's plan runner (worker::runner, forward_logits) under a minimal bookkeeping of its
// own (request and state slots, KV pages): each step is a wire::step_plan, prepared as the
// service prepares it. Generation as the service runs it (scheduler + runner, sampling on the
// device) is coordinator::local_service.
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "hyserve/common/config.h"
#include "hyserve/common/index_pool.h"
#include "hyserve/worker/model.h"
#include "hyserve/worker/runner.h"
#include "hyserve/worker/state_pools.h"

namespace hyserve::worker {

struct step_row {
  int32_t request = -1;         // handle from open_request()
  std::vector<int32_t> tokens;  // tokens consumed this step
};

class engine {
 public:
  // Builds the configured model on the CPU with tp = 1 and pools sized from cfg.cache.
  explicit engine(const service_config& cfg);
  engine(std::unique_ptr<model> m, const cache_section& cache);
  ~engine();

  const model_config& config() const { return runner_->get_model().config(); }
  // The request state (KV pages, recurrent state) in their configured element types.
  const state_pools& pools() const { return runner_->pools(); }

  // A request slot with zeroed SSM/conv state; throws capacity_error when none is free.
  int32_t open_request();
  void close_request(int32_t request);
  int32_t cached_len(int32_t request) const;

  // Runs one step of `mode` over the rows (each row continues its request's cache). Returns the
  // logits the model returns (see model::forward). Mixed rows with one token and a non-empty
  // cache are decode rows. TargetVerify and Draft steps (draft_len: the longest row's tokens;
  // verify rows need exactly that many) write their per-step states to the step scratch and
  // commit nothing: each request's cached length and recurrent state stay as they were (the KV
  // they wrote past the cache is overwritten by the next step).
  host_tensor step(forward_mode mode, const std::vector<step_row>& rows, const forward_options& opts = {});

  // Greedy generation: Extend over the prompt (in chunks of prefill_chunk tokens when > 0), then
  // Decode steps. When logits is set it receives one row per position of prompt + output (row t:
  // the logits after consuming token t).
  std::vector<int32_t> generate_greedy(const std::vector<int32_t>& prompt, int32_t max_new_tokens,
                                       int32_t prefill_chunk = 0, std::vector<std::vector<float>>* logits = nullptr);

 private:
  struct request_state {
    int32_t req_slot = -1;
    int32_t mamba_slot = -1;
    int32_t cached = 0;
    std::vector<int32_t> pages;
    bool fresh = true;  // its first step resets the recurrent state slot
  };
  void init(std::unique_ptr<model> m, const cache_section& cache);
  // Pages for new_len tokens: the ones added (capacity_error when there are not enough).
  std::vector<int32_t> reserve_kv(request_state& r, int32_t new_len);

  std::unique_ptr<collective> comm_;
  std::unique_ptr<runner> runner_;
  int32_t page_size_ = 16;
  int32_t max_context_ = 0;
  std::unique_ptr<index_pool> pages_, req_slots_, state_slots_;
  std::vector<int32_t> released_req_slots_;  // their page tables are cleared by the next step
  std::unordered_map<int32_t, request_state> requests_;
  int32_t next_handle_ = 0;
  uint64_t next_step_ = 1;
};

}  // namespace hyserve::worker
