#include "coordinator/scheduler.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <thread>

#include "hyserve/common/error.h"
#include "hyserve/common/forward_mode.h"

namespace hyserve::coordinator {

namespace {

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

scheduler::scheduler(const service_config& cfg, const model_config& mc, std::vector<wire::hello> groups,
                     transport& link)
    : cfg_(cfg), link_(link), hellos_(std::move(groups)) {
  if (!cfg.scheduler.step_trace.empty()) trace_.open(cfg.scheduler.step_trace + ".coordinator.csv");
  info_.model_id = cfg.model.synthetic ? "synthetic-bamba" : cfg.model.path;
  info_.vocab_size = mc.vocab_size;
  info_.eos_token_id = mc.eos_token_id;
  info_.dp = cfg.parallel.dp;
  info_.tp = cfg.parallel.tp;
  info_.max_context = cfg.cache.max_context;
  for (const wire::hello& h : hellos_) info_.max_context = std::min(info_.max_context, h.max_context);
  groups_.reserve(hellos_.size());
  for (const wire::hello& h : hellos_)
    groups_.emplace_back(memory_book(h, prefix_enabled() ? cfg.cache.prefix.state_slots : 0),
                         speculative_round(cfg, h.page_size, info_.max_context));
}

// The scheduler as group g's speculative rounds see it.
class scheduler::group_host final : public round_host {
 public:
  group_host(scheduler& s, int g) : s_(s), g_(g) {}
  request_state* find(uint64_t id) override {
    auto it = s_.requests_.find(id);
    return it == s_.requests_.end() ? nullptr : &it->second;
  }
  wire::plan_row base_row(request_state& r) override { return s_.base_row(r); }
  wire::plan_row prefill_row(request_state& r, int32_t n) override { return s_.prefill_row(r, n); }
  int32_t next_chunk(const request_state& r, int32_t budget) override { return s_.next_chunk(r, budget); }
  bool emit(request_state& r, const std::vector<int32_t>& tokens, const wire::row_result* row) override {
    return s_.emit(r, tokens, row);
  }
  bool row_failed(uint64_t id, const wire::step_result& res, size_t row) override {
    return s_.row_failed(g_, id, res, row);
  }
  void on_spec(int64_t drafted, int64_t accepted) override {
    if (s_.observer_.on_spec) s_.observer_.on_spec(drafted, accepted);
  }

 private:
  scheduler& s_;
  int g_;
};

const spec::step_costs& scheduler::step_times(int g) const {
  HYSERVE_CHECK(g >= 0 && g < static_cast<int>(groups_.size()), "step_times: no group " + std::to_string(g));
  return groups_[static_cast<size_t>(g)].round.costs();
}

void scheduler::seed_step_times(int g, const spec::step_costs& costs) {
  HYSERVE_CHECK(g >= 0 && g < static_cast<int>(groups_.size()), "seed_step_times: no group " + std::to_string(g));
  groups_[static_cast<size_t>(g)].round.seed_costs(costs);
}

int32_t scheduler::pages_for(const request_state& r) const {
  const int32_t ps = hellos_.front().page_size;
  int64_t len = static_cast<int64_t>(r.req.input_ids.size()) + r.req.sampling.max_new_tokens;
  // Verify steps write up to num_draft_tokens positions past the last accepted token.
  if (spec_enabled()) len = std::min<int64_t>(len + cfg_.speculative.num_draft_tokens, info_.max_context);
  return static_cast<int32_t>((len + ps - 1) / ps);
}

submit_result scheduler::submit(generate_request req) {
  submit_result res;
  if (draining_.load() || !healthy_.load()) {
    res.status = submit_status::kShuttingDown;
    res.message = healthy_.load() ? "the server is shutting down" : "the server is unhealthy";
    return res;
  }
  const int64_t need = static_cast<int64_t>(req.input_ids.size()) + req.sampling.max_new_tokens;
  if (need > info_.max_context) {
    res.status = submit_status::kTooLong;
    res.message = "prompt (" + std::to_string(req.input_ids.size()) + " tokens) + max_new_tokens (" +
                  std::to_string(req.sampling.max_new_tokens) + ") = " + std::to_string(need) +
                  " exceeds the context limit of " + std::to_string(info_.max_context);
    return res;
  }
  std::lock_guard<std::mutex> lock(inbox_mu_);
  if (queued_.load() >= cfg_.scheduler.max_queue) {
    res.status = submit_status::kQueueFull;
    res.message = "the request queue is full (scheduler.max_queue = " + std::to_string(cfg_.scheduler.max_queue) + ")";
    return res;
  }
  req.id = next_id_++;
  res.id = req.id;
  if (req.sink) {
    std::lock_guard<std::mutex> sinks_lock(sinks_mu_);
    sinks_[req.id] = req.sink;
  }
  ++queued_;
  inbox_.push_back(std::move(req));
  return res;
}

void scheduler::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(inbox_mu_);
  cancel_inbox_.push_back(id);
}

void scheduler::take_submissions() {
  std::deque<generate_request> in;
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    in.swap(inbox_);
  }
  for (generate_request& req : in) {
    const uint64_t id = req.id;
    request_state r;
    if (!req.sampling.seed) req.sampling.seed = id * 0x9e3779b97f4a7c15ull;
    r.req = std::move(req);
    if (spec_enabled()) r.spec.budget.emplace(cfg_.speculative.num_draft_tokens, cfg_.speculative.min_accept_rate);
    requests_.emplace(id, std::move(r));
    waiting_.push_back(id);
  }
}

