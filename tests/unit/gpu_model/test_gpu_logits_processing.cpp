// Logits processing through step plans on CUDA (the worker's runner, bamba-tiny, float32, CUDA
// graphs on): the same tokens, logprobs and top logprobs as a CPU runner fed the same plans, and
// the fast path kept for rows that do not ask. Plain decode steps, and steps whose rows ask only
// for the sampled token's logprob, bring back at most 16 bytes a row (they replay the decode
// graph); a step with a logit_bias / penalty / top_logprobs row runs eagerly and still agrees.
// Skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include "fixture.h"
#include "hyserve/common/config.h"
#include "hyserve/common/wire.h"
#include "hyserve/kernels/device.h"
#include "hyserve/worker/forward_mode.h"
#include "hyserve/worker/model.h"
#include "hyserve/worker/runner.h"

namespace hyserve {
namespace {

constexpr int32_t kPage = 16, kMaxContext = 256, kPagesPerRow = kMaxContext / kPage;

service_config config(device_kind device) {
  service_config cfg;
  cfg.model.path = test::fixture_dir("bamba-tiny");
  cfg.device = device;
  cfg.cache.page_size = kPage;
  cfg.cache.max_requests = 4;
  cfg.cache.max_context = kMaxContext;
  return cfg;
}

std::unique_ptr<worker::runner> make_runner(const service_config& cfg) {
  return std::make_unique<worker::runner>(worker::make_model(cfg, resolve_model_config(cfg), {}, nullptr), cfg.cache,
                                          nullptr);
}

uint8_t mode(worker::forward_mode m) { return static_cast<uint8_t>(m); }

TEST(GpuLogitsProcessing, RunnerMatchesCpuAndKeepsTheFastPath) {
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const auto prompts = test::load_reference_prompts("bamba-tiny");
  auto cpu = make_runner(config(device_kind::kCpu));
  auto gpu = make_runner(config(device_kind::kCuda));
  constexpr int32_t kRows = 3;
  // Row 0 plain greedy, row 1 with penalties + bias + top logprobs, row 2 logprob only.
  auto processing = [](int32_t slot, int32_t output_index, int32_t prompt_len) {
    wire::logits_processing lp;
    if (slot == 1) {
      lp.repetition_penalty = 1.3f;
      lp.presence_penalty = 0.4f;
      lp.frequency_penalty = 0.6f;
      lp.bias_ids = {7, 300};
      lp.bias_values = {3.0f, -5.0f};
      lp.top_logprobs = 5;
      lp.logprobs = true;
      lp.prompt_len = prompt_len;
      if (output_index < 3) {
        lp.min_tokens = 3;
        lp.min_tokens_mask = {2};
      }
    } else if (slot == 2) {
      lp.logprobs = true;
    }
    return lp;
  };
  wire::step_plan prefill;
  prefill.step_id = 1;
  prefill.mode = mode(worker::forward_mode::kExtend);
  std::vector<int32_t> lens, last;
  for (int32_t s = 0; s < kRows; ++s) {
    wire::plan_row r;
    r.request_id = s;
    r.req_slot = s;
    r.mamba_slot = s;
    r.tokens = prompts[static_cast<size_t>(s)].input_ids;
    r.new_pages.resize(kPagesPerRow);
    std::iota(r.new_pages.begin(), r.new_pages.end(), s * kPagesPerRow);
    r.reset_state = true;
    r.processing = processing(s, 0, static_cast<int32_t>(r.tokens.size()));
    lens.push_back(static_cast<int32_t>(r.tokens.size()));
    prefill.rows.push_back(r);
  }
  auto compare = [&](const wire::step_result& a, const wire::step_result& b, const char* what) {
    ASSERT_TRUE(a.ok) << a.error;
    ASSERT_TRUE(b.ok) << b.error;
    ASSERT_EQ(a.rows.size(), b.rows.size());
    for (size_t i = 0; i < a.rows.size(); ++i) {
      EXPECT_EQ(a.rows[i].tokens, b.rows[i].tokens) << what << " row " << i;
      ASSERT_EQ(a.rows[i].logprobs.size(), b.rows[i].logprobs.size()) << what << " row " << i;
      for (size_t k = 0; k < a.rows[i].logprobs.size(); ++k)
        EXPECT_NEAR(a.rows[i].logprobs[k], b.rows[i].logprobs[k], 1e-3) << what << " row " << i;
      EXPECT_EQ(a.rows[i].top_n, b.rows[i].top_n) << what << " row " << i;
      EXPECT_EQ(a.rows[i].top_ids, b.rows[i].top_ids) << what << " row " << i;
      for (size_t k = 0; k < a.rows[i].top_logprobs.size() && k < b.rows[i].top_logprobs.size(); ++k)
        EXPECT_NEAR(a.rows[i].top_logprobs[k], b.rows[i].top_logprobs[k], 1e-3) << what << " row " << i;
    }
    // Logprobs only for the rows that asked.
    EXPECT_TRUE(b.rows[0].logprobs.empty());
    EXPECT_EQ(b.rows[1].top_n, 5);
    EXPECT_EQ(b.rows[2].top_n, 0);
    EXPECT_EQ(b.rows[2].logprobs.size(), 1u);
  };
  wire::step_result rc = cpu->execute(prefill), rg = gpu->execute(prefill);
  compare(rc, rg, "prefill");
  for (const auto& row : rg.rows) last.push_back(row.tokens.at(0));
  int fast_steps = 0;  // fast-path steps that brought back at most 16 bytes a row
  for (int32_t step = 0; step < 8; ++step) {
    // Mixed decode: all three rows (processing on), then rows 0 and 2 alone (fast path).
    for (const bool with_processing_row : {true, false}) {
      wire::step_plan d;
      d.step_id = static_cast<uint64_t>(10 + 2 * step + (with_processing_row ? 0 : 1));
      d.mode = mode(worker::forward_mode::kDecode);
      for (int32_t s = 0; s < kRows; ++s) {
        if (s == 1 && !with_processing_row) continue;
        wire::plan_row r;
        r.request_id = s;
        r.req_slot = s;
        r.mamba_slot = s;
        r.prefix_len = lens[static_cast<size_t>(s)];
        r.tokens = {last[static_cast<size_t>(s)]};
        r.output_index = r.prefix_len - static_cast<int32_t>(prompts[static_cast<size_t>(s)].input_ids.size()) + 1;
        r.processing = processing(s, r.output_index, static_cast<int32_t>(prompts[static_cast<size_t>(s)].input_ids.size()));
        d.rows.push_back(r);
      }
      rc = cpu->execute(d);
      rg = gpu->execute(d);
      ASSERT_TRUE(rg.ok) << rg.error;
      if (!with_processing_row) {
        // The decode graph's path: 8 bytes (token and logprob) a row come back, except in the
        // warm-up step of a new graph key (its logits come back once).
        const bool small = gpu->last_step_d2h_bytes() <= 16u * d.rows.size();
        fast_steps += small ? 1 : 0;
        if (step == 7) {
          EXPECT_TRUE(small) << gpu->last_step_d2h_bytes() << " bytes for " << d.rows.size() << " rows";
        }
      }
      ASSERT_EQ(rc.rows.size(), rg.rows.size());
      for (size_t i = 0; i < rc.rows.size(); ++i) {
        EXPECT_EQ(rc.rows[i].tokens, rg.rows[i].tokens) << "step " << step << " row " << i;
        const int32_t s = static_cast<int32_t>(d.rows[i].request_id);
        lens[static_cast<size_t>(s)] += 1;
        last[static_cast<size_t>(s)] = rg.rows[i].tokens.at(0);
        if (s == 1) {
          EXPECT_NE(rg.rows[i].tokens.at(0), 2) << "min_tokens: EOS masked";
          EXPECT_EQ(rg.rows[i].top_ids.size(), 5u);
          EXPECT_EQ(rg.rows[i].top_ids.at(0), rg.rows[i].tokens.at(0)) << "greedy: the sampled token ranks first";
          for (size_t k = 0; k < rg.rows[i].top_ids.size(); ++k)
            EXPECT_NEAR(rg.rows[i].top_logprobs[k], rc.rows[i].top_logprobs[k], 1e-3) << "step " << step;
        }
        if (s != 0) {
          ASSERT_EQ(rg.rows[i].logprobs.size(), 1u);
          EXPECT_NEAR(rg.rows[i].logprobs[0], rc.rows[i].logprobs[0], 1e-3) << "step " << step << " row " << i;
        } else {
          EXPECT_TRUE(rg.rows[i].logprobs.empty());
        }
      }
    }
  }
  EXPECT_GE(fast_steps, 5) << "of 8 steps without processing rows (warm-ups of new graph keys excepted)";
}

}  // namespace
}  // namespace hyserve
