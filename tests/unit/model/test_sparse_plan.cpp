// The per-step sparse attention plan of the model (worker/model/sparse_select.h): which steps
// keep page summaries, which select pages, which rows stay dense, and the step's decode
// attention statistics, against counts worked out by hand from docs/ARCHITECTURE.md, Sparse Top-K attention.
// Config: page size 4, budget 3 pages, 1 sink, 1 recent, min_seq_len 8.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "../../../worker/model/sparse_select.h"
#include "hyserve/common/config.h"
#include "hyserve/worker/forward_batch.h"
#include "hyserve/worker/hybrid_metadata.h"

namespace hyserve::worker {
namespace {

constexpr int32_t kPage = 4;

sparsity_section quest() {
  sparsity_section s;
  s.algorithm = sparsity_algorithm::kQuest;
  s.page_budget = 3;
  s.sink_pages = 1;
  s.recent_pages = 1;
  s.min_seq_len = 8;
  return s;
}

struct row_spec {
  int32_t prefix = 0;
  bool dense = false;
  bool padding = false;
};

// Rows of `q_len` tokens each after `prefix` cached tokens.
forward_batch make_batch(forward_mode mode, int32_t q_len, const std::vector<row_spec>& rows) {
  forward_batch b;
  b.mode = mode;
  if (mode == forward_mode::kTargetVerify) b.draft_len = q_len;
  for (size_t i = 0; i < rows.size(); ++i) {
    batch_row r;
    r.request_id = static_cast<int64_t>(i);
    r.req_slot = rows[i].padding ? -1 : static_cast<int32_t>(i);
    r.mamba_slot = rows[i].padding ? -1 : static_cast<int32_t>(i);
    r.prefix_len = rows[i].prefix;
    r.tokens.assign(static_cast<size_t>(q_len), 1);
    r.dense_attention = rows[i].dense;
    r.is_decode = mode == forward_mode::kMixed && q_len == 1;
    b.rows.push_back(r);
  }
  return b;
}

layers::sparse_step plan(const sparsity_section& cfg, const forward_batch& b) {
  const hybrid_metadata meta = build_hybrid_metadata(b);
  int32_t max_len = 1;
  for (int32_t l : meta.seq_lens) max_len = std::max(max_len, l);
  return layers::plan_sparse_step(cfg, b, meta, (max_len + kPage - 1) / kPage, kPage, {});
}

// Verify rows of 4 tokens:
//   r0: 40 cached → length 44, 11 pages; its queries sit in page 10 → 1 sink + 1 top + 1 recent.
//   r1: 2 cached → length 6 < min_seq_len: dense, 2 pages.
//   r2: like r0 but opted out: dense, 11 pages.
//   r3: padding: not counted.
//   r4: 38 cached → length 42, 11 pages; its queries span pages 9 and 10, which are both kept
//       (recent grows to 2), so 1 sink + 2 recent and no page by score: 3 pages.
TEST(SparsePlan, TargetVerifySelectsWithSharedPagesPerRow) {
  const forward_batch b =
      make_batch(forward_mode::kTargetVerify, 4, {{40, false, false}, {2, false, false}, {40, true, false},
                                                   {0, false, true}, {38, false, false}});
  const layers::sparse_step s = plan(quest(), b);
  EXPECT_TRUE(s.summaries);
  EXPECT_TRUE(s.select);
  EXPECT_TRUE(s.multi_query_rows);
  EXPECT_EQ(s.stats.decode_rows, 4);
  EXPECT_EQ(s.stats.sparse_rows, 2);
  EXPECT_EQ(s.stats.pages_read, 3 + 2 + 11 + 3);
  EXPECT_EQ(s.stats.dense_pages, 11 + 2 + 11 + 11);
  EXPECT_EQ(s.eff_seq_lens.numel(), 5);
  EXPECT_EQ(s.page_table.numel(), 5 * 11);
  // Row flags as uploaded: opted-out and padding rows are dense.
  const uint8_t* dense = s.dense_rows.as<uint8_t>();
  EXPECT_EQ(dense[0], 0);
  EXPECT_EQ(dense[2], 1);
  EXPECT_EQ(dense[3], 1);
  EXPECT_EQ(dense[4], 0);
}

TEST(SparsePlan, DecodeRowsAndStatistics) {
  // Decode: r0 length 41 (11 pages) sparse → 3 pages; r1 length 7 < 8 → dense, 2 pages.
  const forward_batch b = make_batch(forward_mode::kDecode, 1, {{40, false, false}, {6, false, false}});
  const layers::sparse_step s = plan(quest(), b);
  EXPECT_TRUE(s.select);
  EXPECT_FALSE(s.multi_query_rows);
  EXPECT_EQ(s.stats.decode_rows, 2);
  EXPECT_EQ(s.stats.sparse_rows, 1);
  EXPECT_EQ(s.stats.pages_read, 3 + 2);
  EXPECT_EQ(s.stats.dense_pages, 11 + 2);
}

TEST(SparsePlan, NoRowSparseMeansNoSelection) {
  // Every row within the budget or below min_seq_len: the layers read the dense table as is.
  const forward_batch b = make_batch(forward_mode::kDecode, 1, {{11, false, false}, {6, false, false}});
  const layers::sparse_step s = plan(quest(), b);
  EXPECT_TRUE(s.summaries);
  EXPECT_FALSE(s.select);
  EXPECT_EQ(s.stats.decode_rows, 2);
  EXPECT_EQ(s.stats.sparse_rows, 0);
  EXPECT_EQ(s.stats.pages_read, 3 + 2);
  EXPECT_EQ(s.page_table.data(), nullptr);
}

TEST(SparsePlan, PrefillKeepsSummariesButNeverSelects) {
  for (forward_mode mode : {forward_mode::kExtend, forward_mode::kMixed}) {
    const forward_batch b = make_batch(mode, 1, {{40, false, false}});
    const layers::sparse_step s = plan(quest(), b);
    EXPECT_TRUE(s.summaries) << forward_mode_name(mode);
    EXPECT_FALSE(s.select) << forward_mode_name(mode);
    EXPECT_EQ(s.stats.decode_rows, 0) << forward_mode_name(mode);
    EXPECT_EQ(s.stats.pages_read, 0) << forward_mode_name(mode);
  }
}

TEST(SparsePlan, WithoutSparsityDecodeIsCountedDense) {
  const forward_batch b = make_batch(forward_mode::kDecode, 1, {{40, false, false}, {6, false, false}});
  const layers::sparse_step s = plan(sparsity_section{}, b);
  EXPECT_FALSE(s.summaries);
  EXPECT_FALSE(s.select);
  EXPECT_EQ(s.stats.decode_rows, 2);
  EXPECT_EQ(s.stats.sparse_rows, 0);
  EXPECT_EQ(s.stats.pages_read, 11 + 2);
}

}  // namespace
}  // namespace hyserve::worker
