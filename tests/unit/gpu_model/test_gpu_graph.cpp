// CUDA-graph decode (worker/model/decode_graphs.h) against eager decode on CUDA: two engines
// over the same fixture, one with `cuda_graphs: true`, one with `cuda_graphs: false`, run the
// same prefills and the same decode steps (Qwen3-Next: GDN, gated attention and the MoE with
// device routing inside the graph). Batches of 1, 2, 3, 5, 6 and 4 rows hit the buckets
// 1, 2, 4 and 8 (padding rows in 3, 5 and 6), contexts of 3 to 50 tokens at page size 4 hit
// several page-table strides. Per step: float32 logits within 1e-5·(1 + |eager|), bf16 mode
// within 2e-3·(1 + |eager|), identical greedy ids; the graph engine reports that it replayed a
// graph of the expected bucket. A padded step leaves every state slot and KV location outside
// its real rows untouched. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <set>
#include <utility>
#include <string>
#include <vector>

#include "graph_test_support.h"
#include "fixture.h"
#include "hyserve/common/config.h"
#include "hyserve/common/model_config.h"
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

using graph_test::argmax;
using graph_test::case_name;
using graph_test::graph_case;

service_config graph_config(const graph_case& c, bool graphs) { return graph_test::graph_config(c, graphs, 8); }

int32_t bucket_of(int32_t bs) {
  int32_t b = 1;
  while (b < bs) b *= 2;
  return b;
}

// The host bytes of every KV and recurrent-state tensor of an engine.
struct state_snapshot {
  std::vector<std::vector<uint8_t>> kv;     // per attention layer: K then V
  std::vector<std::vector<uint8_t>> state;  // per state layer: conv then ssm
};

std::vector<uint8_t> bytes_of(const tensor& t) {
  std::vector<uint8_t> b(t.nbytes());
  t.copy_to_host(b.data(), b.size());
  return b;
}

state_snapshot snapshot(const engine& e) {
  state_snapshot s;
  const model_config& mc = e.config();
  // Layers with a KV cache, and layers with recurrent state (MLP-only layers have neither).
  const int32_t attn = static_cast<int32_t>(mc.num_attention_layers());
  const int32_t rec = static_cast<int32_t>(mc.num_recurrent_layers());
  for (int32_t i = 0; i < attn; ++i) {
    std::vector<uint8_t> k = bytes_of(e.pools().kv->layer(i).k), v = bytes_of(e.pools().kv->layer(i).v);
    k.insert(k.end(), v.begin(), v.end());
    s.kv.push_back(std::move(k));
  }
  for (int32_t i = 0; i < rec; ++i) {
    std::vector<uint8_t> c = bytes_of(e.pools().recurrent->layer(i).conv);
    std::vector<uint8_t> m = bytes_of(e.pools().recurrent->layer(i).ssm);
    c.insert(c.end(), m.begin(), m.end());
    s.state.push_back(std::move(c));
  }
  return s;
}

// Distinct `unit`-byte blocks that differ between a and b.
int64_t changed_blocks(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, size_t unit) {
  int64_t n = 0;
  for (size_t o = 0; o + unit <= a.size(); o += unit)
    if (std::memcmp(a.data() + o, b.data() + o, unit) != 0) ++n;
  return n;
}

class GpuGraphDecode : public ::testing::TestWithParam<graph_case> {
 protected:
  void SetUp() override {
    if (const char* why = graph_test::skip_reason(GetParam())) GTEST_SKIP() << why;
    eager_ = std::make_unique<engine>(graph_config(GetParam(), false));
    graph_ = std::make_unique<engine>(graph_config(GetParam(), true));
    vocab_ = eager_->config().vocab_size;
  }

  // Opens one request per prompt length in both engines and prefills it; returns the handles
  // (the same in both engines) and the first greedy token of each.
  void open_and_prefill(const std::vector<int32_t>& lengths) {
    for (size_t i = 0; i < lengths.size(); ++i) {
      std::vector<int32_t> prompt(static_cast<size_t>(lengths[i]));
      for (size_t t = 0; t < prompt.size(); ++t)
        prompt[t] = static_cast<int32_t>((7 + 31 * i + 13 * t) % static_cast<size_t>(vocab_));
      const int32_t a = eager_->open_request(), b = graph_->open_request();
      ASSERT_EQ(a, b);
      const tensor la = eager_->step(forward_mode::kExtend, {step_row{a, prompt}});
      const tensor lb = graph_->step(forward_mode::kExtend, {step_row{b, prompt}});
      const int32_t ta = argmax(la.as<float>() + (la.shape()[0] - 1) * vocab_, vocab_);
      ASSERT_EQ(ta, argmax(lb.as<float>() + (lb.shape()[0] - 1) * vocab_, vocab_));
      handles_.push_back(a);
      next_.push_back(ta);
      lens_.push_back(lengths[i]);
    }
  }

