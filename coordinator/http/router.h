#pragma once
// Method + path dispatch. Paths match exactly (the query string is ignored). An unknown path
// answers 404; a known path with another method answers 405 with an Allow header listing the
// methods it takes. Both are JSON errors like every other failure.
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include <boost/asio/awaitable.hpp>

#include "coordinator/http/exchange.h"

namespace hyserve::coordinator::http {

using handler = std::function<boost::asio::awaitable<void>(exchange&)>;

class router {
 public:
  // Registering the same method and path twice is a bug (HYSERVE_CHECK).
  void add(std::string method, std::string path, handler h);

  // Runs the matching handler, or answers 404 / 405.
  boost::asio::awaitable<void> dispatch(exchange& ex) const;

 private:
  // path -> method -> handler
  std::map<std::string, std::map<std::string, handler>, std::less<>> routes_;
};

}  // namespace hyserve::coordinator::http
