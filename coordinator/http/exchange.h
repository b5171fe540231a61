#pragma once
// One request/response exchange on a connection, as a handler sees it. The session implements
// it; handlers run as coroutines on the session's strand (executor()), so everything a handler
// touches through the exchange is single-threaded.
//
// A handler answers exactly once: either respond(), or begin_stream() + write_chunk()* +
// end_stream() for a chunked response (server-sent events). Writes report false when the
// client is gone, after which the handler should stop writing.
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "coordinator/http/response.h"

namespace hyserve::coordinator::http {

class exchange {
 public:
  virtual ~exchange() = default;

  virtual std::string_view method() const = 0;  // "GET", "POST", ...
  virtual std::string_view path() const = 0;    // target without the query string
  virtual std::string_view header(std::string_view name) const = 0;  // "" when absent
  virtual std::string_view body() const = 0;

  // The session's strand: post here to run code serialised with the handler.
  virtual boost::asio::any_io_executor executor() const = 0;

  virtual boost::asio::awaitable<void> respond(response res) = 0;
  // HTTP/1.1 clients get a chunked body; HTTP/1.0 clients a close-delimited one (the connection
  // closes at end_stream). `headers`: extra response headers.
  virtual boost::asio::awaitable<bool> begin_stream(unsigned status, std::string content_type,
                                                    std::vector<std::pair<std::string, std::string>> headers = {}) = 0;
  virtual boost::asio::awaitable<bool> write_chunk(std::string data) = 0;
  virtual boost::asio::awaitable<bool> end_stream() = 0;

  // Arms a one-shot watch for the client going away (its side closed or reset, or the server
  // aborting the connection at the end of a drain) while the handler waits for something else.
  // `on_gone` runs on executor(). The watch ends when the handler returns.
  virtual void watch_disconnect(std::function<void()> on_gone) = 0;
  virtual bool client_gone() const = 0;
};

}  // namespace hyserve::coordinator::http
