#include "hyserve/worker/runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <vector>
#include <string>
#include <unistd.h>

#include "hyserve/common/error.h"
#include "hyserve/kernels/device.h"
#include "hyserve/kernels/run.h"
#include "hyserve/kernels/sampling.h"
#include "hyserve/worker/hybrid_metadata.h"

namespace hyserve::worker {

namespace {

// Checks a row's processing values the worker uses (a bad one fails the row alone).
void check_processing(const wire::logits_processing& lp, int64_t vocab) {
  kernels::logits_row_settings s;
  s.repetition_penalty = lp.repetition_penalty;
  s.presence_penalty = lp.presence_penalty;
  s.frequency_penalty = lp.frequency_penalty;
  kernels::check_logits_row_settings(s, 0, 0, 0, 0);
  for (size_t k = 0; k < lp.bias_ids.size(); ++k)
    if (lp.bias_ids[k] < 0 || lp.bias_ids[k] >= vocab || !std::isfinite(lp.bias_values[k]))
      throw invalid_argument_error("logit_bias: token " + std::to_string(lp.bias_ids[k]) + " (bias " +
                                   std::to_string(lp.bias_values[k]) + ") is outside the vocabulary [0, " +
                                   std::to_string(vocab) + ") or not finite");
  for (int32_t id : lp.min_tokens_mask)
    if (id < 0 || id >= vocab)
      throw invalid_argument_error("min_tokens: stop token " + std::to_string(id) + " is outside the vocabulary");
}

// Adds logits row i's processing (row pr, its output index counter) to the step's sampling.
void add_processing(const wire::plan_row& pr, uint64_t counter, bool feeds, step_sampling& sampling,
                    std::vector<kernels::logits_row_settings>& rows, size_t i) {
  const wire::logits_processing& lp = pr.processing;
  kernels::logits_row_settings& s = rows[i];
  s.repetition_penalty = lp.repetition_penalty;
  s.presence_penalty = lp.presence_penalty;
  s.frequency_penalty = lp.frequency_penalty;
  s.count_slot = lp.penalties() ? pr.req_slot : -1;
  s.bias_begin = static_cast<int32_t>(sampling.bias_ids.size());
  s.bias_count = static_cast<int32_t>(lp.bias_ids.size());
  sampling.bias_ids.insert(sampling.bias_ids.end(), lp.bias_ids.begin(), lp.bias_ids.end());
  sampling.bias_values.insert(sampling.bias_values.end(), lp.bias_values.begin(), lp.bias_values.end());
  s.mask_begin = static_cast<int32_t>(sampling.mask_ids.size());
  if (counter < static_cast<uint64_t>(lp.min_tokens)) {
    s.mask_count = static_cast<int32_t>(lp.min_tokens_mask.size());
    sampling.mask_ids.insert(sampling.mask_ids.end(), lp.min_tokens_mask.begin(), lp.min_tokens_mask.end());
  }
  s.top_n = lp.top_logprobs;
  sampling.max_top = std::max(sampling.max_top, lp.top_logprobs);
  // The row's sampled token is an output token (counted) once the row reaches the prompt's end.
  if (lp.penalties() && feeds &&
      pr.prefix_len + static_cast<int64_t>(pr.tokens.size()) >= static_cast<int64_t>(lp.prompt_len)) {
    sampling.count_slots.resize(rows.size(), -1);
    sampling.count_slots[i] = pr.req_slot;
  }
}

}  // namespace

runner::runner(std::unique_ptr<model> m, const cache_section& cache, collective* comm, fault_injection fault)
    : runner(std::move(m), nullptr, cache, comm, fault) {}

runner::runner(std::unique_ptr<model> m, std::unique_ptr<model> draft, const cache_section& cache, collective* comm,
               fault_injection fault)
    : model_(std::move(m)), comm_(comm), fault_(fault) {
  page_size_ = cache.page_size;
  max_requests_ = cache.max_requests;
  if (draft && draft->config().vocab_size != model_->config().vocab_size)
    throw config_error("speculative.draft_model: vocab_size " + std::to_string(draft->config().vocab_size) +
                       " differs from the target's " + std::to_string(model_->config().vocab_size));
  pools_ = make_state_pools(*model_, cache, comm_, draft.get());
  if (!draft) return;
  cache_section c = cache;
  c.num_pages = pools_.num_pages;  // the coordinator's page numbers index both KV pools
  draft_pools_ = make_state_pools(*draft, c, comm_);
  draft_ = std::move(draft);
}

runner::~runner() = default;

wire::hello runner::capacity(int32_t dp_rank) const {
  wire::hello h;
  h.dp_rank = dp_rank;
  h.tp_size = comm_ ? comm_->size() : 1;
  h.num_pages = pools_.num_pages;
  h.mamba_slots = max_requests_;
  h.max_requests = max_requests_;
  h.max_context = pools_.req_to_token->max_context();
  h.page_size = page_size_;
  h.vocab_size = model_->config().vocab_size;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  h.host = host;
  return h;
}

host_tensor runner::forward_logits(const wire::step_plan& plan, const forward_options& opts) {
  forward_batch batch;
  prepare(plan, batch);
  ++executed_;
  const hybrid_metadata meta = build_hybrid_metadata(batch);
  if (writes_step_scratch(batch.mode))
    pools_.ensure_steps(static_cast<int32_t>(batch.rows.size()), batch.draft_len, model_->exec().device);
  return model_->forward(batch, meta, pools_.context(), opts);
}

void runner::prepare(const wire::step_plan& plan, forward_batch& batch) {
  if (fault_.step == executed_ && (comm_ ? comm_->rank() : 0) == fault_.rank)
    throw error("injected worker failure in step " + std::to_string(executed_));
  batch.mode = forward_mode_from_byte(plan.mode);
  batch.draft_len = plan.draft_len;
  batch.is_tree = plan.is_tree;
  batch.extend_rows = plan.extend_rows;
  // Commits of the previous verify / draft steps come first: they finish the previous round.
  auto commit = [&](const std::vector<wire::commit_op>& ops, state_pools& pools, const model& m) {
    if (ops.empty()) return;
    std::vector<int32_t> slots, rows, steps;
    for (const wire::commit_op& c : ops) {
      slots.push_back(c.mamba_slot);
      rows.push_back(c.row);
      steps.push_back(c.accepted_step);
    }
    pools.commit_steps(slots, rows, steps, m.exec());
  };
  commit(plan.commits, pools_, *model_);
  if (!plan.draft_commits.empty() && !draft_)
    throw invalid_argument_error("draft_commits: this worker has no draft model (speculative.algorithm is not draft_model)");
  if (draft_) commit(plan.draft_commits, draft_pools_, *draft_);
  for (const wire::kv_move_op& mv : plan.kv_moves) pools_.move_kv(mv.req_slot, mv.from_pos, mv.to_pos, model_->exec());
  for (int32_t slot : plan.free_req_slots) {
    if (slot < 0 || slot >= max_requests_) throw invalid_argument_error("free_req_slots: bad slot " + std::to_string(slot));
    std::fill_n(pools_.req_to_token->row(slot), pools_.req_to_token->max_context(), -1);
    if (draft_) std::fill_n(draft_pools_.req_to_token->row(slot), draft_pools_.req_to_token->max_context(), -1);
  }
  const int32_t max_ctx = pools_.req_to_token->max_context();
  for (const wire::plan_row& r : plan.rows) {
    const bool padding = r.mamba_slot < 0;
    if (!padding) {
      if (r.req_slot < 0 || r.req_slot >= max_requests_)
        throw invalid_argument_error("request " + std::to_string(r.request_id) + ": req_slot " +
                                     std::to_string(r.req_slot) + " outside [0, " + std::to_string(max_requests_) + ")");
      if (r.mamba_slot >= pools_.request_slots)
        throw invalid_argument_error("request " + std::to_string(r.request_id) + ": mamba_slot " +
                                     std::to_string(r.mamba_slot) + " outside [0, " + std::to_string(pools_.request_slots) + ")");
      if (r.first_page_pos % page_size_ != 0)
        throw invalid_argument_error("first_page_pos " + std::to_string(r.first_page_pos) + " is not page aligned");
      int32_t* table = pools_.req_to_token->row(r.req_slot);
      int32_t* draft_table = draft_ ? draft_pools_.req_to_token->row(r.req_slot) : nullptr;
      for (size_t i = 0; i < r.new_pages.size(); ++i) {
        const int32_t page = r.new_pages[i];
        if (page < 0 || page >= pools_.num_pages) throw invalid_argument_error("page " + std::to_string(page) + " out of range");
        const int32_t first = r.first_page_pos + static_cast<int32_t>(i) * page_size_;
        for (int32_t o = 0; o < page_size_ && first + o < max_ctx; ++o) {
          table[first + o] = page * page_size_ + o;
          if (draft_table) draft_table[first + o] = page * page_size_ + o;
        }
      }
      if (r.prefix_len + static_cast<int32_t>(r.tokens.size()) > max_ctx)
        throw invalid_argument_error("request " + std::to_string(r.request_id) + " exceeds max_context");
    }
    if (draft_ && std::any_of(r.tokens.begin(), r.tokens.end(), [](int32_t t) { return t < 0; }))
      throw invalid_argument_error("request " + std::to_string(r.request_id) +
                                   ": token placeholders (overlapped steps) are not taken with a draft model");
    batch_row row;
    row.request_id = r.request_id;
    row.req_slot = padding ? -1 : r.req_slot;
    row.mamba_slot = r.mamba_slot;
    row.prefix_len = r.prefix_len;
    row.tokens = r.tokens;
    row.retrieve_next_token = r.retrieve_next_token;
    row.retrieve_next_sibling = r.retrieve_next_sibling;
    row.draft_step = r.draft_step;
    row.is_decode = r.is_decode;
    row.dense_attention = r.dense_attention;
    batch.rows.push_back(std::move(row));
  }
  for (const wire::plan_row& r : plan.rows)
    if (r.reset_state && r.mamba_slot >= 0) {
      pools_.recurrent->reset_slot(r.mamba_slot);
      if (draft_) draft_pools_.recurrent->reset_slot(r.mamba_slot);
    }
  // Prefix caching: rows that start from a checkpoint get it copied into their slot.
  pools_.copy_slots(plan.state_restores, model_->exec());
  if (draft_) draft_pools_.copy_slots(plan.state_restores, draft_->exec());
}

void runner::launch(const forward_batch& batch, flight& f) {
  const wire::step_plan& plan = f.plan;
  f.t_forward = std::chrono::steady_clock::now();
  wire::step_result& res = f.res;
  res.step_id = plan.step_id;
  const hybrid_metadata meta = build_hybrid_metadata(batch);
  bool on_draft = false;     // the step runs on the draft model
  bool mirror_draft = false;  // the draft model follows the target over the same tokens
  switch (batch.mode) {
    case forward_mode::kDraft:
    case forward_mode::kDraftExtend:
      on_draft = true;
      break;
    case forward_mode::kExtend:
    case forward_mode::kDecode:
    case forward_mode::kMixed:
      mirror_draft = draft_ != nullptr;
      break;
    case forward_mode::kIdle:
    case forward_mode::kTargetVerify:
      break;
  }
  if (on_draft && !draft_)
    throw invalid_argument_error(std::string(forward_mode_name(batch.mode)) +
                                 " step: this worker has no draft model (speculative.algorithm is not draft_model)");
  model& m = on_draft ? *draft_ : *model_;
  state_pools& pools = on_draft ? draft_pools_ : pools_;
  if (batch.mode == forward_mode::kTargetVerify || batch.mode == forward_mode::kDraft)
    pools.ensure_steps(static_cast<int32_t>(batch.rows.size()), batch.draft_len, m.exec().device);
  // Sampling settings of every logits row (one per row, or one per token of a verify row), in
  // row order; each draw's counter is its output index, so a token does not depend on the batch.
  step_sampling sampling;
  // Rows whose settings the sampler cannot use fail alone: they sample greedily in this step and
  // return no token, with the reason in res.error (the coordinator fails only their requests).
  std::vector<std::pair<size_t, std::string>>& bad_rows = f.bad_rows;
  const auto n_rows = static_cast<int64_t>(batch.rows.size());
  // Logits processing (model.h, step_sampling): rows of the target model that ask for it.
  // Filled (one entry per logits row) only when a row asks: other steps allocate nothing for it.
  std::vector<kernels::logits_row_settings> processing;
  bool any_processing = false;
  const int64_t vocab = model_->config().vocab_size;
  for (int64_t bi = 0; bi < n_rows; ++bi) {
    const auto b = static_cast<size_t>(bi);
    const wire::plan_row& pr = plan.rows[b];
    const int64_t begin = meta.logit_row_start[b], end = meta.logit_row_start[b + 1];
    for (int64_t i = begin; i < end; ++i) {
      kernels::sample_settings st;
      // Drafts are greedy: deterministic drafts keep the target's sampling distribution.
      st.temperature = on_draft ? 0.0f : pr.sample.temperature;
      st.top_k = pr.sample.top_k;
      st.top_p = pr.sample.top_p;
      st.seed = pr.sample.seed;
      st.counter = static_cast<uint64_t>(pr.output_index) + static_cast<uint64_t>(i - begin);
      const wire::logits_processing& lp = pr.processing;
      st.want_logprob = plan.want_logprobs || lp.logprobs || lp.top_logprobs > 0 ? 1 : 0;
      bool ok = true;
      try {
        kernels::check_sample_settings(st);
        if (lp.any()) check_processing(lp, vocab);
      } catch (const std::exception& e) {
        if (bad_rows.empty() || bad_rows.back().first != b) bad_rows.emplace_back(b, e.what());
        st.temperature = 0.0f;
        st.top_k = 0;
        st.top_p = 1.0f;
        ok = false;
      }
      if (ok && !on_draft && pr.mamba_slot >= 0 && (lp.changes_logits() || lp.top_logprobs > 0)) {
        const auto li = static_cast<size_t>(i - meta.logit_row_start[0]);
        if (processing.empty())
          processing.resize(static_cast<size_t>(meta.logit_row_start.back() - meta.logit_row_start[0]));
        add_processing(pr, st.counter, i + 1 == end, sampling, processing, li);
        any_processing = true;
        if (lp.penalties() && i == begin) {
          // The slot's counts start with the request's first chunk; prompt positions are marked.
          if (pr.reset_state) sampling.clear_slots.push_back(pr.req_slot);
          for (size_t j = 0; j < pr.tokens.size(); ++j)
            if (pr.prefix_len + static_cast<int64_t>(j) < lp.prompt_len && pr.tokens[j] >= 0) {
              sampling.seen.push_back(pr.req_slot);
              sampling.seen.push_back(pr.tokens[j]);
            }
        }
      }
      sampling.settings.push_back(st);
      // The row's last logits row feeds its slot: the next step's placeholder for this request.
      sampling.feed_slots.push_back(i + 1 == end ? pr.mamba_slot : -1);
    }
  }
  if (any_processing) {
    sampling.processing = std::move(processing);
    if (!sampling.count_slots.empty()) sampling.count_slots.resize(sampling.processing.size(), -1);
  }
  f.top_width = sampling.max_top;
  f.logit_row_start = meta.logit_row_start;
  f.request_ids.reserve(batch.rows.size());
  for (const batch_row& row : batch.rows) f.request_ids.push_back(row.request_id);
  // A draft tree's first position needs the runner-up tokens: its logits come to the host.
  f.want_logits = batch.mode == forward_mode::kDraft && plan.draft_width > 1 && !plan.want_logprobs;
  sparse_attention_stats attention;
  forward_options opts;
  opts.sparse_stats = &attention;
  if (!f.want_logits) {
    opts.sample = &sampling;
    opts.sampled = &f.sampled;
    if (sampling.max_top > 0) opts.top_logprobs = &f.top;
    // Only a step nothing else follows on the host may end later (complete()).
    if (!mirror_draft && (!comm_ || comm_->size() == 1)) opts.defer = &f.defer;
  }
  // Prefix caching: checkpoints of the state after this step, queued on the stream the forward
  // pass ran on, right behind it (a replayed decode graph has its own stream).
  const bool saves = !plan.state_saves.empty();
  if (saves && !on_draft)
    opts.after_forward = [&](const kernels::exec_context& ex) { pools_.copy_slots(plan.state_saves, ex); };
  f.d2h_before = kernels::device_to_host_bytes();
  f.logits = m.forward(batch, meta, pools.context(), opts);
  res.decode_rows = static_cast<int32_t>(attention.decode_rows);
  res.sparse_rows = static_cast<int32_t>(attention.sparse_rows);
  res.pages_read = attention.pages_read;
  if (mirror_draft) {
    forward_options mirror;
    if (saves)
      mirror.after_forward = [&](const kernels::exec_context& ex) { draft_pools_.copy_slots(plan.state_saves, ex); };
    (void)draft_->forward(batch, meta, draft_pools_.context(), mirror);
  }
  if (draft_ && batch.mode == forward_mode::kTargetVerify && batch.extend_rows > 0) {
    // The prefill chunks riding in the verify step run on the draft model as an Extend step,
    // so its cache covers the same tokens.
    forward_batch ext;
    ext.mode = forward_mode::kExtend;
    ext.rows.assign(batch.rows.end() - batch.extend_rows, batch.rows.end());
    (void)draft_->forward(ext, build_hybrid_metadata(ext), draft_pools_.context(), forward_options{});
  }
  if (saves && on_draft) {
    // A step of the draft model leaves the target's state as it was; both are saved as they are.
    pools_.copy_slots(plan.state_saves, model_->exec());
    draft_pools_.copy_slots(plan.state_saves, draft_->exec());
  } else if (saves && draft_ && !mirror_draft) {
    draft_pools_.copy_slots(plan.state_saves, draft_->exec());
  }
  f.t_sample = std::chrono::steady_clock::now();
  if (f.want_logits) {
    kernels::sample_rows_params p;
    f.sampled.resize(sampling.settings.size());
    p.logits = f.logits.as<float>();
    p.settings = sampling.settings.data();
    p.out = f.sampled.data();
    p.rows = static_cast<int64_t>(f.sampled.size());
    p.vocab = model_->config().vocab_size;
    p.stride = p.vocab;
    kernels::run(p, kernels::exec_context{});
  }
}

void runner::complete(flight& f) {
  if (f.defer) f.defer.finish();
  const wire::step_plan& plan = f.plan;
  wire::step_result& res = f.res;
  last_d2h_bytes_ = kernels::device_to_host_bytes() - f.d2h_before;
  const int64_t vocab = model_->config().vocab_size;
  const size_t n_rows = f.request_ids.size();
  HYSERVE_CHECK(f.logit_row_start.size() == n_rows + 1, "runner: logits rows per row missing");
  const int64_t first_logit = f.logit_row_start[0];
  HYSERVE_CHECK(f.sampled.size() == static_cast<size_t>(f.logit_row_start.back() - first_logit),
                "runner: " + std::to_string(f.sampled.size()) + " sampled tokens for " +
                    std::to_string(f.logit_row_start.back() - first_logit) + " logits rows");
  res.rows.resize(n_rows);
  for (size_t b = 0; b < n_rows; ++b) {
    wire::row_result& rr = res.rows[b];
    rr.request_id = f.request_ids[b];
    const wire::plan_row& pr = plan.rows[b];
    const auto first = static_cast<size_t>(f.logit_row_start[b]);
    const auto per_row = static_cast<size_t>(f.logit_row_start[b + 1]) - first;
    const wire::logits_processing& lp = pr.processing;
    // Logprobs only for rows that asked (or a plan that asks for every row).
    const bool want_logprob = plan.want_logprobs || lp.logprobs || lp.top_logprobs > 0;
    const bool want_top = lp.top_logprobs > 0 && f.top_width > 0 && !f.top.empty();
    if (want_top) rr.top_n = lp.top_logprobs;
    for (size_t j = 0; j < per_row; ++j) {
      const size_t li = first + j - static_cast<size_t>(first_logit);
      const kernels::sample_output& so = f.sampled[li];
      rr.tokens.push_back(so.token);
      if (want_logprob) rr.logprobs.push_back(so.logprob);
      if (want_top)
        for (int32_t k = 0; k < lp.top_logprobs; ++k) {
          const kernels::top_logprob& t = f.top[li * static_cast<size_t>(f.top_width) + static_cast<size_t>(k)];
          rr.top_ids.push_back(t.token);
          rr.top_logprobs.push_back(t.logprob);
        }
      // A draft tree's first position: the next best tokens after the greedy one, best first
      // (ties to the lower id), as sibling drafts.
      if (f.want_logits && pr.draft_step == 0 && pr.mamba_slot >= 0) {
        const float* row = f.logits.as<float>() + static_cast<int64_t>(first + j - static_cast<size_t>(first_logit)) * vocab;
        std::vector<int32_t> ids;
        for (int32_t v = 0; v < static_cast<int32_t>(vocab); ++v)
          if (v != so.token) ids.push_back(v);
        const auto n = static_cast<size_t>(std::min<int64_t>(plan.draft_width - 1, static_cast<int64_t>(ids.size())));
        std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end(),
                          [&](int32_t a, int32_t c) { return row[a] > row[c] || (row[a] == row[c] && a < c); });
        rr.tokens.insert(rr.tokens.end(), ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n));
      }
    }
  }

  for (const auto& [b, why] : f.bad_rows) {
    res.rows[b].tokens.clear();
    res.rows[b].logprobs.clear();
    res.rows[b].top_n = 0;
    res.rows[b].top_ids.clear();
    res.rows[b].top_logprobs.clear();
    res.error += (res.error.empty() ? "" : "; ") + std::string("request ") + std::to_string(plan.rows[b].request_id) +
                 ": " + why;
  }

  if (plan.mode < phases_.size()) {
    phase_times& ph = phases_[plan.mode];
    ph.forward_s += std::chrono::duration<double>(f.t_sample - f.t_forward).count();
    ph.sample_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - f.t_sample).count();
  }
}