void scheduler::take_cancellations() {
  std::vector<uint64_t> ids;
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    ids.swap(cancel_inbox_);
  }
  for (uint64_t id : ids) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;  // already finished
    if (observer_.on_cancel) observer_.on_cancel();
    if (it->second.in_steps > 0) {
      it->second.cancelled = true;  // finished when its step's result arrives
    } else {
      finish(id, finish_reason::kAbort, std::nullopt);
    }
  }
}

void scheduler::release(request_state& r) {
  if (r.group < 0) return;
  group_state& g = groups_[static_cast<size_t>(r.group)];
  // A decode checkpoint the tree did not take (the request failed or was cancelled, or the node
  // had one): no step writes it any more, so its slot is free at once.
  if (r.gen_ckpt_slot >= 0) free_decode_slot(g, r.gen_ckpt_slot);
  r.gen_ckpt_slot = -1;
  held_resources h{r.req_slot, r.mamba_slot, {}, std::move(r.held_nodes), r.pinned_node};
  r.pinned_node = -1;
  // Pages the prefix tree owns stay with it (the request lets go of their nodes).
  for (size_t i = 0; i < r.pages.size(); ++i)
    if (i >= r.page_shared.size() || !r.page_shared[i]) h.pages.push_back(r.pages[i]);
  r.held_nodes.clear();
  r.page_shared.clear();
  // A step in flight may still write the request's slot and pages (an overlapped step sent
  // before the request finished): they are freed once the last such step has come back.
  if (r.in_steps > 0 && g.in_flight()) g.flights.back().deferred.push_back(std::move(h));
  else free_resources(g, h);
  g.running.erase(std::remove(g.running.begin(), g.running.end(), r.req.id), g.running.end());
  r.pages.clear();
  r.group = -1;
}

void scheduler::free_resources(group_state& g, held_resources& h) {
  g.mem.release(h.req_slot, h.mamba_slot, h.pages);
  h.pages.clear();
  if (g.mem.tree && !h.nodes.empty()) g.mem.tree->release(h.nodes, ++tick_);
  if (g.mem.tree && h.pinned_node >= 0) g.mem.tree->unpin_checkpoint(h.pinned_node);
  h.pinned_node = -1;
  h.nodes.clear();
}

void scheduler::finish(uint64_t id, finish_reason reason, std::optional<std::string> err) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  request_state& r = it->second;
  if (r.group < 0) {  // still waiting
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
    --queued_;
  }
  // Only a request that ended normally puts its answer on the tree (its fed tokens are final).
  if (!err && reason != finish_reason::kAbort) insert_generated(r);
  release(r);
  {
    std::lock_guard<std::mutex> sinks_lock(sinks_mu_);
    sinks_.erase(id);
  }
  request_event ev;
  ev.finished = true;
  ev.reason = reason;
  ev.error = std::move(err);
  ev.metrics.prompt_tokens = static_cast<int32_t>(r.req.input_ids.size());
  ev.metrics.completion_tokens = static_cast<int32_t>(r.output.size());
  ev.metrics.latency_ms = ms_since(r.req.arrival);
  ev.metrics.spec_drafted = r.spec.drafted;
  ev.metrics.spec_accepted = r.spec.accepted;
  ev.metrics.cached_tokens = r.cached_tokens;
  if (!r.output.empty())
    ev.metrics.ttft_ms = std::chrono::duration<double, std::milli>(r.first_token - r.req.arrival).count();
  flush_events();  // this request's earlier events first (and every other's: finishing is rare)
  if (r.req.sink) r.req.sink(std::move(ev));
  requests_.erase(it);
}

