#pragma once
// Carries one request's events from the scheduler thread to the HTTP session's strand.
//
// The scheduler calls the sink (make_sink) on its own thread; the sink never blocks: it hands
// the event to the event_gate, which posts it onto the strand, where it is queued and the
// waiting handler is woken. next() is awaited by the handler on that strand, so the queue needs
// no lock.
//
// The event_gate carries the events of every request to their channels, in batches: the
// scheduler thread only appends an event to the gate's list (a lock and a push); the first event
// after a delivery posts one delivery task onto that event's strand (when the scheduler's
// event_batch ends, coordinator/request.h), which hands each waiting event to its channel's
// strand. Posting onto an idle strand wakes an I/O thread (a system call
// and, in a virtual machine, a cross-CPU interrupt: tens of microseconds); with 64 streams a
// step's events used to cost the scheduler thread milliseconds, so the device waited for it.
// One delivery runs at a time (it loops until the list is empty), so a channel's events keep
// their order.
//
// The server closes the gate before its io_context is destroyed, after which late events (a
// scheduler finishing a request after the server stopped) are dropped instead of being posted
// to a dead executor.
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
  // Queues event for channel (any thread; never waits for I/O).
  void deliver(const std::shared_ptr<event_channel>& channel, request_event event);
  void close() {
    std::lock_guard lock(mutex_);
    open_ = false;
    pending_.clear();
  }

 private:
  void drain();  // on an I/O thread

  std::mutex mutex_;
  bool open_ = true;
  bool scheduled_ = false;  // a delivery is posted or running
  std::vector<std::pair<std::weak_ptr<event_channel>, request_event>> pending_;
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
  // next() without waiting: every event already queued, merged into one (append_event, in
  // order, up to and including one that ends the request); nullopt when none is queued.
  std::optional<request_event> take_queued();

  // Wakes next() for good: the handler stops waiting (client gone, server aborting).
  void interrupt();
  const boost::asio::any_io_executor& strand() const { return strand_; }
  bool interrupted() const { return interrupted_; }

 private:
  friend class event_gate;
  void push(request_event event);

  boost::asio::any_io_executor strand_;
  boost::asio::steady_timer wakeup_;  // waits "forever"; cancelled to wake next()
  std::deque<request_event> events_;
  bool interrupted_ = false;
};

}  // namespace hyserve::coordinator::api
