#pragma once
// Test doubles for the coordinator's HTTP tests: a deterministic frontend, and a synchronous
// Beast HTTP client whose every exchange is bounded by a deadline.
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
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

#include "coordinator/request.h"

namespace hyserve::coordinator::testing {

using namespace std::chrono_literals;

// Emits tokens (input_ids.back() + 1 + i) % vocab, one per event per tick, from its own thread.
// Honours max_new_tokens (finish: length), stop_token_ids (finish: stop) and cancel (finish:
// abort). Knobs make it refuse with a full queue, fail like a worker, or throw from submit.
class test_frontend final : public frontend {
 public:
  static constexpr int64_t kVocab = 1000;
  static constexpr int32_t kMaxContext = 256;

  test_frontend() : thread_([this] { loop(); }) {}
  ~test_frontend() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  submit_result submit(generate_request req) override {
    if (throw_on_submit) throw std::runtime_error("injected submit failure");
    if (queue_full) return {submit_status::kQueueFull, 0, "queue is full (max_queue 4)"};
    if (shutting_down) return {submit_status::kShuttingDown, 0, ""};
    std::lock_guard lock(mutex_);
    const uint64_t id = ++next_id_;
    req.id = id;
    active_.emplace(id, running{std::move(req), 0, false});
    ++submitted_;
    cv_.notify_all();
    return {submit_status::kAccepted, id, ""};
  }

  void cancel(uint64_t id) override {
    std::lock_guard lock(mutex_);
    cancelled_ids_.push_back(id);
    if (auto it = active_.find(id); it != active_.end()) it->second.cancelled = true;
    cv_.notify_all();
  }

  model_info info() const override {
    model_info m;
    m.model_id = "test-model";
    m.vocab_size = kVocab;
    m.max_context = kMaxContext;
    m.eos_token_id = 0;
    return m;
  }

  bool healthy() const override { return healthy_flag.load(); }

  bool wait_for_cancel(uint64_t id, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] {
      return std::find(cancelled_ids_.begin(), cancelled_ids_.end(), id) != cancelled_ids_.end();
    });
  }

  bool wait_for_active(size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return active_.size() >= n; });
  }

  uint64_t last_id() {
    std::lock_guard lock(mutex_);
    return next_id_;
  }

  std::atomic<bool> healthy_flag{true};
  std::atomic<bool> queue_full{false};
  std::atomic<bool> shutting_down{false};
  std::atomic<bool> throw_on_submit{false};
  std::atomic<int> fail_after_tokens{-1};  // >= 0: report a worker error after this many tokens
  std::atomic<int> tick_us{300};           // time between tokens

 private:
  struct running {
    generate_request req;
    int32_t produced = 0;
    bool cancelled = false;
  };

  void loop() {
    std::unique_lock lock(mutex_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::microseconds(tick_us.load()));
      std::vector<std::pair<event_sink, request_event>> out;
      for (auto it = active_.begin(); it != active_.end();) {
        running& r = it->second;
        request_event ev;
        bool done = false;
        if (r.cancelled) {
          ev.finished = done = true;
          ev.reason = finish_reason::kAbort;
        } else if (fail_after_tokens.load() >= 0 && r.produced >= fail_after_tokens.load()) {
          ev.finished = done = true;
          ev.error = "worker 1: injected fault";
        } else if (r.produced >= r.req.sampling.max_new_tokens) {
          ev.finished = done = true;
          ev.reason = finish_reason::kLength;
        } else {
          const int32_t token = static_cast<int32_t>((r.req.input_ids.back() + 1 + r.produced) % kVocab);
          ++r.produced;
          ev.new_tokens.push_back(token);
          const auto& stops = r.req.sampling.stop_token_ids;
          if (std::find(stops.begin(), stops.end(), token) != stops.end()) {
            ev.finished = done = true;
            ev.reason = finish_reason::kStop;
          } else if (r.produced >= r.req.sampling.max_new_tokens) {
            ev.finished = done = true;
            ev.reason = finish_reason::kLength;
          }
        }
        if (done) {
          ev.metrics.prompt_tokens = static_cast<int32_t>(r.req.input_ids.size());
          ev.metrics.completion_tokens = r.produced;
        }
        out.emplace_back(r.req.sink, std::move(ev));
        it = done ? active_.erase(it) : std::next(it);
      }
      lock.unlock();
      for (auto& [sink, ev] : out) sink(std::move(ev));
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<uint64_t, running> active_;
  std::vector<uint64_t> cancelled_ids_;
  uint64_t next_id_ = 0;
  uint64_t submitted_ = 0;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses
};

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;

