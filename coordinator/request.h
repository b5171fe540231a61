#pragma once
// The boundary between the HTTP layer and the scheduler. HTTP threads validate requests and
// call frontend::submit / cancel, which only touch thread-safe queues: they never call MPI.
// The scheduler thread reports progress through the request's event sink, which the HTTP
// session wraps so that events are posted onto its own executor.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hyserve::coordinator {

struct sampling_params {
  int32_t max_new_tokens = 128;
  float temperature = 0.0f;  // 0 = greedy
  float top_p = 1.0f;        // (0, 1]
  int32_t top_k = 0;         // 0 or -1 = off
  std::optional<uint64_t> seed;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool sparse = true;        // per-request override of sparse attention
  // Logits processing on the worker (vLLM's definitions; README, Sampling parameters).
  float repetition_penalty = 1.0f;  // (0, 2]... validated range in api/validation.h; 1 = off
  float presence_penalty = 0.0f;    // [-2, 2]
  float frequency_penalty = 0.0f;   // [-2, 2]
  int32_t min_tokens = 0;           // EOS and stop token ids masked until this many tokens
  std::vector<std::pair<int32_t, float>> logit_bias;  // token id -> additive bias, ids ascending
  bool logprobs = false;            // the sampled token's logprob per output token
  int32_t top_logprobs = 0;         // 0..20 most likely tokens per output token
  bool penalties() const { return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f; }
  bool changes_logits() const { return penalties() || min_tokens > 0 || !logit_bias.empty(); }
  bool needs_processing() const { return changes_logits() || logprobs || top_logprobs > 0; }
};

enum class finish_reason : uint8_t { kStop, kLength, kAbort };

struct request_metrics {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  double ttft_ms = 0.0;
  double latency_ms = 0.0;
  int64_t spec_drafted = 0;
  int64_t spec_accepted = 0;
  int32_t cached_tokens = 0;  // prompt tokens served from the prefix cache
};

// One update of a request, in order. The last event has finished = true.
struct request_event {
  std::vector<int32_t> new_tokens;  // tokens generated since the previous event
  // With sampling_params.logprobs / top_logprobs: one entry per new token (logprob of the
  // processed distribution; README, Sampling parameters), and its top_logprobs (token, logprob).
  std::vector<float> logprobs;
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;
  bool finished = false;
  finish_reason reason = finish_reason::kLength;
  // Set when the request failed on a worker (HTTP 500) or the service is shutting down.
  std::optional<std::string> error;
  request_metrics metrics;  // filled on the final event
};

using event_sink = std::function<void(request_event)>;

// Appends a later event of the same request to `into` (its tokens after into's; its end, if it
// ends the request). Events that queued up behind a stream's write go out as one.
inline void append_event(request_event& into, request_event&& later) {
  into.new_tokens.insert(into.new_tokens.end(), later.new_tokens.begin(), later.new_tokens.end());
  into.logprobs.insert(into.logprobs.end(), later.logprobs.begin(), later.logprobs.end());
  for (auto& top : later.top_logprobs) into.top_logprobs.push_back(std::move(top));
  into.finished = later.finished;
  into.reason = later.reason;
  into.error = std::move(later.error);
  into.metrics = later.metrics;
}

// Events handed to sinks while an event_batch lives on the calling thread may be delivered
// together when it ends: a sink whose delivery must wake another thread (a system call, tens
// of microseconds in a virtual machine) registers that wake-up with defer_wakeup, and it runs
// once, when the outermost batch on the thread ends. The scheduler wraps each step's events in
// one (scheduler::flush_events), so 64 streams cost it one wake-up per step, not 64.
class event_batch {
 public:
  event_batch() { ++depth(); }
  ~event_batch() {
    if (--depth() > 0) return;
    std::vector<std::function<void()>> run;
    run.swap(wakeups());
    for (auto& f : run) f();
  }
  event_batch(const event_batch&) = delete;
  event_batch& operator=(const event_batch&) = delete;
  // Runs f now when no batch is open on this thread, else when the outermost one ends.
  static void defer_wakeup(std::function<void()> f) {
    if (depth() == 0) f();
    else wakeups().push_back(std::move(f));
  }

 private:
  static int& depth() {
    thread_local int d = 0;
    return d;
  }
  static std::vector<std::function<void()>>& wakeups() {
    thread_local std::vector<std::function<void()>> w;
    return w;
  }
};

struct generate_request {
  uint64_t id = 0;  // assigned by submit
  std::vector<int32_t> input_ids;
  sampling_params sampling;
  std::chrono::steady_clock::time_point arrival = std::chrono::steady_clock::now();
  event_sink sink;  // called from the scheduler thread; must not block
};

enum class submit_status : uint8_t { kAccepted, kQueueFull, kShuttingDown, kTooLong };

struct submit_result {
  submit_status status = submit_status::kAccepted;
  uint64_t id = 0;
  std::string message;  // for rejections: names the limit
};

struct model_info {
  std::string model_id;
  int64_t vocab_size = 0;
  int32_t max_context = 0;
  int32_t eos_token_id = -1;
  int32_t dp = 1, tp = 1;
};

// POST /flush_cache: what the prefix cache dropped (every node no running request holds).
struct flush_result {
  bool ok = false;
  int64_t pages = 0, checkpoints = 0;
  std::string message;  // when !ok: why
};

// Implemented by the scheduler.
class frontend {
 public:
  virtual ~frontend() = default;
  virtual submit_result submit(generate_request req) = 0;
  // Cancels a request (client went away): its slots are freed; its sink gets a final kAbort.
  virtual void cancel(uint64_t id) = 0;
  virtual model_info info() const = 0;
  // false while loading, while draining for shutdown, or after a fatal worker error.
  virtual bool healthy() const = 0;
  // true from the first shutdown signal on (in-flight requests finish, new ones are refused).
  virtual bool draining() const { return false; }
  // Drops every prefix-cache entry no running request holds (waits for the scheduler loop).
  virtual flush_result flush_cache() { return flush_result{false, 0, 0, "prefix caching is not available"}; }
};

}  // namespace hyserve::coordinator
