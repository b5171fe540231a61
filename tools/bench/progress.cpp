#include "progress.h"

#include <algorithm>
#include <cstdio>
#include <string>

namespace hyserve::bench {

progress::progress(int64_t total, bool terminal) : total_(total), terminal_(terminal) {}

progress::~progress() { finish(); }

void progress::start() {
  start_ = bench_clock::now();
  if (!terminal_) return;
  ticker_ = std::thread([this] {
    std::unique_lock lock(mutex_);
    while (!finished_) {
      draw_bar();
      wake_.wait_for(lock, std::chrono::milliseconds(100));
    }
  });
}

// Caller holds mutex_.
void progress::draw_bar() {
  constexpr int kWidth = 30;
  const int64_t done = done_.load();
  const int64_t failed = failed_.load();
  const double elapsed = std::chrono::duration<double>(bench_clock::now() - start_).count();
  const double rate = elapsed > 0.0 ? static_cast<double>(tokens_.load()) / elapsed : 0.0;
  const int filled = total_ > 0 ? static_cast<int>(kWidth * done / total_) : kWidth;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kWidth - filled), '.');
  std::fprintf(stderr, "\r\033[2K[%s] %lld/%lld requests", bar.c_str(), static_cast<long long>(done),
               static_cast<long long>(total_));
  if (failed > 0) std::fprintf(stderr, " (%lld failed)", static_cast<long long>(failed));
  std::fprintf(stderr, "  %.1f tok/s  %.1f s", rate, elapsed);
  std::fflush(stderr);
}

// Caller holds mutex_.
void progress::print_line(int64_t done, int64_t failed) {
  const double elapsed = std::chrono::duration<double>(bench_clock::now() - start_).count();
  const double rate = elapsed > 0.0 ? static_cast<double>(tokens_.load()) / elapsed : 0.0;
  std::fprintf(stderr, "progress: %lld/%lld requests (%lld%%), %lld failed, %.1f tok/s, %.1f s\n",
               static_cast<long long>(done), static_cast<long long>(total_),
               static_cast<long long>(total_ > 0 ? 100 * done / total_ : 100), static_cast<long long>(failed), rate,
               elapsed);
  std::fflush(stderr);
}

void progress::request_done(bool ok) {
  if (!ok) failed_.fetch_add(1);
  if (terminal_) {
    done_.fetch_add(1);
    return;
  }
  std::lock_guard lock(mutex_);
  const int64_t done = done_.fetch_add(1) + 1;
  // A line each time another tenth of the requests (at least one request) has completed.
  const int64_t step = std::max<int64_t>(1, (total_ + 9) / 10);
  if (done >= std::min(next_line_ * step, total_)) {
    while (next_line_ * step <= done) ++next_line_;
    print_line(done, failed_.load());
  }
}

void progress::finish() {
  {
    std::lock_guard lock(mutex_);
    if (finished_) return;
    finished_ = true;
    if (terminal_ && start_ != bench_clock::time_point{}) {
      draw_bar();
      std::fputc('\n', stderr);
      std::fflush(stderr);
    }
  }
  wake_.notify_all();
  if (ticker_.joinable()) ticker_.join();
}

}  // namespace hyserve::bench
