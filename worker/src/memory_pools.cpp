#include "hyserve/worker/memory_pools.h"

#include <algorithm>
#include <string>

#include "hyserve/common/error.h"
#include "hyserve/kernels/device.h"

namespace hyserve::worker {
namespace {

void require_non_negative(const char* what, int64_t v) {
  if (v < 0) throw invalid_argument_error(std::string(what) + " " + std::to_string(v) + " is negative");
}

void require_positive(const char* what, int64_t v) {
  if (v < 1) throw invalid_argument_error(std::string(what) + " " + std::to_string(v) + " must be >= 1");
}

}  // namespace

// ---- req_to_token_pool ----

req_to_token_pool::req_to_token_pool(int32_t max_requests, int32_t max_context)
    : max_requests_(max_requests), max_context_(max_context), slots_("request slot", std::max(max_requests, 0)) {
  require_non_negative("req_to_token_pool max_requests", max_requests);
  require_non_negative("req_to_token_pool max_context", max_context);
  table_.assign(static_cast<size_t>(max_requests) * static_cast<size_t>(max_context), -1);
}

std::optional<int32_t> req_to_token_pool::alloc() { return slots_.alloc(); }

void req_to_token_pool::free(int32_t slot) {
  slots_.free(slot);
  int32_t* r = row(slot);
  std::fill(r, r + max_context_, -1);
}

int32_t* req_to_token_pool::row(int32_t slot) {
  return const_cast<int32_t*>(static_cast<const req_to_token_pool*>(this)->row(slot));
}

const int32_t* req_to_token_pool::row(int32_t slot) const {
  if (slot < 0 || slot >= max_requests_)
    throw invalid_argument_error("request slot " + std::to_string(slot) + " is outside [0, " +
                                 std::to_string(max_requests_) + ")");
  return table_.data() + static_cast<size_t>(slot) * static_cast<size_t>(max_context_);
}

// ---- kv_cache ----

int64_t kv_cache::bytes_per_page(int32_t num_layers, int32_t page_size, int32_t kv_heads, int32_t head_dim,
                                 dtype type) {
  return int64_t{2} * num_layers * page_size * kv_heads * head_dim * static_cast<int64_t>(dtype_size(type));
}

kv_cache::kv_cache(int32_t num_layers, int32_t num_pages, int32_t page_size, int32_t kv_heads, int32_t head_dim,
                   device_kind device, dtype type)
    : page_size_(page_size), num_pages_(num_pages), type_(type) {
  if (type != dtype::kF32 && type != dtype::kBF16)
    throw invalid_argument_error("kv_cache element type " + std::string(dtype_name(type)) + " (supported: f32, bf16)");
  require_non_negative("kv_cache num_layers", num_layers);
  require_non_negative("kv_cache num_pages", num_pages);
  require_positive("kv_cache page_size", page_size);
  require_positive("kv_cache kv_heads", kv_heads);
  require_positive("kv_cache head_dim", head_dim);
  layers_.reserve(static_cast<size_t>(num_layers));
  const shape_t shape{num_pages, page_size, kv_heads, head_dim};
  for (int32_t l = 0; l < num_layers; ++l) layers_.push_back({tensor(type, shape, device), tensor(type, shape, device)});
}

// ---- mamba_state_cache ----

int64_t mamba_state_cache::bytes_per_slot(int32_t num_layers, const mamba_state_shape& shape, dtype state_type) {
  const int64_t conv = int64_t{shape.conv_dim} * (shape.conv_width - 1);
  const int64_t ssm = int64_t{shape.heads} * shape.head_dim * shape.d_state;
  return num_layers * (conv * static_cast<int64_t>(sizeof(float)) + ssm * static_cast<int64_t>(dtype_size(state_type)));
}

mamba_state_cache::mamba_state_cache(int32_t num_layers, int32_t n_slots, const mamba_state_shape& shape,
                                     device_kind device, dtype state_type)
    : n_slots_(n_slots), shape_(shape), state_type_(state_type) {
  if (state_type != dtype::kF32 && state_type != dtype::kBF16)
    throw invalid_argument_error("mamba_state_cache state type " + std::string(dtype_name(state_type)) +
                                 " (supported: f32, bf16)");
  require_non_negative("mamba_state_cache num_layers", num_layers);
  require_non_negative("mamba_state_cache n_slots", n_slots);
  require_positive("mamba_state_cache conv_dim", shape.conv_dim);
  require_positive("mamba_state_cache conv_width", shape.conv_width);
  require_positive("mamba_state_cache heads", shape.heads);
  require_positive("mamba_state_cache head_dim", shape.head_dim);
  require_positive("mamba_state_cache d_state", shape.d_state);
  layers_.reserve(static_cast<size_t>(num_layers));
  const int64_t slots = static_cast<int64_t>(n_slots) + 1;  // + the padding slot
  for (int32_t l = 0; l < num_layers; ++l)
    layers_.push_back({tensor::f32({slots, shape.conv_dim, shape.conv_width - 1}, device),
                       tensor(state_type, {slots, shape.heads, shape.head_dim, shape.d_state}, device)});
}

void mamba_state_cache::reset_slot(int32_t slot) {
  if (slot < 0 || slot > n_slots_)
    throw invalid_argument_error("mamba slot " + std::to_string(slot) + " is outside [0, " + std::to_string(n_slots_) +
                                 "] (slot " + std::to_string(n_slots_) + " is the padding slot)");
  for (mamba_layer_state& st : layers_) {
    for (tensor* t : {&st.conv, &st.ssm}) {
      const auto per_slot = static_cast<size_t>(t->numel() / t->shape()[0]) * dtype_size(t->type());
      if (per_slot == 0) continue;  // conv_width 1 keeps no conv window
      t->zero_range(static_cast<size_t>(slot) * per_slot, per_slot);
    }
  }
}

// ---- sizing ----

int32_t plan_kv_pages(const cache_section& cache, device_kind device, int64_t page_bytes, int64_t state_bytes) {
  if (cache.num_pages > 0) return cache.num_pages;
  const int64_t pages_per_req = (int64_t{cache.max_context} + cache.page_size - 1) / cache.page_size;
  const int64_t addressable = int64_t{cache.max_requests} * pages_per_req;
  if (device == device_kind::kCpu || page_bytes <= 0) return static_cast<int32_t>(addressable);
  const kernels::device_memory_info mem = kernels::cuda_memory_info();
  const double budget = static_cast<double>(mem.free_bytes) * cache.gpu_memory_fraction /
                            static_cast<double>(std::max(1, cache.ranks_per_device)) -
                        static_cast<double>(state_bytes);
  const int64_t fit = budget > 0 ? static_cast<int64_t>(budget / static_cast<double>(page_bytes)) : 0;
  if (fit < 1)
    throw capacity_error("cache.gpu_memory_fraction = " + std::to_string(cache.gpu_memory_fraction) + " of " +
                         std::to_string(mem.free_bytes) + " free device bytes leaves no room for a KV page of " +
                         std::to_string(page_bytes) + " bytes after " + std::to_string(state_bytes) +
                         " bytes of recurrent state (request and checkpoint slots, and with speculation every "
                         "request's per-token states of a verify step: lower cache.max_requests or "
                         "speculative.num_draft_tokens)");
  return static_cast<int32_t>(std::min(fit, addressable));
}

}  // namespace hyserve::worker
