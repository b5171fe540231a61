// Sparse Top-K decode attention through the service (docs/ARCHITECTURE.md, Sparse Top-K attention): sampling_params.sparse
// reaches the worker's step plan, a request that opts out decodes exactly like the dense
// fixture reference, and /metrics counts decode rows, sparse rows and KV pages read.
// bamba-tiny, page size 4, budget 3 pages (1 sink, 1 recent), min_seq_len 8; the 41-token
// fixture prompt holds 11 pages at its first decode step, so every decode step of it is sparse
// unless the request opts out. The prefix cache is off: the prompt is sent twice, and the second
// time a hit would leave one token to prefill, a one-token row the counts below do not expect.
#include <gtest/gtest.h>

#include <boost/json.hpp>
#include <string>
#include <vector>

#include "service_test_support.h"

namespace hyserve::service_test {
namespace {

std::string body_with_sparse(const std::vector<int32_t>& ids, int32_t n, bool sparse) {
  boost::json::value v = boost::json::parse(generate_body(ids, greedy(n, true)));
  v.as_object()["sampling_params"].as_object()["sparse"] = sparse;
  return boost::json::serialize(v);
}

double metric(uint16_t port, const std::string& name) {
  return metric_value(metrics_text(port), name).value_or(-1.0);
}

TEST(ServiceSparse, OptOutIsDenseAndMetricsCountDecodeRows) {
  service_process svc("sparse", R"(model: {path: @MODEL@}
parallel: {tp: 1, dp: 1}
cache: {page_size: 4, max_requests: 4, max_context: 256, prefix: {enabled: false}}
sparsity: {algorithm: quest, page_budget: 3, sink_pages: 1, recent_pages: 1, min_seq_len: 8}
server: {host: 127.0.0.1, port: @PORT@}
)",
                      1);
  ASSERT_TRUE(svc.launch()) << svc.report();
  const auto& p = reference()[2];
  ASSERT_EQ(p.input_ids.size(), 41u);
  const int32_t n = static_cast<int32_t>(p.greedy_ids.size());  // 24: 1 from the prefill + 23 decode steps

  // Opted out: dense attention, the fixture's greedy tokens exactly.
  const generation dense = parse_generation(http_post(svc.port(), "/generate", body_with_sparse(p.input_ids, n, false)));
  ASSERT_EQ(dense.status, 200u) << dense;
  EXPECT_EQ(dense.ids, p.greedy_ids) << dense;
  // Decode step i (0-based) runs at length 42 + i; a dense row reads all its pages.
  int64_t dense_pages = 0;
  for (int32_t len = 42; len < 42 + n - 1; ++len) dense_pages += (len + 3) / 4;
  EXPECT_EQ(metric(svc.port(), "hyserve_decode_rows_total"), n - 1);
  EXPECT_EQ(metric(svc.port(), "hyserve_sparse_decode_rows_total"), 0);
  EXPECT_EQ(metric(svc.port(), "hyserve_sparse_decode_row_fraction"), 0);
  EXPECT_EQ(metric(svc.port(), "hyserve_attention_pages_read_total"), static_cast<double>(dense_pages));

  // Default (sparse): every decode step reads 3 pages.
  const generation sparse = parse_generation(http_post(svc.port(), "/generate", body_with_sparse(p.input_ids, n, true)));
  ASSERT_EQ(sparse.status, 200u) << sparse;
  EXPECT_EQ(sparse.ids.size(), p.greedy_ids.size());
  EXPECT_EQ(metric(svc.port(), "hyserve_decode_rows_total"), 2 * (n - 1));
  EXPECT_EQ(metric(svc.port(), "hyserve_sparse_decode_rows_total"), n - 1);
  EXPECT_EQ(metric(svc.port(), "hyserve_sparse_decode_row_fraction"), 0.5);
  EXPECT_EQ(metric(svc.port(), "hyserve_attention_pages_read_total"), static_cast<double>(dense_pages + 3 * (n - 1)));
  EXPECT_EQ(metric(svc.port(), "hyserve_attention_pages_read_per_step_count"), 2 * (n - 1));

  // A non-boolean override is refused before it reaches the scheduler.
  const http_reply bad = http_post(svc.port(), "/generate",
                                   R"({"input_ids": [1, 2], "sampling_params": {"sparse": "off"}})");
  EXPECT_EQ(bad.status, 400u) << bad.body;
  EXPECT_NE(bad.body.find("sampling_params.sparse"), std::string::npos) << bad.body;
}

}  // namespace
}  // namespace hyserve::service_test
