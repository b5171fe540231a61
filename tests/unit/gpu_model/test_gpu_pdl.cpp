// Programmatic dependent launch (kernels/cuda/launch.cuh) changes when a kernel may start, never
// what it computes: two engines over the same fixture, one with `kernels.pdl: true` (the
// default) and one with `kernels.pdl: false` (plain launches), run the same prefills and the
// same decode steps, through decode graphs and eagerly; every step's logits must be identical
// bit for bit. A kernel launched with PDL that read its input before griddepcontrol.wait (or a
// weight prefetch that touched written memory) would read the previous kernel's half-written
// output and differ here. Fixtures: every family, with the MoE layer (Qwen3-Next's device
// routing, Granite-4.0-H's experts), GDN, squared-ReLU MLP and parallel attention + Mamba2.
// Also kernels.attn_decode_early_loads against the default (GpuPdlEarlyLoads). Skips without a
// CUDA device.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "fixture.h"
#include "graph_test_support.h"
#include "hyserve/common/config.h"
#include "hyserve/common/model_config.h"
#include "hyserve/kernels/device.h"
#include "hyserve/worker/engine.h"

namespace hyserve {
namespace {

using graph_test::argmax;
using graph_test::case_name;
using graph_test::differing_floats;
using graph_test::graph_case;
using worker::engine;
using worker::forward_mode;
using worker::forward_options;
using worker::step_report;
using worker::step_row;

service_config pdl_config(const graph_case& c, bool pdl) {
  service_config cfg = graph_test::graph_config(c, true, 8);
  cfg.kernels.pdl = pdl;
  return cfg;
}

class GpuPdl : public graph_test::device_case_test {};

// What both engines run: prompts of `lengths` tokens (token t of prompt i: (a + b·i + c·t) mod
// vocab), then decode steps over the rows of each schedule entry, the last `eager` of them eagerly.
struct step_plan {
  std::vector<int32_t> lengths;
  int64_t a, b, c;
  std::vector<std::vector<size_t>> schedule;
  size_t eager;
};

// Buckets 1, 4 (a padding row in the 3-row steps) and 2; the last two steps run eagerly.
const step_plan kFixturePlan{{13, 6, 10, 25}, 5, 29, 11,
                             {{0}, {0, 1, 2}, {0, 1, 2, 3}, {1, 3}, {0}, {0, 1, 2}, {0, 1, 2, 3}, {2}, {0, 1, 2, 3}},
                             2};

// The plan's prefills and decode steps on both engines: every step's logits identical bit for
// bit, and the steps before the eager ones run as graphs on both.
void expect_same_steps(engine& on, engine& off, const step_plan& plan = kFixturePlan) {
  const int64_t vocab = on.config().vocab_size;
  std::vector<int32_t> handles, next;
  for (size_t i = 0; i < plan.lengths.size(); ++i) {
    std::vector<int32_t> prompt(static_cast<size_t>(plan.lengths[i]));
    for (size_t t = 0; t < prompt.size(); ++t)
      prompt[t] = static_cast<int32_t>((plan.a + plan.b * static_cast<int64_t>(i) + plan.c * static_cast<int64_t>(t)) %
                                       vocab);
    const int32_t a = on.open_request(), b = off.open_request();
    ASSERT_EQ(a, b);
    const tensor la = on.step(forward_mode::kExtend, {step_row{a, prompt}});
    const tensor lb = off.step(forward_mode::kExtend, {step_row{b, prompt}});
    ASSERT_EQ(la.shape(), lb.shape());
    EXPECT_EQ(differing_floats(la, lb), 0) << "prefill of request " << i;
    handles.push_back(a);
    next.push_back(argmax(la.as<float>() + (la.shape()[0] - 1) * vocab, vocab));
  }
  const auto& schedule = plan.schedule;
  int graph_steps = 0;
  for (size_t s = 0; s < schedule.size(); ++s) {
    std::vector<step_row> rows;
    for (size_t r : schedule[s]) rows.push_back(step_row{handles[r], {next[r]}});
    const bool eager = s + plan.eager >= schedule.size();
    step_report ron, roff;
    forward_options oon, ooff;
    oon.eager = ooff.eager = eager;
    oon.report = &ron;
    ooff.report = &roff;
    const tensor lon = on.step(forward_mode::kDecode, rows, oon);
    const tensor loff = off.step(forward_mode::kDecode, rows, ooff);
    ASSERT_EQ(lon.shape(), loff.shape());
    EXPECT_EQ(differing_floats(lon, loff), 0)
        << "decode step " << s << " (" << rows.size() << " rows, " << (eager ? "eager" : "graph") << ")";
    EXPECT_EQ(ron.graph, !eager) << "step " << s;
    EXPECT_EQ(roff.graph, !eager) << "step " << s;
    if (ron.graph) ++graph_steps;
    if (::testing::Test::HasFailure()) return;
    for (size_t i = 0; i < schedule[s].size(); ++i)
      next[schedule[s][i]] = argmax(lon.as<float>() + static_cast<int64_t>(i) * vocab, vocab);
  }
  EXPECT_EQ(graph_steps, static_cast<int>(schedule.size() - plan.eager));
}

TEST_P(GpuPdl, OnEqualsOffBitwiseInPrefillGraphsAndEagerDecode) {
  engine on(pdl_config(GetParam(), true)), off(pdl_config(GetParam(), false));
  expect_same_steps(on, off);
}

// kernels.smem_carveout: 100 (every decode-path kernel prefers the largest shared memory) changes
// where blocks may run, never what they compute.
TEST_P(GpuPdl, CarveoutPreferenceEqualsDefaultBitwise) {
  service_config carve = pdl_config(GetParam(), true);
  carve.kernels.smem_carveout = 100;
  engine on(carve), off(pdl_config(GetParam(), true));
  expect_same_steps(on, off);
}

// kernels.attn_decode_early_loads: the tensor-core decode kernel loads a row's older keys before
// the programmatic-launch wait and this step's keys (written by the rope and kv_write kernel just
// before it) after it. Were the split wrong, or an older key still being written when the kernel
// starts, a step would read stale or half-written rows. On a model whose attention runs that
// kernel (bamba-tiny's layout with head_dim 128 and synthetic weights, bf16 weights and KV cache;
// the fixtures' head_dim 16 runs the CUDA-core kernel), every graph decode step's logits equal
// the default's bit for bit, over contexts of one to 13 pages of 16 keys (several tiles a warp,
// slices of several warps, the cluster merge) at batches 1 to 4.
TEST(GpuPdlEarlyLoads, EqualsDefaultBitwiseInDecodeGraphs) {
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  synthetic_model_config syn;
  syn.arch = read_hf_config(test::fixture_dir("bamba-tiny") + "/config.json");
  syn.arch.head_dim = 128;
  syn.seed = 5;
  auto config = [&](bool early) {
    service_config cfg = graph_test::graph_config(graph_case{"bamba-tiny", true}, true, 8);
    cfg.model.path.clear();
    cfg.model.synthetic = syn;
    cfg.cache.page_size = 16;
    cfg.cache.max_context = 512;
    cfg.kernels.attn_decode_early_loads = early;
    return cfg;
  };
  engine on(config(true)), off(config(false));
  expect_same_steps(on, off,
                    step_plan{{37, 130, 201, 15}, 3, 31, 7,
                              {{0}, {1}, {2}, {3}, {0, 1, 2, 3}, {0, 2}, {1, 2, 3}, {2}, {0, 1, 2, 3}, {3}, {0, 1}, {2}},
                              0});
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuPdl,
                         ::testing::Values(graph_case{"bamba-tiny", true}, graph_case{"qwen3next-tiny", true},
                                           graph_case{"granite4h-tiny", false}, graph_case{"falconh1-tiny", false},
                                           graph_case{"nemotronh-tiny", false}, graph_case{"bamba-groups", false}),
                         case_name);

}  // namespace
}  // namespace hyserve
