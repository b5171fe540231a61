// The event gate and channels: what the scheduler thread hands to the sinks reaches each
// request's handler complete and in order, across many channels on a real io_context with two
// I/O threads, and nothing is delivered after the gate closes.
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <gtest/gtest.h>

#include "coordinator/api/event_channel.h"

namespace hyserve::coordinator::api {
namespace {

namespace net = boost::asio;

TEST(EventGate, SixtyFourChannelsGetEveryEventInOrder) {
  constexpr int kChannels = 64, kSteps = 300;
  net::io_context ioc(2);
  auto work = net::make_work_guard(ioc);
  std::vector<std::thread> io;
  for (int i = 0; i < 2; ++i) io.emplace_back([&] { ioc.run(); });

  auto gate = std::make_shared<event_gate>();
  std::vector<std::shared_ptr<event_channel>> channels;
  std::vector<event_sink> sinks;
  std::vector<std::vector<int32_t>> got(kChannels);
  std::atomic<int> done{0};
  for (int c = 0; c < kChannels; ++c) {
    auto ch = std::make_shared<event_channel>(net::make_strand(ioc));
    channels.push_back(ch);
    sinks.push_back(event_channel::make_sink(ch, gate));
    net::co_spawn(ch->strand(), [ch, &out = got[static_cast<size_t>(c)], &done]() -> net::awaitable<void> {
      for (;;) {
        std::optional<request_event> e = co_await ch->next();
        if (!e) break;
        out.insert(out.end(), e->new_tokens.begin(), e->new_tokens.end());
        if (e->finished) break;
      }
      done.fetch_add(1);
    }, net::detached);
  }
  // The scheduler thread: one event per channel per step, as a 64-stream decode produces them.
  std::thread scheduler([&] {
    for (int s = 0; s < kSteps; ++s)
      for (int c = 0; c < kChannels; ++c) {
        request_event e;
        e.new_tokens = {s, c};
        e.finished = s == kSteps - 1;
        sinks[static_cast<size_t>(c)](std::move(e));
      }
  });
  scheduler.join();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (done.load() < kChannels && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(done.load(), kChannels);
  work.reset();
  ioc.stop();
  for (auto& t : io) t.join();
  for (int c = 0; c < kChannels; ++c) {
    const auto& v = got[static_cast<size_t>(c)];
    ASSERT_EQ(v.size(), static_cast<size_t>(2 * kSteps)) << "channel " << c;
    for (int s = 0; s < kSteps; ++s) {
      ASSERT_EQ(v[static_cast<size_t>(2 * s)], s) << "channel " << c << ": events out of order";
      ASSERT_EQ(v[static_cast<size_t>(2 * s + 1)], c) << "channel " << c << ": another channel's event";
    }
  }
}

TEST(EventGate, NothingIsDeliveredAfterClose) {
  net::io_context ioc(1);
  auto gate = std::make_shared<event_gate>();
  auto ch = std::make_shared<event_channel>(net::make_strand(ioc));
  event_sink sink = event_channel::make_sink(ch, gate);
  request_event before;
  before.new_tokens = {7};
  sink(std::move(before));
  gate->close();  // the queued event is dropped too: the executor may be going away
  request_event after;
  after.new_tokens = {8};
  sink(std::move(after));
  bool got_event = false;
  net::co_spawn(ch->strand(), [ch, &got_event]() -> net::awaitable<void> {
    // interrupt() below ends the wait; an event delivered first would be seen here.
    std::optional<request_event> e = co_await ch->next();
    got_event = e.has_value();
  }, net::detached);
  net::post(ch->strand(), [ch] { ch->interrupt(); });
  ioc.run();
  EXPECT_FALSE(got_event);
}

TEST(EventGate, AChannelWhoseHandlerLeftIsSkipped) {
  net::io_context ioc(1);
  auto gate = std::make_shared<event_gate>();
  auto gone = std::make_shared<event_channel>(net::make_strand(ioc));
  auto kept = std::make_shared<event_channel>(net::make_strand(ioc));
  event_sink to_gone = event_channel::make_sink(gone, gate), to_kept = event_channel::make_sink(kept, gate);
  request_event a;
  a.new_tokens = {1};
  to_gone(std::move(a));  // queued while the handler was there
  gone.reset();           // then the handler went away
  request_event b;
  b.new_tokens = {2};
  b.finished = true;
  to_kept(std::move(b));
  std::vector<int32_t> got;
  net::co_spawn(kept->strand(), [kept, &got]() -> net::awaitable<void> {
    std::optional<request_event> e = co_await kept->next();
    if (e) got = e->new_tokens;
  }, net::detached);
  ioc.run();
  EXPECT_EQ(got, std::vector<int32_t>{2});
}

TEST(EventGate, EventsOfABatchAreWokenOnceWhenItEnds) {
  net::io_context ioc(1);
  auto gate = std::make_shared<event_gate>();
  std::vector<std::shared_ptr<event_channel>> channels;
  std::vector<std::vector<int32_t>> got(4);
  for (int c = 0; c < 4; ++c) {
    auto ch = std::make_shared<event_channel>(net::make_strand(ioc));
    channels.push_back(ch);
    net::co_spawn(ch->strand(), [ch, &out = got[static_cast<size_t>(c)]]() -> net::awaitable<void> {
      std::optional<request_event> e = co_await ch->next();
      if (e) out = e->new_tokens;
    }, net::detached);
  }
  ioc.poll();  // the handlers wait
  {
    const event_batch batch;
    for (int c = 0; c < 4; ++c) {
      request_event e;
      e.new_tokens = {c};
      event_channel::make_sink(channels[static_cast<size_t>(c)], gate)(std::move(e));
    }
    ioc.poll();
    for (const auto& v : got) EXPECT_TRUE(v.empty()) << "delivered before the batch ended";
  }
  ioc.run();
  for (int c = 0; c < 4; ++c) EXPECT_EQ(got[static_cast<size_t>(c)], std::vector<int32_t>{c});
}

TEST(EventChannel, QueuedEventsAreTakenAsOneUpToTheEnd) {
  net::io_context ioc(1);
  auto gate = std::make_shared<event_gate>();
  auto ch = std::make_shared<event_channel>(net::make_strand(ioc));
  event_sink sink = event_channel::make_sink(ch, gate);
  for (int i = 0; i < 5; ++i) {
    request_event e;
    e.new_tokens = {2 * i, 2 * i + 1};
    e.finished = i == 3;  // the request ends at the fourth event; a fifth must stay queued
    e.reason = finish_reason::kStop;
    sink(std::move(e));
  }
  ioc.run();  // delivered onto the strand (one thread: nothing else touches the channel now)
  std::optional<request_event> first = ch->take_queued();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->new_tokens, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_TRUE(first->finished);
  EXPECT_EQ(first->reason, finish_reason::kStop);
  std::optional<request_event> rest = ch->take_queued();
  ASSERT_TRUE(rest.has_value());
  EXPECT_EQ(rest->new_tokens, (std::vector<int32_t>{8, 9}));
  EXPECT_FALSE(ch->take_queued().has_value());
}

}  // namespace
}  // namespace hyserve::coordinator::api
