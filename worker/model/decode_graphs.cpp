#include "decode_graphs.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <mutex>
#include <string>

#include "hyserve/common/error.h"
#include "hyserve/kernels/run.h"
#include "step_pack.h"

namespace hyserve::worker {

namespace {

// The logits come back in chunks of this many bytes: the host moves chunk i into the result
// while the copies of the chunks after it are still in flight.
constexpr size_t kLogitsChunkBytes = size_t{4} << 20;
// Graph arenas are sized in multiples of this.
constexpr size_t kArenaGranule = size_t{2} << 20;

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

}  // namespace

std::vector<int32_t> decode_batch_buckets(int32_t max_batch) {
  std::vector<int32_t> b;
  for (int64_t v = 1; v < max_batch; v *= 2) b.push_back(static_cast<int32_t>(v));
  if (max_batch >= 1) b.push_back(max_batch);
  return b;
}

std::optional<int32_t> pick_batch_bucket(const std::vector<int32_t>& buckets, int32_t bs) {
  if (bs < 1) return std::nullopt;
  for (int32_t b : buckets)
    if (b >= bs) return b;
  return std::nullopt;
}

int64_t pick_page_stride(int64_t pages, int64_t max_pages) {
  int64_t s = 1;
  while (s < pages) s *= 2;
  return std::max<int64_t>(1, std::min(s, std::max(max_pages, pages)));
}

void log_decode_path_once(const std::string& line) {
  static std::mutex mutex;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mutex);
  if (seen.insert(line).second) std::cerr << "hyserve: " << line << "\n";
}

decode_graphs::decode_graphs(const decode_graph_config& cfg) : cfg_(cfg), buckets_(decode_batch_buckets(cfg.max_batch)) {
  HYSERVE_CHECK(!buckets_.empty(), "decode graphs: max_batch must be at least 1");
}

std::string decode_graphs::describe() const {
  std::string list;
  for (int32_t b : buckets_) list += (list.empty() ? "" : ",") + std::to_string(b);
  return "CUDA graphs per batch bucket {" + list + "}";
}

void decode_graphs::wait_idle() {
  if (stream_) kernels::stream_synchronize(stream_.get());
}

void decode_graphs::stream_deleter::operator()(void* s) const noexcept {
  try {
    kernels::stream_synchronize(s);
  } catch (const std::exception& e) {
    std::cerr << "decode graphs: " << e.what() << "\n";
  }
  kernels::stream_destroy(s);
}

decode_graphs::~decode_graphs() {
  auto summary = [](std::vector<float> v) {
    if (v.empty()) return std::string("none");
    double sum = 0;
    for (float x : v) sum += x;
    std::sort(v.begin(), v.end());
    auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))]; };
    char text[128];
    std::snprintf(text, sizeof text, "mean %.1f us, p50 %.1f, p90 %.1f, p99 %.1f", sum / static_cast<double>(v.size()),
                  at(0.5), at(0.9), at(0.99));
    return std::string(text);
  };
  if (!clock_.busy_us.empty())
    std::cerr << "hyserve: decode graphs: " << clock_.busy_us.size() << " replayed sampling steps: device busy "
              << summary(clock_.busy_us) << "; device idle before a step that follows one (" << clock_.idle_us.size()
              << "): " << summary(clock_.idle_us) << "\n";
}

std::string decode_graphs::ineligible(const hybrid_metadata& meta, const forward_options& opts) const {
  if (meta.mode != forward_mode::kDecode) return std::string(forward_mode_name(meta.mode)) + " step";
  if (opts.eager) return "forward_options.eager";
  if (opts.hidden_states) return "hidden-state capture";
  if (meta.batch_size < 1) return "empty batch";
  if (!pick_batch_bucket(buckets_, meta.batch_size))
    return "batch " + std::to_string(meta.batch_size) + " above the largest bucket " + std::to_string(buckets_.back());
  return {};
}

std::vector<const void*> decode_graphs::cache_addresses(const model_context& ctx) const {
  std::vector<const void*> a;
  for (int32_t i = 0; i < cfg_.attention_layers; ++i) {
    a.push_back(ctx.kv->layer(i).k.data());
    a.push_back(ctx.kv->layer(i).v.data());
  }
  for (int32_t i = 0; i < cfg_.state_layers; ++i) {
    a.push_back(ctx.mamba->layer(i).conv.data());
    a.push_back(ctx.mamba->layer(i).ssm.data());
  }
  a.push_back(ctx.last_tokens);
  return a;
}

