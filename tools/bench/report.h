// Aggregation of per-request results into the benchmark summary, as text or JSON.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <boost/json/object.hpp>

#include "client.h"
#include "options.h"

namespace hyserve::bench {

// Milliseconds.
struct distribution {
  size_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
};

// Linear interpolation between closest ranks (numpy's default); q in [0, 1]; values sorted.
double percentile(const std::vector<double>& sorted, double q);

// values in seconds -> distribution in ms; nullopt when empty.
std::optional<distribution> summarize(std::vector<double> seconds);

struct summary {
  std::string url;
  bool stream = true;
  bool incremental = true;  // stream_options.incremental was asked for
  int32_t concurrency = 0;
  int32_t requests = 0;
  int32_t prompt_len = 0;
  int32_t output_len = 0;
  int64_t ok = 0;
  int64_t failed = 0;
  std::string first_error;            // empty when nothing failed
  int64_t unexpected_output_len = 0;  // successful requests whose token count != output_len
  double wall_s = 0;
  int32_t shared_prefix = 0, turns = 1;
  int64_t prompt_tokens = 0;          // successful requests
  int64_t cached_tokens = 0;          // of those, served from the server's prefix cache
  int64_t output_tokens = 0;          // successful requests
  double request_throughput = 0;      // ok requests / s
  double output_throughput = 0;       // output tokens / s
  double total_throughput = 0;        // (prompt + output tokens) / s
  std::optional<distribution> ttft, itl, tpot, e2e;
};

summary make_summary(const bench_options& options, const std::vector<request_result>& results,
                     const std::string& first_error, double wall_s);

void print_text(std::FILE* out, const summary& s);
boost::json::object to_json(const summary& s);

}  // namespace hyserve::bench
