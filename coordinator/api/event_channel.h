#pragma once
// Carries one request's events from the scheduler thread to the HTTP session's strand.
//
// The scheduler calls the sink (make_sink) on its own thread; the sink never blocks: it posts
// the event onto the strand, where it is queued and the waiting handler is woken. next() is
// awaited by the handler on that strand, so the queue needs no lock.
//
// An event_gate guards the posting: the server closes it before its io_context is destroyed,
// after which late events (a scheduler finishing a request after the server stopped) are
// dropped instead of being posted to a dead executor.
#include <deque>
#include <memory>
#include <mutex>
#include <optional>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include "coordinator/request.h"

namespace hyserve::coordinator::api {

class event_gate {
 public:
  // Runs `post` unless the gate is closed; the lock keeps close() from completing meanwhile.
  template <class F>
  void pass(F&& post) {
    std::lock_guard lock(mutex_);
    if (open_) post();
  }
  void close() {
    std::lock_guard lock(mutex_);
    open_ = false;
  }

 private:
  std::mutex mutex_;
  bool open_ = true;
};

class event_channel {
 public:
  // `strand` is the executor every member except make_sink's sink runs on.
  explicit event_channel(boost::asio::any_io_executor strand);

  // The sink for generate_request::sink. It holds the gate and a weak reference to the
  // channel: events that arrive after the handler dropped the channel are discarded.
  static event_sink make_sink(const std::shared_ptr<event_channel>& channel, std::shared_ptr<event_gate> gate);

  // The next event in order, or nullopt once interrupt() was called.
  boost::asio::awaitable<std::optional<request_event>> next();

  // Wakes next() for good: the handler stops waiting (client gone, server aborting).
  void interrupt();
  bool interrupted() const { return interrupted_; }

 private:
  void push(request_event event);

  boost::asio::any_io_executor strand_;
  boost::asio::steady_timer wakeup_;  // waits "forever"; cancelled to wake next()
  std::deque<request_event> events_;
  bool interrupted_ = false;
};

}  // namespace hyserve::coordinator::api
