#include "coordinator/http/session.h"

#include <sys/socket.h>

#include <cerrno>
#include <exception>
#include <optional>
#include <string>
#include <utility>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "coordinator/http/exchange.h"
#include "coordinator/http/router.h"
#include "coordinator/http/session_registry.h"
#include "coordinator/log.h"

namespace hyserve::coordinator::http {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;

constexpr std::string_view kServerName = "hyserve";
// After answering a request whose body was not read (413, malformed request), keep reading and
// discarding for a moment so the peer gets the answer instead of a connection reset.
constexpr std::chrono::milliseconds kLingerTimeout{500};
constexpr size_t kLingerMaxBytes = 4 << 20;

bool is_http_error(const beast::error_code& ec) {
  return ec.category() == bhttp::make_error_code(bhttp::error::bad_method).category();
}

class beast_session final : public session, private exchange {
 public:
  beast_session(tcp::socket socket, const router& routes, const session_options& options, session_registry& registry)
      : executor_(socket.get_executor()), stream_(std::move(socket)), router_(routes), options_(options), registry_(registry) {}

  ~beast_session() override { registry_.remove(this); }

  void start() override {
    registry_.add(shared_from_this());
    auto self = std::static_pointer_cast<beast_session>(shared_from_this());
    net::co_spawn(stream_.get_executor(), run(), [self](std::exception_ptr error) {
      if (!error) return;
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        HYSERVE_LOG_ERROR("http session ended by an exception: %s", e.what());
      } catch (...) {
        HYSERVE_LOG_ERROR("http session ended by an unknown exception");
      }
    });
  }

  void drain() override {
    net::post(stream_.get_executor(), [self = self_ptr()] {
      self->draining_ = true;
      if (self->idle_) self->stream_.cancel();
    });
  }

  void abort() override {
    net::post(stream_.get_executor(), [self = self_ptr()] {
      self->draining_ = true;
      self->aborted_ = true;
      self->mark_client_gone();
      beast::error_code ec;
      self->stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
      self->stream_.cancel();
    });
  }

 private:
  std::shared_ptr<beast_session> self_ptr() { return std::static_pointer_cast<beast_session>(shared_from_this()); }

  net::awaitable<void> run() {
    bool linger = false;  // the peer may still be sending a request we did not read
    while (!draining_) {
      bhttp::request_parser<bhttp::string_body> parser;
      parser.header_limit(static_cast<std::uint32_t>(options_.header_limit));
      parser.body_limit(options_.body_limit);

      beast::error_code ec;
      idle_ = true;
      stream_.expires_after(options_.read_timeout);
      co_await bhttp::async_read_header(stream_, buffer_, parser, net::redirect_error(net::use_awaitable, ec));
      idle_ = false;
      if (!ec && !parser.is_done()) {
        if (bhttp::token_list(parser.get()[bhttp::field::expect]).exists("100-continue")) {
          static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
          stream_.expires_after(options_.write_timeout);
          co_await net::async_write(stream_, net::buffer(kContinue.data(), kContinue.size()),
                                    net::redirect_error(net::use_awaitable, ec));
        }
        if (!ec) {
          stream_.expires_after(options_.read_timeout);
          co_await bhttp::async_read(stream_, buffer_, parser, net::redirect_error(net::use_awaitable, ec));
        }
      }
      if (aborted_) break;
      if (ec) {
        linger = co_await answer_read_error(ec);
        break;
      }

      request_ = parser.release();
      const std::string_view target(request_.target().data(), request_.target().size());
      path_ = std::string(target.substr(0, target.find('?')));
      keep_alive_ = request_.keep_alive();
      close_delimited_ = false;
      responded_ = false;
      client_gone_ = false;

      std::string failure;
      try {
        co_await router_.dispatch(*this);
      } catch (const std::exception& e) {
        failure = e.what();
      }
      end_watch();
      if (!failure.empty()) {
        HYSERVE_LOG_ERROR("handler for %s %s failed: %s", std::string(method()).c_str(), path_.c_str(),
                          failure.c_str());
        keep_alive_ = false;
        if (!responded_ && !client_gone_) {
          co_await respond(error_response(500, kServerError, "internal error: " + failure));
        }
        break;
      }
      if (!responded_ && !client_gone_) {
        keep_alive_ = false;
        co_await respond(error_response(500, kServerError, "the handler sent no response"));
      }
      if (!keep_alive_ || client_gone_) break;
    }
    co_await close(linger);
  }

