// Command-line options of hyserve-bench.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace hyserve::bench {

// A bad flag or value: main prints the message and the usage and exits with code 2.
class usage_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct server_url {
  std::string text;         // as given, without a trailing '/'
  std::string host;         // without brackets for IPv6 literals
  std::string port = "80";  // service name or number
  std::string base_path;    // "" or "/prefix" (no trailing '/')
  std::string host_header() const;
};

struct bench_options {
  server_url url;
  int32_t concurrency = 8;
  int32_t requests = 64;
  int32_t prompt_len = 128;
  int32_t output_len = 64;
  int32_t vocab = 1024;
  // Prefix caching workloads: every request starts with the same shared_prefix tokens (a system
  // prompt); with turns > 1, --requests conversations of `turns` requests each, where every turn
  // resends the whole conversation (prefix, earlier prompts and answers) plus prompt_len new tokens.
  int32_t shared_prefix = 0;
  int32_t turns = 1;
  uint64_t seed = 0;
  bool stream = true;
  bool cumulative = false;  // streamed chunks with the whole output so far (else incremental)
  std::optional<std::string> api_key;
  bool json = false;
  double timeout_s = 120.0;
  bool help = false;
};

extern const char* const kUsage;

// Parses "http://host[:port][/prefix]"; throws usage_error.
server_url parse_url(const std::string& text);

// Throws usage_error on unknown flags, missing or malformed values and out-of-range numbers.
bench_options parse_args(int argc, char** argv);

}  // namespace hyserve::bench
