#pragma once
// Answers one generation call (/generate, /v1/completions, /v1/chat/completions): validate,
// submit to the frontend, then relay the request's events as one JSON response or as
// server-sent events. Runs on the session's strand; events reach it through an event_channel.
// When the client goes away before the end, the request is cancelled at the frontend.
//
// With a tokenizer, generated ids are also turned into text here (the scheduler stays at the
// token level): streamed text never splits a UTF-8 character, and when a stop string appears
// the request is cancelled at the frontend and answered as finished with "stop", its text
// ending right before the stop string.
#include <memory>
#include <string>

#include <boost/asio/awaitable.hpp>

#include "coordinator/api/completion_call.h"
#include "coordinator/api/event_channel.h"
#include "coordinator/api/text_support.h"
#include "coordinator/http/exchange.h"
#include "coordinator/metrics/service_metrics.h"
#include "coordinator/request.h"

namespace hyserve::coordinator::api {

struct generation_options {
  std::string served_model_name;  // "model" in OpenAI responses; empty: frontend's model_id
  int retry_after_seconds = 1;    // Retry-After when the queue is full
  text_support text;              // tokenizer and chat format; empty: token ids only
  // OpenAI routes: unknown request fields are a 400 instead of a warning (X-Hyserve-Ignored-Fields
  // header and a log line).
  bool strict_fields = false;
};

// The response header that names request fields an OpenAI route ignored.
inline constexpr const char* kIgnoredFieldsHeader = "X-Hyserve-Ignored-Fields";

class generation_handler {
 public:
  generation_handler(frontend& fe, metrics::service_metrics& metrics, std::shared_ptr<event_gate> gate,
                     generation_options options);

  boost::asio::awaitable<void> handle(http::exchange& ex, api_kind kind) const;

 private:
  frontend& frontend_;
  metrics::service_metrics& metrics_;
  std::shared_ptr<event_gate> gate_;
  generation_options options_;
};

}  // namespace hyserve::coordinator::api