  // Answers a failed read where an answer is useful. Returns true when the request was not
  // read to its end.
  net::awaitable<bool> answer_read_error(const beast::error_code& ec) {
    if (ec == bhttp::error::body_limit) {
      keep_alive_ = false;
      co_await respond(error_response(413, kInvalidRequest,
                                      "request body exceeds the limit of " + std::to_string(options_.body_limit) +
                                          " bytes"));
      co_return true;
    }
    if (ec == bhttp::error::header_limit) {
      keep_alive_ = false;
      co_await respond(error_response(431, kInvalidRequest,
                                      "request headers exceed the limit of " +
                                          std::to_string(options_.header_limit) + " bytes"));
      co_return true;
    }
    // end_of_stream: the client closed between requests; partial_message: it closed mid-request.
    if (is_http_error(ec) && ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message) {
      keep_alive_ = false;
      co_await respond(error_response(400, kInvalidRequest, "malformed HTTP request: " + ec.message()));
      co_return true;
    }
    // Timeouts, resets, and cancellation by drain(): close without an answer.
    co_return false;
  }

  net::awaitable<void> close(bool linger) {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (linger && !ec) {
      stream_.expires_after(kLingerTimeout);
      size_t discarded = 0;
      char sink[4096];
      while (discarded < kLingerMaxBytes) {
        const size_t n =
            co_await stream_.async_read_some(net::buffer(sink), net::redirect_error(net::use_awaitable, ec));
        if (ec) break;
        discarded += n;
      }
    }
    stream_.socket().close(ec);
  }

  // exchange

  std::string_view method() const override {
    const auto m = request_.method_string();
    return {m.data(), m.size()};
  }
  std::string_view path() const override { return path_; }
  std::string_view header(std::string_view name) const override {
    const auto it = request_.find(beast::string_view(name.data(), name.size()));
    if (it == request_.end()) return {};
    return {it->value().data(), it->value().size()};
  }
  std::string_view body() const override { return request_.body(); }
  net::any_io_executor executor() const override { return executor_; }

  net::awaitable<void> respond(response res) override {
    responded_ = true;
    bhttp::response<bhttp::string_body> msg{static_cast<bhttp::status>(res.status), version()};
    msg.set(bhttp::field::server, beast::string_view(kServerName.data(), kServerName.size()));
    msg.set(bhttp::field::content_type, res.content_type);
    for (const auto& [name, value] : res.headers) msg.set(name, value);
    msg.keep_alive(keep_alive_ && !draining_);
    msg.body() = std::move(res.body);
    msg.prepare_payload();
    beast::error_code ec;
    stream_.expires_after(options_.write_timeout);
    co_await bhttp::async_write(stream_, msg, net::redirect_error(net::use_awaitable, ec));
    if (ec) fail_write();
  }

  net::awaitable<bool> begin_stream(unsigned status, std::string content_type,
                                    std::vector<std::pair<std::string, std::string>> headers = {}) override {
    responded_ = true;
    bhttp::response<bhttp::empty_body> msg{static_cast<bhttp::status>(status), version()};
    msg.set(bhttp::field::server, beast::string_view(kServerName.data(), kServerName.size()));
    msg.set(bhttp::field::content_type, content_type);
    msg.set(bhttp::field::cache_control, "no-cache");
    for (const auto& [name, value] : headers) msg.set(name, value);
    // HTTP/1.0 has no chunked encoding: the body runs until the connection closes.
    close_delimited_ = request_.version() < 11;
    if (close_delimited_) keep_alive_ = false;
    msg.keep_alive(keep_alive_ && !draining_);
    msg.chunked(!close_delimited_);
    bhttp::response_serializer<bhttp::empty_body> serializer{msg};
    beast::error_code ec;
    stream_.expires_after(options_.write_timeout);
    co_await bhttp::async_write_header(stream_, serializer, net::redirect_error(net::use_awaitable, ec));
    if (ec) fail_write();
    co_return !ec;
  }

