#pragma once
// A small synchronous Boost.Beast HTTP/1.1 client for the tests of the HTTP server and of the
// whole service (the hyserve_test_support library). Every exchange is bounded: a watchdog
// thread shuts the socket down at the deadline, which makes a blocked read or write fail
// instead of hanging the test.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>

namespace hyserve::test_support {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using namespace std::chrono_literals;

// Shuts the socket down if the guarded I/O is still running at the deadline.
class socket_deadline {
 public:
  socket_deadline(tcp::socket& socket, std::chrono::milliseconds limit)
      : socket_deadline(socket.native_handle(), limit) {}
  socket_deadline(int fd, std::chrono::milliseconds limit)
      : thread_([this, fd, limit] {
          std::unique_lock lock(mutex_);
          if (!cv_.wait_for(lock, limit, [this] { return done_; })) {
            expired_ = true;
            ::shutdown(fd, SHUT_RDWR);
          }
        }) {}
  ~socket_deadline() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  bool expired() {
    std::lock_guard lock(mutex_);
    return expired_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  bool expired_ = false;
  std::thread thread_;
};

struct http_reply {
  unsigned status = 0;  // 0: the exchange failed (see error)
  std::string body;
  std::map<std::string, std::string> headers;  // lower-case names
  bool keep_alive = false;                     // the response lets the connection stay open
  std::string error;

  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
  // The body as JSON (null when it is not JSON).
  boost::json::value json() const {
    boost::system::error_code ec;
    boost::json::value v = boost::json::parse(body, ec);
    return ec ? boost::json::value() : v;
  }
  std::string describe() const {
    return "status " + std::to_string(status) + (error.empty() ? "" : " (" + error + ")") + ", body: " +
           body.substr(0, 600);
  }
};

// One connection (keep-alive).
class http_connection {
 public:
  explicit http_connection(uint16_t port, std::chrono::milliseconds connect_limit = 10s) : socket_(ioc_) {
    beast::error_code ec;
    socket_.open(tcp::v4(), ec);
    if (ec) {
      error_ = "open: " + ec.message();
      return;
    }
    error_ = connect_with_timeout(socket_.native_handle(), port, connect_limit);
  }
  ~http_connection() { close(); }

  bool connected() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  http_reply request(const std::string& method, const std::string& target, const std::string& body = {},
                     const std::vector<std::pair<std::string, std::string>>& headers = {},
                     std::chrono::milliseconds limit = 120s) {
    http_reply reply;
    if (!connected()) {
      reply.error = error_;
      return reply;
    }
    socket_deadline deadline(socket_.native_handle(), limit);
    beast::error_code ec;
    bhttp::write(socket_, make_request(method, target, body, headers), ec);
    if (ec) {
      reply.error = "write: " + ec.message() + (deadline.expired() ? " (deadline)" : "");
      // The server may have answered before reading everything (413): try to read it.
    }
    read_reply(reply, deadline);
    return reply;
  }

  // Writes raw bytes (a hand-made request) and reads one response.
  http_reply raw_exchange(const std::string& bytes, std::chrono::milliseconds limit = 30s) {
    http_reply reply;
    if (!connected()) {
      reply.error = error_;
      return reply;
    }
    socket_deadline deadline(socket_.native_handle(), limit);
    beast::error_code ec;
    net::write(socket_, net::buffer(bytes), ec);
    if (ec) reply.error = "write: " + ec.message();
    read_reply(reply, deadline);
    return reply;
  }

  // Writes a request without reading the answer.
  bool send_only(const std::string& method, const std::string& target, const std::string& body,
                 std::chrono::milliseconds limit = 30s) {
    if (!connected()) return false;
    socket_deadline deadline(socket_.native_handle(), limit);
    beast::error_code ec;
    bhttp::write(socket_, make_request(method, target, body, {}), ec);
    if (ec) error_ = "write: " + ec.message();
    return !ec;
  }

  // Streaming: sends the request and reads the response header. Returns the status (0 on
  // failure); events are then read with next_event().
  unsigned begin_stream(const std::string& target, const std::string& body, std::chrono::milliseconds limit = 60s) {
    stream_parser_.emplace();
    stream_parser_->body_limit(256 << 20);
    stream_consumed_ = 0;
    if (!connected()) return 0;
    socket_deadline deadline(socket_.native_handle(), limit);
    beast::error_code ec;
    bhttp::write(socket_, make_request("POST", target, body, {}), ec);
    if (ec) {
      error_ = "write: " + ec.message();
      return 0;
    }
    bhttp::read_header(socket_, buffer_, *stream_parser_, ec);
    if (ec) {
      error_ = "read header: " + ec.message() + (deadline.expired() ? " (deadline)" : "");
      return 0;
    }
    return stream_parser_->get().result_int();
  }

