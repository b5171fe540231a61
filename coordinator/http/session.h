#pragma once
// One client connection: HTTP/1.1 with keep-alive, a timeout on every read and write, a body
// limit (413), handlers dispatched through the router. An exception thrown by a handler ends
// only this connection (after a 500 if nothing was sent yet). The Beast implementation lives in
// session.cpp so that this header stays light.
#include <chrono>
#include <cstddef>
#include <memory>

#include <boost/asio/ip/tcp.hpp>

namespace hyserve::coordinator::http {

class router;
class session_registry;

struct session_options {
  std::size_t body_limit = 1 << 20;        // bytes; a larger body answers 413
  std::size_t header_limit = 16 * 1024;    // bytes; larger headers answer 431
  std::chrono::milliseconds read_timeout{30'000};   // per read (also the keep-alive idle limit)
  std::chrono::milliseconds write_timeout{30'000};  // per write
};

class session : public std::enable_shared_from_this<session> {
 public:
  // `routes`, `options` and `registry` must outlive the session. The session adds itself to
  // `registry` on start and removes itself on destruction.
  static std::shared_ptr<session> create(boost::asio::ip::tcp::socket socket, const router& routes,
                                         const session_options& options, session_registry& registry);
  virtual ~session() = default;

  // Starts serving on the socket's executor (a strand).
  virtual void start() = 0;
  // Thread-safe. Finish the request in flight (answering with Connection: close), then close;
  // an idle connection closes at once.
  virtual void drain() = 0;
  // Thread-safe. Close now: the handler in flight sees the client as gone (and cancels its work).
  virtual void abort() = 0;
};

}  // namespace hyserve::coordinator::http
