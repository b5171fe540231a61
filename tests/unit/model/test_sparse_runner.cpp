// Sparse attention through step plans (the worker's runner): the per-row disable flag
// (plan_row.dense_attention, from sampling_params.sparse: false) and the decode attention
// statistics of step_result. bamba-tiny on the CPU, page size 4, budget 3 pages, min_seq_len 8.
// Reference: a runner of the same model without sparsity, fed the same plans. Also the runner's
// per-mode host-time counters.
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <vector>

#include "fixture.h"
#include "hyserve/common/config.h"
#include "hyserve/common/wire.h"
#include "hyserve/worker/forward_mode.h"
#include "hyserve/worker/model.h"
#include "hyserve/worker/runner.h"

namespace hyserve {
namespace {

using worker::forward_mode;

constexpr int32_t kPage = 4, kBudget = 3, kMaxContext = 128;
constexpr int32_t kPagesPerRow = kMaxContext / kPage;

service_config config(bool quest) {
  service_config cfg;
  cfg.model.path = test::fixture_dir("bamba-tiny");
  cfg.cache.page_size = kPage;
  cfg.cache.max_requests = 4;
  cfg.cache.max_context = kMaxContext;
  if (quest) {
    cfg.sparsity.algorithm = sparsity_algorithm::kQuest;
    cfg.sparsity.page_budget = kBudget;
    cfg.sparsity.sink_pages = 1;
    cfg.sparsity.recent_pages = 1;
    cfg.sparsity.min_seq_len = 8;
  }
  return cfg;
}

std::unique_ptr<worker::runner> make_runner(const service_config& cfg) {
  return std::make_unique<worker::runner>(worker::make_model(cfg, resolve_model_config(cfg), {}, nullptr), cfg.cache,
                                          nullptr);
}

// Row `slot` owns pages [slot · kPagesPerRow, (slot + 1) · kPagesPerRow), all sent with its prefill.
wire::plan_row prefill_row(int32_t slot, const std::vector<int32_t>& prompt) {
  wire::plan_row r;
  r.request_id = slot;
  r.req_slot = slot;
  r.mamba_slot = slot;
  r.tokens = prompt;
  r.first_page_pos = 0;
  r.new_pages.resize(kPagesPerRow);
  std::iota(r.new_pages.begin(), r.new_pages.end(), slot * kPagesPerRow);
  r.reset_state = true;
  return r;
}

wire::plan_row decode_row(int32_t slot, int32_t prefix, int32_t token, bool dense, int32_t output_index) {
  wire::plan_row r;
  r.request_id = slot;
  r.req_slot = slot;
  r.mamba_slot = slot;
  r.prefix_len = prefix;
  r.tokens = {token};
  r.output_index = output_index;
  r.dense_attention = dense;
  return r;
}

TEST(SparseRunner, DisabledRowStaysDenseAndStatisticsAreReported) {
  const auto prompts = test::load_reference_prompts("bamba-tiny");
  const std::vector<int32_t>& a = prompts[2].input_ids;  // 41 tokens: sparse from its first decode
  const std::vector<int32_t>& b = prompts[1].input_ids;  // 23 tokens: sparse too, but opted out
  auto sparse = make_runner(config(true));
  auto dense = make_runner(config(false));

  wire::step_plan p;
  p.step_id = 1;
  p.mode = static_cast<uint8_t>(forward_mode::kExtend);
  p.rows = {prefill_row(0, a), prefill_row(1, b)};
  const wire::step_result ps = sparse->execute(p), pd = dense->execute(p);
  ASSERT_TRUE(ps.ok) << ps.error;
  ASSERT_TRUE(pd.ok) << pd.error;
  EXPECT_EQ(ps.decode_rows, 0) << "an Extend step has no decode rows";
  EXPECT_EQ(ps.pages_read, 0);
  std::vector<int32_t> ta{ps.rows[0].tokens.at(0)}, tb{ps.rows[1].tokens.at(0)};
  std::vector<int32_t> da{pd.rows[0].tokens.at(0)}, db{pd.rows[1].tokens.at(0)};
  ASSERT_EQ(ta, da);  // prefill is never sparse
  ASSERT_EQ(tb, db);

  for (int32_t step = 0; step < 16; ++step) {
    const int32_t la = static_cast<int32_t>(a.size()) + step, lb = static_cast<int32_t>(b.size()) + step;
    wire::step_plan s;
    s.step_id = static_cast<uint64_t>(2 + step);
    s.mode = static_cast<uint8_t>(forward_mode::kDecode);
    s.rows = {decode_row(0, la, ta.back(), false, step + 1), decode_row(1, lb, tb.back(), true, step + 1)};
    const wire::step_result rs = sparse->execute(s);
    ASSERT_TRUE(rs.ok) << rs.error;
    // Reference for row 1 only: the dense runner fed row 1's own tokens (row 0 follows its own
    // dense continuation there; rows do not interact).
    s.rows = {decode_row(0, la, da.back(), false, step + 1), decode_row(1, lb, db.back(), false, step + 1)};
    const wire::step_result rd = dense->execute(s);
    ASSERT_TRUE(rd.ok) << rd.error;
    ta.push_back(rs.rows[0].tokens.at(0));
    tb.push_back(rs.rows[1].tokens.at(0));
    da.push_back(rd.rows[0].tokens.at(0));
    db.push_back(rd.rows[1].tokens.at(0));
    // Row 0 (la + 1 tokens, > 3 pages, ≥ min_seq_len) reads 3 pages; row 1 is dense by request.
    const int32_t pages_b = (lb + 1 + kPage - 1) / kPage;
    EXPECT_EQ(rs.decode_rows, 2);
    EXPECT_EQ(rs.sparse_rows, 1);
    EXPECT_EQ(rs.pages_read, kBudget + pages_b) << "step " << step;
    // The dense runner reads every page of both rows.
    EXPECT_EQ(rd.decode_rows, 2);
    EXPECT_EQ(rd.sparse_rows, 0);
    EXPECT_EQ(rd.pages_read, (la + 1 + kPage - 1) / kPage + pages_b);
  }
  EXPECT_EQ(tb, db) << "the row with dense_attention decodes exactly as without sparsity";
}

// The runner's host-time counters (hyserve-bench-spec prints them): one step per executed plan
// under its mode, a forward time for every step that ran, zero after reset_phases.
TEST(RunnerPhases, CountStepsAndTimeByMode) {
  const auto prompts = test::load_reference_prompts("bamba-tiny");
  const std::vector<int32_t>& a = prompts[1].input_ids;
  auto r = make_runner(config(false));
  wire::step_plan p;
  p.step_id = 1;
  p.mode = static_cast<uint8_t>(forward_mode::kExtend);
  p.rows = {prefill_row(0, a)};
  const wire::step_result res = r->execute(p);
  ASSERT_TRUE(res.ok) << res.error;
  int32_t token = res.rows[0].tokens.at(0);
  for (int32_t step = 0; step < 3; ++step) {
    wire::step_plan s;
    s.step_id = static_cast<uint64_t>(2 + step);
    s.mode = static_cast<uint8_t>(forward_mode::kDecode);
    s.rows = {decode_row(0, static_cast<int32_t>(a.size()) + step, token, false, step + 1)};
    const wire::step_result rs = r->execute(s);
    ASSERT_TRUE(rs.ok) << rs.error;
    token = rs.rows[0].tokens.at(0);
  }
  const auto& ph = r->phases();
  EXPECT_EQ(ph[static_cast<size_t>(forward_mode::kExtend)].steps, 1);
  EXPECT_EQ(ph[static_cast<size_t>(forward_mode::kDecode)].steps, 3);
  EXPECT_EQ(ph[static_cast<size_t>(forward_mode::kTargetVerify)].steps, 0);
  for (const forward_mode m : {forward_mode::kExtend, forward_mode::kDecode}) {
    const auto& x = ph[static_cast<size_t>(m)];
    EXPECT_GT(x.forward_s, 0.0);
    EXPECT_GE(x.prepare_s, 0.0);
    EXPECT_GE(x.sample_s, 0.0);
  }
  r->reset_phases();
  EXPECT_EQ(r->phases()[static_cast<size_t>(forward_mode::kDecode)].steps, 0);
  EXPECT_EQ(r->phases()[static_cast<size_t>(forward_mode::kDecode)].forward_s, 0.0);
}

}  // namespace
}  // namespace hyserve
