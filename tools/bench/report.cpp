#include "report.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace hyserve::bench {

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0.0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

std::optional<distribution> summarize(std::vector<double> seconds) {
  if (seconds.empty()) return std::nullopt;
  for (double& v : seconds) v *= 1e3;
  std::sort(seconds.begin(), seconds.end());
  distribution d;
  d.count = seconds.size();
  d.mean = std::accumulate(seconds.begin(), seconds.end(), 0.0) / static_cast<double>(seconds.size());
  d.p50 = percentile(seconds, 0.50);
  d.p90 = percentile(seconds, 0.90);
  d.p99 = percentile(seconds, 0.99);
  return d;
}

summary make_summary(const bench_options& options, const std::vector<request_result>& results,
                     const std::string& first_error, double wall_s) {
  summary s;
  s.url = options.url.text;
  s.stream = options.stream;
  s.incremental = options.stream && !options.cumulative;
  s.concurrency = options.concurrency;
  s.requests = options.requests * options.turns;
  s.prompt_len = options.prompt_len;
  s.output_len = options.output_len;
  s.first_error = first_error;
  s.wall_s = wall_s;
  s.shared_prefix = options.shared_prefix;
  s.turns = options.turns;
  std::vector<double> ttft, itl, tpot, e2e;
  for (const request_result& r : results) {
    if (!r.ok) {
      ++s.failed;
      if (s.first_error.empty()) s.first_error = r.error;
      continue;
    }
    ++s.ok;
    s.prompt_tokens += r.prompt_tokens;
    s.cached_tokens += r.cached_tokens;
    s.output_tokens += r.output_tokens;
    if (r.output_tokens != options.output_len) ++s.unexpected_output_len;
    e2e.push_back(r.e2e_s);
    if (r.ttft_s >= 0.0) {
      ttft.push_back(r.ttft_s);
      if (r.output_tokens > 1) tpot.push_back((r.e2e_s - r.ttft_s) / static_cast<double>(r.output_tokens - 1));
    }
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
  }
  if (wall_s > 0.0) {
    s.request_throughput = static_cast<double>(s.ok) / wall_s;
    s.output_throughput = static_cast<double>(s.output_tokens) / wall_s;
    s.total_throughput = static_cast<double>(s.prompt_tokens + s.output_tokens) / wall_s;
  }
  s.ttft = summarize(std::move(ttft));
  s.itl = summarize(std::move(itl));
  s.tpot = summarize(std::move(tpot));
  s.e2e = summarize(std::move(e2e));
  return s;
}

namespace {

void print_row(std::FILE* out, const char* name, const std::optional<distribution>& d) {
  if (!d) {
    std::fprintf(out, "  %-22s %10s %10s %10s %10s\n", name, "-", "-", "-", "-");
    return;
  }
  std::fprintf(out, "  %-22s %10.2f %10.2f %10.2f %10.2f\n", name, d->mean, d->p50, d->p90, d->p99);
}

boost::json::value distribution_json(const std::optional<distribution>& d) {
  if (!d) return nullptr;
  boost::json::object o;
  o["count"] = d->count;
  o["mean"] = d->mean;
  o["p50"] = d->p50;
  o["p90"] = d->p90;
  o["p99"] = d->p99;
  return o;
}

}  // namespace

void print_text(std::FILE* out, const summary& s) {
  std::fprintf(out, "============ hyserve-bench summary ============\n");
  std::fprintf(out, "%-36s %s (%s)\n", "Server:", s.url.c_str(), s.stream ? "streaming" : "no streaming");
  std::fprintf(out, "%-36s %d / %d\n", "Concurrency / requests:", s.concurrency, s.requests);
  std::fprintf(out, "%-36s %d / %d\n", "Prompt / output tokens per request:", s.prompt_len, s.output_len);
  std::fprintf(out, "%-36s %lld\n", "Successful requests:", static_cast<long long>(s.ok));
  std::fprintf(out, "%-36s %lld\n", "Failed requests:", static_cast<long long>(s.failed));
  if (!s.first_error.empty()) std::fprintf(out, "%-36s %s\n", "First error:", s.first_error.c_str());
  if (s.unexpected_output_len > 0) {
    std::fprintf(out, "%-36s %lld (expected %d tokens each)\n", "Unexpected output length:",
                 static_cast<long long>(s.unexpected_output_len), s.output_len);
  }
  std::fprintf(out, "%-36s %.3f\n", "Wall time (s):", s.wall_s);
  std::fprintf(out, "%-36s %lld / %lld\n", "Prompt / output tokens (total):", static_cast<long long>(s.prompt_tokens),
               static_cast<long long>(s.output_tokens));
  if (s.shared_prefix > 0 || s.turns > 1)
    std::fprintf(out, "%-36s %d / %d\n", "Shared prefix tokens / turns:", s.shared_prefix, s.turns);
  std::fprintf(out, "%-36s %lld (%.1f%% of prompt tokens)\n", "Prompt tokens served from cache:",
               static_cast<long long>(s.cached_tokens),
               s.prompt_tokens > 0 ? 100.0 * static_cast<double>(s.cached_tokens) / static_cast<double>(s.prompt_tokens) : 0.0);
  std::fprintf(out, "%-36s %.3f\n", "Request throughput (req/s):", s.request_throughput);
  std::fprintf(out, "%-36s %.2f\n", "Output token throughput (tok/s):", s.output_throughput);
  std::fprintf(out, "%-36s %.2f\n", "Total token throughput (tok/s):", s.total_throughput);
  std::fprintf(out, "%-24s %10s %10s %10s %10s\n", "Latency (ms)", "mean", "p50", "p90", "p99");
  print_row(out, "TTFT", s.ttft);
  print_row(out, "ITL", s.itl);
  print_row(out, "TPOT", s.tpot);
  print_row(out, "End-to-end", s.e2e);
  if (!s.stream) std::fprintf(out, "(TTFT, ITL and TPOT need --stream)\n");
  std::fprintf(out, "===============================================\n");
}

boost::json::object to_json(const summary& s) {
  boost::json::object o;
  o["url"] = s.url;
  o["stream"] = s.stream;
  o["incremental"] = s.incremental;
  o["concurrency"] = s.concurrency;
  o["requests"] = s.requests;
  o["prompt_len"] = s.prompt_len;
  o["output_len"] = s.output_len;
  o["successful_requests"] = s.ok;
  o["failed_requests"] = s.failed;
  if (s.first_error.empty()) {
    o["first_error"] = nullptr;
  } else {
    o["first_error"] = s.first_error;
  }
  o["unexpected_output_len"] = s.unexpected_output_len;
  o["wall_time_s"] = s.wall_s;
  o["prompt_tokens"] = s.prompt_tokens;
  o["output_tokens"] = s.output_tokens;
  o["shared_prefix"] = s.shared_prefix;
  o["turns"] = s.turns;
  o["cached_prompt_tokens"] = s.cached_tokens;
  o["request_throughput"] = s.request_throughput;
  o["output_token_throughput"] = s.output_throughput;
  o["total_token_throughput"] = s.total_throughput;
  o["ttft_ms"] = distribution_json(s.ttft);
  o["itl_ms"] = distribution_json(s.itl);
  o["tpot_ms"] = distribution_json(s.tpot);
  o["e2e_latency_ms"] = distribution_json(s.e2e);
  return o;
}

}  // namespace hyserve::bench
