#include "coordinator/http/router.h"

#include "hyserve/common/error.h"

namespace hyserve::coordinator::http {

void router::add(std::string method, std::string path, handler h) {
  auto& methods = routes_[std::move(path)];
  const bool inserted = methods.emplace(std::move(method), std::move(h)).second;
  HYSERVE_CHECK(inserted, "route registered twice");
}

boost::asio::awaitable<void> router::dispatch(exchange& ex) const {
  const auto by_path = routes_.find(ex.path());
  if (by_path == routes_.end()) {
    co_await ex.respond(error_response(404, kInvalidRequest, "no route for " + std::string(ex.path())));
    co_return;
  }
  const auto& methods = by_path->second;
  const auto by_method = methods.find(std::string(ex.method()));
  if (by_method == methods.end()) {
    std::string allow;
    for (const auto& [method, unused] : methods) {
      if (!allow.empty()) allow += ", ";
      allow += method;
    }
    response res = error_response(
        405, kInvalidRequest,
        "method " + std::string(ex.method()) + " is not allowed on " + by_path->first + " (allowed: " + allow + ")");
    res.headers.emplace_back("Allow", allow);
    co_await ex.respond(std::move(res));
    co_return;
  }
  co_await by_method->second(ex);
}

}  // namespace hyserve::coordinator::http
