// Decode graphs carve their activations from a graph arena (worker/model/decode_graphs.h,
// kernels/graph.h): a captured bucket graph holds no memory-alloc / memory-free node, and a
// replay computes exactly what the eager model body computes on the same padded step.
//   - NoMemoryNodesAndEqualToEager: steps of batch 1, 3 (bucket 4, one padding row) and 8 in an
//     engine with `cuda_graphs: true` and one without; every graph the graph engine ran reports
//     0 alloc and 0 free nodes and a non-empty arena, and its logits equal the eager engine's
//     within the tolerance of test_gpu_graph.cpp (f32 1e-5·(1 + |eager|), bf16 2e-3·(…)), with
//     the same greedy ids.
//   - ReplayBitwiseEqualsWarmUp: two graph engines over the same requests, in one of which the
//     bucket was captured beforehand (on other requests of the same lengths). The first step
//     over the requests is then the warm-up (the eager body on the graph stream) in one engine
//     and a replay in the other: the logits must be identical bit for bit, and stay so over the
//     following steps (both replaying: the recurrent and KV state the warm-up and the replay
//     wrote were identical too).
// Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "graph_test_support.h"
#include "hyserve/common/config.h"
#include "hyserve/kernels/device.h"
#include "hyserve/kernels/gdn.h"
#include "hyserve/kernels/run.h"
#include "hyserve/worker/engine.h"

