#pragma once
// Carries one request's events from the scheduler thread to the HTTP session's strand.
//
// The scheduler calls the sink (make_sink) on its own thread; the sink never blocks: it hands
// the event to the server's event_gate, which relays it onto the channel's strand, where it is
// queued and the waiting handler is woken. next() is awaited by the handler on that strand, so
// the queue needs no lock.
//
// The relay batches: a sink call costs the scheduler thread a lock and a push; the first event
// of a burst (one step's tokens for every stream) posts one task to the I/O threads, which
// takes every event queued until it runs and posts each to its strand. So the scheduler's cost
// per step does not grow with the streams' posts, wake-ups and writes.
//
// The gate also guards the posting: the server closes it before its io_context is destroyed,
// after which late events (a scheduler finishing a request after the server stopped) are
// dropped instead of being posted to a dead executor.
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include "coordinator/request.h"

namespace hyserve::coordinator::api {

class event_channel;

class event_gate : public std::enable_shared_from_this<event_gate> {
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
  // Queues `event` for `channel` (see the file comment); `io` runs the relay task. Events for
  // one channel arrive in the order they were relayed.
  void relay(std::weak_ptr<event_channel> channel, const boost::asio::any_io_executor& io, request_event event);

 private:
  void dispatch();  // on an I/O thread: posts the queued events until none is left

  std::mutex mutex_;
  bool open_ = true;
  std::vector<std::pair<std::weak_ptr<event_channel>, request_event>> pending_;
  bool dispatching_ = false;  // a relay task is posted or running
};

class event_channel {
 public:
  // `strand` is the executor every member except make_sink's sink runs on.
  explicit event_channel(boost::asio::any_io_executor strand);

  // The sink for generate_request::sink. It holds the gate and a weak reference to the
  // channel: events that arrive after the handler dropped the channel are discarded.
  static event_sink make_sink(const std::shared_ptr<event_channel>& channel, std::shared_ptr<event_gate> gate);
  friend class event_gate;

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