  // The payload of the next `data: ...` event; nullopt at the end of the stream or on error
  // (stream_error() tells which).
  std::optional<std::string> next_event(std::chrono::milliseconds limit = 60s) {
    if (!stream_parser_) return std::nullopt;
    socket_deadline deadline(socket_.native_handle(), limit);
    while (true) {
      const std::string& body = stream_parser_->get().body();
      const size_t end = body.find("\n\n", stream_consumed_);
      if (end != std::string::npos) {
        std::string block = body.substr(stream_consumed_, end - stream_consumed_);
        stream_consumed_ = end + 2;
        if (block.rfind("data: ", 0) == 0) return block.substr(6);
        continue;  // a comment or another field: skip
      }
      if (stream_parser_->is_done()) return std::nullopt;
      beast::error_code ec;
      bhttp::read_some(socket_, buffer_, *stream_parser_, ec);
      if (ec) {
        stream_error_ = "read: " + ec.message() + (deadline.expired() ? " (deadline)" : "");
        return std::nullopt;
      }
    }
  }
  bool stream_done() const { return stream_parser_ && stream_parser_->is_done(); }

  // Reads a streamed response (its request sent with send_only) until its body contains
  // `needle`; returns the body so far.
  std::string read_stream_until(const std::string& needle, std::chrono::milliseconds limit = 5s) {
    socket_deadline deadline(socket_, limit);
    bhttp::response_parser<bhttp::string_body> parser;
    beast::error_code ec;
    bhttp::read_header(socket_, buffer_, parser, ec);
    while (!ec && parser.get().body().find(needle) == std::string::npos && !parser.is_done())
      bhttp::read_some(socket_, buffer_, parser, ec);
    return parser.get().body();
  }
  const std::string& stream_error() const { return stream_error_; }

  void close() {
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
  }
  tcp::socket& socket() { return socket_; }

  // Closes abruptly (RST): what a client that crashes does.
  void reset() {
    beast::error_code ec;
    socket_.set_option(net::socket_base::linger(true, 0), ec);
    socket_.close(ec);
  }

 private:
  // A non-blocking connect bounded by poll(); "" on success.
  static std::string connect_with_timeout(int fd, uint16_t port, std::chrono::milliseconds limit) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    const int flags = ::fcntl(fd, F_GETFL, 0);
    ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    std::string err;
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
      if (errno != EINPROGRESS) {
        err = std::string("connect: ") + std::strerror(errno);
      } else {
        pollfd p{fd, POLLOUT, 0};
        const int n = ::poll(&p, 1, static_cast<int>(limit.count()));
        int so_error = 0;
        socklen_t len = sizeof(so_error);
        if (n == 0) {
          err = "connect: timed out";
        } else if (n < 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) {
          err = std::string("connect: ") + std::strerror(errno);
        } else if (so_error != 0) {
          err = std::string("connect: ") + std::strerror(so_error);
        }
      }
    }
    ::fcntl(fd, F_SETFL, flags);
    return err;
  }

  void read_reply(http_reply& reply, socket_deadline& deadline) {
    bhttp::response_parser<bhttp::string_body> parser;
    parser.body_limit(256 << 20);
    beast::error_code rec;
    bhttp::read(socket_, buffer_, parser, rec);
    if (rec) {
      reply.error = (reply.error.empty() ? "" : reply.error + "; ") + "read: " + rec.message() +
                    (deadline.expired() ? " (deadline)" : "");
      return;
    }
    auto res = parser.release();
    reply.status = res.result_int();
    reply.keep_alive = res.keep_alive();
    for (const auto& f : res) {
      std::string name(f.name_string());
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      reply.headers[name] = std::string(f.value());
    }
    reply.body = std::move(res.body());
  }

  static bhttp::request<bhttp::string_body> make_request(
      const std::string& method, const std::string& target, const std::string& body,
      const std::vector<std::pair<std::string, std::string>>& headers) {
    bhttp::request<bhttp::string_body> req;
    req.method_string(method);
    req.target(target);
    req.version(11);
    req.set(bhttp::field::host, "127.0.0.1");
    if (!body.empty()) req.set(bhttp::field::content_type, "application/json");
    for (const auto& [name, value] : headers) req.set(name, value);
    req.body() = body;
    req.keep_alive(true);
    req.prepare_payload();
    return req;
  }

  net::io_context ioc_;
  tcp::socket socket_;
  beast::flat_buffer buffer_;
  std::string error_;
  std::optional<bhttp::response_parser<bhttp::string_body>> stream_parser_;
  size_t stream_consumed_ = 0;
  std::string stream_error_;
};

// One request on a fresh connection.
inline http_reply http_call(uint16_t port, const std::string& method, const std::string& target,
                            const std::string& body = {}, std::chrono::milliseconds limit = 120s) {
  http_connection c(port);
  return c.request(method, target, body, {}, limit);
}

// The payloads of the `data: ...` events of a server-sent-events body, in order.
inline std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> events;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    const std::string block = body.substr(pos, end - pos);
    if (block.rfind("data: ", 0) == 0) events.push_back(block.substr(6));
    pos = end + 2;
  }
  return events;
}

inline http_reply http_get(uint16_t port, const std::string& target) { return http_call(port, "GET", target); }
inline http_reply http_post(uint16_t port, const std::string& target, const std::string& body,
                            std::chrono::milliseconds limit = 120s) {
  return http_call(port, "POST", target, body, limit);
}

}  // namespace hyserve::test_support