void scheduler::flush_events() {
  if (outbox_.empty()) return;
  trace_.add("flush", 0, static_cast<int64_t>(outbox_.size()));
  {
    const event_batch batch;  // one wake-up of the HTTP side for all of them
    for (pending_event& p : outbox_) {
      const auto it = requests_.find(p.id);
      if (it != requests_.end() && it->second.req.sink) it->second.req.sink(std::move(p.event));
    }
  }
  outbox_.clear();
  trace_.add("flushed", 0);
}

void scheduler::admit() {
  while (!waiting_.empty()) {
    request_state& r = requests_.at(waiting_.front());
    const int32_t need = pages_for(r);
    int best = -1;
    prefix_tree::match best_match;
    const auto prompt_len = static_cast<int32_t>(r.req.input_ids.size());
    for (size_t g = 0; g < groups_.size(); ++g) {
      const group_state& gs = groups_[g];
      if (!gs.mem.has_request_slots()) continue;
      if (static_cast<int32_t>(gs.running.size()) >= cfg_.scheduler.max_running) continue;
      // Prefix caching: the deepest cached node with a checkpoint (the last prompt token is
      // always prefilled); its pages need no new ones, and unheld tree pages can be evicted. A
      // request with penalties prefills its whole prompt: the worker starts its token counts
      // with the first chunk from a zeroed state and marks the prompt tokens that chunk carries.
      prefix_tree::match m;
      int32_t avail = gs.mem.pages.available();
      if (gs.mem.tree) {
        if (!r.req.sampling.penalties()) m = gs.mem.tree->lookup(r.req.input_ids, prompt_len - 1 - invariant_tail());
        avail += gs.mem.tree->unheld() - m.tokens();
      }
      if (avail < need - m.tokens()) continue;
      if (best < 0 || m.tokens() > best_match.tokens() ||
          (m.tokens() == best_match.tokens() && gs.running.size() < groups_[static_cast<size_t>(best)].running.size())) {
        best = static_cast<int>(g);
        best_match = std::move(m);
      }
    }
    if (best >= 0 && groups_[static_cast<size_t>(best)].mem.tree) {
      // Under memory pressure admission evicts before it waits (the match is held first).
      group_state& gs = groups_[static_cast<size_t>(best)];
      gs.mem.tree->hold(best_match.nodes);
      if (!evict_for(gs, need - best_match.tokens(), 0)) {
        gs.mem.tree->release(best_match.nodes, ++tick_);
        return;
      }
    }
    if (best < 0) {
      // FCFS: the head waits for capacity. One that can never fit is rejected instead.
      const int32_t total = hellos_.front().num_pages;
      if (need > total)
        finish(r.req.id, finish_reason::kAbort,
               "request needs " + std::to_string(need) + " KV pages but a group has only " + std::to_string(total));
      else
        return;
      continue;
    }
    group_state& gs = groups_[static_cast<size_t>(best)];
    r.group = best;
    r.admit_tick = ++tick_;
    const memory_book::request_slots slots = *gs.mem.take_request_slots();
    r.req_slot = slots.req;
    r.mamba_slot = slots.mamba;
    r.pages = best_match.pages;
    r.page_shared.assign(r.pages.size(), 1);
    r.held_nodes = best_match.nodes;
    if (best_match.tokens() > 0) {
      r.cached_tokens = best_match.tokens() * hellos_.front().page_size;
      r.consumed = r.cached_tokens;
      r.restore_from = best_match.checkpoint;
      r.pinned_node = best_match.nodes.back();
      gs.mem.tree->pin_checkpoint(r.pinned_node, ++tick_);
    }
    if (gs.mem.tree && observer_.on_prefix_lookup) observer_.on_prefix_lookup(prompt_len, r.cached_tokens);
    const std::optional<std::vector<int32_t>> fresh = gs.mem.pages.alloc(need - best_match.tokens());
    HYSERVE_CHECK(fresh, "scheduler: admission found pages that are not free");
    r.pages.insert(r.pages.end(), fresh->begin(), fresh->end());
    r.page_shared.resize(r.pages.size(), 0);
    gs.running.push_back(r.req.id);
    waiting_.pop_front();
    --queued_;
    if (r.req.sampling.max_new_tokens == 0) finish(r.req.id, finish_reason::kLength, std::nullopt);
  }
}

