#pragma once
// The coordinator's HTTP server: an io_context run by N threads, the listener, one session per
// connection, and the routes of the API (api/endpoints.h) over a frontend (the scheduler).
//
//   metrics::service_metrics metrics;            // shared with the scheduler
//   my_scheduler scheduler(cfg, metrics);        // implements coordinator::frontend
//   http::server_options opts;  opts.port = 8000;
//   http::server server(opts, scheduler, metrics);
//   server.start();                              // binds (throws hyserve::error), serves
//   ...  // on SIGINT/SIGTERM:
//   server.stop(std::chrono::seconds(30));       // drain in-flight requests, then close
//
// The frontend and the metrics must outlive the server. The frontend may call a request's sink
// at any time, even after the server is gone (late events are dropped).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <boost/json/object.hpp>

#include "coordinator/api/text_support.h"
#include "coordinator/metrics/service_metrics.h"
#include "coordinator/request.h"

namespace hyserve::coordinator::http {

struct server_options {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;  // 0 picks an ephemeral port (see server::port())
  int threads = 2;       // io_context threads
  std::size_t body_limit = 1 << 20;                 // bytes; larger bodies answer 413
  std::chrono::milliseconds read_timeout{30'000};   // per read, also the keep-alive idle limit
  std::chrono::milliseconds write_timeout{30'000};  // per write
  std::optional<std::string> api_key;  // when set, all routes but /health need "Authorization: Bearer <key>"
  std::string served_model_name;       // empty: the frontend's model_id
  int retry_after_seconds = 1;         // Retry-After of 503 queue-full answers
  boost::json::object server_info;     // extra fields for GET /server_info (e.g. the config)
  api::text_support text;              // tokenizer and chat format; empty: token ids only
  bool strict_fields = false;          // OpenAI routes: unknown request fields are a 400
};

class server {
 public:
  server(server_options options, frontend& fe, metrics::service_metrics& metrics);
  ~server();  // stop(0) if still running
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  // Binds and starts serving. Throws hyserve::error when the address cannot be bound.
  void start();
  // The bound port (after start()).
  uint16_t port() const;

  // Graceful stop: stop accepting, let in-flight requests finish until `deadline` elapses, then
  // abort what is left (its requests are cancelled at the frontend) and join the threads.
  // Returns true when everything finished within the deadline. Idempotent.
  bool stop(std::chrono::milliseconds deadline);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace hyserve::coordinator::http