wire::step_result runner::execute(const wire::step_plan& plan) {
  submit(plan);
  return finish();
}

bool runner::can_submit_behind(const wire::step_plan& next) const {
  if (flights_.size() != 1 || !flights_.front().defer) return false;
  if (draft_ || (comm_ && comm_->size() > 1)) return false;
  if (forward_mode_from_byte(next.mode) != forward_mode::kDecode) return false;
  // Its preparation may only touch the host (page tables): no device-side state changes that
  // the step in flight could still be reading. Prefix-cache saves may ride along: they are
  // queued on the step's own stream behind its forward pass (forward_options::after_forward),
  // index arrays included, and write free
  // checkpoint slots, which only restores read, and a plan with restores is not queued behind.
  if (!next.commits.empty() || !next.draft_commits.empty() || !next.kv_moves.empty() ||
      !next.state_restores.empty())
    return false;
  return std::none_of(next.rows.begin(), next.rows.end(), [](const wire::plan_row& r) { return r.reset_state; });
}

bool runner::oldest_ready() const {
  if (flights_.empty()) return true;
  const flight& f = flights_.front();
  if (!f.defer) return true;
  try {
    return f.defer.ready();
  } catch (const std::exception&) {
    return true;  // finish() reports the failure
  }
}

void runner::submit(wire::step_plan plan) {
  flight& f = flights_.emplace_back();
  f.plan = std::move(plan);
  f.started = std::chrono::steady_clock::now();
  const wire::step_plan& p = f.plan;
  forward_batch batch;
  std::string& failure = f.failure;
  try {
    prepare(p, batch);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  ++executed_;
  if (p.mode < phases_.size()) {
    ++phases_[p.mode].steps;
    phases_[p.mode].prepare_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - f.started).count();
  }
  // Agree on the prepare phase before the forward pass enters any collective. The lowest failing
  // rank's message is broadcast so the coordinator sees the real cause.
  if (comm_ && comm_->size() > 1) {
    float first_bad = failure.empty() ? static_cast<float>(comm_->size()) : static_cast<float>(comm_->rank());
    std::vector<float> ranks(static_cast<size_t>(comm_->size()));
    comm_->all_gather(&first_bad, ranks.data(), 1);
    const int root = static_cast<int>(*std::min_element(ranks.begin(), ranks.end()));
    if (root < comm_->size()) {
      uint64_t len = comm_->rank() == root ? failure.size() : 0;
      comm_->broadcast(&len, sizeof(len), root);
      std::string msg(len, '\0');
      if (comm_->rank() == root) msg = failure;
      comm_->broadcast(msg.data(), len, root);
      failure = "tp rank " + std::to_string(root) + ": " + msg;
    }
  }
  if (!failure.empty()) std::fprintf(stderr, "[worker] step %llu failed: %s\n",
                                     static_cast<unsigned long long>(p.step_id), failure.c_str());
  if (failure.empty()) {
    try {
      launch(batch, f);
    } catch (const std::exception& e) {
      failure = e.what();
      f.defer = deferred_step{};
    }
  }
}

wire::step_result runner::finish() {
  HYSERVE_CHECK(!flights_.empty(), "runner::finish: no step in flight");
  flight& f = flights_.front();  // completed in place: its device work writes f.sampled
  if (f.failure.empty()) {
    try {
      complete(f);
    } catch (const std::exception& e) {
      f.failure = e.what();
    }
  }
  wire::step_result res = std::move(f.res);
  if (!f.failure.empty()) {
    res = wire::step_result{};
    res.ok = false;
    res.error = f.failure;
  }
  res.step_id = f.plan.step_id;
  res.step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - f.started).count();
  flights_.pop_front();
  return res;
}

}  // namespace hyserve::worker