  net::awaitable<bool> write_chunk(std::string data) override {
    if (client_gone_) co_return false;
    beast::error_code ec;
    stream_.expires_after(options_.write_timeout);
    if (close_delimited_)
      co_await net::async_write(stream_, net::buffer(data), net::redirect_error(net::use_awaitable, ec));
    else
      co_await net::async_write(stream_, bhttp::make_chunk(net::buffer(data)),
                                net::redirect_error(net::use_awaitable, ec));
    if (ec) fail_write();
    co_return !ec;
  }

  net::awaitable<bool> end_stream() override {
    if (client_gone_) co_return false;
    if (close_delimited_) co_return true;  // the connection closes after the handler (keep_alive_ off)
    beast::error_code ec;
    stream_.expires_after(options_.write_timeout);
    co_await net::async_write(stream_, bhttp::make_chunk_last(), net::redirect_error(net::use_awaitable, ec));
    if (ec) fail_write();
    co_return !ec;
  }

  void watch_disconnect(std::function<void()> on_gone) override {
    on_gone_ = std::move(on_gone);
    if (client_gone_) {
      mark_client_gone();
      return;
    }
    arm_watch();
  }

  bool client_gone() const override { return client_gone_; }

  // The disconnect watch: a wait for readability on the socket while the handler waits for
  // events. Readable means either a pipelined request (the client is alive) or end of stream.
  void arm_watch() {
    const uint64_t generation = ++watch_generation_;
    stream_.socket().async_wait(
        tcp::socket::wait_read,
        net::bind_executor(stream_.get_executor(), [self = self_ptr(), generation](const beast::error_code& ec) {
          self->on_readable(generation, ec);
        }));
  }

  void on_readable(uint64_t generation, const beast::error_code& ec) {
    if (generation != watch_generation_ || !on_gone_) return;  // stale, or the watch ended
    if (!ec) {
      char byte = 0;
      const ssize_t n = ::recv(stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n > 0) return;  // pipelined data: the client is still there; stop watching
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        arm_watch();  // spurious wake-up
        return;
      }
    }
    mark_client_gone();
  }

  void end_watch() {
    ++watch_generation_;
    on_gone_ = nullptr;
    beast::error_code ec;
    stream_.socket().cancel(ec);
  }

  void mark_client_gone() {
    client_gone_ = true;
    if (auto on_gone = std::exchange(on_gone_, nullptr)) on_gone();
  }

  void fail_write() {
    keep_alive_ = false;
    mark_client_gone();
  }

  unsigned version() const { return request_.version() == 0 ? 11 : request_.version(); }

  net::any_io_executor executor_;  // the connection's strand
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  const router& router_;
  const session_options& options_;
  session_registry& registry_;

  bhttp::request<bhttp::string_body> request_;
  std::string path_;
  bool keep_alive_ = false;
  bool close_delimited_ = false;  // the response being streamed ends when the connection closes
  bool responded_ = false;    // the current request has been answered (or its stream begun)
  bool idle_ = true;          // waiting for the next request's header
  bool draining_ = false;
  bool aborted_ = false;
  bool client_gone_ = false;
  std::function<void()> on_gone_;
  uint64_t watch_generation_ = 0;
};

}  // namespace

std::shared_ptr<session> session::create(tcp::socket socket, const router& routes, const session_options& options,
                                         session_registry& registry) {
  return std::make_shared<beast_session>(std::move(socket), routes, options, registry);
}

}  // namespace hyserve::coordinator::http