  // One decode step over `rows` (indices into handles_) in both engines; compares the logits.
  step_report decode(const std::vector<size_t>& rows) {
    std::vector<step_row> in;
    for (size_t r : rows) in.push_back(step_row{handles_[r], {next_[r]}});
    forward_options ge;
    ge.eager = true;
    const tensor le = eager_->step(forward_mode::kDecode, in, ge);
    step_report report;
    forward_options go;
    go.report = &report;
    const tensor lg = graph_->step(forward_mode::kDecode, in, go);
    const double tol = GetParam().bf16 ? 2e-3 : 1e-5;
    EXPECT_EQ(le.shape(), lg.shape());
    for (size_t i = 0; i < rows.size(); ++i) {
      const float* e = le.as<float>() + static_cast<int64_t>(i) * vocab_;
      const float* g = lg.as<float>() + static_cast<int64_t>(i) * vocab_;
      double worst = 0.0;
      for (int64_t j = 0; j < vocab_; ++j)
        worst = std::max(worst, std::abs(static_cast<double>(g[j]) - e[j]) / (1.0 + std::abs(e[j])));
      EXPECT_LE(worst, tol) << "batch " << rows.size() << " row " << i;
      const int32_t id = argmax(e, vocab_);
      EXPECT_EQ(argmax(g, vocab_), id) << "batch " << rows.size() << " row " << i;
      next_[rows[i]] = id;
    }
    // Every fixture decodes through graphs (Qwen3-Next's 4 experts route on the device), so
    // every step of the graph engine takes one: no step falls back to the eager path.
    EXPECT_TRUE(report.graph) << "batch " << rows.size() << ": decode ran eagerly in the graph engine";
    // The key: the batch bucket and the page-table stride (a power of two ≥ the longest row's
    // pages at page size 4); its first step captures, every later one replays.
    int32_t longest = 0;
    for (size_t r : rows) longest = std::max(longest, lens_[r] + 1);
    const std::pair<int32_t, int32_t> key{bucket_of(static_cast<int32_t>(rows.size())), bucket_of((longest + 3) / 4)};
    EXPECT_EQ(report.graph_batch, key.first) << "batch " << rows.size();
    EXPECT_EQ(report.captured, seen_.insert(key).second) << "batch " << rows.size() << " stride " << key.second;
    for (size_t r : rows) lens_[r] += 1;
    EXPECT_GE(report.gpu_ms, 0.0);
    return report;
  }

  std::unique_ptr<engine> eager_, graph_;
  int64_t vocab_ = 0;
  std::vector<int32_t> handles_, next_, lens_;  // per request: handle, next token, cached tokens
  std::set<std::pair<int32_t, int32_t>> seen_;  // graph keys captured so far
};

TEST_P(GpuGraphDecode, GraphDecodeEqualsEagerAcrossBucketsAndLengths) {
  open_and_prefill({3, 9, 17, 30, 5, 41});
  const std::vector<std::vector<size_t>> schedule = {
      {0}, {1, 2}, {0, 3, 5}, {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4, 5}, {5, 4, 3, 2}, {2},
      {0, 3, 5}, {1, 2}, {0, 1, 2, 3, 4, 5}, {3}, {0, 3, 5}, {0, 1, 2, 3, 4}, {5, 4, 3, 2}};
  int replays = 0;
  for (int round = 0; round < 2; ++round)
    for (const std::vector<size_t>& rows : schedule) {
      const step_report r = decode(rows);
      if (r.graph && !r.captured) {
        ++replays;
        EXPECT_GT(r.nodes.kernels, 0);
      }
      if (HasFailure()) return;
    }
  // 28 steps over 8 keys (worked out from the schedule): (1, 1), (1, 4), (1, 8), (1, 16), (2, 8),
  // (4, 16), (8, 8), (8, 16); every other step replays.
  EXPECT_EQ(seen_.size(), 8u);
  EXPECT_EQ(replays, 20);
}

TEST_P(GpuGraphDecode, PaddedRowsTouchNoOtherStateOrKv) {
  open_and_prefill({6, 11, 19, 4});
  const step_report first = decode({0, 1, 2});  // bucket 4 captured (warm-up), one padding row
  EXPECT_TRUE(first.graph && first.captured);
  EXPECT_EQ(first.graph_batch, 4);
  const state_snapshot before = snapshot(*graph_);
  const step_report replay = decode({0, 1, 2});  // the replay: the padding row runs in the graph
  EXPECT_TRUE(replay.graph && !replay.captured);
  EXPECT_EQ(replay.graph_batch, 4);
  const state_snapshot after = snapshot(*graph_);
  const model_config& mc = graph_->config();
  // One K or V token row of a layer: kv_heads_local × head_dim elements.
  const size_t kv_elem = GetParam().bf16 ? 2 : 4;
  const size_t kv_row = static_cast<size_t>(mc.num_kv_heads * mc.head_dim) * kv_elem;
  for (size_t l = 0; l < before.kv.size(); ++l)
    EXPECT_EQ(changed_blocks(before.kv[l], after.kv[l], kv_row), 2 * 3) << "attention layer " << l;  // K and V of 3 rows
  // Recurrent state per slot: conv window then the SSM state; count changed slots in each part.
  const auto shape = graph_->pools().recurrent->shape();
  const size_t slots = static_cast<size_t>(graph_->pools().recurrent->n_slots() + 1);
  const size_t conv_slot = static_cast<size_t>(shape.conv_dim) * static_cast<size_t>(shape.conv_width - 1) * 4;
  for (size_t l = 0; l < before.state.size(); ++l) {
    const std::vector<uint8_t> conv_a(before.state[l].begin(), before.state[l].begin() + conv_slot * slots);
    const std::vector<uint8_t> conv_b(after.state[l].begin(), after.state[l].begin() + conv_slot * slots);
    EXPECT_EQ(changed_blocks(conv_a, conv_b, conv_slot), 3) << "state layer " << l;
    const size_t ssm_bytes = before.state[l].size() - conv_slot * slots;
    const std::vector<uint8_t> ssm_a(before.state[l].begin() + conv_slot * slots, before.state[l].end());
    const std::vector<uint8_t> ssm_b(after.state[l].begin() + conv_slot * slots, after.state[l].end());
    EXPECT_EQ(changed_blocks(ssm_a, ssm_b, ssm_bytes / slots), 3) << "state layer " << l;
  }
}