void decode_graphs::check_caches(const model_context& ctx) {
  std::vector<const void*> now = cache_addresses(ctx);
  if (now == baked_) return;
  // Other caches (another engine's pools on the same model): the graphs read the old ones.
  if (!graphs_.empty()) log_decode_path_once("decode graphs: cache addresses changed; graphs recaptured");
  graphs_.clear();
  failed_.clear();
  baked_ = std::move(now);
}

void decode_graphs::ensure_buffers(const model_context& ctx, bool attention, int32_t page_size) {
  if (stream_) return;
  max_pages_ = attention ? (ctx.req_to_token->max_context() + page_size - 1) / page_size : 0;
  const layers::step_layout largest = layers::make_step_layout(
      cfg_.max_batch, cfg_.max_batch, cfg_.max_batch, attention, std::max<int64_t>(max_pages_, 1), 0, false, false, true);
  inputs_ = tensor::i32({largest.total}, device_kind::kCuda);
  logits_ = tensor::f32({cfg_.max_batch, cfg_.vocab_local}, device_kind::kCuda);
  sampled_ = tensor::i32({int64_t{cfg_.max_batch} * 2}, device_kind::kCuda);
  host_in_elems_ = static_cast<size_t>(largest.total);
  host_in_.reset(kernels::pinned_alloc(2 * host_in_elems_ * sizeof(int32_t)));
  host_sampled_.reset(kernels::pinned_alloc(2 * static_cast<size_t>(sampled_.nbytes())));
  in_copied_.clear();
  sampled_copied_.clear();
  for (int h = 0; h < 2; ++h) {
    in_copied_.emplace_back();
    sampled_copied_.emplace_back();
  }
  host_out_.reset(kernels::pinned_alloc(logits_.nbytes()));
  chunk_done_.clear();
  for (size_t c = 0; c < (logits_.nbytes() + kLogitsChunkBytes - 1) / kLogitsChunkBytes; ++c) chunk_done_.emplace_back();
  stream_.reset(kernels::stream_create());
}

