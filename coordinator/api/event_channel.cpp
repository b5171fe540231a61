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
  return [weak = std::weak_ptr<event_channel>(channel), gate = std::move(gate)](request_event event) {
    const std::shared_ptr<event_channel> live = weak.lock();
    if (!live) return;  // the handler is gone (client left, request cancelled)
    gate->deliver(live, std::move(event));
  };
}

void event_gate::deliver(const std::shared_ptr<event_channel>& channel, request_event event) {
  {
    std::lock_guard lock(mutex_);
    if (!open_) return;
    pending_.emplace_back(channel, std::move(event));
    if (scheduled_) return;
    scheduled_ = true;
  }
  // One delivery per batch of the scheduler's events (coordinator/request.h, event_batch).
  event_batch::defer_wakeup([self = shared_from_this(), strand = channel->strand_] {
    std::lock_guard lock(self->mutex_);
    if (self->open_) net::post(strand, [self] { self->drain(); });
    else self->scheduled_ = false;
  });
}

void event_gate::drain() {
  std::vector<std::pair<std::weak_ptr<event_channel>, request_event>> batch;
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (pending_.empty() || !open_) {
        scheduled_ = false;
        return;
      }
      batch.swap(pending_);
    }
    // Posted from an I/O thread: the strands' handlers are queued without waking a thread per
    // event. Every channel's events go out in the order they came.
    for (auto& [weak, event] : batch) {
      const std::shared_ptr<event_channel> target = weak.lock();
      if (!target) continue;
      net::post(target->strand_, [weak = std::move(weak), event = std::move(event)]() mutable {
        if (const auto t = weak.lock()) t->push(std::move(event));
      });
    }
    batch.clear();
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

std::optional<request_event> event_channel::take_queued() {
  if (events_.empty() || interrupted_) return std::nullopt;
  request_event merged = std::move(events_.front());
  events_.pop_front();
  while (!merged.finished && !merged.error && !events_.empty()) {
    append_event(merged, std::move(events_.front()));
    events_.pop_front();
  }
  return merged;
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
