#pragma once
// A small Prometheus registry: metric families (name, help, type) holding one series per label
// set, rendered in the text exposition format 0.0.4. Series are created on first use and live
// as long as the registry, so callers may keep the returned references. Thread-safe: lookups and
// rendering take the registry mutex; updates go to the series (atomics / histogram mutex).
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "coordinator/metrics/counter.h"
#include "coordinator/metrics/gauge.h"
#include "coordinator/metrics/histogram.h"

namespace hyserve::coordinator::metrics {

enum class metric_type : uint8_t { kCounter, kGauge, kHistogram };

// Label name/value pairs, in the order they are rendered.
using label_set = std::vector<std::pair<std::string, std::string>>;

class registry {
 public:
  registry() = default;
  registry(const registry&) = delete;
  registry& operator=(const registry&) = delete;

  // Registers a family with no series yet, so that it shows in the output (HELP and TYPE)
  // before its first label set is used. Re-declaring with the same type is a no-op; a name
  // already declared with another type is a bug (HYSERVE_CHECK).
  void declare(std::string_view name, std::string_view help, metric_type type);

  // Get-or-create a series. `help` is used when the family is created.
  counter& counter_series(std::string_view name, std::string_view help, const label_set& labels = {});
  gauge& gauge_series(std::string_view name, std::string_view help, const label_set& labels = {});
  // `bounds` are used when the series is created (see histogram).
  histogram& histogram_series(std::string_view name, std::string_view help, const std::vector<double>& bounds,
                              const label_set& labels = {});

  // The whole registry in the text exposition format, families in name order.
  std::string render() const;

 private:
  struct family {
    std::string help;
    metric_type type = metric_type::kCounter;
    std::map<label_set, std::unique_ptr<counter>> counters;
    std::map<label_set, std::unique_ptr<gauge>> gauges;
    std::map<label_set, std::unique_ptr<histogram>> histograms;
  };

  family& family_locked(std::string_view name, std::string_view help, metric_type type);

  mutable std::mutex mutex_;
  std::map<std::string, family, std::less<>> families_;
};

// Sample value in the exposition format: shortest round-trip decimal, "+Inf", "-Inf", "NaN".
std::string format_sample_value(double v);

}  // namespace hyserve::coordinator::metrics
