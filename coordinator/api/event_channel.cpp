#include "coordinator/api/event_channel.h"

#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace hyserve::coordinator::api {

namespace net = boost::asio;

event_channel::event_channel(net::any_io_executor strand) : strand_(strand), wakeup_(strand) {}

event_sink event_channel::make_sink(const std::shared_ptr<event_channel>& channel, std::shared_ptr<event_gate> gate) {
  // Only a weak reference: the handler owns the channel (and through it a timer and a strand),
  // so a sink that outlives the handler, or the server, holds no I/O object.
  return [weak = std::weak_ptr<event_channel>(channel), io = channel->strand_, gate = std::move(gate)](
             request_event event) { gate->relay(weak, io, std::move(event)); };
}

void event_gate::relay(std::weak_ptr<event_channel> channel, const net::any_io_executor& io, request_event event) {
  std::lock_guard lock(mutex_);
  if (!open_) return;
  pending_.emplace_back(std::move(channel), std::move(event));
  if (dispatching_) return;
  dispatching_ = true;
  net::post(io, [self = shared_from_this()] { self->dispatch(); });
}

void event_gate::dispatch() {
  std::vector<std::pair<std::weak_ptr<event_channel>, request_event>> batch;
  while (true) {
    {
      std::lock_guard lock(mutex_);
      batch.clear();
      batch.swap(pending_);
      // Only one relay task at a time (events keep their order): it ends when nothing is left.
      if (batch.empty() || !open_) {
        pending_.clear();
        dispatching_ = false;
        return;
      }
    }
    for (auto& [weak, event] : batch) {
      const std::shared_ptr<event_channel> live = weak.lock();
      if (!live) continue;  // the handler is gone (client left, request cancelled)
      net::post(live->strand_, [weak = std::move(weak), event = std::move(event)]() mutable {
        if (const auto target = weak.lock()) target->push(std::move(event));
      });
    }
  }
}

void event_channel::push(request_event event) {
  events_.push_back(std::move(event));
  wakeup_.cancel();
}

void event_channel::interrupt() {
  interrupted_ = true;
  wakeup_.cancel();
}

net::awaitable<std::optional<request_event>> event_channel::next() {
  while (events_.empty() && !interrupted_) {
    wakeup_.expires_at(net::steady_timer::time_point::max());
    boost::system::error_code ec;
    co_await wakeup_.async_wait(net::redirect_error(net::use_awaitable, ec));
  }
  if (interrupted_) co_return std::nullopt;
  request_event event = std::move(events_.front());
  events_.pop_front();
  co_return event;
}

}  // namespace hyserve::coordinator::api