wire::plan_row scheduler::base_row(request_state& r) const {
  wire::plan_row row;
  row.request_id = static_cast<int64_t>(r.req.id);
  row.req_slot = r.req_slot;
  row.mamba_slot = r.mamba_slot;
  row.prefix_len = r.fed();
  row.sample.temperature = r.req.sampling.temperature;
  row.sample.top_k = r.req.sampling.top_k > 0 ? r.req.sampling.top_k : 0;
  row.sample.top_p = r.req.sampling.top_p;
  row.sample.seed = *r.req.sampling.seed;
  row.output_index = static_cast<int32_t>(r.output.size()) + r.flight_outputs;
  return row;
}

void scheduler::send_plan(int g, built_step step) {
  group_state& gs = groups_[static_cast<size_t>(g)];
  wire::step_plan& plan = step.plan;
  plan.step_id = next_step_++;
  plan.free_req_slots = gs.mem.take_released_request_slots();
  gs.round.move_ops_into(plan);
  plan.state_restores = std::move(gs.restores);
  gs.restores.clear();
  plan.state_saves = std::move(gs.saves);
  gs.saves.clear();
  group_state::flight f;
  f.step_id = plan.step_id;
  f.mode = step.mode;
  f.rows = std::move(step.rows);
  f.rows.emits.resize(f.rows.ids.size(), 0);
  f.sent_at = clock::now();
  ++loop_stats_.plans;
  if (gs.last_result_at > gs.last_plan_at) {
    // A plan that follows a result (the time the device may have waited for it).
    ++loop_stats_.gaps;
    loop_stats_.gap_s += std::chrono::duration<double>(f.sent_at - gs.last_result_at).count();
  }
  gs.last_plan_at = f.sent_at;
  f.saves = std::move(gs.step_saves);
  gs.step_saves.clear();
  if (!gs.flights.empty() && observer_.on_overlap) observer_.on_overlap(static_cast<int64_t>(f.rows.ids.size()));
  gs.flights.push_back(std::move(f));
  link_.send_plan(g, wire::encode(plan));
  trace_.add("plan", plan.step_id, g, static_cast<int64_t>(plan.rows.size()));
}

bool scheduler::may_send(int g) const {
  const group_state& gs = groups_[static_cast<size_t>(g)];
  if (gs.flights.empty()) return true;
  // Overlap: up to scheduler.overlap_steps plain steps in flight (speculative rounds run strictly:
  // each of their steps depends on the previous result).
  return cfg_.scheduler.overlap && !spec_enabled() &&
         gs.flights.size() < static_cast<size_t>(cfg_.scheduler.overlap_steps) && !gs.round.active() &&
         gs.flights.back().rows.kind == step_kind::kPlain;
}

