#include "coordinator/http/server.h"

#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/json.hpp>

#include "coordinator/api/endpoints.h"
#include "coordinator/api/event_channel.h"
#include "coordinator/http/listener.h"
#include "coordinator/http/router.h"
#include "coordinator/http/session.h"
#include "coordinator/http/session_registry.h"
#include "coordinator/log.h"
#include "hyserve/common/error.h"

#ifndef HYSERVE_VERSION
#define HYSERVE_VERSION "unknown"
#endif

namespace hyserve::coordinator::http {

namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

// After the drain deadline, aborted sessions get this long to unwind before the threads stop.
constexpr std::chrono::milliseconds kAbortGrace{1000};

}  // namespace

struct server::impl {
  impl(server_options opts, frontend& fe, metrics::service_metrics& m)
      : options(std::move(opts)), frontend_ref(fe), metrics_ref(m), gate(std::make_shared<api::event_gate>()) {
    session_opts.body_limit = options.body_limit;
    session_opts.read_timeout = options.read_timeout;
    session_opts.write_timeout = options.write_timeout;
  }

  boost::json::object server_info() const {
    boost::json::object http_info;
    http_info["host"] = options.host;
    http_info["port"] = listen->port();
    http_info["threads"] = options.threads;
    http_info["body_limit_bytes"] = options.body_limit;
    http_info["read_timeout_ms"] = options.read_timeout.count();
    http_info["write_timeout_ms"] = options.write_timeout.count();
    http_info["api_key_required"] = options.api_key.has_value();
    boost::json::object info = options.server_info;
    info["version"] = HYSERVE_VERSION;
    info["http"] = std::move(http_info);
    return info;
  }

  void run_thread() {
    // A handler that throws ends only its own work; the thread goes back to running others.
    for (;;) {
      try {
        ioc.run();
        return;
      } catch (const std::exception& e) {
        HYSERVE_LOG_ERROR("http thread: uncaught exception: %s", e.what());
      }
    }
  }

  server_options options;
  frontend& frontend_ref;
  metrics::service_metrics& metrics_ref;
  session_options session_opts;
  std::shared_ptr<api::event_gate> gate;
  // Declared before the io_context: sessions destroyed with it still remove themselves here.
  session_registry sessions;
  router routes;
  std::unique_ptr<api::endpoints> endpoints;
  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::shared_ptr<listener> listen;
  std::vector<std::thread> threads;
  std::mutex state_mutex;
  bool started = false;
  bool stopped = false;
  std::atomic<bool> stopping{false};
};

server::server(server_options options, frontend& fe, metrics::service_metrics& metrics)
    : impl_(std::make_unique<impl>(std::move(options), fe, metrics)) {}

server::~server() {
  stop(std::chrono::milliseconds(0));
  impl_->gate->close();
}

void server::start() {
  impl& s = *impl_;
  std::lock_guard lock(s.state_mutex);
  HYSERVE_CHECK(!s.started, "server::start called twice");
  boost::system::error_code ec;
  const auto address = net::ip::make_address(s.options.host, ec);
  if (ec) throw error("server.host: not an IP address: " + s.options.host);
  s.listen = std::make_shared<listener>(s.ioc, tcp::endpoint(address, s.options.port), [&s](tcp::socket socket) {
    auto c = session::create(std::move(socket), s.routes, s.session_opts, s.sessions);
    c->start();
    // Accepted while stop() was draining: it may have missed this one.
    if (s.stopping.load()) c->drain();
  });

  api::endpoint_options endpoint_opts;
  endpoint_opts.api_key = s.options.api_key;
  endpoint_opts.generation.served_model_name = s.options.served_model_name;
  endpoint_opts.generation.retry_after_seconds = s.options.retry_after_seconds;
  endpoint_opts.generation.strict_fields = s.options.strict_fields;
  endpoint_opts.generation.text = s.options.text;
  endpoint_opts.server_info = s.server_info();
  s.endpoints = std::make_unique<api::endpoints>(s.frontend_ref, s.metrics_ref, s.gate, std::move(endpoint_opts));
  s.endpoints->register_routes(s.routes);

  s.work.emplace(net::make_work_guard(s.ioc));
  s.listen->start();
  const int n = s.options.threads > 0 ? s.options.threads : 1;
  for (int i = 0; i < n; ++i) s.threads.emplace_back([&s] { s.run_thread(); });
  s.started = true;
  HYSERVE_LOG_INFO("http server listening on %s:%u (%d threads)", s.options.host.c_str(),
                   static_cast<unsigned>(s.listen->port()), n);
}

uint16_t server::port() const { return impl_->listen ? impl_->listen->port() : 0; }

bool server::stop(std::chrono::milliseconds deadline) {
  impl& s = *impl_;
  std::lock_guard lock(s.state_mutex);
  if (!s.started || s.stopped) return true;
  s.stopped = true;
  const auto until = std::chrono::steady_clock::now() + deadline;
  s.stopping.store(true);

  s.listen->stop();
  s.sessions.for_each([](session& c) { c.drain(); });
  bool drained = s.sessions.wait_empty_until(until);
  if (!drained) {
    HYSERVE_LOG_WARN("http server: %zu connection(s) still busy at the stop deadline; aborting them",
                     s.sessions.size());
    s.sessions.for_each([](session& c) { c.abort(); });
    s.sessions.wait_empty_until(std::chrono::steady_clock::now() + kAbortGrace);
  }
  s.work.reset();
  s.ioc.stop();
  for (auto& t : s.threads) t.join();
  s.threads.clear();
  HYSERVE_LOG_INFO("http server stopped%s", drained ? "" : " (some requests were aborted)");
  return drained;
}

}  // namespace hyserve::coordinator::http
