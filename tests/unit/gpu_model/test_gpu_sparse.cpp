// Sparse Top-K decode attention in the model on CUDA (float32), against the same model on the
// CPU: page size 4, budget 3 pages (1 sink, 1 recent), min_seq_len 8, bamba-tiny. Skips
// without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fixture.h"
#include "hyserve/common/config.h"
#include "hyserve/kernels/device.h"
#include "hyserve/worker/engine.h"

namespace hyserve {
namespace {

using worker::engine;
using worker::forward_mode;
using worker::step_row;

// f32 on both devices; the two attention paths sum in different orders. Selection scores are
// well separated on this fixture, so both devices pick the same pages.
constexpr float kLogitTol = 1e-3f;

#define HYSERVE_REQUIRE_CUDA() \
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

service_config quest_config(device_kind device, int32_t page_size, int32_t budget) {
  service_config cfg;
  cfg.model.path = test::fixture_dir("bamba-tiny");
  cfg.device = device;
  cfg.cache.page_size = page_size;
  cfg.cache.max_requests = 4;
  cfg.cache.max_context = 256;
  cfg.sparsity.algorithm = sparsity_algorithm::kQuest;
  cfg.sparsity.page_budget = budget;
  cfg.sparsity.sink_pages = 1;
  cfg.sparsity.recent_pages = 1;
  cfg.sparsity.min_seq_len = 8;
  return cfg;
}

TEST(GpuSparse, CoveringBudgetReproducesReferenceGreedy) {
  HYSERVE_REQUIRE_CUDA();
  engine eng(quest_config(device_kind::kCuda, 16, 16));
  for (const auto& p : test::load_reference_prompts("bamba-tiny"))
    EXPECT_EQ(eng.generate_greedy(p.input_ids, static_cast<int32_t>(p.greedy_ids.size())), p.greedy_ids);
}

// Teacher-forced decode of the longest prompt, every step sparse, batched with a short row that
// stays dense (below min_seq_len): CUDA logits against CPU logits at every step.
TEST(GpuSparse, SparseDecodeMatchesCpu) {
  HYSERVE_REQUIRE_CUDA();
  const auto prompts = test::load_reference_prompts("bamba-tiny");
  const auto& lp = prompts.back();
  const auto& sp = prompts.front();
  engine gpu(quest_config(device_kind::kCuda, 4, 3));
  engine cpu(quest_config(device_kind::kCpu, 4, 3));
  const int64_t vocab = cpu.config().vocab_size;
  auto open = [&](engine& e) {
    const int32_t a = e.open_request(), b = e.open_request();
    e.step(forward_mode::kExtend, {step_row{a, lp.input_ids}, step_row{b, sp.input_ids}});
    return std::pair<int32_t, int32_t>{a, b};
  };
  const auto [ga, gb] = open(gpu);
  const auto [ca, cb] = open(cpu);
  for (size_t i = 0; i + 1 < sp.greedy_ids.size(); ++i) {
    const std::vector<int32_t> lt{lp.greedy_ids[i]}, st{sp.greedy_ids[i]};
    const host_tensor g = gpu.step(forward_mode::kDecode, {step_row{ga, lt}, step_row{gb, st}});
    const host_tensor c = cpu.step(forward_mode::kDecode, {step_row{ca, lt}, step_row{cb, st}});
    ASSERT_EQ(g.shape(), c.shape());
    for (int64_t r = 0; r < 2; ++r)
      EXPECT_LE(test::max_abs_diff(g.as<float>() + r * vocab, c.as<float>() + r * vocab, vocab), kLogitTol)
          << "step " << i << " row " << r;
  }
}

// The page summaries on the device equal the min / max over the keys each page holds.
TEST(GpuSparse, PageSummariesTrackTheCachedKeys) {
  HYSERVE_REQUIRE_CUDA();
  const auto prompts = test::load_reference_prompts("bamba-tiny");
  const auto& p = prompts.back();
  constexpr int32_t kPage = 4;
  engine eng(quest_config(device_kind::kCuda, kPage, 3));
  const int32_t n = 6;
  eng.generate_greedy(p.input_ids, n);
  const int32_t len = static_cast<int32_t>(p.input_ids.size()) + n - 1;
  worker::kv_layer_cache& cache = eng.pools().kv->layer(0);
  ASSERT_EQ(cache.k.type(), dtype::kF32);
  const tensor k = cache.k.to_host();
  const tensor mn = cache.key_min.to_host(), mx = cache.key_max.to_host();
  const int64_t row = cache.k.shape()[2] * cache.k.shape()[3];
  for (int32_t page = 0; page * kPage < len; ++page)
    for (int64_t e = 0; e < row; ++e) {
      float lo = std::numeric_limits<float>::infinity(), hi = -lo;
      for (int32_t o = 0; o < kPage && page * kPage + o < len; ++o) {
        lo = std::min(lo, k.as<float>()[(page * kPage + o) * row + e]);
        hi = std::max(hi, k.as<float>()[(page * kPage + o) * row + e]);
      }
      ASSERT_EQ(mn.as<float>()[page * row + e], lo) << "page " << page;
      ASSERT_EQ(mx.as<float>()[page * row + e], hi) << "page " << page;
    }
}

}  // namespace
}  // namespace hyserve
