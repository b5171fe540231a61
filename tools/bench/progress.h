// Progress on stderr: a bar redrawn in place on a terminal, else a line every ~10%.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "client.h"

namespace hyserve::bench {

class progress {
 public:
  progress(int64_t total, bool terminal);
  ~progress();
  progress(const progress&) = delete;
  progress& operator=(const progress&) = delete;

  void start();                      // starts the clock (and the redraw thread on a terminal)
  void add_tokens(int64_t n) { tokens_.fetch_add(n, std::memory_order_relaxed); }
  void request_done(bool ok);  // thread-safe
  void finish();                     // final redraw; idempotent

 private:
  void draw_bar();
  void print_line(int64_t done, int64_t failed);

  const int64_t total_;
  const bool terminal_;
  bench_clock::time_point start_{};
  std::atomic<int64_t> tokens_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<int64_t> failed_{0};
  std::mutex mutex_;  // serialises writes to stderr and guards the fields below
  int64_t next_line_ = 1;
  bool finished_ = false;
  std::condition_variable wake_;
  std::thread ticker_;
};

}  // namespace hyserve::bench
