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
  bool finished = false;
  finish_reason reason = finish_reason::kLength;
  // Set when the request failed on a worker (HTTP 500) or the service is shutting down.
  std::optional<std::string> error;
  request_metrics metrics;  // filled on the final event
};

using event_sink = std::function<void(request_event)>;

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
