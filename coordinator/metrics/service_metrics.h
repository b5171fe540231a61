#pragma once
// The coordinator's metrics, by name, over one registry. The HTTP layer updates the request,
// token and latency metrics from request events; the scheduler updates the queue, running,
// step-time and capacity metrics. Every accessor is thread-safe and returns a reference that
// stays valid for the life of this object.
//
//   hyserve_requests_total{status}            counter   generation requests by HTTP status
//   hyserve_prompt_tokens_total               counter   prompt tokens of accepted requests
//   hyserve_generation_tokens_total           counter   tokens streamed back to clients
//   hyserve_cancelled_requests_total          counter   requests cancelled because the client left
//   hyserve_queue_depth                       gauge     waiting requests (scheduler)
//   hyserve_running_requests                  gauge     requests in the running batch (scheduler)
//   hyserve_free_kv_pages                     gauge     free KV cache pages (scheduler)
//   hyserve_free_mamba_slots                  gauge     free Mamba state slots (scheduler)
//   hyserve_time_to_first_token_seconds       histogram arrival → first generated token
//   hyserve_inter_token_latency_seconds       histogram gap between generated tokens
//   hyserve_request_latency_seconds           histogram arrival → final event
//   hyserve_step_seconds{mode}                histogram one scheduler step by forward mode (scheduler)
//   hyserve_decode_rows_total                 counter   decode / verify rows run (padding excluded)
//   hyserve_sparse_decode_rows_total          counter   of those, rows that attended over a sparse page selection
//   hyserve_sparse_decode_row_fraction        gauge     sparse_decode_rows_total / decode_rows_total
//   hyserve_attention_pages_read_per_step     histogram KV pages one attention layer read in a decode step
//   hyserve_attention_pages_read_total        counter   the sum of those
// The decode attention metrics come from the workers' step results (docs/ARCHITECTURE.md, Sparse Top-K attention).
#include <string>
#include <string_view>

#include "coordinator/metrics/registry.h"

namespace hyserve::coordinator::metrics {

class service_metrics {
 public:
  service_metrics();
  service_metrics(const service_metrics&) = delete;
  service_metrics& operator=(const service_metrics&) = delete;

  registry& metric_registry() { return registry_; }
  std::string render() const { return registry_.render(); }

  // HTTP layer.
  void count_request(unsigned http_status);
  counter& prompt_tokens() { return prompt_tokens_; }
  counter& generation_tokens() { return generation_tokens_; }
  counter& cancelled_requests() { return cancelled_requests_; }
  histogram& time_to_first_token() { return time_to_first_token_; }
  histogram& inter_token_latency() { return inter_token_latency_; }
  histogram& request_latency() { return request_latency_; }

  // Scheduler.
  gauge& queue_depth() { return queue_depth_; }
  gauge& running_requests() { return running_requests_; }
  gauge& free_kv_pages() { return free_kv_pages_; }
  gauge& free_mamba_slots() { return free_mamba_slots_; }
  // `mode` is the forward mode's name ("extend", "decode", ...).
  histogram& step_seconds(std::string_view mode);
  // One Decode / TargetVerify step's attention as a worker reported it: its rows, how many were
  // sparse, and the KV pages one attention layer read. Steps without decode rows are ignored.
  void record_decode_attention(int64_t decode_rows, int64_t sparse_rows, int64_t pages_read);

 private:
  registry registry_;  // declared first: the references below point into it
  counter& prompt_tokens_;
  counter& generation_tokens_;
  counter& cancelled_requests_;
  histogram& time_to_first_token_;
  histogram& inter_token_latency_;
  histogram& request_latency_;
  gauge& queue_depth_;
  gauge& running_requests_;
  gauge& free_kv_pages_;
  gauge& free_mamba_slots_;
  counter& decode_rows_;
  counter& sparse_decode_rows_;
  gauge& sparse_decode_row_fraction_;
  histogram& pages_read_per_step_;
  counter& pages_read_;
};

}  // namespace hyserve::coordinator::metrics