// A Qwen3-Next with 512 experts, top 10 (qwen3next-tiny's shapes otherwise, synthetic weights,
// expert width 16): MoE decode runs inside the decode graphs (the routed experts are one
// device op at any expert count), and graph decode equals eager decode within 1e-5·(1 + |eager|)
// with the same greedy ids, at batches 1 and 3 (one padding row).
TEST(GpuGraphMoe, ManyExpertsDecodeInGraphs) {
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  if (!kernels::has_cuda<kernels::gdn_chunk_scan_params>()) GTEST_SKIP() << "Gated DeltaNet has no CUDA op in this build";
  synthetic_model_config syn;
  syn.arch = read_hf_config(test::fixture_dir("qwen3next-tiny") + "/config.json");
  syn.arch.num_experts = 512;
  syn.arch.num_experts_per_tok = 10;
  syn.arch.moe_intermediate_size = 16;
  syn.seed = 3;
  auto config = [&](bool graphs) {
    service_config cfg = graph_config(graph_case{"qwen3next-tiny", false}, graphs);
    cfg.model.path.clear();
    cfg.model.synthetic = syn;
    return cfg;
  };
  engine eager(config(false)), graph(config(true));
  const int64_t vocab = eager.config().vocab_size;
  ASSERT_EQ(eager.config().num_experts, 512);
  std::vector<int32_t> handles, next;
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> prompt(static_cast<size_t>(5 + 7 * i));
    for (size_t t = 0; t < prompt.size(); ++t) prompt[t] = static_cast<int32_t>((11 + 17 * i + 5 * t) % vocab);
    const int32_t a = eager.open_request(), b = graph.open_request();
    ASSERT_EQ(a, b);
    const tensor la = eager.step(forward_mode::kExtend, {step_row{a, prompt}});
    graph.step(forward_mode::kExtend, {step_row{b, prompt}});
    handles.push_back(a);
    next.push_back(argmax(la.as<float>() + (la.shape()[0] - 1) * vocab, vocab));
  }
  for (const std::vector<size_t>& rows : std::vector<std::vector<size_t>>{{0}, {0}, {0, 1, 2}, {0, 1, 2}, {1}}) {
    std::vector<step_row> in;
    for (size_t r : rows) in.push_back(step_row{handles[r], {next[r]}});
    forward_options ge;
    ge.eager = true;
    const tensor le = eager.step(forward_mode::kDecode, in, ge);
    step_report report;
    forward_options go;
    go.report = &report;
    const tensor lg = graph.step(forward_mode::kDecode, in, go);
    EXPECT_TRUE(report.graph) << "batch " << rows.size() << ": a 512-expert decode ran eagerly";
    for (size_t i = 0; i < rows.size(); ++i) {
      const float* e = le.as<float>() + static_cast<int64_t>(i) * vocab;
      const float* g = lg.as<float>() + static_cast<int64_t>(i) * vocab;
      double worst = 0.0;
      for (int64_t j = 0; j < vocab; ++j)
        worst = std::max(worst, std::abs(static_cast<double>(g[j]) - e[j]) / (1.0 + std::abs(e[j])));
      EXPECT_LE(worst, 1e-5) << "batch " << rows.size() << " row " << i;
      const int32_t id = argmax(e, vocab);
      EXPECT_EQ(argmax(g, vocab), id) << "batch " << rows.size() << " row " << i;
      next[rows[i]] = id;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuGraphDecode,
                         ::testing::Values(graph_case{"bamba-tiny", false}, graph_case{"bamba-tiny", true},
                                           graph_case{"qwen3next-tiny", false}, graph_case{"qwen3next-tiny", true},
                                           graph_case{"nemotronh-tiny", false}, graph_case{"granite4h-tiny", false},
                                           graph_case{"falconh1-tiny", false}),
                         case_name);

}  // namespace
}  // namespace hyserve
