#include "coordinator/api/generation_handler.h"

#include <chrono>
#include <optional>
#include <string>

#include <boost/json.hpp>

#include "coordinator/api/completions_api.h"
#include "coordinator/api/generate_api.h"
#include "coordinator/log.h"

namespace hyserve::coordinator::api {
namespace {

using clock = std::chrono::steady_clock;
constexpr unsigned kClientClosedRequest = 499;  // nginx's status for a client that went away
constexpr std::string_view kDone = "data: [DONE]\n\n";

const char* api_name(api_kind kind) {
  switch (kind) {
    case api_kind::kGenerate: return "generate";
    case api_kind::kCompletions: return "completions";
  }
  return "?";
}

std::string sse(const boost::json::value& v) { return "data: " + boost::json::serialize(v) + "\n\n"; }

double seconds_between(clock::time_point a, clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

boost::json::object render_final(api_kind kind, const completion_state& state) {
  switch (kind) {
    case api_kind::kGenerate: return generate_response(state);
    case api_kind::kCompletions: return completion_response(state);
  }
  return {};
}

boost::json::object render_chunk(api_kind kind, const completion_state& state, std::span<const int32_t> new_ids) {
  switch (kind) {
    case api_kind::kGenerate: return generate_chunk(state, new_ids);
    case api_kind::kCompletions: return completion_chunk(state, new_ids);
  }
  return {};
}

// The answer to a submit the frontend refused; nullopt when it accepted. (Kept out of the
// coroutine: GCC 12 mishandles locals in a switch around co_await.)
std::optional<http::response> refusal_response(const submit_result& submitted, api_kind kind,
                                               int retry_after_seconds) {
  switch (submitted.status) {
    case submit_status::kAccepted:
      return std::nullopt;
    case submit_status::kQueueFull: {
      http::response res = http::error_response(
          503, http::kUnavailableError,
          submitted.message.empty() ? "the request queue is full, retry later" : submitted.message);
      res.headers.emplace_back("Retry-After", std::to_string(retry_after_seconds));
      return res;
    }
    case submit_status::kShuttingDown:
      return http::error_response(503, http::kUnavailableError,
                                  submitted.message.empty() ? "the server is shutting down" : submitted.message);
    case submit_status::kTooLong:
      return http::error_response(
          400, http::kInvalidRequest,
          submitted.message.empty() ? "the request does not fit the server's limits" : submitted.message,
          kind == api_kind::kGenerate ? "input_ids" : "prompt");
  }
  return http::error_response(500, http::kServerError, "unknown submit status");
}

void log_finished(api_kind kind, const completion_state& state, const char* outcome) {
  HYSERVE_LOG_INFO("request id=%llu api=%s prompt_tokens=%d completion_tokens=%zu latency_ms=%.1f finish_reason=%s",
                   static_cast<unsigned long long>(state.id), api_name(kind), state.prompt_tokens,
                   state.output_ids.size(), state.latency_ms, outcome);
}

}  // namespace

generation_handler::generation_handler(frontend& fe, metrics::service_metrics& metrics,
                                       std::shared_ptr<event_gate> gate, generation_options options)
    : frontend_(fe), metrics_(metrics), gate_(std::move(gate)), options_(std::move(options)) {}

boost::asio::awaitable<void> generation_handler::handle(http::exchange& ex, api_kind kind) const {
  const clock::time_point arrival = clock::now();
  const model_info info = frontend_.info();
  parse_result<completion_call> parsed =
      kind == api_kind::kGenerate ? parse_generate(ex.body(), info) : parse_completion(ex.body(), info);
  if (auto* e = std::get_if<api_error>(&parsed)) {
    metrics_.count_request(e->status);
    co_await ex.respond(to_response(*e));
    co_return;
  }
  completion_call call = std::get<completion_call>(std::move(parsed));

  completion_state state;
  state.model = options_.served_model_name.empty() ? info.model_id : options_.served_model_name;
  state.created = std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::system_clock::now().time_since_epoch()).count();
  state.prompt_tokens = static_cast<int32_t>(call.input_ids.size());