namespace hyserve {
namespace {

using worker::engine;
using worker::forward_mode;
using worker::forward_options;
using worker::step_report;
using worker::step_row;

using arena_case = graph_test::graph_case;
using graph_test::argmax;
using graph_test::case_name;

service_config make_config(const arena_case& c, bool graphs) { return graph_test::graph_config(c, graphs, 16); }

std::vector<int32_t> prompt_of(size_t i, int32_t len, int64_t vocab) {
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (size_t t = 0; t < p.size(); ++t) p[t] = static_cast<int32_t>((7 + 31 * i + 13 * t) % static_cast<size_t>(vocab));
  return p;
}

// Opens and prefills one request per length in `e`; returns the handles and each first greedy token.
void open_all(engine& e, const std::vector<int32_t>& lengths, std::vector<int32_t>& handles, std::vector<int32_t>& next) {
  const int64_t vocab = e.config().vocab_size;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int32_t h = e.open_request();
    const tensor l = e.step(forward_mode::kExtend, {step_row{h, prompt_of(i, lengths[i], vocab)}});
    handles.push_back(h);
    next.push_back(argmax(l.as<float>() + (l.shape()[0] - 1) * vocab, vocab));
  }
}

std::vector<step_row> rows_of(const std::vector<int32_t>& handles, const std::vector<int32_t>& next,
                              const std::vector<size_t>& pick) {
  std::vector<step_row> rows;
  for (size_t r : pick) rows.push_back(step_row{handles[r], {next[r]}});
  return rows;
}

class GpuGraphArena : public graph_test::device_case_test {};

TEST_P(GpuGraphArena, NoMemoryNodesAndEqualToEager) {
  engine eager(make_config(GetParam(), false)), graphs(make_config(GetParam(), true));
  const int64_t vocab = eager.config().vocab_size;
  const std::vector<int32_t> lengths = {3, 9, 17, 30, 5, 41, 12, 7};
  std::vector<int32_t> he, hg, next, unused;
  open_all(eager, lengths, he, next);
  open_all(graphs, lengths, hg, unused);
  ASSERT_EQ(next, unused);
  const double tol = GetParam().bf16 ? 2e-3 : 1e-5;
  const std::vector<std::vector<size_t>> schedule = {{0}, {0, 1, 2}, {0, 1, 2, 3, 4, 5, 6, 7}, {0},
                                                     {0, 1, 2}, {0, 1, 2, 3, 4, 5, 6, 7}, {0, 1, 2}};
  int graphs_seen = 0;
  for (const std::vector<size_t>& pick : schedule) {
    forward_options oe;
    oe.eager = true;
    const tensor le = eager.step(forward_mode::kDecode, rows_of(he, next, pick), oe);
    step_report report;
    forward_options og;
    og.report = &report;
    const tensor lg = graphs.step(forward_mode::kDecode, rows_of(hg, next, pick), og);
    ASSERT_EQ(le.shape(), lg.shape());
    ASSERT_TRUE(report.graph) << "batch " << pick.size();
    ++graphs_seen;
    EXPECT_EQ(report.nodes.mem_allocs, 0) << "batch " << pick.size();
    EXPECT_EQ(report.nodes.mem_frees, 0) << "batch " << pick.size();
    EXPECT_GT(report.nodes.arena_bytes, 0) << "batch " << pick.size();
    EXPECT_GT(report.nodes.kernels, 0) << "batch " << pick.size();
    for (size_t i = 0; i < pick.size(); ++i) {
      const float* e = le.as<float>() + static_cast<int64_t>(i) * vocab;
      const float* g = lg.as<float>() + static_cast<int64_t>(i) * vocab;
      double worst = 0.0;
      for (int64_t j = 0; j < vocab; ++j)
        worst = std::max(worst, std::abs(static_cast<double>(g[j]) - e[j]) / (1.0 + std::abs(e[j])));
      EXPECT_LE(worst, tol) << "batch " << pick.size() << " row " << i;
      const int32_t id = argmax(e, vocab);
      EXPECT_EQ(argmax(g, vocab), id) << "batch " << pick.size() << " row " << i;
      next[pick[i]] = id;
    }
    if (HasFailure()) return;
  }
  EXPECT_EQ(graphs_seen, static_cast<int>(schedule.size()));
}

TEST_P(GpuGraphArena, ReplayBitwiseEqualsWarmUp) {
  engine first(make_config(GetParam(), true)), second(make_config(GetParam(), true));
  const int64_t vocab = first.config().vocab_size;
  // Bucket 4 (one padding row); page-table stride 4 for the 3 steps (at most 16 tokens of 4).
  const std::vector<int32_t> lengths = {13, 6, 10};
  // In `second` only: other requests of the same lengths capture the bucket beforehand.
  {
    std::vector<int32_t> handles, next;
    open_all(second, lengths, handles, next);
    step_report r;
    forward_options o;
    o.report = &r;
    second.step(forward_mode::kDecode, rows_of(handles, next, {0, 1, 2}), o);
    ASSERT_TRUE(r.graph && r.captured);
  }
  std::vector<int32_t> h1, h2, next, next2;
  open_all(first, lengths, h1, next);
  open_all(second, lengths, h2, next2);
  ASSERT_EQ(next, next2);
  for (int step = 0; step < 3; ++step) {
    step_report r1, r2;
    forward_options o1, o2;
    o1.report = &r1;
    o2.report = &r2;
    const tensor l1 = first.step(forward_mode::kDecode, rows_of(h1, next, {0, 1, 2}), o1);
    const tensor l2 = second.step(forward_mode::kDecode, rows_of(h2, next, {0, 1, 2}), o2);
    ASSERT_TRUE(r1.graph && r2.graph);
    EXPECT_EQ(r1.captured, step == 0);  // the warm-up, then replays
    EXPECT_FALSE(r2.captured);          // replays only
    EXPECT_EQ(r1.graph_batch, 4);
    EXPECT_EQ(r2.graph_batch, 4);
    ASSERT_EQ(l1.shape(), l2.shape());
    EXPECT_EQ(graph_test::differing_floats(l1, l2), 0) << "step " << step << (step == 0 ? " (warm-up against replay)" : " (replays)");
    if (HasFailure()) return;
    for (size_t i = 0; i < 3; ++i) next[i] = argmax(l1.as<float>() + static_cast<int64_t>(i) * vocab, vocab);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuGraphArena,
                         ::testing::Values(arena_case{"bamba-tiny", false}, arena_case{"bamba-tiny", true},
                                           arena_case{"qwen3next-tiny", false}, arena_case{"qwen3next-tiny", true}),
                         case_name);

}  // namespace
}  // namespace hyserve
