#pragma once
// Memory pools of one worker (docs/ARCHITECTURE.md, Memory): the req→token table, the paged KV allocator and
// caches, and the mamba slot allocator with per-layer conv/SSM state. The coordinator owns the
// bookkeeping in the service; the offline engine drives the same allocators directly.
#include <cstdint>
#include <optional>
#include <vector>

#include "hyserve/common/config.h"
#include "hyserve/common/index_pool.h"
#include "hyserve/common/tensor.h"

namespace hyserve::worker {

// [max_requests, max_context] i32: token position → flat KV location (page·page_size + offset).
class req_to_token_pool {
 public:
  req_to_token_pool(int32_t max_requests, int32_t max_context);
  std::optional<int32_t> alloc();  // a free request slot, or nullopt when full
  void free(int32_t slot);         // throws invalid_argument_error on double free / bad slot
  int32_t* row(int32_t slot);
  const int32_t* row(int32_t slot) const;
  int32_t max_requests() const { return max_requests_; }
  int32_t max_context() const { return max_context_; }
  int32_t available() const { return slots_.available(); }

 private:
  int32_t max_requests_, max_context_;
  std::vector<int32_t> table_;
  index_pool slots_;
};

// K and V pages of one attention layer: [num_pages, page_size, kv_heads, head_dim] each, on
// the cache's device, in the cache's element type (f32 or bf16: cache.kv_dtype).
struct kv_layer_cache {
  tensor k;
  tensor v;
  // Page summaries for sparse attention (docs/ARCHITECTURE.md, Memory; Sparse Top-K attention): f32 [num_pages, kv_heads, head_dim]
  // element-wise min / max of each page's keys. Empty unless sparsity.algorithm is quest; then
  // allocated on the device of k by the first step that writes keys (worker/model/sparse_select.h).
  tensor key_min{};
  tensor key_max{};
};

class kv_cache {
 public:
  kv_cache(int32_t num_layers, int32_t num_pages, int32_t page_size, int32_t kv_heads, int32_t head_dim,
           device_kind device = device_kind::kCpu, dtype type = dtype::kF32);
  // Bytes of K and V for one page in every layer (what one more page costs).
  static int64_t bytes_per_page(int32_t num_layers, int32_t page_size, int32_t kv_heads, int32_t head_dim,
                                dtype type = dtype::kF32);
  kv_layer_cache& layer(int32_t i) { return layers_.at(static_cast<size_t>(i)); }
  int32_t page_size() const { return page_size_; }
  int32_t num_pages() const { return num_pages_; }
  dtype type() const { return type_; }

 private:
  int32_t page_size_, num_pages_;
  dtype type_ = dtype::kF32;
  std::vector<kv_layer_cache> layers_;
};

// Conv window and SSM state of one SSM layer, on the cache's device. The conv window is f32;
// the SSM state is the cache's state type (f32, or bf16 with cache.ssm_state_dtype: bfloat16).
struct mamba_layer_state {
  tensor conv;  // f32 [n_slots + 1, conv_dim, K-1], oldest first
  tensor ssm;   // [n_slots + 1, heads, head_dim, d_state]
};

struct mamba_state_shape {
  int32_t conv_dim = 0, conv_width = 0;
  int32_t heads = 0, head_dim = 0, d_state = 0;
};

class mamba_state_cache {
 public:
  mamba_state_cache(int32_t num_layers, int32_t n_slots, const mamba_state_shape& shape,
                    device_kind device = device_kind::kCpu, dtype state_type = dtype::kF32);
  // Bytes of conv window and state of one slot in every layer.
  static int64_t bytes_per_slot(int32_t num_layers, const mamba_state_shape& shape, dtype state_type = dtype::kF32);
  mamba_layer_state& layer(int32_t i) { return layers_.at(static_cast<size_t>(i)); }
  // Zeroes one slot in every layer (a freshly allocated request starts from zero state).
  void reset_slot(int32_t slot);
  int32_t n_slots() const { return n_slots_; }
  const mamba_state_shape& shape() const { return shape_; }
  dtype state_type() const { return state_type_; }

 private:
  int32_t n_slots_;
  mamba_state_shape shape_;
  dtype state_type_ = dtype::kF32;
  std::vector<mamba_layer_state> layers_;
};

// Pages of the KV pool. cache.num_pages > 0 is taken as given. Otherwise on the CPU:
// max_requests · ceil(max_context / page_size) (every request can reach max_context). On CUDA,
// measured after the weights are resident:
//   budget    = free_device_bytes · gpu_memory_fraction / ranks_per_device − state_bytes
//   num_pages = min(floor(budget / page_bytes), max_requests · ceil(max_context / page_size))
// where page_bytes = kv_cache::bytes_per_page(...) and state_bytes is the recurrent-state cache
// (mamba_state_cache::bytes_per_slot(...) · (max_requests + 1)). Throws capacity_error when the
// budget holds no page.
int32_t plan_kv_pages(const cache_section& cache, device_kind device, int64_t page_bytes, int64_t state_bytes);

}  // namespace hyserve::worker
