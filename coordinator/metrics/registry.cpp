#include "coordinator/metrics/registry.h"

#include <charconv>
#include <cmath>

#include "hyserve/common/error.h"

namespace hyserve::coordinator::metrics {
namespace {

const char* type_name(metric_type type) {
  switch (type) {
    case metric_type::kCounter: return "counter";
    case metric_type::kGauge: return "gauge";
    case metric_type::kHistogram: return "histogram";
  }
  return "untyped";
}

bool valid_metric_name(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// HELP text escapes backslash and newline; label values also escape the double quote.
void append_escaped(std::string& out, std::string_view text, bool quote) {
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quote && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

// `{a="x",b="y"}` with an optional extra trailing pair (the histogram's `le`); empty when no labels.
void append_labels(std::string& out, const label_set& labels, std::string_view extra_name = {},
                   std::string_view extra_value = {}) {
  if (labels.empty() && extra_name.empty()) return;
  out += '{';
  bool first = true;
  auto add = [&](std::string_view name, std::string_view value) {
    if (!first) out += ',';
    first = false;
    out += name;
    out += "=\"";
    append_escaped(out, value, /*quote=*/true);
    out += '"';
  };
  for (const auto& [name, value] : labels) add(name, value);
  if (!extra_name.empty()) add(extra_name, extra_value);
  out += '}';
}

void append_sample(std::string& out, std::string_view name, std::string_view suffix, const label_set& labels,
                   double value, std::string_view extra_name = {}, std::string_view extra_value = {}) {
  out += name;
  out += suffix;
  append_labels(out, labels, extra_name, extra_value);
  out += ' ';
  out += format_sample_value(value);
  out += '\n';
}

}  // namespace

std::string format_sample_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, result.ptr);
}

registry::family& registry::family_locked(std::string_view name, std::string_view help, metric_type type) {
  auto it = families_.find(name);
  if (it == families_.end()) {
    HYSERVE_CHECK(valid_metric_name(name), "invalid metric name: " + std::string(name));
    it = families_.emplace(std::string(name), family{}).first;
    it->second.help = std::string(help);
    it->second.type = type;
  }
  HYSERVE_CHECK(it->second.type == type, "metric " + std::string(name) + " was registered as a " +
                                             type_name(it->second.type) + ", used as a " + type_name(type));
  return it->second;
}

void registry::declare(std::string_view name, std::string_view help, metric_type type) {
  std::lock_guard lock(mutex_);
  family_locked(name, help, type);
}

counter& registry::counter_series(std::string_view name, std::string_view help, const label_set& labels) {
  std::lock_guard lock(mutex_);
  auto& slot = family_locked(name, help, metric_type::kCounter).counters[labels];
  if (!slot) slot = std::make_unique<counter>();
  return *slot;
}

gauge& registry::gauge_series(std::string_view name, std::string_view help, const label_set& labels) {
  std::lock_guard lock(mutex_);
  auto& slot = family_locked(name, help, metric_type::kGauge).gauges[labels];
  if (!slot) slot = std::make_unique<gauge>();
  return *slot;
}

histogram& registry::histogram_series(std::string_view name, std::string_view help, const std::vector<double>& bounds,
                                      const label_set& labels) {
  std::lock_guard lock(mutex_);
  auto& slot = family_locked(name, help, metric_type::kHistogram).histograms[labels];
  if (!slot) slot = std::make_unique<histogram>(bounds);
  return *slot;
}

std::string registry::render() const {
  std::string out;
  std::lock_guard lock(mutex_);
  for (const auto& [name, fam] : families_) {
    out += "# HELP ";
    out += name;
    out += ' ';
    append_escaped(out, fam.help, /*quote=*/false);
    out += "\n# TYPE ";
    out += name;
    out += ' ';
    out += type_name(fam.type);
    out += '\n';
    for (const auto& [labels, c] : fam.counters) append_sample(out, name, "", labels, c->value());
    for (const auto& [labels, g] : fam.gauges) append_sample(out, name, "", labels, g->value());
    for (const auto& [labels, h] : fam.histograms) {
      const histogram::snapshot s = h->read();
      for (size_t i = 0; i < s.bounds.size(); ++i) {
        append_sample(out, name, "_bucket", labels, static_cast<double>(s.cumulative[i]), "le",
                      format_sample_value(s.bounds[i]));
      }
      append_sample(out, name, "_bucket", labels, static_cast<double>(s.cumulative.back()), "le", "+Inf");
      append_sample(out, name, "_sum", labels, s.sum);
      append_sample(out, name, "_count", labels, static_cast<double>(s.count));
    }
  }
  return out;
}

}  // namespace hyserve::coordinator::metrics
