#include "coordinator/http/listener.h"

#include <chrono>
#include <exception>
#include <string>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "coordinator/log.h"
#include "hyserve/common/error.h"

namespace hyserve::coordinator::http {

namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

std::string endpoint_text(const tcp::endpoint& ep) { return ep.address().to_string() + ":" + std::to_string(ep.port()); }

}  // namespace

listener::listener(net::io_context& ioc, const tcp::endpoint& endpoint, accept_handler on_accept)
    : ioc_(ioc), acceptor_(net::make_strand(ioc)), on_accept_(std::move(on_accept)) {
  boost::system::error_code ec;
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
  if (ec) throw error("cannot listen on " + endpoint_text(endpoint) + ": " + ec.message());
  port_ = acceptor_.local_endpoint().port();
}

void listener::start() {
  net::co_spawn(acceptor_.get_executor(), accept_loop(), [self = shared_from_this()](std::exception_ptr e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      HYSERVE_LOG_ERROR("http listener stopped by an exception: %s", ex.what());
    }
  });
}

void listener::stop() {
  net::post(acceptor_.get_executor(), [self = shared_from_this()] {
    boost::system::error_code ec;
    self->acceptor_.close(ec);
  });
}

net::awaitable<void> listener::accept_loop() {
  net::steady_timer backoff(acceptor_.get_executor());
  while (acceptor_.is_open()) {
    boost::system::error_code ec;
    tcp::socket socket =
        co_await acceptor_.async_accept(net::make_strand(ioc_), net::redirect_error(net::use_awaitable, ec));
    if (!acceptor_.is_open() || ec == net::error::operation_aborted) break;
    if (ec) {
      // Typically out of file descriptors: back off instead of spinning.
      HYSERVE_LOG_WARN("accept failed: %s", ec.message().c_str());
      backoff.expires_after(std::chrono::milliseconds(50));
      co_await backoff.async_wait(net::redirect_error(net::use_awaitable, ec));
      continue;
    }
    boost::system::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    on_accept_(std::move(socket));
  }
}

}  // namespace hyserve::coordinator::http
