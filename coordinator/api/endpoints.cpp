#include "coordinator/api/endpoints.h"

#include <chrono>
#include <string>

#include <boost/json.hpp>

namespace hyserve::coordinator::api {
namespace {

constexpr std::string_view kBearer = "Bearer ";

// Compares without an early exit, so the time taken does not tell how much of a key matched
// (only whether the length did).
bool same_secret(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

endpoints::endpoints(frontend& fe, metrics::service_metrics& metrics, std::shared_ptr<event_gate> gate,
                     endpoint_options options)
    : frontend_(fe),
      metrics_(metrics),
      options_(std::move(options)),
      generation_(fe, metrics, std::move(gate), options_.generation),
      started_(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                   .count()) {}

void endpoints::register_routes(http::router& routes) const {
  routes.add("GET", "/health", [this](http::exchange& ex) { return health(ex); });
  routes.add("GET", "/v1/models", guard([this](http::exchange& ex) { return models(ex); }));
  routes.add("GET", "/server_info", guard([this](http::exchange& ex) { return server_info(ex); }));
  routes.add("GET", "/metrics", guard([this](http::exchange& ex) { return metrics_text(ex); }));
  routes.add("POST", "/flush_cache", guard([this](http::exchange& ex) { return flush_cache(ex); }));
  routes.add("POST", "/generate",
             guard([this](http::exchange& ex) { return generation_.handle(ex, api_kind::kGenerate); }));
  routes.add("POST", "/v1/completions",
             guard([this](http::exchange& ex) { return generation_.handle(ex, api_kind::kCompletions); }));
  routes.add("POST", "/v1/chat/completions",
             guard([this](http::exchange& ex) { return generation_.handle(ex, api_kind::kChat); }));
}

http::handler endpoints::guard(http::handler inner) const {
  if (!options_.api_key) return inner;
  // The router keeps this closure (and so `inner`) alive for as long as it dispatches.
  return [this, inner = std::move(inner)](http::exchange& ex) { return authorized(ex, inner); };
}

boost::asio::awaitable<void> endpoints::authorized(http::exchange& ex, const http::handler& inner) const {
  const std::string_view auth = ex.header("Authorization");
  const bool ok = auth.starts_with(kBearer) && same_secret(auth.substr(kBearer.size()), *options_.api_key);
  if (!ok) {
    http::response res = http::error_response(
        401, http::kAuthenticationError,
        auth.empty() ? "missing API key: send Authorization: Bearer <key>" : "invalid API key");
    res.headers.emplace_back("WWW-Authenticate", "Bearer");
    co_await ex.respond(std::move(res));
    co_return;
  }
  co_await inner(ex);
}

boost::asio::awaitable<void> endpoints::health(http::exchange& ex) const {
  const bool healthy = frontend_.healthy();
  boost::json::object body;
  body["status"] = healthy ? "ok" : "unavailable";
  co_await ex.respond(http::json_response(healthy ? 200 : 503, body));
}

boost::asio::awaitable<void> endpoints::models(http::exchange& ex) const {
  const model_info info = frontend_.info();
  boost::json::object model;
  model["id"] = options_.generation.served_model_name.empty() ? info.model_id : options_.generation.served_model_name;
  model["object"] = "model";
  model["created"] = started_;
  model["owned_by"] = "hyserve";
  model["max_model_len"] = info.max_context;
  boost::json::array data;
  data.emplace_back(std::move(model));
  boost::json::object body;
  body["object"] = "list";
  body["data"] = std::move(data);
  co_await ex.respond(http::json_response(200, body));
}

boost::asio::awaitable<void> endpoints::server_info(http::exchange& ex) const {
  const model_info info = frontend_.info();
  boost::json::object model;
  model["model_id"] = info.model_id;
  model["vocab_size"] = info.vocab_size;
  model["max_context"] = info.max_context;
  model["eos_token_id"] = info.eos_token_id;
  model["dp"] = info.dp;
  model["tp"] = info.tp;
  boost::json::object body = options_.server_info;
  body["model_info"] = std::move(model);
  body["served_model_name"] =
      options_.generation.served_model_name.empty() ? info.model_id : options_.generation.served_model_name;
  body["healthy"] = frontend_.healthy();
  body["started"] = started_;
  co_await ex.respond(http::json_response(200, body));
}

// POST /flush_cache: drops every prefix-cache entry no running request holds. The scheduler
// loop does it between two iterations; this handler waits for it (a few milliseconds).
boost::asio::awaitable<void> endpoints::flush_cache(http::exchange& ex) const {
  const flush_result r = frontend_.flush_cache();
  if (!r.ok) {
    co_await ex.respond(http::error_response(400, http::kInvalidRequest, r.message));
    co_return;
  }
  boost::json::object body;
  body["flushed"] = true;
  body["pages"] = r.pages;
  body["checkpoints"] = r.checkpoints;
  co_await ex.respond(http::json_response(200, body));
}

boost::asio::awaitable<void> endpoints::metrics_text(http::exchange& ex) const {
  http::response res;
  res.content_type = "text/plain; version=0.0.4; charset=utf-8";
  res.body = metrics_.render();
  co_await ex.respond(std::move(res));
}

}  // namespace hyserve::coordinator::api
