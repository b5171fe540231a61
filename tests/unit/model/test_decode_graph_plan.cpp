// The host side of CUDA-graph decode (worker/model/decode_graphs.h, step_pack.h): bucket and
// stride choice, the packed metadata layout, and the padding rows of a padded decode pack, worked
// out by hand. Runs on the CPU.
#include <gtest/gtest.h>

#include <vector>

#include "../../../worker/model/decode_graphs.h"
#include "../../../worker/model/layers.h"
#include "../../../worker/model/step_driver.h"
#include "../../../worker/model/step_pack.h"
#include "hyserve/common/error.h"
#include "hyserve/worker/forward_batch.h"
#include "hyserve/worker/hybrid_metadata.h"
#include "hyserve/worker/memory_pools.h"

namespace hyserve::worker {
namespace {

TEST(DecodeGraphPlan, BucketsArePowersOfTwoThenTheBound) {
  EXPECT_EQ(decode_batch_buckets(1), (std::vector<int32_t>{1}));
  EXPECT_EQ(decode_batch_buckets(8), (std::vector<int32_t>{1, 2, 4, 8}));
  EXPECT_EQ(decode_batch_buckets(48), (std::vector<int32_t>{1, 2, 4, 8, 16, 32, 48}));
  EXPECT_TRUE(decode_batch_buckets(0).empty());
}

TEST(DecodeGraphPlan, PickBucketIsTheSmallestThatFits) {
  const std::vector<int32_t> b = decode_batch_buckets(48);
  EXPECT_EQ(pick_batch_bucket(b, 1), 1);
  EXPECT_EQ(pick_batch_bucket(b, 3), 4);
  EXPECT_EQ(pick_batch_bucket(b, 17), 32);
  EXPECT_EQ(pick_batch_bucket(b, 33), 48);
  EXPECT_EQ(pick_batch_bucket(b, 48), 48);
  EXPECT_FALSE(pick_batch_bucket(b, 49).has_value());
  EXPECT_FALSE(pick_batch_bucket(b, 0).has_value());
}

TEST(DecodeGraphPlan, PageStrideIsAPowerOfTwoCappedAtTheContext) {
  EXPECT_EQ(pick_page_stride(1, 256), 1);
  EXPECT_EQ(pick_page_stride(3, 256), 4);
  EXPECT_EQ(pick_page_stride(65, 256), 128);
  EXPECT_EQ(pick_page_stride(200, 256), 256);
  EXPECT_EQ(pick_page_stride(250, 250), 250);  // cap: the pages of max_context
}

TEST(DecodeGraphPlan, LayoutPlacesEveryArrayBackToBack) {
  const layers::step_layout l = layers::make_step_layout(4, 4, 4, true, 8, 0, false);
  EXPECT_EQ(l.query_start_loc, 0);
  EXPECT_EQ(l.mamba_slots, 5);
  EXPECT_EQ(l.has_initial_state, 9);
  EXPECT_EQ(l.positions, 10);
  EXPECT_EQ(l.token_ids, 14);
  EXPECT_EQ(l.logit_token_rows, 18);
  EXPECT_EQ(l.locs, 22);
  EXPECT_EQ(l.page_table, 26);
  EXPECT_EQ(l.seq_lens, 58);
  EXPECT_EQ(l.total, 62);
  const layers::step_layout no_attn = layers::make_step_layout(3, 3, 3, false, 8, 0, false);
  EXPECT_EQ(no_attn.page_table_stride, 0);
  EXPECT_EQ(no_attn.total, 4 + 3 + 1 + 3 + 3 + 3);
}

// Two decode rows (slots 5 and 2, cached 17 and 3 tokens, page size 4) padded to a bucket of 4
// rows with a page-table stride of 8.
TEST(DecodeGraphPlan, PaddedDecodePackWritesNowhere) {
  forward_batch batch;
  batch.mode = forward_mode::kDecode;
  req_to_token_pool pool(4, 32);
  const int32_t r0 = *pool.alloc(), r1 = *pool.alloc();
  for (int32_t p = 0; p < 32; ++p) {
    pool.row(r0)[p] = 40 + p;  // pages 10.. (4 tokens each)
    pool.row(r1)[p] = 80 + p;  // pages 20..
  }
  batch_row a;
  a.req_slot = r0;
  a.mamba_slot = 5;
  a.prefix_len = 17;
  a.tokens = {7};
  batch_row b;
  b.req_slot = r1;
  b.mamba_slot = 2;
  b.prefix_len = 3;
  b.tokens = {9};
  batch.rows = {a, b};
  const hybrid_metadata meta = build_hybrid_metadata(batch);
  const layers::attention_step step = layers::build_attention_step(batch, meta, pool, 4);
  ASSERT_EQ(step.page_table_stride, 5);  // ceil(18 / 4)

  const layers::step_layout l = layers::make_step_layout(4, 4, 4, true, 8, 0, false);
  std::vector<int32_t> out(static_cast<size_t>(l.total), 12345);
  layers::pack_step(l, meta, &step, {7, 9}, out.data());
  auto at = [&](int64_t offset, int64_t i) { return out[static_cast<size_t>(offset + i)]; };

  EXPECT_EQ((std::vector<int32_t>{at(l.query_start_loc, 0), at(l.query_start_loc, 1), at(l.query_start_loc, 2),
                                  at(l.query_start_loc, 3), at(l.query_start_loc, 4)}),
            (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(at(l.mamba_slots, 0), 5);
  EXPECT_EQ(at(l.mamba_slots, 1), 2);
  EXPECT_EQ(at(l.mamba_slots, 2), -1);  // padding: every SSM kernel skips it
  EXPECT_EQ(at(l.mamba_slots, 3), -1);
  // has_initial_state bytes 1, 1, 0, 0 in one little-endian word.
  EXPECT_EQ(at(l.has_initial_state, 0), 0x0101);
  EXPECT_EQ(at(l.positions, 0), 17);
  EXPECT_EQ(at(l.positions, 1), 3);
  EXPECT_EQ(at(l.positions, 2), 0);
  EXPECT_EQ(at(l.token_ids, 0), 7);
  EXPECT_EQ(at(l.token_ids, 1), 9);
  EXPECT_EQ(at(l.token_ids, 3), 0);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(at(l.logit_token_rows, i), i);
  EXPECT_EQ(at(l.locs, 0), 40 + 17);
  EXPECT_EQ(at(l.locs, 1), 80 + 3);
  EXPECT_EQ(at(l.locs, 2), -1);  // padding: the KV write skips it
  EXPECT_EQ(at(l.locs, 3), -1);
  // Row 0: pages 10..14 at stride 8, the rest zero; row 1: page 20; padding rows all zero.
  for (int i = 0; i < 8; ++i) EXPECT_EQ(at(l.page_table, i), i < 5 ? 10 + i : 0) << i;
  for (int i = 0; i < 8; ++i) EXPECT_EQ(at(l.page_table, 8 + i), i == 0 ? 20 : 0) << i;
  for (int i = 16; i < 32; ++i) EXPECT_EQ(at(l.page_table, i), 0) << i;
  EXPECT_EQ(at(l.seq_lens, 0), 18);
  EXPECT_EQ(at(l.seq_lens, 1), 4);
  EXPECT_EQ(at(l.seq_lens, 2), 0);  // padding: attention skips a row of length 0
  EXPECT_EQ(at(l.seq_lens, 3), 0);
}

TEST(DecodeGraphPlan, PackRejectsAStepLargerThanItsLayout) {
  forward_batch batch;
  batch.mode = forward_mode::kDecode;
  for (int32_t i = 0; i < 3; ++i) {
    batch_row r;
    r.req_slot = i;
    r.mamba_slot = i;
    r.prefix_len = 1;
    r.tokens = {1};
    batch.rows.push_back(r);
  }
  const hybrid_metadata meta = build_hybrid_metadata(batch);
  const layers::step_layout l = layers::make_step_layout(2, 2, 2, false, 0, 0, false);
  std::vector<int32_t> out(static_cast<size_t>(l.total));
  EXPECT_THROW(layers::pack_step(l, meta, nullptr, {1, 1, 1}, out.data()), invalid_argument_error);
}

// Which steps replay a graph and which run eagerly, and why (no device needed: the graph
// runtime allocates nothing before its first run).
TEST(DecodeGraphPlan, IneligibleStepsNameTheirReason) {
  decode_graph_config c;
  c.max_batch = 4;
  c.vocab_local = 8;
  const decode_graphs g(c);
  EXPECT_EQ(g.describe(), "CUDA graphs per batch bucket {1,2,4}");
  hybrid_metadata meta;
  meta.mode = forward_mode::kDecode;
  meta.batch_size = 3;
  forward_options opts;
  EXPECT_EQ(g.ineligible(meta, opts), "");
  meta.batch_size = 5;
  EXPECT_EQ(g.ineligible(meta, opts), "batch 5 above the largest bucket 4");
  meta.batch_size = 0;
  EXPECT_EQ(g.ineligible(meta, opts), "empty batch");
  meta.batch_size = 2;
  opts.eager = true;
  EXPECT_EQ(g.ineligible(meta, opts), "forward_options.eager");
  opts.eager = false;
  std::vector<tensor> hidden;
  opts.hidden_states = &hidden;
  EXPECT_EQ(g.ineligible(meta, opts), "hidden-state capture");
  opts.hidden_states = nullptr;
  for (forward_mode m : kAllForwardModes) {
    meta.mode = m;
    EXPECT_EQ(g.ineligible(meta, opts).empty(), m == forward_mode::kDecode) << forward_mode_name(m);
  }
}

// Sampling steps whose rows ask for logits processing (logit_bias, penalties, pending
// min_tokens, top_logprobs) take the eager path; the sampled token's logprob alone and plain
// rows keep the graph.
TEST(DecodeGraphPlan, LogitsProcessingTakesTheEagerPath) {
  EXPECT_EQ(processing_blocker(nullptr), "");
  step_sampling s;
  s.settings.resize(2);
  s.settings[1].want_logprob = 1;
  s.feed_slots = {0, 1};
  EXPECT_FALSE(s.needs_processing());
  EXPECT_EQ(processing_blocker(&s), "");
  s.processing.resize(2);
  s.processing[1].bias_count = 1;
  EXPECT_TRUE(s.needs_processing());
  EXPECT_NE(processing_blocker(&s).find("logits processing"), std::string::npos);
  step_sampling counted;
  counted.count_slots = {-1, 3};
  EXPECT_FALSE(processing_blocker(&counted).empty());
  step_sampling prompt;
  prompt.seen = {3, 17};
  EXPECT_FALSE(processing_blocker(&prompt).empty());
}

TEST(DecodeGraphPlan, BlockersOfAWholeModel) {
  decode_graph_options on;
  on.enabled = true;
  on.max_batch = 8;
  kernels::exec_context cuda;
  cuda.device = device_kind::kCuda;
  EXPECT_EQ(decode_graph_blocker(cuda, on, 1), "");
  EXPECT_EQ(decode_graph_blocker(kernels::exec_context{}, on, 1), "device cpu");
  EXPECT_EQ(decode_graph_blocker(cuda, decode_graph_options{}, 1), "cuda_graphs: false");
  EXPECT_NE(decode_graph_blocker(cuda, on, 2).find("tp > 1"), std::string::npos);
}

}  // namespace
}  // namespace hyserve::worker