void scheduler::schedule_group(int g) {
  group_state& gs = groups_[static_cast<size_t>(g)];
  if (!may_send(g)) return;
  group_host host(*this, g);
  if (gs.round.active()) {
    send_plan(g, gs.round.next_step(host));
    return;
  }
  if (gs.running.empty()) return;
  if (spec_enabled()) {
    if (std::optional<built_step> step = gs.round.catch_up(host, gs.running)) {
      send_plan(g, std::move(*step));
      return;
    }
  }
  std::vector<uint64_t> decode_ids, prefill_ids;
  for (uint64_t id : gs.running) {
    const request_state& r = requests_.at(id);
    if (r.flight_outputs > 0) {
      // Behind a step in flight (overlap): a request that step will finish by length, or one
      // cancelled, gets no row; one that stops on a sampled stop token costs one wasted row.
      if (r.cancelled || static_cast<int32_t>(r.output.size()) + r.flight_outputs >= r.req.sampling.max_new_tokens ||
          r.known_len() >= info_.max_context)
        continue;
    }
    if (r.cancelled && r.in_steps > 0) continue;
    // (A prefix-cache hit that left only the last prompt token to run is a decode row once its
    // first step has sent its pages.)
    (r.known_len() - r.fed() == 1 && r.fed() > 0 && r.pages_sent ? decode_ids : prefill_ids).push_back(id);
  }
  if (decode_ids.empty() && prefill_ids.empty()) return;
  // Speculative rounds carry the prefill chunks of the other requests in their verify step;
  // a round without drafts is an ordinary Decode or Mixed step.
  // A request with logits processing or logprobs does not speculate (its verify rows would need
  // the processing and counts at every draft position): while one is decoding, the group's
  // steps are plain (the others decode without drafts meanwhile; outputs are unchanged).
  const bool processing = std::any_of(decode_ids.begin(), decode_ids.end(), [&](uint64_t id) {
    return requests_.at(id).req.sampling.needs_processing();
  });
  if (spec_enabled() && !processing && !decode_ids.empty() && gs.round.may_start(!prefill_ids.empty())) {
    if (std::optional<built_step> step = gs.round.start(host, decode_ids, prefill_ids)) {
      send_plan(g, std::move(*step));
      return;
    }
    schedule_plain(g, decode_ids, prefill_ids);
    return;
  }
  gs.round.prefill_served();
  schedule_plain(g, decode_ids, prefill_ids);
}

void scheduler::schedule_plain(int g, const std::vector<uint64_t>& decode_ids, const std::vector<uint64_t>& prefill_ids) {
  built_step step;
  wire::step_plan& plan = step.plan;
  int32_t budget = cfg_.scheduler.max_batch_tokens;
  auto add_row = [&](request_state& r, int32_t n, bool is_decode) {
    wire::plan_row row = prefill_row(r, n);
    row.is_decode = is_decode;
    plan.rows.push_back(std::move(row));
    // The row emits its sampled token when it reaches the end of what is known (a decode row,
    // or the prompt's last chunk).
    const bool emits = r.fed() + n == r.known_len();
    step.rows.add(r.req.id, n, emits);
    r.flight_consumed += n;
    if (emits) ++r.flight_outputs;
    budget -= n;
  };
  for (uint64_t id : decode_ids) {
    if (budget <= 0) break;
    add_row(requests_.at(id), 1, true);
  }
  const size_t n_decode = plan.rows.size();
  for (uint64_t id : prefill_ids) {
    if (budget <= 0) break;
    request_state& r = requests_.at(id);
    const int32_t n = next_chunk(r, budget);
    if (n <= 0) continue;  // its next chunk does not fit this step (a later one may)
    add_row(r, n, false);
  }
  if (plan.rows.empty()) return;
  const bool has_prefill = plan.rows.size() > n_decode;
  const bool has_decode = n_decode > 0;
  step.mode = "decode";
  if (has_prefill && has_decode) {
    plan.mode = mode_byte(forward_mode::kMixed);
    step.mode = "mixed";
  } else if (has_prefill) {
    plan.mode = mode_byte(forward_mode::kExtend);
    step.mode = "extend";
    for (auto& row : plan.rows) row.is_decode = false;
  } else {
    plan.mode = mode_byte(forward_mode::kDecode);
    for (auto& row : plan.rows) row.is_decode = false;
  }
  step.rows.cost_kind = plan.mode == mode_byte(forward_mode::kDecode) ? speculative_round::kCostDecode : -1;
  step.rows.cost_rows = static_cast<int32_t>(plan.rows.size());
  step.rows.cost_width = 1;
  send_plan(g, std::move(step));
}

int32_t scheduler::next_chunk(const request_state& r, int32_t budget) const {
  const int32_t c = std::min(cfg_.scheduler.chunked_prefill, cfg_.scheduler.max_batch_tokens);
  const int32_t f = r.fed();
  const int32_t n = std::min(r.known_len() - f, c - f % c);
  return n > budget ? 0 : prefill_chunk(r, n);
}

