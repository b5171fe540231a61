#include "hyserve/worker/state_pools.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "hyserve/common/error.h"
#include "hyserve/kernels/run.h"
#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/device.h"
#include "hyserve/kernels/graph.h"
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

namespace {

// Device bytes of m's pools: per KV page, and for all its recurrent-state slots (requests,
// prefix checkpoints and the padding slot).
struct pool_bytes {
  int64_t page = 0, state = 0;
};

// Slots of state_pools::steps planned up front: every row a speculative step may have, each
// with its cache.spec_step_cols states (and the cache's padding slot).
int64_t step_slots(const cache_section& cache) {
  return cache.spec_step_slots() > 0 ? cache.spec_step_slots() + 1 : 0;
}

pool_bytes bytes_of(const model& m, const cache_section& cache) {
  const model_config& mc = m.config();
  const auto attn_layers = static_cast<int32_t>(mc.num_attention_layers());
  pool_bytes b;
  b.page = kv_cache::bytes_per_page(attn_layers, cache.page_size, m.kv_heads_local(), static_cast<int32_t>(mc.head_dim),
                                    cache.kv_dtype);
  // Sparse Top-K keeps f32 key_min/key_max [kv_heads, head_dim] per page and attention layer.
  if (m.sparsity().algorithm == sparsity_algorithm::kQuest)
    b.page += int64_t{attn_layers} * 2 * m.kv_heads_local() * mc.head_dim * static_cast<int64_t>(sizeof(float));
  // Request and checkpoint slots, the padding slot, and the speculative steps' states
  // (state_pools::steps, allocated up front: grown mid-service it would come out of the memory
  // left for activations).
  b.state = mamba_state_cache::bytes_per_slot(static_cast<int32_t>(mc.num_recurrent_layers()), m.mamba_shape(),
                                              cache.ssm_state_dtype) *
            (int64_t{cache.max_requests} + cache.checkpoint_slots() + 1 + step_slots(cache));
  return b;
}

}  // namespace

state_pools make_state_pools(const model& m, const cache_section& cache, collective* comm, const model* draft) {
  const model_config& mc = m.config();
  const device_kind device = m.exec().device;
  check_state_dtype(mc, cache.ssm_state_dtype);
  const auto attn_layers = static_cast<int32_t>(mc.num_attention_layers());
  const auto recurrent_layers = static_cast<int32_t>(mc.num_recurrent_layers());
  state_pools p;
  // A draft model's pools mirror these (same pages and slots): the budget holds both.
  pool_bytes need = bytes_of(m, cache);
  if (draft != nullptr) {
    const pool_bytes d = bytes_of(*draft, cache);
    need.page += d.page;
    need.state += d.state;
  }
  p.num_pages = plan_kv_pages(cache, device, need.page, need.state);
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
  // Prefix-cache checkpoint slots follow the request slots in the same cache.
  p.request_slots = cache.max_requests;
  p.recurrent = std::make_unique<mamba_state_cache>(recurrent_layers, cache.max_requests + cache.checkpoint_slots(),
                                                    m.mamba_shape(), device, cache.ssm_state_dtype);
  p.recurrent_layers = recurrent_layers;
  p.attn_layers = attn_layers;
  if (cache.spec_step_slots() > 0 && recurrent_layers > 0)
    p.steps = std::make_unique<mamba_state_cache>(recurrent_layers, static_cast<int32_t>(cache.spec_step_slots()),
                                                  m.mamba_shape(), device, cache.ssm_state_dtype);
  p.last_tokens = tensor::i32({cache.max_requests}, device);
  return p;
}

