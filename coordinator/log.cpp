#include "coordinator/log.h"

#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <ctime>

namespace hyserve::coordinator {
namespace {

std::atomic<log_level> g_level{log_level::kInfo};

const char* level_name(log_level level) {
  switch (level) {
    case log_level::kDebug: return "DEBUG";
    case log_level::kInfo: return "INFO";
    case log_level::kWarn: return "WARN";
    case log_level::kError: return "ERROR";
  }
  return "?";
}

}  // namespace

void set_log_level(log_level level) { g_level.store(level, std::memory_order_relaxed); }

log_level current_log_level() { return g_level.load(std::memory_order_relaxed); }

void log_line(log_level level, const char* format, ...) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &utc);

  char message[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  std::fprintf(stderr, "%s.%03dZ %-5s %s\n", stamp, static_cast<int>(millis), level_name(level), message);
}

}  // namespace hyserve::coordinator
