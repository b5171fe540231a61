#include "coordinator/api/generation_handler.h"

#include <chrono>
#include <cmath>
#include <cstddef>
#include <optional>
#include <string>

#include <boost/json.hpp>

#include "coordinator/api/chat_api.h"
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
    case api_kind::kChat: return "chat";
  }
  return "?";
}

std::string sse(const boost::json::value& v) { return "data: " + http::json_text(v) + "\n\n"; }

double seconds_between(clock::time_point a, clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

boost::json::object render_final(api_kind kind, const completion_state& state) {
  switch (kind) {
    case api_kind::kGenerate: return generate_response(state);
    case api_kind::kCompletions: return completion_response(state);
    case api_kind::kChat: return chat_response(state);
  }
  return {};
}

// The SSE events for one update: the ids and text that became final with it. A chat stream
// sends text deltas only (none while a character or a possible stop string is held back) and
// a closing chunk with the finish_reason.
// Chat logprobs go with the text they belong to: a chunk carries those of the output tokens
// since the previous chunk (state.logprobs_sent), the closing chunk any left.
std::string render_chunks(api_kind kind, completion_state& state, std::span<const int32_t> new_ids,
                          std::string_view new_text) {
  switch (kind) {
    case api_kind::kGenerate: return sse(generate_chunk(state, new_ids, new_text));
    case api_kind::kCompletions: return sse(completion_chunk(state, new_ids, new_text));
    case api_kind::kChat: {
      std::string out;
      const size_t to = state.output_ids.size();
      if (!new_text.empty()) {
        out += sse(chat_content_chunk(state, new_text, state.logprobs_sent, to));
        state.logprobs_sent = to;
      }
      if (state.finished) {
        out += sse(chat_final_chunk(state, state.logprobs_sent, to));
        state.logprobs_sent = to;
      }
      return out;
    }
  }
  return {};
}

parse_result<completion_call> parse_call(api_kind kind, std::string_view body, const model_info& info,
                                         const text_support& text) {
  switch (kind) {
    case api_kind::kGenerate: return parse_generate(body, info, text);
    case api_kind::kCompletions: return parse_completion(body, info, text);
    case api_kind::kChat: return parse_chat(body, info, text);
  }
  return invalid_param("", "unknown API");
}

const char* prompt_param(api_kind kind) {
  switch (kind) {
    case api_kind::kGenerate: return "input_ids";
    case api_kind::kCompletions: return "prompt";
    case api_kind::kChat: return "messages";
  }
  return "";
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
          prompt_param(kind));
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
  parse_result<completion_call> parsed = parse_call(kind, ex.body(), info, options_.text);
  if (auto* e = std::get_if<api_error>(&parsed)) {
    metrics_.count_request(e->status);
    co_await ex.respond(to_response(*e));
    co_return;
  }
  completion_call call = std::get<completion_call>(std::move(parsed));
  // Unknown fields on the OpenAI routes: a 400 with server.strict_fields, else ignored with a
  // warning header on every answer and a log line.
  std::vector<std::pair<std::string, std::string>> warn_headers;
  if (!call.ignored_fields.empty()) {
    std::string names;
    for (const auto& f : call.ignored_fields) names += (names.empty() ? "" : ", ") + f;
    if (options_.strict_fields) {
      metrics_.count_request(400);
      co_await ex.respond(http::error_response(
          400, http::kInvalidRequest,
          "unknown field" + std::string(call.ignored_fields.size() > 1 ? "s " : " ") + names +
              " (server.strict_fields is on)",
          call.ignored_fields.front()));
      co_return;
    }
    HYSERVE_LOG_WARN("%s request: ignored unknown field(s): %s", api_name(kind), names.c_str());
    warn_headers.emplace_back(kIgnoredFieldsHeader, names);
  }
  auto with_warning = [&warn_headers](http::response res) {
    for (const auto& h : warn_headers) res.headers.push_back(h);
    return res;
  };

  completion_state state;
  state.model = options_.served_model_name.empty() ? info.model_id : options_.served_model_name;
  state.created = std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::system_clock::now().time_since_epoch()).count();
  state.prompt_tokens = static_cast<int32_t>(call.input_ids.size());
  state.incremental_stream = call.incremental_stream;
  if (call.echo) {
    state.echo_text = std::move(call.echo_text);
    state.echo_ids = std::move(call.echo_ids);
  }
  state.has_text = options_.text.tokenizer != nullptr;
  state.tokenizer = options_.text.tokenizer.get();
  state.logprobs = call.sampling.logprobs || call.sampling.top_logprobs > 0;
  state.top_logprobs = call.sampling.top_logprobs;
  std::optional<text_stream> texts;
  if (state.has_text) texts.emplace(*options_.text.tokenizer, std::move(call.stop_strings), call.sampling.min_tokens);

  auto channel = std::make_shared<event_channel>(ex.executor());
  generate_request req;
  req.input_ids = std::move(call.input_ids);
  req.sampling = call.sampling;
  req.arrival = arrival;
  req.sink = event_channel::make_sink(channel, gate_);
  const submit_result submitted = frontend_.submit(std::move(req));
  if (std::optional<http::response> refusal = refusal_response(submitted, kind, options_.retry_after_seconds)) {
    metrics_.count_request(refusal->status);
    co_await ex.respond(with_warning(std::move(*refusal)));
    co_return;
  }
  state.id = submitted.id;
  metrics_.prompt_tokens().inc(state.prompt_tokens);
  ex.watch_disconnect([channel] { channel->interrupt(); });

  bool streaming = false;
  bool gone = false;
  bool stop_string = false;  // a stop string ended the output: the request was cancelled
  std::optional<std::string> failure;
  clock::time_point last_token = arrival;
  for (;;) {
    std::optional<request_event> event = co_await channel->next();
    if (!event) {
      gone = true;
      break;
    }
    // Events that queued up meanwhile (this stream's last write still in flight, or the I/O
    // thread behind the steps) go out with this one: one write per catch-up, not one per step.
    // Streams only: a non-streamed answer writes nothing per event, and its time-to-first-token
    // and inter-token observations stay one per event as the scheduler produced them.
    if (call.stream && !event->finished && !event->error)
      if (std::optional<request_event> more = channel->take_queued()) append_event(*event, std::move(*more));
    const clock::time_point now = clock::now();
    state.latency_ms = seconds_between(arrival, now) * 1e3;
    std::string new_text;
    size_t fresh = event->new_tokens.size();
    if (texts && fresh > 0) {
      text_stream::update u = texts->push(event->new_tokens);
      new_text = std::move(u.delta);
      fresh = u.consumed;  // ids after the one that completed a stop string are dropped
      stop_string = u.stopped;
    }
    if (fresh > 0) {
      if (state.output_ids.empty()) {
        metrics_.time_to_first_token().observe(seconds_between(arrival, now));
      } else {
        const double gap = seconds_between(last_token, now) / static_cast<double>(fresh);
        for (size_t i = 0; i < fresh; ++i) metrics_.inter_token_latency().observe(gap);
      }
      last_token = now;
      metrics_.generation_tokens().inc(static_cast<double>(fresh));
      state.output_ids.insert(state.output_ids.end(), event->new_tokens.begin(),
                              event->new_tokens.begin() + static_cast<std::ptrdiff_t>(fresh));
      if (state.logprobs)
        for (size_t i = 0; i < fresh; ++i) {
          state.output_logprobs.push_back(i < event->logprobs.size() ? event->logprobs[i] : NAN);
          state.output_top_logprobs.push_back(i < event->top_logprobs.size() ? event->top_logprobs[i]
                                                                              : decltype(event->top_logprobs)::value_type{});
        }
    }
    if (stop_string) {
      // The scheduler does not know stop strings: end the request there. Its abort event is
      // never read (the channel goes with this handler).
      if (!event->finished) frontend_.cancel(state.id);
      state.finished = finish_reason::kStop;
    } else if (event->error) {
      // Tokens that arrived with the error (events merged while the stream caught up) are
      // still streamed before it.
      failure = *event->error;
    } else if (event->finished) {
      state.finished = event->reason;
      state.spec_drafted = event->metrics.spec_drafted;
      state.spec_accepted = event->metrics.spec_accepted;
      state.cached_tokens = event->metrics.cached_tokens;
      if (texts) {
        new_text += texts->finish();
        if (texts->stopped()) state.finished = finish_reason::kStop;
      }
    }
    if (texts) state.text = texts->text();
    const bool done = state.finished.has_value();
    if (call.stream && (fresh > 0 || done)) {
      if (!streaming) {
        streaming = true;
        if (!co_await ex.begin_stream(200, "text/event-stream", warn_headers)) {
          gone = true;
          break;
        }
        if (kind == api_kind::kChat && !co_await ex.write_chunk(sse(chat_role_chunk(state)))) {
          gone = true;
          break;
        }
        // echo: the prompt is the stream's first chunk.
        if (kind == api_kind::kCompletions && state.echo_text &&
            !co_await ex.write_chunk(sse(completion_chunk(state, state.echo_ids, *state.echo_text)))) {
          gone = true;
          break;
        }
      }
      const std::span<const int32_t> new_ids(state.output_ids.data() + (state.output_ids.size() - fresh), fresh);
      const std::string chunks = render_chunks(kind, state, new_ids, new_text);
      if (!chunks.empty() && !co_await ex.write_chunk(chunks)) {
        gone = true;
        break;
      }
    }
    if (done || failure) break;
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
      co_await ex.respond(with_warning(http::error_response(500, http::kServerError, message)));
    }
    co_return;
  }

  metrics_.request_latency().observe(state.latency_ms / 1e3);
  metrics_.count_request(200);
  log_finished(kind, state, finish_reason_name(*state.finished));
  if (streaming) {
    if (co_await ex.write_chunk(std::string(kDone))) co_await ex.end_stream();
  } else {
    co_await ex.respond(with_warning(http::json_response(200, render_final(kind, state))));
  }
}

}  // namespace hyserve::coordinator::api