// Shuts the socket down if the guarded I/O is still running at the deadline, which makes a
// blocked read or write fail instead of hanging the test.
class io_deadline {
 public:
  io_deadline(tcp::socket& socket, std::chrono::milliseconds limit)
      : thread_([this, fd = socket.native_handle(), limit] {
          std::unique_lock lock(mutex_);
          if (!cv_.wait_for(lock, limit, [this] { return done_; })) {
            expired_ = true;
            ::shutdown(fd, SHUT_RDWR);
          }
        }) {}
  ~io_deadline() {
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
  unsigned status = 0;  // 0 when the exchange failed (see error)
  std::string body;
  std::map<std::string, std::string> headers;  // lower-case names
  bool keep_alive = false;
  std::string error;

  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};

// One keep-alive connection; request() writes a request and reads the whole response with
// beast::http::write / read.
class http_client {
 public:
  explicit http_client(uint16_t port) : socket_(ioc_) {
    socket_.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  }

  http_reply request(const std::string& method, const std::string& target, const std::string& body = {},
                     const std::vector<std::pair<std::string, std::string>>& headers = {},
                     std::chrono::milliseconds limit = 10s) {
    http_reply reply;
    io_deadline deadline(socket_, limit);
    beast::error_code ec;
    bhttp::write(socket_, make_request(method, target, body, headers), ec);
    if (ec) {
      reply.error = "write: " + ec.message();
      return reply;
    }
    bhttp::response_parser<bhttp::string_body> parser;
    parser.body_limit(64 << 20);
    bhttp::read(socket_, buffer_, parser, ec);
    if (ec) {
      reply.error = "read: " + ec.message() + (deadline.expired() ? " (deadline)" : "");
      return reply;
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
    return reply;
  }

  // Writes a request without reading the answer.
  void send_only(const std::string& method, const std::string& target, const std::string& body) {
    io_deadline deadline(socket_, 5s);
    bhttp::write(socket_, make_request(method, target, body, {}));
  }

  // Reads a streamed (chunked) response until its body contains `needle`; returns the body so far.
  std::string read_stream_until(const std::string& needle, std::chrono::milliseconds limit = 5s) {
    io_deadline deadline(socket_, limit);
    bhttp::response_parser<bhttp::string_body> parser;
    beast::error_code ec;
    bhttp::read_header(socket_, buffer_, parser, ec);
    while (!ec && parser.get().body().find(needle) == std::string::npos && !parser.is_done()) {
      bhttp::read_some(socket_, buffer_, parser, ec);
    }
    return parser.get().body();
  }

  void close() {
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
  }

  tcp::socket& socket() { return socket_; }

 private:
  static bhttp::request<bhttp::string_body> make_request(const std::string& method, const std::string& target,
                                                         const std::string& body,
                                                         const std::vector<std::pair<std::string, std::string>>& headers) {
    bhttp::request<bhttp::string_body> req;
    req.method_string(method);
    req.target(target);
    req.version(11);
    req.set(bhttp::field::host, "127.0.0.1");
    for (const auto& [name, value] : headers) req.set(name, value);
    if (!body.empty()) req.set(bhttp::field::content_type, "application/json");
    req.body() = body;
    req.keep_alive(true);
    req.prepare_payload();
    return req;
  }

  net::io_context ioc_;
  tcp::socket socket_;
  beast::flat_buffer buffer_;
};

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

}  // namespace hyserve::coordinator::testing
