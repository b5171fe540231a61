#include "hyserve/worker/engine.h"

#include <algorithm>
#include <string>
#include <utility>

#include "hyserve/common/error.h"
#include "hyserve/kernels/device.h"
#include "hyserve/kernels/sampling.h"
#include "hyserve/common/forward_mode.h"
#include "hyserve/common/wire.h"

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
  init(build_local_model(cfg, comm_.get()), cfg.cache);
}

engine::engine(std::unique_ptr<model> m, const cache_section& cache) { init(std::move(m), cache); }

void engine::init(std::unique_ptr<model> m, const cache_section& cache) {
  page_size_ = cache.page_size;
  runner_ = std::make_unique<runner>(std::move(m), cache, comm_.get());
  const wire::hello h = runner_->capacity(0);
  max_context_ = h.max_context;
  pages_ = std::make_unique<index_pool>("kv page", h.num_pages);
  req_slots_ = std::make_unique<index_pool>("request slot", h.max_requests);
  state_slots_ = std::make_unique<index_pool>("mamba slot", h.mamba_slots);
}

engine::~engine() = default;

int32_t engine::open_request() {
  auto req_slot = req_slots_->alloc();
  if (!req_slot) throw capacity_error("no free request slot (cache.max_requests = " +
                                      std::to_string(req_slots_->size()) + ")");
  auto mamba_slot = state_slots_->alloc();
  if (!mamba_slot) {
    req_slots_->free(*req_slot);
    throw capacity_error("no free mamba state slot");
  }
  const int32_t handle = next_handle_++;
  requests_[handle] = request_state{*req_slot, *mamba_slot, 0, {}, true};
  return handle;
}

void engine::close_request(int32_t request) {
  auto it = requests_.find(request);
  if (it == requests_.end()) throw invalid_argument_error("unknown request " + std::to_string(request));
  pages_->free(it->second.pages);
  req_slots_->free(it->second.req_slot);
  released_req_slots_.push_back(it->second.req_slot);
  state_slots_->free(it->second.mamba_slot);
  requests_.erase(it);
}

int32_t engine::cached_len(int32_t request) const { return requests_.at(request).cached; }

std::vector<int32_t> engine::reserve_kv(request_state& r, int32_t new_len) {
  if (new_len > max_context_)
    throw capacity_error("sequence length " + std::to_string(new_len) + " exceeds cache.max_context = " +
                         std::to_string(max_context_));
  const int32_t need = pages_needed(new_len, page_size_) - static_cast<int32_t>(r.pages.size());
  if (need <= 0) return {};
  auto got = pages_->alloc(need);
  if (!got) throw capacity_error("out of KV pages (" + std::to_string(pages_->available()) + " free, " +
                                 std::to_string(need) + " needed)");
  r.pages.insert(r.pages.end(), got->begin(), got->end());
  return *got;
}

host_tensor engine::step(forward_mode mode, const std::vector<step_row>& rows, const forward_options& opts) {
  wire::step_plan plan;
  plan.step_id = next_step_++;
  plan.mode = mode_byte(mode);
  const bool scratch_step = writes_step_scratch(mode);  // TargetVerify, Draft: per-step states in scratch
  if (scratch_step) {
    for (const step_row& in : rows)
      plan.draft_len = std::max(plan.draft_len, static_cast<int32_t>(in.tokens.size()));
  }
  // Pages added for this step: given back if it fails, so the next step sends them again.
  std::vector<std::pair<request_state*, size_t>> added;
  host_tensor logits;
  try {
    for (const step_row& in : rows) {
      auto it = requests_.find(in.request);
      if (it == requests_.end()) throw invalid_argument_error("unknown request " + std::to_string(in.request));
      request_state& r = it->second;
      wire::plan_row row;
      row.first_page_pos = static_cast<int32_t>(r.pages.size()) * page_size_;
      row.new_pages = reserve_kv(r, r.cached + static_cast<int32_t>(in.tokens.size()));
      added.emplace_back(&r, row.new_pages.size());
      row.request_id = in.request;
      row.req_slot = r.req_slot;
      row.mamba_slot = r.mamba_slot;
      row.prefix_len = r.cached;
      row.tokens = in.tokens;
      row.is_decode = mode == forward_mode::kMixed && in.tokens.size() == 1 && r.cached > 0;
      row.reset_state = r.fresh;
      plan.rows.push_back(std::move(row));
    }
    plan.free_req_slots = released_req_slots_;
    logits = runner_->forward_logits(plan, opts);
  } catch (...) {
    for (auto it = added.rbegin(); it != added.rend(); ++it) {
      std::vector<int32_t>& pages = it->first->pages;
      const std::vector<int32_t> back(pages.end() - static_cast<std::ptrdiff_t>(it->second), pages.end());
      pages_->free(back);
      pages.resize(pages.size() - it->second);
    }
    throw;
  }
  released_req_slots_.clear();
  for (const step_row& in : rows) requests_[in.request].fresh = false;
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
