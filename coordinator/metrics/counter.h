#pragma once
// A Prometheus counter: a monotonically increasing value, updated lock-free from any thread.
#include <atomic>

namespace hyserve::coordinator::metrics {

class counter {
 public:
  // `amount` must be >= 0 (counters never go down); negative amounts are ignored.
  void inc(double amount = 1.0) {
    if (amount > 0.0) value_.fetch_add(amount, std::memory_order_relaxed);
  }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

}  // namespace hyserve::coordinator::metrics
