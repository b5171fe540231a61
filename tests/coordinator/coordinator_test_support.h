#pragma once
// Test doubles for the coordinator's HTTP tests: a deterministic frontend, and the bounded
// HTTP client of the test-support library that throws when it cannot connect.
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
#include "http_client.h"

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

// The HTTP client of the test-support library (tests/support/http_client.h).
using io_deadline = test_support::socket_deadline;
using test_support::http_reply;
using test_support::sse_events;

// One keep-alive connection to the server under test; the constructor throws
// boost::system::system_error when the server does not accept the connection.
class http_client : public test_support::http_connection {
 public:
  explicit http_client(uint16_t port) : http_connection(port) {
    if (!connected())
      throw boost::system::system_error(make_error_code(boost::asio::error::connection_refused), error());
  }
};

}  // namespace hyserve::coordinator::testing
