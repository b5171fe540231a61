#pragma once
// A Prometheus histogram with fixed bucket upper bounds (the +Inf bucket is implicit).
// observe() takes a small mutex so that a snapshot's buckets, sum and count always agree.
#include <cstdint>
#include <mutex>
#include <vector>

namespace hyserve::coordinator::metrics {

class histogram {
 public:
  struct snapshot {
    std::vector<double> bounds;          // upper bounds, ascending, without +Inf
    std::vector<uint64_t> cumulative;    // [bounds.size() + 1]: count of observations <= bound; last is +Inf
    double sum = 0.0;
    uint64_t count = 0;
  };

  // `bounds` must be strictly ascending and finite (checked).
  explicit histogram(std::vector<double> bounds);

  void observe(double value);
  snapshot read() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> counts_;  // [bounds_.size() + 1], per bucket (not cumulative)
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

// Bucket presets in seconds.
std::vector<double> latency_buckets();  // 1 ms .. 120 s, for request latency and TTFT
std::vector<double> token_buckets();    // 0.5 ms .. 5 s, for inter-token latency and step time

}  // namespace hyserve::coordinator::metrics