wire::plan_row scheduler::prefill_row(request_state& r, int32_t n) {
  wire::plan_row row = base_row(r);
  for (int32_t i = 0; i < n; ++i) row.tokens.push_back(r.token_or_placeholder(r.fed() + i));
  group_state& gs = groups_[static_cast<size_t>(r.group)];
  if (!r.pages_sent) {
    row.first_page_pos = 0;
    row.new_pages = r.pages;
    // A prefix-cache hit starts from a copy of the checkpoint instead of a zero state.
    row.reset_state = r.restore_from < 0;
    if (r.restore_from >= 0) gs.restores.push_back(wire::state_copy_op{r.restore_from, r.mamba_slot});
    r.restore_from = -1;
    r.pages_sent = true;
  }
  plan_save(r, r.fed() + n);
  row.dense_attention = !r.req.sampling.sparse;
  // Logits processing (the worker applies it where it samples; README, Sampling parameters).
  const sampling_params& sp = r.req.sampling;
  if (sp.needs_processing()) {
    wire::logits_processing& lp = row.processing;
    lp.repetition_penalty = sp.repetition_penalty;
    lp.presence_penalty = sp.presence_penalty;
    lp.frequency_penalty = sp.frequency_penalty;
    lp.prompt_len = static_cast<int32_t>(r.req.input_ids.size());
    lp.logprobs = sp.logprobs;
    lp.top_logprobs = sp.top_logprobs;
    for (const auto& [id, bias] : sp.logit_bias) {
      lp.bias_ids.push_back(id);
      lp.bias_values.push_back(bias);
    }
    // min_tokens: the stop ids travel only while the row's token could still come too early.
    if (row.output_index < sp.min_tokens) {
      lp.min_tokens = sp.min_tokens;
      lp.min_tokens_mask = sp.stop_token_ids;
      if (!sp.ignore_eos && info_.eos_token_id >= 0) lp.min_tokens_mask.push_back(info_.eos_token_id);
    }
  }
  ++r.in_steps;
  return row;
}

bool scheduler::emit(request_state& r, const std::vector<int32_t>& tokens, const wire::row_result* row) {
  const sampling_params& sp = r.req.sampling;
  request_event ev;
  std::optional<finish_reason> done;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const int32_t tok = tokens[t];
    if (r.output.empty()) r.first_token = clock::now();
    r.output.push_back(tok);
    ev.new_tokens.push_back(tok);
    if (sp.logprobs || sp.top_logprobs > 0) {
      const bool have = row && t < row->logprobs.size();
      ev.logprobs.push_back(have ? row->logprobs[t] : std::numeric_limits<float>::quiet_NaN());
      auto& top = ev.top_logprobs.emplace_back();
      if (row && row->top_n > 0)
        for (int32_t k = 0; k < row->top_n; ++k) {
          const size_t at = t * static_cast<size_t>(row->top_n) + static_cast<size_t>(k);
          if (at < row->top_ids.size()) top.emplace_back(row->top_ids[at], row->top_logprobs[at]);
        }
    }
    const bool is_stop = std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), tok) != sp.stop_token_ids.end() ||
                         (!sp.ignore_eos && info_.eos_token_id >= 0 && tok == info_.eos_token_id);
    if (is_stop) done = finish_reason::kStop;
    else if (static_cast<int32_t>(r.output.size()) >= sp.max_new_tokens || r.total_len() >= info_.max_context)
      done = finish_reason::kLength;
    if (done) break;
  }
  if (r.req.sink) outbox_.push_back(pending_event{r.req.id, std::move(ev)});
  if (done) finish(r.req.id, *done, std::nullopt);
  return done.has_value();
}

bool scheduler::row_failed(int g, uint64_t id, const wire::step_result& res, size_t row) {
  if (!res.rows.at(row).tokens.empty()) return false;
  // The worker refused this row alone (e.g. sampling settings it cannot use): only its request
  // fails; the others of the step go on.
  // res.error lists the refused rows as "request ID: reason; request ID: reason": keep this one's.
  std::string why = res.error.empty() ? "the worker returned no token for this request" : res.error;
  const std::string tag = "request " + std::to_string(id) + ": ";
  if (const size_t at = res.error.find(tag); at != std::string::npos) {
    const size_t from = at + tag.size();
    const size_t end = res.error.find("; request ", from);
    why = res.error.substr(from, end == std::string::npos ? std::string::npos : end - from);
  }
  std::fprintf(stderr, "[coordinator] step %llu on group %d: request %llu failed: %s\n",
               static_cast<unsigned long long>(res.step_id), g, static_cast<unsigned long long>(id), why.c_str());
  finish(id, finish_reason::kAbort, "worker error: " + why);
  return true;
}