void state_pools::run_commit(mamba_state_cache& source, int32_t steps, const std::vector<int32_t>& slots,
                             const std::vector<int32_t>& rows, const std::vector<int32_t>& steps_taken,
                             const kernels::exec_context& ctx) {
  // The index arrays are allocated, filled and freed in the order of ctx's stream: it may be a
  // replayed decode graph's, which the legacy stream (synchronous copies, the default
  // allocation order) does not wait for. Declared first: released after the tensors below.
  const bool own_stream = ctx.device == device_kind::kCuda && ctx.stream != nullptr;
  std::optional<kernels::allocation_stream_scope> order;
  if (own_stream) order.emplace(ctx.stream, /*zero_fill=*/false);
  auto upload = [&](const std::vector<int32_t>& v) {
    const auto n = static_cast<int64_t>(v.size());
    if (!own_stream) return tensor::from_host(v.data(), dtype::kI32, n, ctx.device);
    tensor t = tensor::i32({n}, ctx.device);
    kernels::copy_h2d_async(t.data(), v.data(), static_cast<size_t>(n) * sizeof(int32_t), ctx.stream);
    return t;
  };
  std::vector<void*> ssm;
  std::vector<const void*> ssm_src;
  std::vector<float*> conv;
  std::vector<const float*> conv_src;
  for (int32_t l = 0; l < recurrent_layers; ++l) {
    ssm.push_back(recurrent->layer(l).ssm.data());
    conv.push_back(recurrent->layer(l).conv.as<float>());
    ssm_src.push_back(source.layer(l).ssm.data());
    conv_src.push_back(source.layer(l).conv.as<float>());
  }
  const mamba_state_shape& s = recurrent->shape();
  const auto n = static_cast<int64_t>(slots.size());
  const tensor d_slots = upload(slots);
  const tensor d_rows = upload(rows);
  const tensor d_taken = upload(steps_taken);
  kernels::state_commit_params p;
  p.n_layers = recurrent_layers;
  p.ssm_states = ssm.data();
  p.ssm_steps = ssm_src.data();
  p.conv_states = conv.data();
  p.conv_steps = conv_src.data();
  p.state_elems = int64_t{s.heads} * s.head_dim * s.d_state;
  p.conv_elems = int64_t{s.conv_dim} * (s.conv_width - 1);
  p.steps = steps;
  p.slots = d_slots.as<int32_t>();
  p.rows = d_rows.as<int32_t>();
  p.steps_taken = d_taken.as<int32_t>();
  p.n_commits = n;
  p.state_dtype = recurrent->state_type();
  kernels::run(p, ctx);
}

void state_pools::ensure_steps(int32_t rows, int32_t cols, device_kind device) {
  const int64_t need = int64_t{rows} * cols;
  if (!steps || steps->n_slots() < need) {
    // Only without cache.spec_step_cols (planned up front) or beyond it. Grows only, to the rows
    // rounded up to 8 (at most the request slots), never doubling: each slot holds a whole
    // recurrent state per layer (116 MiB a row-step for the 9B in f32), so slack costs
    // gigabytes. The old steps go first: a commit of the previous layout always runs before a
    // step that grows it.
    const int64_t padded_rows = std::max<int64_t>(rows, std::min<int64_t>((int64_t{rows} + 7) / 8 * 8, request_slots));
    steps.reset();
    // Per-step SSM states have the slots' element type, so a step stores exactly what a decode
    // step would store in the slot (bf16 states are rounded after every token either way).
    steps = std::make_unique<mamba_state_cache>(recurrent_layers, static_cast<int32_t>(padded_rows * cols),
                                                recurrent->shape(), device, recurrent->state_type());
  }
  step_rows = rows;
  step_cols = cols;
}

