#include "step_driver.h"

#include <algorithm>
#include <optional>
#include <string>

#include "hyserve/common/error.h"
#include "hyserve/kernels/graph.h"
#include "hyserve/kernels/run.h"
#include "sparse_select.h"
#include "step_pack.h"

namespace hyserve::worker {

namespace {

// The sampled tokens of host-sampled rows into the context's last-token feed.
void feed_from_host(const std::vector<kernels::sample_output>& sampled, const std::vector<int32_t>& feed_slots,
                    const model_context& ctx, const kernels::exec_context& ex) {
  if (!ctx.last_tokens || sampled.empty()) return;
  kernels::last_token_scatter_params p;
  p.rows = static_cast<int64_t>(sampled.size());
  p.n_slots = ctx.last_token_slots;
  p.last = ctx.last_tokens;
  if (ex.device == device_kind::kCpu) {
    p.sampled = sampled.data();
    p.slots = feed_slots.data();
    kernels::run(p, ex);
    return;
  }
  const tensor dev_sampled = tensor::from_host(sampled.data(), dtype::kI32, p.rows * 2, ex.device);
  const tensor dev_slots = tensor::from_host(feed_slots.data(), dtype::kI32, p.rows, ex.device);
  p.sampled = static_cast<const kernels::sample_output*>(dev_sampled.data());
  p.slots = dev_slots.as<int32_t>();
  kernels::run(p, ex);
  kernels::stream_synchronize(ex.stream);  // before the uploads are freed
}

// A host vector in ex's memory (the host vector itself on the CPU).
struct staged {
  tensor dev;
  const void* ptr = nullptr;
};
template <class T>
staged stage(const std::vector<T>& v, const kernels::exec_context& ex) {
  staged s;
  if (v.empty()) return s;
  if (ex.device == device_kind::kCpu) {
    s.ptr = v.data();
    return s;
  }
  static_assert(sizeof(T) % 4 == 0);
  s.dev = tensor::from_host(v.data(), dtype::kI32, static_cast<int64_t>(v.size() * sizeof(T) / 4), ex.device);
  s.ptr = s.dev.data();
  return s;
}

}  // namespace

std::string processing_blocker(const step_sampling* sampling) {
  if (sampling && sampling->needs_processing()) return "logits processing (penalties, logit_bias, min_tokens or top_logprobs)";
  return {};
}

int32_t* step_driver::counts(const model_context& ctx, int64_t vocab, device_kind where) {
  const int64_t slots = ctx.req_to_token ? ctx.req_to_token->max_requests() : 0;
  if (slots <= 0) throw invalid_argument_error("logits processing: the model context has no request slots");
  if (counts_.numel() == 0 || counts_.device() != where || counts_slots_ != slots || counts_vocab_ != vocab) {
    const std::vector<int32_t> zeros(static_cast<size_t>(slots * vocab), 0);
    counts_ = tensor::from_host(zeros.data(), dtype::kI32, slots * vocab, where);
    counts_slots_ = slots;
    counts_vocab_ = vocab;
  }
  return counts_.as<int32_t>();
}

void step_driver::process_logits(float* logits, int64_t rows, int64_t vocab, const step_sampling& s,
                                 const model_context& ctx, const kernels::exec_context& ex,
                                 std::vector<kernels::top_logprob>* top) {
  const bool penalties = !s.clear_slots.empty() || !s.seen.empty() || !s.count_slots.empty() ||
                         std::any_of(s.processing.begin(), s.processing.end(),
                                     [](const kernels::logits_row_settings& r) { return r.count_slot >= 0; });
  int32_t* cnt = penalties ? counts(ctx, vocab, ex.device) : nullptr;
  if (!s.clear_slots.empty() || !s.seen.empty()) {
    const staged clear = stage(s.clear_slots, ex), seen = stage(s.seen, ex);
    kernels::token_count_params c;
    c.counts = cnt;
    c.n_slots = counts_slots_;
    c.vocab = vocab;
    c.clear_slots = static_cast<const int32_t*>(clear.ptr);
    c.n_clear = static_cast<int64_t>(s.clear_slots.size());
    c.seen = static_cast<const int32_t*>(seen.ptr);
    c.n_seen = static_cast<int64_t>(s.seen.size() / 2);
    kernels::run(c, ex);
    if (ex.device != device_kind::kCpu) kernels::stream_synchronize(ex.stream);  // before the uploads are freed
  }
  if (s.processing.empty()) return;
  if (static_cast<int64_t>(s.processing.size()) != rows)
    throw invalid_argument_error("logits processing: " + std::to_string(s.processing.size()) + " settings for " +
                                 std::to_string(rows) + " logits rows");
  for (const kernels::logits_row_settings& r : s.processing)
    kernels::check_logits_row_settings(r, penalties ? counts_slots_ : 0, static_cast<int64_t>(s.bias_ids.size()),
                                       static_cast<int64_t>(s.mask_ids.size()), s.max_top);
  const staged settings = stage(s.processing, ex), bias_ids = stage(s.bias_ids, ex),
               bias_values = stage(s.bias_values, ex), mask = stage(s.mask_ids, ex);
  tensor dev_top;
  const int64_t top_elems = rows * s.max_top;
  if (top) top->assign(static_cast<size_t>(top_elems), kernels::top_logprob{});
  kernels::logits_process_params p;
  p.logits = logits;
  p.settings = static_cast<const kernels::logits_row_settings*>(settings.ptr);
  p.counts = cnt;
  p.bias_ids = static_cast<const int32_t*>(bias_ids.ptr);
  p.bias_values = static_cast<const float*>(bias_values.ptr);
  p.mask_ids = static_cast<const int32_t*>(mask.ptr);
  p.rows = rows;
  p.vocab = vocab;
  p.stride = vocab;
  p.n_slots = penalties ? counts_slots_ : 0;
  p.n_bias = static_cast<int64_t>(s.bias_ids.size());
  p.n_mask = static_cast<int64_t>(s.mask_ids.size());
  p.max_top = top ? s.max_top : 0;
  if (p.max_top > 0) {
    if (ex.device == device_kind::kCpu) {
      p.top = top->data();
    } else {
      dev_top = tensor::i32({top_elems * 2}, ex.device);
      p.top = static_cast<kernels::top_logprob*>(dev_top.data());
    }
  }
  kernels::run(p, ex);
  if (ex.device != device_kind::kCpu) {
    // Only the rows that asked pay this copy: 8 bytes per (row, rank) of the step's max_top.
    if (p.max_top > 0) dev_top.copy_to_host(top->data(), static_cast<size_t>(top_elems) * sizeof(kernels::top_logprob));
    kernels::stream_synchronize(ex.stream);  // before the uploads are freed
  }
}

void step_driver::count_sampled(const kernels::sample_output* sampled, const step_sampling& s,
                                const kernels::exec_context& ex) {
  if (s.count_slots.empty() || counts_.numel() == 0) return;
  const staged slots = stage(s.count_slots, ex);
  kernels::token_count_params c;
  c.counts = counts_.as<int32_t>();
  c.n_slots = counts_slots_;
  c.vocab = counts_vocab_;
  c.sampled = sampled;
  c.sampled_slots = static_cast<const int32_t*>(slots.ptr);
  c.n_sampled = static_cast<int64_t>(s.count_slots.size());
  kernels::run(c, ex);
  if (ex.device != device_kind::kCpu) kernels::stream_synchronize(ex.stream);  // before the upload is freed
}

void check_step_tokens(const std::vector<int32_t>& ids, int64_t vocab, const model_context& ctx) {
  for (size_t t = 0; t < ids.size(); ++t) {
    const int32_t id = ids[t];
    if (id >= 0 && id < vocab) continue;
    if (id < 0 && ctx.last_tokens && -static_cast<int64_t>(id) - 1 < ctx.last_token_slots) continue;
    if (id < 0 && ctx.last_tokens)
      throw invalid_argument_error("token placeholder " + std::to_string(id) + " at batch position " + std::to_string(t) +
                                   " names slot " + std::to_string(-static_cast<int64_t>(id) - 1) + " outside [0, " +
                                   std::to_string(ctx.last_token_slots) + ")");
    throw invalid_argument_error("token id " + std::to_string(id) + " at batch position " + std::to_string(t) +
                                 " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  }
}

void resolve_placeholders(const layers::step_inputs& in, const std::vector<int32_t>& ids, const model_context& ctx,
                          const kernels::exec_context& ex) {
  if (!ctx.last_tokens || std::none_of(ids.begin(), ids.end(), [](int32_t id) { return id < 0; })) return;
  kernels::token_resolve_params p;
  p.ids = in.token_ids.as<int32_t>();
  p.n = static_cast<int64_t>(ids.size());
  p.last = ctx.last_tokens;
  p.n_slots = ctx.last_token_slots;
  kernels::run(p, ex);
}

std::string decode_graph_blocker(const kernels::exec_context& ctx, const decode_graph_options& graphs, int tp_size) {
  if (ctx.device != device_kind::kCuda) return "device cpu";
  if (!graphs.enabled) return "cuda_graphs: false";
  if (graphs.max_batch < 1) return "no batch bucket (max_batch < 1)";
  if (tp_size > 1) return "tp > 1 (the collective waits on the host with a deadline)";
  return {};
}

step_driver::step_driver(const step_frame& frame, const decode_graph_options& graphs, int32_t attention_layers,
                         int32_t state_layers, const std::string& why_not_graphs)
    : frame_(frame) {
  if (why_not_graphs.empty()) {
    decode_graph_config c;
    c.max_batch = graphs.max_batch;
    c.vocab_local = frame.vocab_local;
    c.attention_layers = attention_layers;
    c.state_layers = state_layers;
    c.step_clock = graphs.step_clock;
    c.paths = frame.ctx.paths;
    graphs_ = std::make_unique<decode_graphs>(c);
    log_decode_path_once("decode (" + frame.label + "): " + graphs_->describe());
  } else if (frame.ctx.device == device_kind::kCuda) {
    log_decode_path_once("decode (" + frame.label + "): eager (" + why_not_graphs + ")");
  }
}

step_driver::~step_driver() = default;

tensor step_driver::forward(const forward_batch& batch, const hybrid_metadata& meta, const model_context& ctx,
                            const forward_options& opts, const model_body& body) {
  if (opts.defer) *opts.defer = deferred_step{};
  const std::vector<int32_t> ids = layers::batch_token_ids(batch);
  check_step_tokens(ids, frame_.vocab_size, ctx);
  const step_sampling* sampling = opts.sample;
  if (sampling) {
    if (!opts.sampled) throw invalid_argument_error("forward_options.sample needs forward_options.sampled");
    if (opts.all_logits || opts.hidden_states)
      throw invalid_argument_error("forward_options.sample: not with all_logits or hidden_states (they return logits)");
    const size_t n = meta.logit_token_indices.size();
    if (sampling->settings.size() != n || sampling->feed_slots.size() != n)
      throw invalid_argument_error("forward_options.sample: " + std::to_string(sampling->settings.size()) +
                                   " settings and " + std::to_string(sampling->feed_slots.size()) +
                                   " feed slots for " + std::to_string(n) + " logits rows");
    // Checked once here, on the host, for every path (the CUDA op cannot check device settings).
    for (const kernels::sample_settings& s : sampling->settings) kernels::check_sample_settings(s);
  }
  // Tensor parallelism gathers the vocabulary shards on the host (logits_to_host): sampled there.
  const bool tp = frame_.comm && frame_.comm->size() > 1;
  const step_sampling* device_sampling = tp ? nullptr : sampling;
  layers::attention_step step;
  const bool attention = frame_.attention_layers && meta.batch_size > 0;
  if (attention) step = layers::build_attention_step(batch, meta, *ctx.req_to_token, ctx.kv->page_size());
  // Host-side plan (statistics; device scratch only when a row is sparse).
  layers::sparse_step sparse;
  if (attention)
    sparse = layers::plan_sparse_step(*frame_.sparsity, batch, meta, step.page_table_stride, step.page_size, frame_.ctx);
  if (opts.sparse_stats) *opts.sparse_stats = sparse.stats;

  if (graphs_) {
    std::string why = graphs_->ineligible(meta, opts);
    if (why.empty() && frame_.sparsity->algorithm != sparsity_algorithm::kNone)
      why = "sparse attention (per-step host selection plans)";
    if (why.empty()) why = processing_blocker(sampling);
    if (why.empty()) {
      const step_body graph_body = [&](const layers::step_inputs& in, const kernels::exec_context& ex) {
        return body(in, ex, /*all_logits=*/true, nullptr);  // decode: one logits row per token
      };
      return graphs_->run(meta, attention ? &step : nullptr, ids, ctx, graph_body, opts.report, sampling,
                          opts.sampled, opts.defer, opts.after_forward);
    }
    if (meta.mode == forward_mode::kDecode) log_decode_path_once("decode step eager: " + why);
  }

  // Eager work runs on the model's stream: after any graph step still in flight.
  if (graphs_) graphs_->wait_idle();
  layers::step_inputs in = layers::upload_step(meta, attention ? &step : nullptr, ids, frame_.ctx, device_sampling);
  in.sparse = std::move(sparse);
  resolve_placeholders(in, ids, ctx, frame_.ctx);
  std::vector<tensor> hidden;
  std::optional<kernels::gpu_timer> timer;
  const bool cuda = frame_.ctx.device == device_kind::kCuda;
  if (opts.report && cuda) {
    timer.emplace();
    timer->start(frame_.ctx.stream);
  }
  // Op-level profile (kernels::profile_start): the baseline mark; a Decode step's activations
  // are then not zero-filled, as in a graph capture (its body writes everything it reads).
  std::optional<kernels::allocation_stream_scope> profile_scope;
  if (cuda && kernels::profile_active()) {
    if (meta.mode == forward_mode::kDecode) profile_scope.emplace(frame_.ctx.stream, /*zero_fill=*/false);
    kernels::profile_mark(nullptr, 0, frame_.ctx.stream);
  }
  tensor local = body(in, frame_.ctx, opts.all_logits, opts.hidden_states ? &hidden : nullptr);
  if (timer) timer->stop(frame_.ctx.stream);
  if (opts.after_forward) opts.after_forward(frame_.ctx);
  if (opts.hidden_states) *opts.hidden_states = std::move(hidden);
  auto report = [&] {
    if (!opts.report) return;
    *opts.report = step_report{};
    opts.report->gpu_ms = timer ? timer->elapsed_ms() : -1.0;
  };
  if (device_sampling) {
    // Tokens (and logprobs) are all that leave the device: 8 bytes per logits row.
    const int64_t rows = static_cast<int64_t>(meta.logit_token_indices.size());
    std::vector<kernels::sample_output>& out = *opts.sampled;
    out.assign(static_cast<size_t>(rows), kernels::sample_output{});
    if (rows > 0) {
      const tensor dev_out = tensor::i32({rows * 2}, frame_.ctx.device);
      if (sampling->needs_processing())
        process_logits(local.as<float>(), rows, local.shape()[1], *sampling, ctx, frame_.ctx, opts.top_logprobs);
      kernels::sample_rows_params p;
      p.logits = local.as<float>();
      p.settings = in.sample_settings.as<kernels::sample_settings>();
      p.out = static_cast<kernels::sample_output*>(dev_out.data());
      p.rows = rows;
      p.vocab = local.shape()[1];
      p.stride = local.shape()[1];
      kernels::run(p, frame_.ctx);
      count_sampled(p.out, *sampling, frame_.ctx);
      if (ctx.last_tokens) {
        kernels::last_token_scatter_params f;
        f.sampled = p.out;
        f.slots = in.feed_slots.as<int32_t>();
        f.last = ctx.last_tokens;
        f.rows = rows;
        f.n_slots = ctx.last_token_slots;
        kernels::run(f, frame_.ctx);
      }
      dev_out.copy_to_host(out.data(), static_cast<size_t>(rows) * sizeof(kernels::sample_output));
    }
    report();
    return tensor{};
  }
  tensor logits = layers::logits_to_host(local, frame_.comm, frame_.ctx);
  report();
  if (sampling) {
    // Tensor parallelism: every rank samples the same gathered logits (the same tokens).
    const int64_t rows = logits.shape()[0];
    std::vector<kernels::sample_output>& out = *opts.sampled;
    out.assign(static_cast<size_t>(rows), kernels::sample_output{});
    const kernels::exec_context host{};
    if (sampling->needs_processing())
      process_logits(logits.as<float>(), rows, logits.shape()[1], *sampling, ctx, host, opts.top_logprobs);
    kernels::sample_rows_params p;
    p.logits = logits.as<float>();
    p.settings = sampling->settings.data();
    p.out = out.data();
    p.rows = rows;
    p.vocab = logits.shape()[1];
    p.stride = logits.shape()[1];
    kernels::run(p, host);
    count_sampled(out.data(), *sampling, host);
    feed_from_host(out, sampling->feed_slots, ctx, frame_.ctx);
    return tensor{};
  }
  return logits;
}

}  // namespace hyserve::worker