  auto channel = std::make_shared<event_channel>(ex.executor());
  generate_request req;
  req.input_ids = std::move(call.input_ids);
  req.sampling = call.sampling;
  req.arrival = arrival;
  req.sink = event_channel::make_sink(channel, gate_);
  const submit_result submitted = frontend_.submit(std::move(req));
  if (std::optional<http::response> refusal = refusal_response(submitted, kind, options_.retry_after_seconds)) {
    metrics_.count_request(refusal->status);
    co_await ex.respond(std::move(*refusal));
    co_return;
  }
  state.id = submitted.id;
  metrics_.prompt_tokens().inc(state.prompt_tokens);
  ex.watch_disconnect([channel] { channel->interrupt(); });

  bool streaming = false;
  bool gone = false;
  std::optional<std::string> failure;
  clock::time_point last_token = arrival;
  for (;;) {
    std::optional<request_event> event = co_await channel->next();
    if (!event) {
      gone = true;
      break;
    }
    const clock::time_point now = clock::now();
    state.latency_ms = seconds_between(arrival, now) * 1e3;
    const size_t fresh = event->new_tokens.size();
    if (fresh > 0) {
      if (state.output_ids.empty()) {
        metrics_.time_to_first_token().observe(seconds_between(arrival, now));
      } else {
        const double gap = seconds_between(last_token, now) / static_cast<double>(fresh);
        for (size_t i = 0; i < fresh; ++i) metrics_.inter_token_latency().observe(gap);
      }
      last_token = now;
      metrics_.generation_tokens().inc(static_cast<double>(fresh));
      state.output_ids.insert(state.output_ids.end(), event->new_tokens.begin(), event->new_tokens.end());
    }
    if (event->error) {
      failure = *event->error;
      break;
    }
    if (event->finished) {
      state.finished = event->reason;
      state.spec_drafted = event->metrics.spec_drafted;
      state.spec_accepted = event->metrics.spec_accepted;
    }
    if (call.stream && (fresh > 0 || event->finished)) {
      if (!streaming) {
        streaming = true;
        if (!co_await ex.begin_stream(200, "text/event-stream")) {
          gone = true;
          break;
        }
      }
      const std::span<const int32_t> new_ids(state.output_ids.data() + (state.output_ids.size() - fresh), fresh);
      if (!co_await ex.write_chunk(sse(render_chunk(kind, state, new_ids)))) {
        gone = true;
        break;
      }
    }
    if (event->finished) break;
  }

  if (gone) {
    if (!state.finished && !failure) {
      frontend_.cancel(state.id);
      metrics_.cancelled_requests().inc();
    }
    metrics_.count_request(kClientClosedRequest);
    log_finished(kind, state, "abort (client went away)");
    co_return;
  }
  if (failure) {
    HYSERVE_LOG_WARN("request id=%llu failed: %s", static_cast<unsigned long long>(state.id), failure->c_str());
    log_finished(kind, state, "error");
    metrics_.count_request(500);
    const std::string message = "generation failed: " + *failure;
    if (streaming) {
      if (co_await ex.write_chunk(sse(http::error_body(500, http::kServerError, message))) &&
          co_await ex.write_chunk(std::string(kDone))) {
        co_await ex.end_stream();
      }
    } else {
      co_await ex.respond(http::error_response(500, http::kServerError, message));
    }
    co_return;
  }

  metrics_.request_latency().observe(state.latency_ms / 1e3);
  metrics_.count_request(200);
  log_finished(kind, state, finish_reason_name(*state.finished));
  if (streaming) {
    if (co_await ex.write_chunk(std::string(kDone))) co_await ex.end_stream();
  } else {
    co_await ex.respond(http::json_response(200, render_final(kind, state)));
  }
}

}  // namespace hyserve::coordinator::api
