// The speculative steps' per-token recurrent states (state_pools::steps): with speculation
// configured they are allocated with the pools, for every request row and num_draft_tokens + 1
// states, so a step never allocates them mid-service; a step beyond that grows them to its rows
// (rounded up to 8, at most the request slots), never by doubling.
#include <gtest/gtest.h>

#include "fixture.h"
#include "hyserve/common/config.h"
#include "hyserve/worker/model.h"
#include "hyserve/worker/state_pools.h"

namespace hyserve {
namespace {

service_config config(const std::string& spec) {
  return load_config_string("model: {path: " + test::fixture_dir("bamba-tiny") +
                            "}\ncache: {page_size: 4, max_requests: 20, max_context: 64}\n" + spec);
}

// bamba-tiny's pools for cfg on the CPU.
worker::state_pools pools_of(const service_config& cfg) {
  const auto m = worker::make_model(cfg, resolve_model_config(cfg), worker::tp_placement{}, nullptr);
  return worker::make_state_pools(*m, cfg.cache, nullptr);
}

TEST(StepStatePools, SpeculationAllocatesEveryRowsStepStatesWithThePools) {
  const service_config cfg = config("speculative: {algorithm: ngram, num_draft_tokens: 3}\n");
  EXPECT_EQ(cfg.cache.spec_step_cols, 4);
  worker::state_pools p = pools_of(cfg);
  ASSERT_NE(p.steps, nullptr);
  EXPECT_EQ(p.steps->n_slots(), 20 * 4);
  const worker::mamba_state_cache* before = p.steps.get();
  // Any step of up to 20 rows and 4 states a row fits: nothing is allocated.
  p.ensure_steps(20, 4, device_kind::kCpu);
  p.ensure_steps(7, 2, device_kind::kCpu);
  EXPECT_EQ(p.steps.get(), before);
  EXPECT_EQ(p.step_rows, 7);
  EXPECT_EQ(p.step_cols, 2);
}

TEST(StepStatePools, MaxBatchBoundsThePlannedRows) {
  const service_config cfg = config("speculative: {algorithm: ngram, num_draft_tokens: 3, max_batch: 5}\n");
  EXPECT_EQ(cfg.cache.spec_step_slots(), 5 * 4);
  const worker::state_pools p = pools_of(cfg);
  ASSERT_NE(p.steps, nullptr);
  EXPECT_EQ(p.steps->n_slots(), 5 * 4);
  // Above the request slots it is the request slots.
  EXPECT_EQ(config("speculative: {algorithm: ngram, num_draft_tokens: 3, max_batch: 64}\n").cache.spec_step_slots(), 20 * 4);
}

TEST(StepStatePools, WithoutSpeculationStepsGrowToTheirRowsNotByDoubling) {
  const service_config cfg = config("");
  EXPECT_EQ(cfg.cache.spec_step_cols, 0);
  worker::state_pools p = pools_of(cfg);
  EXPECT_EQ(p.steps, nullptr);
  p.ensure_steps(3, 5, device_kind::kCpu);
  EXPECT_EQ(p.steps->n_slots(), 8 * 5);  // 3 rows rounded up to 8
  p.ensure_steps(9, 5, device_kind::kCpu);
  EXPECT_EQ(p.steps->n_slots(), 16 * 5);  // not 2 · 40
  p.ensure_steps(19, 5, device_kind::kCpu);
  EXPECT_EQ(p.steps->n_slots(), 20 * 5);  // at most the request slots' rows
  p.ensure_steps(20, 6, device_kind::kCpu);
  EXPECT_EQ(p.steps->n_slots(), 20 * 6);
}

}  // namespace
}  // namespace hyserve