void scheduler::handle_result(int g, const std::vector<uint8_t>& bytes) {
  group_state& gs = groups_[static_cast<size_t>(g)];
  if (!gs.in_flight()) throw error("group " + std::to_string(g) + " sent a result with no step in flight");
  // Results come back in the order the steps were sent.
  group_state::flight st = std::move(gs.flights.front());
  gs.flights.pop_front();
  trace_.add("result", st.step_id, g, static_cast<int64_t>(st.rows.ids.size()));
  // The step's own time: from its sending, or from the previous result when it queued behind it.
  const auto started = std::max(st.sent_at, gs.last_result_at);
  gs.last_result_at = clock::now();
  const double seconds = ms_since(started) / 1000.0;
  if (observer_.on_step) observer_.on_step(st.mode, seconds);
  std::optional<wire::step_result> res;
  std::string failure;
  try {
    res = wire::decode_step_result(bytes);
    if (!res->ok) failure = res->error;
    else if (res->rows.size() != st.rows.ids.size()) failure = "result has the wrong number of rows";
  } catch (const error& e) {
    failure = std::string("corrupt step result: ") + e.what();
  }
  if (failure.empty()) gs.round.record_time(st.rows, res->step_ms > 0 ? res->step_ms / 1000.0 : seconds);
  if (failure.empty() && res->decode_rows > 0 && observer_.on_decode_attention)
    observer_.on_decode_attention(res->decode_rows, res->sparse_rows, res->pages_read);
  const std::vector<uint64_t>& ids = st.rows.ids;
  if (!failure.empty()) gs.round.abort();
  // The step is no longer in flight for its requests.
  for (size_t i = 0; i < ids.size(); ++i) {
    auto it = requests_.find(ids[i]);
    if (it == requests_.end() || ids[i] == 0) continue;
    request_state& r = it->second;
    --r.in_steps;
    if (st.rows.kind == step_kind::kPlain) {
      r.flight_consumed -= st.rows.tokens[i];
      if (st.rows.emits[i]) --r.flight_outputs;
    }
  }
  if (!st.saves.empty()) insert_saves(gs, st.saves, failure.empty());
  process_result(g, st, res, failure);
  // Requests that ended while this step was in flight: their slots and pages are free now.
  for (held_resources& h : st.deferred) free_resources(gs, h);
}

void scheduler::process_result(int g, const group_state::flight& st, const std::optional<wire::step_result>& res,
                               const std::string& failure) {
  group_state& gs = groups_[static_cast<size_t>(g)];
  const std::vector<uint64_t>& ids = st.rows.ids;
  // Failures and cancellations first; they end the request whatever the step was.
  for (size_t i = 0; i < ids.size(); ++i) {
    auto it = requests_.find(ids[i]);
    if (it == requests_.end() || ids[i] == 0) continue;
    request_state& r = it->second;
    if (!failure.empty()) {
      std::fprintf(stderr, "[coordinator] step %llu on group %d failed: %s\n",
                   static_cast<unsigned long long>(st.step_id), g, failure.c_str());
      finish(r.req.id, finish_reason::kAbort, "worker error: " + failure);
    } else if (r.cancelled) {
      finish(r.req.id, finish_reason::kAbort, std::nullopt);
    }
  }
  if (!failure.empty()) return;
  if (st.rows.kind != step_kind::kPlain) {
    group_host host(*this, g);
    gs.round.take_result(host, st.rows, *res);
    return;
  }
  int64_t wasted = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto it = requests_.find(ids[i]);
    if (it == requests_.end()) {  // finished while the step was in flight: a wasted row
      ++wasted;
      continue;
    }
    request_state& r = it->second;
    r.consumed += st.rows.tokens[i];
    if (!st.rows.emits[i]) continue;  // a prefill chunk that does not end the prompt
    if (row_failed(g, ids[i], *res, i)) continue;
    emit(r, {res->rows[i].tokens.at(0)}, &res->rows[i]);
  }
  if (wasted > 0 && observer_.on_wasted_rows) observer_.on_wasted_rows(wasted);
}

