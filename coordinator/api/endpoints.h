#pragma once
// The service's routes:
//   POST /generate, POST /v1/completions,
//   POST /v1/chat/completions              generation (generation_handler)
//   GET  /health                           200 {"status":"ok"} when the frontend is healthy, else 503
//   GET  /v1/models                        the served model (OpenAI list format)
//   GET  /server_info                      model_info and the server's settings
//   GET  /metrics                          Prometheus text format 0.0.4
// With an API key configured, every route except /health requires
// `Authorization: Bearer <key>` and answers 401 otherwise.
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/awaitable.hpp>
#include <boost/json/object.hpp>

#include "coordinator/api/generation_handler.h"
#include "coordinator/http/router.h"

namespace hyserve::coordinator::api {

struct endpoint_options {
  std::optional<std::string> api_key;
  generation_options generation;
  boost::json::object server_info;  // merged into GET /server_info
};

class endpoints {
 public:
  endpoints(frontend& fe, metrics::service_metrics& metrics, std::shared_ptr<event_gate> gate,
            endpoint_options options);

  // The routes hold references to this object: it must outlive `routes`' use.
  void register_routes(http::router& routes) const;

 private:
  boost::asio::awaitable<void> health(http::exchange& ex) const;
  boost::asio::awaitable<void> models(http::exchange& ex) const;
  boost::asio::awaitable<void> server_info(http::exchange& ex) const;
  boost::asio::awaitable<void> metrics_text(http::exchange& ex) const;
  boost::asio::awaitable<void> flush_cache(http::exchange& ex) const;
  boost::asio::awaitable<void> authorized(http::exchange& ex, const http::handler& inner) const;
  http::handler guard(http::handler inner) const;

  frontend& frontend_;
  metrics::service_metrics& metrics_;
  endpoint_options options_;
  generation_handler generation_;
  int64_t started_ = 0;  // unix seconds
};

}  // namespace hyserve::coordinator::api
