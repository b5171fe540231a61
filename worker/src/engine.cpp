#include "hyserve/worker/engine.h"

#include <algorithm>
#include <string>

#include "hyserve/common/error.h"
#include "hyserve/kernels/device.h"
#include "hyserve/kernels/sampling.h"
#include "hyserve/worker/hybrid_metadata.h"

namespace hyserve::worker {

namespace {

int32_t pages_needed(int32_t len, int32_t page_size) { return (len + page_size - 1) / page_size; }

// device: cuda runs on CUDA device 0 (config_error when there is none).
std::unique_ptr<model> build_local_model(const service_config& cfg, collective* comm) {
  const kernels::exec_context ctx = kernels::open_device(cfg.device, 0, cfg.kernels);
  return make_model(cfg, resolve_model_config(cfg), tp_placement{}, comm, ctx);
}

}  // namespace

engine::engine(const service_config& cfg) : comm_(make_local_collective()) {
  model_ = build_local_model(cfg, comm_.get());
  init_pools(cfg.cache);
}

engine::engine(std::unique_ptr<model> m, const cache_section& cache) : model_(std::move(m)) { init_pools(cache); }

void engine::init_pools(const cache_section& cache) {
  page_size_ = cache.page_size;
  pools_ = make_state_pools(*model_, cache, nullptr);
  pages_ = std::make_unique<kv_page_allocator>(pools_.num_pages);
  slots_ = std::make_unique<mamba_slot_allocator>(cache.max_requests);
}

engine::~engine() = default;

int32_t engine::open_request() {
  auto req_slot = pools_.req_to_token->alloc();
  if (!req_slot) throw capacity_error("no free request slot (cache.max_requests = " +
                                      std::to_string(pools_.req_to_token->max_requests()) + ")");
  auto mamba_slot = slots_->alloc();
  if (!mamba_slot) {
    pools_.req_to_token->free(*req_slot);
    throw capacity_error("no free mamba state slot");
  }
  pools_.recurrent->reset_slot(*mamba_slot);
  const int32_t handle = next_handle_++;
  requests_[handle] = request_state{*req_slot, *mamba_slot, 0, {}};
  return handle;
}

void engine::close_request(int32_t request) {
  auto it = requests_.find(request);
  if (it == requests_.end()) throw invalid_argument_error("unknown request " + std::to_string(request));
  pages_->free(it->second.pages);
  pools_.req_to_token->free(it->second.req_slot);
  slots_->free(it->second.mamba_slot);
  requests_.erase(it);
}

int32_t engine::cached_len(int32_t request) const { return requests_.at(request).cached; }

void engine::reserve_kv(request_state& r, int32_t new_len) {
  if (new_len > pools_.req_to_token->max_context())
    throw capacity_error("sequence length " + std::to_string(new_len) + " exceeds cache.max_context = " +
                         std::to_string(pools_.req_to_token->max_context()));
  const int32_t need = pages_needed(new_len, page_size_) - static_cast<int32_t>(r.pages.size());
  if (need <= 0) return;
  auto got = pages_->alloc(need);
  if (!got) throw capacity_error("out of KV pages (" + std::to_string(pages_->available()) + " free, " +
                                 std::to_string(need) + " needed)");
  int32_t* table = pools_.req_to_token->row(r.req_slot);
  for (int32_t page : *got) {
    const int32_t first = static_cast<int32_t>(r.pages.size()) * page_size_;
    for (int32_t o = 0; o < page_size_ && first + o < pools_.req_to_token->max_context(); ++o)
      table[first + o] = page * page_size_ + o;
    r.pages.push_back(page);
  }
}

host_tensor engine::step(forward_mode mode, const std::vector<step_row>& rows, const forward_options& opts) {
  forward_batch batch;
  batch.mode = mode;
  const bool scratch_step = writes_step_scratch(mode);  // TargetVerify, Draft: per-step states in scratch
  if (scratch_step) {
    for (const step_row& in : rows)
      batch.draft_len = std::max(batch.draft_len, static_cast<int32_t>(in.tokens.size()));
  }
  for (const step_row& in : rows) {
    auto it = requests_.find(in.request);
    if (it == requests_.end()) throw invalid_argument_error("unknown request " + std::to_string(in.request));
    request_state& r = it->second;
    reserve_kv(r, r.cached + static_cast<int32_t>(in.tokens.size()));
    batch_row row;
    row.request_id = in.request;
    row.req_slot = r.req_slot;
    row.mamba_slot = r.mamba_slot;
    row.prefix_len = r.cached;
    row.tokens = in.tokens;
    row.is_decode = mode == forward_mode::kMixed && in.tokens.size() == 1 && r.cached > 0;
    batch.rows.push_back(std::move(row));
  }
  const hybrid_metadata meta = build_hybrid_metadata(batch);
  if (scratch_step) pools_.ensure_steps(static_cast<int32_t>(batch.rows.size()), batch.draft_len, model_->exec().device);
  const model_context ctx = pools_.context();
  host_tensor logits = model_->forward(batch, meta, ctx, opts);
  if (scratch_step) return logits;  // nothing committed: the request's cache and state stay as they were
  for (const step_row& in : rows) requests_[in.request].cached += static_cast<int32_t>(in.tokens.size());
  return logits;
}

std::vector<int32_t> engine::generate_greedy(const std::vector<int32_t>& prompt, int32_t max_new_tokens,
                                             int32_t prefill_chunk, std::vector<std::vector<float>>* logits) {
  if (prompt.empty()) throw invalid_argument_error("prompt is empty");
  const int32_t req = open_request();
  std::vector<int32_t> out;
  try {
    const int64_t vocab = config().vocab_size;
    auto keep_rows = [&](const host_tensor& t) {
      if (!logits) return;
      for (int64_t i = 0; i < t.shape()[0]; ++i)
        logits->emplace_back(t.as<float>() + i * vocab, t.as<float>() + (i + 1) * vocab);
    };
    auto argmax_last = [&](const host_tensor& t) {
      int32_t id = 0;
      kernels::argmax_params a;
      a.logits = t.as<float>() + (t.shape()[0] - 1) * vocab;
      a.out = &id;
      a.rows = 1;
      a.vocab = vocab;
      a.stride = vocab;
      kernels::run_cpu(a);
      return id;
    };
    forward_options opts;
    opts.all_logits = logits != nullptr;
    const size_t chunk = prefill_chunk > 0 ? static_cast<size_t>(prefill_chunk) : prompt.size();
    host_tensor last;
    for (size_t at = 0; at < prompt.size(); at += chunk) {
      const size_t n = std::min(chunk, prompt.size() - at);
      last = step(forward_mode::kExtend,
                  {step_row{req, std::vector<int32_t>(prompt.begin() + static_cast<std::ptrdiff_t>(at),
                                                      prompt.begin() + static_cast<std::ptrdiff_t>(at + n))}},
                  opts);
      keep_rows(last);
    }
    for (int32_t i = 0; i < max_new_tokens; ++i) {
      out.push_back(argmax_last(last));
      // The last token is consumed only when its logits row is wanted.
      if (i + 1 == max_new_tokens && !logits) break;
      last = step(forward_mode::kDecode, {step_row{req, {out.back()}}}, opts);
      keep_rows(last);
    }
  } catch (...) {
    close_request(req);
    throw;
  }
  close_request(req);
  return out;
}

}  // namespace hyserve::worker