int scheduler::run(const std::atomic<bool>& stop_requested) {
  struct at_exit {
    scheduler& s;
    ~at_exit() {
      s.flush_events();
      if (!s.quiet_) s.log_loop_stats();
    }
  } at_exit{*this};
  std::optional<clock::time_point> drain_deadline;
  const auto step_timeout = std::chrono::duration<double>(cfg_.worker.step_timeout_s);
  while (true) {
    last_tick_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now().time_since_epoch()).count();
    if (lost_flag_.load()) {
      std::string why;
      {
        std::lock_guard<std::mutex> lock(lost_mu_);
        why = lost_;
      }
      fatal(why);
      return 1;
    }
    if (stop_requested.load() && !drain_deadline) {
      draining_ = true;
      drain_deadline = clock::now() + std::chrono::duration_cast<clock::duration>(
                                          std::chrono::duration<double>(cfg_.server.drain_timeout_s));
      if (!quiet_) std::fprintf(stderr, "[coordinator] draining %zu requests\n", requests_.size());
    }
    const auto t_top = clock::now();
    take_submissions();
    take_cancellations();
    take_flushes();
    admit();
    bool busy = false;
    const auto t_schedule = clock::now();
    if (after_result_) {
      loop_stats_.tail_s += std::chrono::duration<double>(t_top - *after_result_).count();
      loop_stats_.admit_s += std::chrono::duration<double>(t_schedule - t_top).count();
      after_result_.reset();
    }
    const int64_t plans_before = loop_stats_.plans;
    for (int g = 0; g < static_cast<int>(groups_.size()); ++g) {
      schedule_group(g);
      busy = busy || groups_[static_cast<size_t>(g)].in_flight();
    }
    if (loop_stats_.plans != plans_before)
      loop_stats_.schedule_s += std::chrono::duration<double>(clock::now() - t_schedule).count();
    // The tokens of the results handled last iteration go out now that the next steps run.
    flush_events();
    {
      std::lock_guard<std::mutex> lock(inbox_mu_);
      report_load();
    }
    bool got_result = false;
    while (auto msg = link_.poll_result()) {
      const auto t_result = clock::now();
      handle_result(msg->first, msg->second);
      got_result = true;
      ++loop_stats_.results;
      loop_stats_.handle_s += std::chrono::duration<double>(clock::now() - t_result).count();
    }
    for (size_t g = 0; g < groups_.size(); ++g) {
      const group_state& gs = groups_[g];
      if (gs.in_flight() && clock::now() - std::max(gs.flights.front().sent_at, gs.last_result_at) > step_timeout) {
        const int first = 1 + static_cast<int>(g) * cfg_.parallel.tp, last = first + cfg_.parallel.tp - 1;
        const std::string ranks = first == last ? "rank " + std::to_string(first)
                                                : "ranks " + std::to_string(first) + "-" + std::to_string(last);
        const std::string why = "data-parallel group " + std::to_string(g) + " (" + ranks + ", leader rank " +
                                std::to_string(first) + " on host " + hellos_[g].host + ") did not answer step " +
                                std::to_string(gs.flights.front().step_id) +
                                " within " + std::to_string(cfg_.worker.step_timeout_s) + " s";
        fatal(why);
        return 1;
      }
    }
    if (drain_deadline) {
      bool idle = requests_.empty();
      for (const auto& gs : groups_) idle = idle && !gs.in_flight();
      if (idle) return 0;
      if (clock::now() > *drain_deadline) {
        std::fprintf(stderr, "[coordinator] drain deadline passed; aborting %zu requests\n", requests_.size());
        std::vector<uint64_t> ids;
        for (const auto& [id, r] : requests_) ids.push_back(id);
        for (uint64_t id : ids) finish(id, finish_reason::kAbort, std::string("the server shut down"));
        // Results of in-flight steps are still collected so every worker is idle at shutdown.
        const auto until = clock::now() + step_timeout;
        for (auto& gs : groups_) {
          while (gs.in_flight() && clock::now() < until) {
            if (auto msg = link_.poll_result()) {
              group_state& from = groups_[static_cast<size_t>(msg->first)];
              if (from.in_flight()) from.flights.pop_front();
            }
            else std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        }
        return 0;
      }
    }
    // A result in: plan the next step at once. A step in flight: poll again soon; on a GPU
    // (steps of a fraction of a millisecond) without sleeping, since a sleep of tens of
    // microseconds costs the device that much idle time per step; on the CPU the workers need
    // the cores.
    if (got_result) {
      after_result_ = clock::now();
      continue;
    }
    if (!busy) std::this_thread::sleep_for(std::chrono::microseconds(500));
    else if (cfg_.device == device_kind::kCuda) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace hyserve::coordinator
