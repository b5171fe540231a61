#pragma once
// The acceptor: binds and listens at construction (so a port conflict is an error at start-up
// and port 0 picks an ephemeral port), then accepts connections until stop(), handing each
// socket, on its own strand, to `on_accept`.
#include <cstdint>
#include <functional>
#include <memory>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

namespace hyserve::coordinator::http {

class listener : public std::enable_shared_from_this<listener> {
 public:
  using accept_handler = std::function<void(boost::asio::ip::tcp::socket)>;

  // Throws hyserve::error naming the endpoint when it cannot bind or listen.
  listener(boost::asio::io_context& ioc, const boost::asio::ip::tcp::endpoint& endpoint, accept_handler on_accept);

  uint16_t port() const { return port_; }

  void start();
  // Thread-safe: closes the acceptor; connections already accepted are not touched.
  void stop();

 private:
  boost::asio::awaitable<void> accept_loop();

  boost::asio::io_context& ioc_;
  boost::asio::ip::tcp::acceptor acceptor_;
  accept_handler on_accept_;
  uint16_t port_ = 0;
};

}  // namespace hyserve::coordinator::http