tensor decode_graphs::run(const hybrid_metadata& meta, const layers::attention_step* step,
                          const std::vector<int32_t>& ids, const model_context& ctx, const step_body& body,
                          step_report* report, const step_sampling* sampling,
                          std::vector<kernels::sample_output>* sampled, deferred_step* defer,
                          const std::function<void(const kernels::exec_context&)>& after_forward) {
  const int32_t bs = meta.batch_size;
  const bool attention = step != nullptr;
  ensure_buffers(ctx, attention, attention ? step->page_size : 0);
  check_caches(ctx);
  for (int32_t b = 0; b < bs; ++b)
    HYSERVE_CHECK(meta.logit_token_indices[static_cast<size_t>(b)] == b, "decode graphs: one logits row per row");

  decode_graph_key key;
  key.batch = *pick_batch_bucket(buckets_, bs);
  key.page_table_stride = attention ? pick_page_stride(step->page_table_stride, max_pages_) : 0;
  key.sampling = sampling != nullptr;
  HYSERVE_CHECK(!sampling || sampled, "decode graphs: sampling without an output");
  const layers::step_layout layout = layers::make_step_layout(key.batch, key.batch, key.batch, attention,
                                                              key.page_table_stride, 0, false, false, key.sampling);
  HYSERVE_CHECK(static_cast<size_t>(layout.total) <= host_in_elems_, "decode graphs: layout exceeds the buffer");
  // This step's half of the pinned staging: free once the copies of the step before the
  // previous one have finished (long since, unless that step is still in flight).
  const int half = half_;
  half_ ^= 1;
  in_copied_[static_cast<size_t>(half)].synchronize();
  auto* host_in = static_cast<int32_t*>(host_in_.get()) + static_cast<size_t>(half) * host_in_elems_;
  void* const stream = stream_.get();
  layers::pack_step(layout, meta, step, ids, host_in, sampling);

  kernels::exec_context ex;
  ex.device = device_kind::kCuda;
  ex.stream = stream;
  ex.paths = cfg_.paths;
  layers::step_inputs in;
  layers::bind_step(in, layout, meta, inputs_.as<int32_t>(), attention ? step->page_size : 0);
  const size_t out_bytes = static_cast<size_t>(key.batch) * static_cast<size_t>(cfg_.vocab_local) * sizeof(float);
  // Placeholder tokens resolved from the last-token feed, the body, then either the sampler
  // (tokens into the static output, fed back to the slots) or the logits into the static output
  // (inside a capture: a copy node).
  auto run_body = [&] {
    if (ctx.last_tokens) {
      kernels::token_resolve_params r;
      r.ids = in.token_ids.as<int32_t>();
      r.n = key.batch;
      r.last = ctx.last_tokens;
      r.n_slots = ctx.last_token_slots;
      kernels::run(r, ex);
    }
    const tensor local = body(in, ex);
    HYSERVE_CHECK(local.numel() * static_cast<int64_t>(sizeof(float)) == static_cast<int64_t>(out_bytes),
                  "decode graphs: body returned " + local.shape().str());
    if (!key.sampling) {
      kernels::copy_d2d_async(logits_.data(), local.data(), out_bytes, stream);
      return;
    }
    kernels::sample_rows_params p;
    p.logits = local.as<float>();
    p.settings = in.sample_settings.as<kernels::sample_settings>();
    p.out = static_cast<kernels::sample_output*>(sampled_.data());
    p.rows = key.batch;
    p.vocab = cfg_.vocab_local;
    p.stride = cfg_.vocab_local;
    kernels::run(p, ex);
    if (ctx.last_tokens) {
      kernels::last_token_scatter_params f;
      f.sampled = p.out;
      f.slots = in.feed_slots.as<int32_t>();
      f.last = ctx.last_tokens;
      f.rows = key.batch;
      f.n_slots = ctx.last_token_slots;
      kernels::run(f, ex);
    }
  };

  std::optional<kernels::gpu_timer> timer;
  if (report) timer.emplace();
  // After every eager op queued on the legacy stream (state resets, the previous eager step).
  kernels::stream_wait_legacy(stream);
  // The step clock (the header): replays of sampling graphs only.
  ++clock_.runs;
  kernels::gpu_timer* step_timer = nullptr;
  uint64_t step_seq = 0;
  bool follows = false;
  if (cfg_.step_clock && key.sampling && graphs_.count(key)) {
    step_seq = clock_.timed++;
    auto& slot = clock_.ring[step_seq % clock_.ring.size()];
    if (!slot) slot = std::make_unique<kernels::gpu_timer>();
    step_timer = slot.get();
    follows = step_seq > 0 && clock_.last_run == clock_.runs - 1;
    clock_.last_run = clock_.runs;
    step_timer->start(stream);
  } else {
    clock_.last_run = 0;
  }
  kernels::copy_h2d_async(inputs_.data(), host_in, static_cast<size_t>(layout.total) * sizeof(int32_t), stream);
  in_copied_[static_cast<size_t>(half)].record(stream);
  if (timer) timer->start(stream);

  bool captured = false;
  const kernels::captured_graph* graph = nullptr;
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    graph = &it->second.graph;
    graph->launch(stream);
  } else {
    size_t footprint = 0;
    {
      // Warm-up: this step's result, computed eagerly on the graph stream; it also measures
      // the arena the capture of the same body carves its allocations from.
      const kernels::allocation_stream_scope scope(stream);
      const kernels::arena_footprint measure;
      run_body();
      footprint = measure.bytes();
    }
    if (!failed_.count(key)) {
      try {
        // The graphs share the arena (they never run at once, see the header); a larger need
        // gets a new one (with room to grow, so that keys of slightly larger footprints do not
        // each add one), and the graphs on the old one keep it.
        if (!arena_ || arena_->bytes() < footprint) {
          const size_t grown = arena_ ? std::max(footprint, arena_->bytes() / 4 * 5) : footprint;
          arena_ = std::make_shared<kernels::graph_arena>((grown + kArenaGranule - 1) / kArenaGranule * kArenaGranule);
        }
        kernels::captured_graph::capture_begin(stream, arena_.get());
        run_body();  // recorded, not executed
        graph_entry entry{arena_, kernels::captured_graph::capture_end(stream)};
        auto [pos, inserted] = graphs_.emplace(key, std::move(entry));
        graph = &pos->second.graph;
        captured = true;
        const kernels::graph_stats& n = graph->stats();
        log_decode_path_once("decode graphs: captured batch " + std::to_string(key.batch) + " (page-table stride " +
                             std::to_string(key.page_table_stride) + "): " + std::to_string(n.total()) + " nodes, " +
                             std::to_string(n.kernels) + " kernels, " + std::to_string(n.memsets) + " memsets, " +
                             std::to_string(n.memcpys) + " copies, " + std::to_string(n.mem_allocs) + " allocs, " +
                             std::to_string(n.mem_frees) + " frees; arena " + mib(n.arena_bytes) + " of " +
                             mib(static_cast<int64_t>(arena_->bytes())));
      } catch (const std::exception& e) {
        kernels::captured_graph::capture_abort(stream);
        failed_.insert(key);
        log_decode_path_once("decode graphs: capture of batch " + std::to_string(key.batch) + " failed (" + e.what() +
                             "); that bucket runs eagerly");
      }
    }
  }
  if (timer) timer->stop(stream);
  if (after_forward) {
    // Its allocations and copies are ordered on the graph stream too (state_pools.cpp).
    after_forward(ex);
  }
  auto fill_report = [&] {
    if (!report) return;
    report->graph = graph != nullptr;
    report->captured = captured;
    report->graph_batch = key.batch;
    report->gpu_ms = timer->elapsed_ms();
    report->nodes = graph ? graph->stats() : kernels::graph_stats{};
  };
  if (key.sampling) {
    // The real rows' tokens: 8 bytes a row.
    const size_t bytes = static_cast<size_t>(bs) * sizeof(kernels::sample_output);
    void* const staged = static_cast<char*>(host_sampled_.get()) + static_cast<size_t>(half) * sampled_.nbytes();
    kernels::copy_d2h_async(staged, sampled_.data(), bytes, stream);
    const kernels::stream_event* copied = &sampled_copied_[static_cast<size_t>(half)];
    sampled_copied_[static_cast<size_t>(half)].record(stream);
    if (step_timer) step_timer->stop(stream);
    auto take = [this, copied, staged, bytes, bs, sampled, step_timer, step_seq, follows] {
      copied->synchronize();
      sampled->resize(static_cast<size_t>(bs));
      std::memcpy(sampled->data(), staged, bytes);
      if (step_timer && clock_.busy_us.size() < (size_t{1} << 20)) {
        clock_.busy_us.push_back(static_cast<float>(step_timer->elapsed_ms() * 1e3));
        if (follows) {
          const auto& before = clock_.ring[(step_seq - 1) % clock_.ring.size()];
          clock_.idle_us.push_back(static_cast<float>(step_timer->since_ms(*before) * 1e3));
        }
      }
    };
    if (defer && !report && graph && !captured) {
      // Replayed: the caller takes the tokens later (the next step may be queued first).
      defer->ready = [copied] { return copied->ready(); };
      defer->finish = take;
      return tensor{};
    }
    take();
    fill_report();
    return tensor{};
  }

  // The real rows' logits: their copies are queued first, then the result is allocated (and
  // zero-filled by the tensor) while the device still runs the step, then each chunk is moved
  // out of the pinned staging as soon as it has landed.
  const size_t real_bytes = static_cast<size_t>(bs) * static_cast<size_t>(cfg_.vocab_local) * sizeof(float);
  const size_t n_chunks = (real_bytes + kLogitsChunkBytes - 1) / kLogitsChunkBytes;
  HYSERVE_CHECK(n_chunks <= chunk_done_.size(), "decode graphs: logits exceed the staging");
  auto* staged = static_cast<char*>(host_out_.get());
  const auto* device_logits = static_cast<const char*>(logits_.data());
  for (size_t c = 0; c < n_chunks; ++c) {
    const size_t at = c * kLogitsChunkBytes, n = std::min(kLogitsChunkBytes, real_bytes - at);
    kernels::copy_d2h_async(staged + at, device_logits + at, n, stream);
    chunk_done_[c].record(stream);
  }
  tensor out = tensor::f32({bs, cfg_.vocab_local});
  auto* dst = static_cast<char*>(out.data());
  // Several host threads drain the chunks (thread t takes chunks t, t + T, …: in arrival order).
  std::exception_ptr failure;
  const auto chunks = static_cast<int64_t>(n_chunks);
#pragma omp parallel for schedule(static, 1) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    try {
      const size_t at = static_cast<size_t>(c) * kLogitsChunkBytes, n = std::min(kLogitsChunkBytes, real_bytes - at);
      chunk_done_[static_cast<size_t>(c)].synchronize();
      std::memcpy(dst + at, staged + at, n);
    } catch (...) {
#pragma omp critical(hyserve_decode_graphs_logits)
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
  kernels::stream_synchronize(stream);  // nothing is left in flight (the last event covered it all)
  fill_report();
  return out;
}

}  // namespace hyserve::worker
