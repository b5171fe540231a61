#include "coordinator/metrics/histogram.h"

#include <algorithm>
#include <cmath>

#include "hyserve/common/error.h"

namespace hyserve::coordinator::metrics {

histogram::histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    HYSERVE_CHECK(std::isfinite(bounds_[i]), "histogram bounds must be finite");
    HYSERVE_CHECK(i == 0 || bounds_[i - 1] < bounds_[i], "histogram bounds must be strictly ascending");
  }
}

void histogram::observe(double value) {
  // Bucket i holds values in (bounds[i-1], bounds[i]]; NaN lands in +Inf.
  const size_t bucket =
      std::isnan(value) ? bounds_.size()
                        : static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  std::lock_guard lock(mutex_);
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

histogram::snapshot histogram::read() const {
  snapshot s;
  s.bounds = bounds_;
  s.cumulative.resize(counts_.size());
  std::lock_guard lock(mutex_);
  uint64_t running = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    running += counts_[i];
    s.cumulative[i] = running;
  }
  s.sum = sum_;
  s.count = count_;
  return s;
}

std::vector<double> latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0};
}

std::vector<double> token_buckets() {
  return {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0};
}

}  // namespace hyserve::coordinator::metrics
