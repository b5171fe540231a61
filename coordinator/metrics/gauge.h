#pragma once
// A Prometheus gauge: a value that goes up and down, updated lock-free from any thread.
#include <atomic>

namespace hyserve::coordinator::metrics {

class gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void add(double delta) { value_.fetch_add(delta, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

}  // namespace hyserve::coordinator::metrics
