// The Prometheus registry's text exposition format.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "coordinator/metrics/registry.h"
#include "coordinator/metrics/service_metrics.h"

namespace hyserve::coordinator::metrics {
namespace {

bool has_line(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(metrics_registry, CounterAndGauge_WithAndWithoutLabels) {
  registry r;
  r.counter_series("req_total", "Requests.", {{"status", "200"}}).inc();
  r.counter_series("req_total", "Requests.", {{"status", "200"}}).inc(2);
  r.counter_series("req_total", "Requests.", {{"status", "500"}}).inc();
  r.gauge_series("depth", "Queue depth.").set(7);
  r.gauge_series("depth", "Queue depth.").add(-2.5);
  const std::string text = r.render();
  EXPECT_TRUE(has_line(text, "# HELP req_total Requests."));
  EXPECT_TRUE(has_line(text, "# TYPE req_total counter"));
  EXPECT_TRUE(has_line(text, R"(req_total{status="200"} 3)"));
  EXPECT_TRUE(has_line(text, R"(req_total{status="500"} 1)"));
  EXPECT_TRUE(has_line(text, "# TYPE depth gauge"));
  EXPECT_TRUE(has_line(text, "depth 4.5"));
}

TEST(metrics_registry, Histogram_CumulativeBucketsSumCount) {
  registry r;
  histogram& h = r.histogram_series("lat_seconds", "Latency.", {0.1, 1.0}, {{"mode", "decode"}});
  h.observe(0.05);
  h.observe(0.1);  // on the bound: counts in le="0.1"
  h.observe(0.5);
  h.observe(5.0);
  const std::string text = r.render();
  EXPECT_TRUE(has_line(text, "# TYPE lat_seconds histogram"));
  EXPECT_TRUE(has_line(text, R"(lat_seconds_bucket{mode="decode",le="0.1"} 2)"));
  EXPECT_TRUE(has_line(text, R"(lat_seconds_bucket{mode="decode",le="1"} 3)"));
  EXPECT_TRUE(has_line(text, R"(lat_seconds_bucket{mode="decode",le="+Inf"} 4)"));
  EXPECT_TRUE(has_line(text, R"(lat_seconds_sum{mode="decode"} 5.65)"));
  EXPECT_TRUE(has_line(text, R"(lat_seconds_count{mode="decode"} 4)"));
}

TEST(metrics_registry, EscapesLabelValuesAndHelp) {
  registry r;
  r.counter_series("x_total", "Line one\nback\\slash", {{"path", "a\"b\\c\nd"}}).inc();
  const std::string text = r.render();
  EXPECT_TRUE(has_line(text, "# HELP x_total Line one\\nback\\\\slash"));
  EXPECT_TRUE(has_line(text, R"(x_total{path="a\"b\\c\nd"} 1)"));
}

TEST(metrics_registry, DeclaredFamilyShowsBeforeFirstSeries_TypeMismatchIsABug) {
  registry r;
  r.declare("later_total", "Later.", metric_type::kCounter);
  EXPECT_TRUE(has_line(r.render(), "# TYPE later_total counter"));
  EXPECT_THROW(r.gauge_series("later_total", "Later."), std::exception);
  EXPECT_THROW(r.counter_series("bad name", "x"), std::exception);
}

TEST(metrics_registry, ConcurrentUpdatesAreCounted) {
  service_metrics m;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&m] {
      for (int i = 0; i < 1000; ++i) {
        m.generation_tokens().inc();
        m.count_request(200);
        m.step_seconds("decode").observe(0.001);
      }
    });
  }
  for (auto& t : threads) t.join();
  const std::string text = m.render();
  EXPECT_TRUE(has_line(text, "hyserve_generation_tokens_total 4000"));
  EXPECT_TRUE(has_line(text, R"(hyserve_requests_total{status="200"} 4000)"));
  EXPECT_TRUE(has_line(text, R"(hyserve_step_seconds_count{mode="decode"} 4000)"));
}

TEST(metrics_registry, DecodeAttentionFromStepResults) {
  service_metrics m;
  m.record_decode_attention(4, 3, 1000);  // 4 rows, 3 sparse, 1000 pages read
  m.record_decode_attention(0, 0, 0);     // a step without decode rows changes nothing
  m.record_decode_attention(4, 1, 3000);
  const std::string text = m.render();
  EXPECT_TRUE(has_line(text, "hyserve_decode_rows_total 8"));
  EXPECT_TRUE(has_line(text, "hyserve_sparse_decode_rows_total 4"));
  EXPECT_TRUE(has_line(text, "hyserve_sparse_decode_row_fraction 0.5"));
  EXPECT_TRUE(has_line(text, "hyserve_attention_pages_read_total 4000"));
  EXPECT_TRUE(has_line(text, "# TYPE hyserve_attention_pages_read_per_step histogram"));
  EXPECT_TRUE(has_line(text, R"(hyserve_attention_pages_read_per_step_bucket{le="512"} 0)"));
  EXPECT_TRUE(has_line(text, R"(hyserve_attention_pages_read_per_step_bucket{le="1024"} 1)"));
  EXPECT_TRUE(has_line(text, R"(hyserve_attention_pages_read_per_step_bucket{le="4096"} 2)"));
  EXPECT_TRUE(has_line(text, "hyserve_attention_pages_read_per_step_count 2"));
  EXPECT_TRUE(has_line(text, "hyserve_attention_pages_read_per_step_sum 4000"));
}

}  // namespace
}  // namespace hyserve::coordinator::metrics
