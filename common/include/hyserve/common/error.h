#pragma once
// Error types. Expected failures (bad input, bad config, unsupported shapes) are typed
// exceptions caught at the boundary (CLI, HTTP, plan execution); bugs use HYSERVE_CHECK.
#include <stdexcept>
#include <string>

namespace hyserve {

// Base of every error the project raises on purpose.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A configuration file (YAML or config.json) is invalid; the message names the path.
class config_error : public error {
 public:
  using error::error;
};

// A file on disk (safetensors, JSON) is malformed or inconsistent.
class format_error : public error {
 public:
  using error::error;
};

// A caller passed a value outside what the operation supports (shape, id, mode byte).
class invalid_argument_error : public error {
 public:
  using error::error;
};

// Capacity exhausted (slots, pages); callers may wait and retry.
class capacity_error : public error {
 public:
  using error::error;
};

[[noreturn]] void throw_check_failure(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace hyserve

// Internal invariant: throws hyserve::error naming the expression and file:line.
#define HYSERVE_CHECK(cond, msg)                                                     \
  do {                                                                               \
    if (!(cond)) ::hyserve::throw_check_failure(#cond, __FILE__, __LINE__, (msg));   \
  } while (0)
