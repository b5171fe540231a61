#include "coordinator/metrics/service_metrics.h"

#include <vector>

namespace hyserve::coordinator::metrics {
namespace {

constexpr std::string_view kRequestsTotal = "hyserve_requests_total";
constexpr std::string_view kRequestsHelp = "Generation requests answered, by HTTP status (499: client went away).";
constexpr std::string_view kStepSeconds = "hyserve_step_seconds";
constexpr std::string_view kStepHelp = "Duration of one scheduler step, by forward mode.";

// KV pages per step: powers of two from 1 to 2^24.
std::vector<double> page_buckets() {
  std::vector<double> b;
  for (double v = 1.0; v <= 16777216.0; v *= 2.0) b.push_back(v);
  return b;
}

}  // namespace

service_metrics::service_metrics()
    : prompt_tokens_(registry_.counter_series("hyserve_prompt_tokens_total", "Prompt tokens of accepted requests.")),
      generation_tokens_(
          registry_.counter_series("hyserve_generation_tokens_total", "Generated tokens sent to clients.")),
      cancelled_requests_(registry_.counter_series("hyserve_cancelled_requests_total",
                                                   "Requests cancelled because the client disconnected.")),
      time_to_first_token_(registry_.histogram_series("hyserve_time_to_first_token_seconds",
                                                      "Time from arrival to the first generated token.",
                                                      latency_buckets())),
      inter_token_latency_(registry_.histogram_series("hyserve_inter_token_latency_seconds",
                                                      "Time between consecutive generated tokens.", token_buckets())),
      request_latency_(registry_.histogram_series("hyserve_request_latency_seconds",
                                                  "Time from arrival to the end of a request.", latency_buckets())),
      queue_depth_(registry_.gauge_series("hyserve_queue_depth", "Requests waiting in the scheduler queue.")),
      running_requests_(registry_.gauge_series("hyserve_running_requests", "Requests in the running batch.")),
      free_kv_pages_(registry_.gauge_series("hyserve_free_kv_pages", "Free KV cache pages.")),
      free_mamba_slots_(registry_.gauge_series("hyserve_free_mamba_slots", "Free Mamba state slots.")),
      decode_rows_(registry_.counter_series("hyserve_decode_rows_total",
                                            "Decode and verify rows run by the workers (padding excluded).")),
      sparse_decode_rows_(registry_.counter_series("hyserve_sparse_decode_rows_total",
                                                   "Decode and verify rows that attended over a sparse page selection.")),
      sparse_decode_row_fraction_(registry_.gauge_series(
          "hyserve_sparse_decode_row_fraction", "Fraction of decode and verify rows that were sparse (since start).")),
      pages_read_per_step_(registry_.histogram_series(
          "hyserve_attention_pages_read_per_step", "KV pages one attention layer read in one decode or verify step.",
          page_buckets())),
      pages_read_(registry_.counter_series("hyserve_attention_pages_read_total",
                                           "KV pages one attention layer read in decode and verify steps.")) {
  registry_.declare(kRequestsTotal, kRequestsHelp, metric_type::kCounter);
  registry_.declare(kStepSeconds, kStepHelp, metric_type::kHistogram);
}

void service_metrics::count_request(unsigned http_status) {
  registry_.counter_series(kRequestsTotal, kRequestsHelp, {{"status", std::to_string(http_status)}}).inc();
}

void service_metrics::record_decode_attention(int64_t decode_rows, int64_t sparse_rows, int64_t pages_read) {
  if (decode_rows <= 0) return;
  decode_rows_.inc(static_cast<double>(decode_rows));
  sparse_decode_rows_.inc(static_cast<double>(sparse_rows));
  sparse_decode_row_fraction_.set(sparse_decode_rows_.value() / decode_rows_.value());
  pages_read_per_step_.observe(static_cast<double>(pages_read));
  pages_read_.inc(static_cast<double>(pages_read));
}

histogram& service_metrics::step_seconds(std::string_view mode) {
  return registry_.histogram_series(kStepSeconds, kStepHelp, token_buckets(), {{"mode", std::string(mode)}});
}

}  // namespace hyserve::coordinator::metrics
