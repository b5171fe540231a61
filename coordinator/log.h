#pragma once
// A tiny logger for the coordinator: one line per call to stderr, prefixed with a UTC timestamp
// (millisecond resolution) and the level. printf-style so a line is written with one fprintf,
// which stdio keeps whole when several threads log at once.
#include <cstdint>

namespace hyserve::coordinator {

enum class log_level : uint8_t { kDebug, kInfo, kWarn, kError };

// Lines below `level` are dropped (default kInfo). Thread-safe.
void set_log_level(log_level level);
log_level current_log_level();

void log_line(log_level level, const char* format, ...) __attribute__((format(printf, 2, 3)));

}  // namespace hyserve::coordinator

#define HYSERVE_LOG(level, ...)                                                             \
  do {                                                                                      \
    if ((level) >= ::hyserve::coordinator::current_log_level())                             \
      ::hyserve::coordinator::log_line((level), __VA_ARGS__);                               \
  } while (0)
#define HYSERVE_LOG_INFO(...) HYSERVE_LOG(::hyserve::coordinator::log_level::kInfo, __VA_ARGS__)
#define HYSERVE_LOG_WARN(...) HYSERVE_LOG(::hyserve::coordinator::log_level::kWarn, __VA_ARGS__)
#define HYSERVE_LOG_ERROR(...) HYSERVE_LOG(::hyserve::coordinator::log_level::kError, __VA_ARGS__)