void state_pools::move_kv(int32_t req_slot, int32_t from, int32_t to, const kernels::exec_context& ctx) {
  if (req_slot < 0 || req_slot >= req_to_token->max_requests())
    throw invalid_argument_error("kv move: req_slot " + std::to_string(req_slot) + " out of range");
  const int32_t max_ctx = req_to_token->max_context();
  if (from < 0 || from >= max_ctx || to < 0 || to >= max_ctx)
    throw invalid_argument_error("kv move: positions " + std::to_string(from) + " -> " + std::to_string(to) +
                                 " outside [0, " + std::to_string(max_ctx) + ")");
  const int32_t src = req_to_token->row(req_slot)[from], dst = req_to_token->row(req_slot)[to];
  if (src < 0 || dst < 0)
    throw invalid_argument_error("kv move: position " + std::to_string(src < 0 ? from : to) + " has no KV location");
  if (src == dst || attn_layers == 0) return;
  // A copy of the token's K and V rows as stored (f32 or bf16), bit for bit, ordered after the
  // work on ctx's stream and finished before the next step's kernels (tree moves are rare).
  const bool device = ctx.device != device_kind::kCpu;
  if (device) kernels::stream_synchronize(ctx.stream);
  const int64_t tokens = int64_t{kv->num_pages()} * kv->page_size();
  for (int32_t l = 0; l < attn_layers; ++l) {
    kv_layer_cache& c = kv->layer(l);
    const auto row_bytes = static_cast<size_t>(c.k.numel() / tokens) * dtype_size(c.k.type());
    if (row_bytes == 0) continue;
    device_allocator& mem = allocator_of(c.k.device());
    for (tensor* t : {&c.k, &c.v}) {
      auto* base = static_cast<char*>(t->data());
      mem.copy_within(base + static_cast<size_t>(dst) * row_bytes, base + static_cast<size_t>(src) * row_bytes, row_bytes);
    }
  }
  if (device) kernels::stream_synchronize(nullptr);
}

void state_pools::copy_slots(const std::vector<wire::state_copy_op>& ops, const kernels::exec_context& ctx) {
  if (ops.empty() || recurrent_layers == 0) return;
  std::vector<int32_t> dst, src, col;
  std::vector<uint8_t> written(static_cast<size_t>(recurrent->n_slots()), 0);
  for (const wire::state_copy_op& c : ops) {
    for (int32_t s : {c.src_slot, c.dst_slot})
      if (s < 0 || s >= recurrent->n_slots())
        throw invalid_argument_error("state copy: slot " + std::to_string(s) + " outside [0, " +
                                     std::to_string(recurrent->n_slots()) + ")");
    written[static_cast<size_t>(c.dst_slot)] = 1;
    dst.push_back(c.dst_slot);
    src.push_back(c.src_slot);
    col.push_back(0);
  }
  // One launch copies every pair in parallel: no pair may read a slot another one writes.
  for (int32_t s : src)
    if (written[static_cast<size_t>(s)])
      throw invalid_argument_error("state copy: slot " + std::to_string(s) + " is both copied from and written");
  // A copy between slots of the same cache is the speculative commit with one step per "row"
  // (row = source slot): the same kernel, every recurrent layer in one launch.
  run_commit(*recurrent, 1, dst, src, col, ctx);
}

void state_pools::commit_steps(const std::vector<int32_t>& slots, const std::vector<int32_t>& rows,
                               const std::vector<int32_t>& step, const kernels::exec_context& ctx) {
  if (slots.empty() || recurrent_layers == 0) return;
  if (!steps || step_cols <= 0)
    throw invalid_argument_error("commit: no verify or draft step has written per-step states");
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] < 0) continue;
    if (slots[i] >= recurrent->n_slots())
      throw invalid_argument_error("commit: mamba_slot " + std::to_string(slots[i]) + " outside [0, " +
                                   std::to_string(recurrent->n_slots()) + ")");
    if (rows[i] < 0 || rows[i] >= step_rows)
      throw invalid_argument_error("commit: row " + std::to_string(rows[i]) + " outside the last step's " +
                                   std::to_string(step_rows) + " rows");
    if (step[i] < 0 || step[i] >= step_cols)
      throw invalid_argument_error("commit: accepted_step " + std::to_string(step[i]) + " outside [0, " +
                                   std::to_string(step_cols) + ")");
  }
  if (steps->state_type() != recurrent->state_type())
    throw invalid_argument_error("commit: per-step states are " + std::string(dtype_name(steps->state_type())) +
                                 ", the slots " + std::string(dtype_name(recurrent->state_type())));
  run_commit(*steps, step_cols, slots, rows, step, ctx);
}

}  // namespace hyserve::worker
