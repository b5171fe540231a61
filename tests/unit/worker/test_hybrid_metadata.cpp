#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "hyserve/common/error.h"
#include "hyserve/worker/forward_batch.h"
#include "hyserve/worker/hybrid_metadata.h"

namespace hyserve::worker {
namespace {

using ints = std::vector<int32_t>;
using bytes = std::vector<uint8_t>;

batch_row make_row(int64_t request_id, int32_t mamba_slot, int32_t prefix_len, int32_t n_tokens) {
  batch_row r;
  r.request_id = request_id;
  r.req_slot = mamba_slot;
  r.mamba_slot = mamba_slot;
  r.prefix_len = prefix_len;
  for (int32_t t = 0; t < n_tokens; ++t) r.tokens.push_back(100 + t);
  return r;
}

batch_row padding_row(int32_t n_tokens) { return make_row(-1, -1, 0, n_tokens); }

// The message of the invalid_argument_error the batch raises, or "" when it builds.
std::string rejection(const forward_batch& b) {
  try {
    (void)build_hybrid_metadata(b);
  } catch (const invalid_argument_error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_REJECTED(batch, ...)                                                  \
  do {                                                                               \
    const std::string msg_ = rejection(batch);                                       \
    ASSERT_FALSE(msg_.empty()) << "batch was accepted";                              \
    for (const char* part_ : {__VA_ARGS__})                                          \
      EXPECT_NE(msg_.find(part_), std::string::npos) << "'" << part_ << "' not in: " << msg_; \
  } while (0)

void expect_no_tree(const hybrid_metadata& md) {
  EXPECT_FALSE(md.is_tree);
  EXPECT_TRUE(md.retrieve_next_token.empty());
  EXPECT_TRUE(md.retrieve_next_sibling.empty());
  EXPECT_TRUE(md.retrieve_parent.empty());
}

// ---- Extend ----

TEST(HybridMetadata, Extend_NoPrefix_Rows3) {
  forward_batch b;
  b.mode = forward_mode::kExtend;
  b.rows = {make_row(7, 0, 0, 3), make_row(8, 2, 0, 1), make_row(9, 1, 0, 2)};
  const hybrid_metadata md = build_hybrid_metadata(b);
  EXPECT_EQ(md.mode, forward_mode::kExtend);
  EXPECT_EQ(md.batch_size, 3);
  EXPECT_EQ(md.num_tokens, 6);
  EXPECT_EQ(md.query_start_loc, ints({0, 3, 4, 6}));
  EXPECT_EQ(md.mamba_slots, ints({0, 2, 1}));
  EXPECT_EQ(md.has_initial_state, bytes({0, 0, 0}));
  EXPECT_EQ(md.prefix_lens, ints({0, 0, 0}));
  EXPECT_EQ(md.seq_lens, ints({3, 1, 2}));
  EXPECT_EQ(md.positions, ints({0, 1, 2, 0, 0, 1}));
  EXPECT_EQ(md.draft_len, 0);
  EXPECT_TRUE(md.draft_steps.empty());
  expect_no_tree(md);
  EXPECT_EQ(md.logit_token_indices, ints({2, 3, 5}));
}

TEST(HybridMetadata, Extend_WithPrefixes_ChunkedContinuation) {
  forward_batch b;
  b.mode = forward_mode::kExtend;
  b.rows = {make_row(1, 3, 4, 2), make_row(2, 0, 0, 3), make_row(3, 5, 10, 1)};
  const hybrid_metadata md = build_hybrid_metadata(b);
  EXPECT_EQ(md.batch_size, 3);
  EXPECT_EQ(md.num_tokens, 6);
  EXPECT_EQ(md.query_start_loc, ints({0, 2, 5, 6}));
  EXPECT_EQ(md.mamba_slots, ints({3, 0, 5}));
  EXPECT_EQ(md.has_initial_state, bytes({1, 0, 1}));
  EXPECT_EQ(md.prefix_lens, ints({4, 0, 10}));
  EXPECT_EQ(md.seq_lens, ints({6, 3, 11}));
  EXPECT_EQ(md.positions, ints({4, 5, 0, 1, 2, 10}));
  EXPECT_EQ(md.draft_len, 0);
  EXPECT_TRUE(md.draft_steps.empty());
  expect_no_tree(md);
  EXPECT_EQ(md.logit_token_indices, ints({1, 4, 5}));
}

TEST(HybridMetadata, Extend_InvalidRowsRejected) {
  forward_batch b;
  b.mode = forward_mode::kExtend;
  b.rows = {make_row(1, 0, 0, 2), make_row(42, 1, 3, 0)};
  EXPECT_REJECTED(b, "extend", "row 1", "request 42", "0 tokens");

  b.rows = {make_row(1, 0, 0, 2), padding_row(2)};
  EXPECT_REJECTED(b, "extend", "row 1", "padding");

  b.rows = {make_row(1, 0, -1, 2)};
  EXPECT_REJECTED(b, "row 0", "prefix_len -1");

  b.rows = {make_row(1, 4, 0, 2), make_row(2, 4, 0, 2)};
  EXPECT_REJECTED(b, "row 1", "mamba_slot 4", "row 0");

  b.rows = {make_row(1, -2, 0, 2)};
  EXPECT_REJECTED(b, "row 0", "mamba_slot -2");

  b.rows = {};
  EXPECT_REJECTED(b, "extend", "no rows");

  b.rows = {make_row(1, 0, 0, 2)};
  b.rows[0].retrieve_next_token = {-1, -1};
  b.rows[0].retrieve_next_sibling = {-1, -1};
  EXPECT_REJECTED(b, "row 0", "tree links");

  b.rows = {make_row(1, 0, 0, 2)};
  b.is_tree = true;
  EXPECT_REJECTED(b, "extend", "is_tree");
}

// ---- Decode ----

TEST(HybridMetadata, Decode_Rows3) {
  forward_batch b;
  b.mode = forward_mode::kDecode;
  b.rows = {make_row(1, 4, 5, 1), make_row(2, 0, 1, 1), make_row(3, 2, 9, 1)};
  const hybrid_metadata md = build_hybrid_metadata(b);
  EXPECT_EQ(md.mode, forward_mode::kDecode);
  EXPECT_EQ(md.batch_size, 3);
  EXPECT_EQ(md.num_tokens, 3);
  EXPECT_EQ(md.query_start_loc, ints({0, 1, 2, 3}));
  EXPECT_EQ(md.mamba_slots, ints({4, 0, 2}));
  EXPECT_EQ(md.has_initial_state, bytes({1, 1, 1}));
  EXPECT_EQ(md.prefix_lens, ints({5, 1, 9}));
  EXPECT_EQ(md.seq_lens, ints({6, 2, 10}));
  EXPECT_EQ(md.positions, ints({5, 1, 9}));
  EXPECT_EQ(md.draft_len, 0);
  EXPECT_TRUE(md.draft_steps.empty());
  expect_no_tree(md);
  EXPECT_EQ(md.logit_token_indices, ints({0, 1, 2}));
}

TEST(HybridMetadata, Decode_PaddingRowsKeepTheirTokenAndLogitRow) {
  forward_batch b;
  b.mode = forward_mode::kDecode;
  b.rows = {make_row(1, 3, 2, 1), padding_row(1), make_row(2, 1, 7, 1), padding_row(1)};
  const hybrid_metadata md = build_hybrid_metadata(b);
  EXPECT_EQ(md.batch_size, 4);
  EXPECT_EQ(md.num_tokens, 4);
  EXPECT_EQ(md.query_start_loc, ints({0, 1, 2, 3, 4}));
  EXPECT_EQ(md.mamba_slots, ints({3, -1, 1, -1}));
  EXPECT_EQ(md.has_initial_state, bytes({1, 0, 1, 0}));
  EXPECT_EQ(md.prefix_lens, ints({2, 0, 7, 0}));
  EXPECT_EQ(md.seq_lens, ints({3, 1, 8, 1}));
  EXPECT_EQ(md.positions, ints({2, 0, 7, 0}));
  EXPECT_EQ(md.draft_len, 0);
  EXPECT_TRUE(md.draft_steps.empty());
  expect_no_tree(md);
  EXPECT_EQ(md.logit_token_indices, ints({0, 1, 2, 3}));
}

TEST(HybridMetadata, Decode_RowWith2TokensRejected) {
  forward_batch b;
  b.mode = forward_mode::kDecode;
  b.rows = {make_row(1, 0, 3, 1), make_row(77, 1, 3, 2)};
  EXPECT_REJECTED(b, "decode", "row 1", "request 77", "2 tokens", "exactly 1");
}

TEST(HybridMetadata, Decode_PaddingRowWith0TokensRejected) {
  forward_batch b;
  b.mode = forward_mode::kDecode;
  b.rows = {make_row(1, 0, 3, 1), padding_row(0)};
  EXPECT_REJECTED(b, "decode", "row 1", "0 tokens");
}

TEST(HybridMetadata, Decode_RowWithoutPrefixRejected) {
  forward_batch b;
  b.mode = forward_mode::kDecode;
  b.rows = {make_row(5, 0, 0, 1)};
  EXPECT_REJECTED(b, "decode", "row 0", "request 5", "prefix_len 0");
}

// ---- Mixed ----

TEST(HybridMetadata, Mixed_ExtendAndDecodeRows) {
  forward_batch b;
  b.mode = forward_mode::kMixed;
  b.rows = {make_row(1, 0, 0, 4), make_row(2, 1, 8, 3), make_row(3, 2, 5, 1), make_row(4, 3, 11, 1)};
  b.rows[2].is_decode = true;
  b.rows[3].is_decode = true;
  const hybrid_metadata md = build_hybrid_metadata(b);
  EXPECT_EQ(md.mode, forward_mode::kMixed);
  EXPECT_EQ(md.batch_size, 4);
  EXPECT_EQ(md.num_tokens, 9);
  EXPECT_EQ(md.query_start_loc, ints({0, 4, 7, 8, 9}));
  EXPECT_EQ(md.mamba_slots, ints({0, 1, 2, 3}));
  EXPECT_EQ(md.has_initial_state, bytes({0, 1, 1, 1}));
  EXPECT_EQ(md.prefix_lens, ints({0, 8, 5, 11}));
  EXPECT_EQ(md.seq_lens, ints({4, 11, 6, 12}));
  EXPECT_EQ(md.positions, ints({0, 1, 2, 3, 8, 9, 10, 5, 11}));
  EXPECT_EQ(md.draft_len, 0);
  EXPECT_TRUE(md.draft_steps.empty());
  expect_no_tree(md);
  EXPECT_EQ(md.logit_token_indices, ints({3, 6, 7, 8}));
}

TEST(HybridMetadata, Mixed_InvalidDecodeRowsRejected) {
  forward_batch b;
  b.mode = forward_mode::kMixed;
  b.rows = {make_row(1, 0, 0, 4), make_row(2, 1, 5, 2)};
  b.rows[1].is_decode = true;
  EXPECT_REJECTED(b, "mixed", "row 1", "request 2", "decode row", "2 tokens");

  b.rows = {make_row(1, 0, 0, 4), make_row(2, 1, 0, 1)};
  b.rows[1].is_decode = true;
  EXPECT_REJECTED(b, "mixed", "row 1", "prefix_len 0");

  b.rows = {make_row(1, 0, 0, 4), padding_row(1)};
  EXPECT_REJECTED(b, "mixed", "row 1", "padding");

  b.rows = {make_row(1, 0, 0, 0)};
  EXPECT_REJECTED(b, "mixed", "row 0", "0 tokens");
}

// ---- Idle ----

TEST(HybridMetadata, Idle_ZeroRows) {
  forward_batch b;
  b.mode = forward_mode::kIdle;
  const hybrid_metadata md = build_hybrid_metadata(b);
  EXPECT_EQ(md.mode, forward_mode::kIdle);
  EXPECT_EQ(md.batch_size, 0);
  EXPECT_EQ(md.num_tokens, 0);
  EXPECT_EQ(md.query_start_loc, ints({0}));
  EXPECT_TRUE(md.mamba_slots.empty());
  EXPECT_TRUE(md.has_initial_state.empty());
  EXPECT_TRUE(md.prefix_lens.empty());
  EXPECT_TRUE(md.seq_lens.empty());
  EXPECT_TRUE(md.positions.empty());
  EXPECT_EQ(md.draft_len, 0);
  EXPECT_TRUE(md.draft_steps.empty());
  expect_no_tree(md);
  EXPECT_TRUE(md.logit_token_indices.empty());
}

TEST(HybridMetadata, Idle_WithRowRejected) {
  forward_batch b;
  b.mode = forward_mode::kIdle;
  b.rows = {padding_row(1)};
  EXPECT_REJECTED(b, "idle", "1 rows");
}

// ---- TargetVerify, chain ----

TEST(HybridMetadata, TargetVerify_Chain_D4_WithPaddingRow) {
  forward_batch b;
  b.mode = forward_mode::kTargetVerify;
  b.draft_len = 4;
  b.rows = {make_row(1, 2, 6, 4), padding_row(4), make_row(2, 0, 3, 4)};
  const hybrid_metadata md = build_hybrid_metadata(b);
  EXPECT_EQ(md.mode, forward_mode::kTargetVerify);
  EXPECT_EQ(md.batch_size, 3);
  EXPECT_EQ(md.num_tokens, 12);
  EXPECT_EQ(md.query_start_loc, ints({0, 4, 8, 12}));
  EXPECT_EQ(md.mamba_slots, ints({2, -1, 0}));
  EXPECT_EQ(md.has_initial_state, bytes({1, 0, 1}));
  EXPECT_EQ(md.prefix_lens, ints({6, 0, 3}));
  EXPECT_EQ(md.seq_lens, ints({10, 4, 7}));
  EXPECT_EQ(md.positions, ints({6, 7, 8, 9, 0, 1, 2, 3, 3, 4, 5, 6}));
  EXPECT_EQ(md.draft_len, 4);
  EXPECT_TRUE(md.draft_steps.empty());
  expect_no_tree(md);
  EXPECT_EQ(md.logit_token_indices, ints({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
}

TEST(HybridMetadata, TargetVerify_Chain_D1_ZeroDraftTokensIsLikeDecode) {
  forward_batch b;
  b.mode = forward_mode::kTargetVerify;
  b.draft_len = 1;
  b.rows = {make_row(1, 2, 6, 1), make_row(2, 0, 3, 1)};
  const hybrid_metadata md = build_hybrid_metadata(b);
  EXPECT_EQ(md.num_tokens, 2);
  EXPECT_EQ(md.query_start_loc, ints({0, 1, 2}));
  EXPECT_EQ(md.has_initial_state, bytes({1, 1}));
  EXPECT_EQ(md.seq_lens, ints({7, 4}));
  EXPECT_EQ(md.positions, ints({6, 3}));
  EXPECT_EQ(md.draft_len, 1);
  EXPECT_EQ(md.logit_token_indices, ints({0, 1}));
}

TEST(HybridMetadata, TargetVerify_InvalidRowsRejected) {
  forward_batch b;
  b.mode = forward_mode::kTargetVerify;
  b.draft_len = 3;
  b.rows = {make_row(1, 0, 4, 3), make_row(9, 1, 4, 2)};
  EXPECT_REJECTED(b, "target_verify", "row 1", "request 9", "2 tokens", "draft_len = 3");

  b.rows = {make_row(1, 0, 4, 3), padding_row(1)};
  EXPECT_REJECTED(b, "target_verify", "row 1", "1 tokens");

  b.rows = {make_row(1, 0, 0, 3)};
  EXPECT_REJECTED(b, "target_verify", "row 0", "prefix_len 0");

  b.draft_len = 0;
  b.rows = {make_row(1, 0, 4, 0)};
  EXPECT_REJECTED(b, "target_verify", "draft_len 0");
}

// ---- TargetVerify, tree ----

struct tree_links {
  ints next, sibling;
};

// Encodes a parent array (parent[0] = -1, parent[i] < i) as first-child / next-sibling links.
// Children are linked in `child_order` order so the sibling walk is exercised in any order.
tree_links encode_tree(const ints& parent, const ints& child_order) {
  const size_t d = parent.size();
  tree_links t{ints(d, -1), ints(d, -1)};
  std::vector<int32_t> last_child(d, -1);
  for (int32_t c : child_order) {
    if (c == 0) continue;
    const auto p = static_cast<size_t>(parent[static_cast<size_t>(c)]);
    if (last_child[p] == -1)
      t.next[p] = c;
    else
      t.sibling[static_cast<size_t>(last_child[p])] = c;
    last_child[p] = c;
  }
  return t;
}

TEST(HybridMetadata, TargetVerify_Tree_D6_HandBuilt) {
  //        0
  //      /   \.
  //     1     2
  //    / \     \.
  //   3   4     5
  forward_batch b;
  b.mode = forward_mode::kTargetVerify;
  b.draft_len = 6;
  b.is_tree = true;
  b.rows = {make_row(1, 3, 10, 6), padding_row(6)};
  b.rows[0].retrieve_next_token = {1, 3, 5, -1, -1, -1};
  b.rows[0].retrieve_next_sibling = {-1, 2, -1, 4, -1, -1};
  const hybrid_metadata md = build_hybrid_metadata(b);
  EXPECT_EQ(md.mode, forward_mode::kTargetVerify);
  EXPECT_EQ(md.batch_size, 2);
  EXPECT_EQ(md.num_tokens, 12);
  EXPECT_EQ(md.query_start_loc, ints({0, 6, 12}));
  EXPECT_EQ(md.mamba_slots, ints({3, -1}));
  EXPECT_EQ(md.has_initial_state, bytes({1, 0}));
  EXPECT_EQ(md.prefix_lens, ints({10, 0}));
  EXPECT_EQ(md.seq_lens, ints({16, 6}));
  EXPECT_EQ(md.draft_len, 6);
  EXPECT_TRUE(md.is_tree);
  EXPECT_TRUE(md.draft_steps.empty());
  // The padding row carries no links and is laid out as a chain.
  EXPECT_EQ(md.positions, ints({10, 11, 11, 12, 12, 12, 0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(md.retrieve_next_token, ints({1, 3, 5, -1, -1, -1, 1, 2, 3, 4, 5, -1}));
  EXPECT_EQ(md.retrieve_next_sibling, ints({-1, 2, -1, 4, -1, -1, -1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(md.retrieve_parent, ints({-1, 0, 0, 1, 1, 2, -1, 0, 1, 2, 3, 4}));
  EXPECT_EQ(md.logit_token_indices, ints({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
}

TEST(HybridMetadata, TargetVerify_Tree_RandomTreesMatchBruteForce) {
  std::mt19937 rng(20240611);
  for (int round = 0; round < 200; ++round) {
    const int32_t d = std::uniform_int_distribution<int32_t>(1, 16)(rng);
    const int32_t bs = std::uniform_int_distribution<int32_t>(1, 4)(rng);
    forward_batch b;
    b.mode = forward_mode::kTargetVerify;
    b.draft_len = d;
    b.is_tree = true;
    std::vector<ints> parents;
    for (int32_t r = 0; r < bs; ++r) {
      ints parent(static_cast<size_t>(d), -1);
      for (int32_t i = 1; i < d; ++i)
        parent[static_cast<size_t>(i)] = std::uniform_int_distribution<int32_t>(0, i - 1)(rng);
      ints order(static_cast<size_t>(d));
      for (int32_t i = 0; i < d; ++i) order[static_cast<size_t>(i)] = i;
      std::shuffle(order.begin(), order.end(), rng);
      const tree_links links = encode_tree(parent, order);
      batch_row row = make_row(r, r, 5 + 3 * r, d);
      row.retrieve_next_token = links.next;
      row.retrieve_next_sibling = links.sibling;
      b.rows.push_back(row);
      parents.push_back(parent);
    }
    const hybrid_metadata md = build_hybrid_metadata(b);
    ASSERT_EQ(md.retrieve_parent.size(), static_cast<size_t>(bs * d));
    ASSERT_EQ(md.positions.size(), static_cast<size_t>(bs * d));
    for (int32_t r = 0; r < bs; ++r) {
      const batch_row& row = b.rows[static_cast<size_t>(r)];
      for (int32_t i = 0; i < d; ++i) {
        const auto at = static_cast<size_t>(r * d + i);
        // Brute force 1: the parent of i is the node whose child list contains i.
        int32_t found = -1;
        for (int32_t n = 0; n < d; ++n)
          for (int32_t c = row.retrieve_next_token[static_cast<size_t>(n)]; c != -1;
               c = row.retrieve_next_sibling[static_cast<size_t>(c)])
            if (c == i) found = n;
        EXPECT_EQ(found, parents[static_cast<size_t>(r)][static_cast<size_t>(i)]);
        EXPECT_EQ(md.retrieve_parent[at], found) << "round " << round << " row " << r << " node " << i;
        // Brute force 2: depth by walking the generating parent array up to the root.
        int32_t depth = 0;
        for (int32_t a = parents[static_cast<size_t>(r)][static_cast<size_t>(i)]; a != -1;
             a = parents[static_cast<size_t>(r)][static_cast<size_t>(a)])
          ++depth;
        EXPECT_EQ(md.positions[at], row.prefix_len + depth) << "round " << round << " row " << r << " node " << i;
        EXPECT_EQ(md.retrieve_next_token[at], row.retrieve_next_token[static_cast<size_t>(i)]);
        EXPECT_EQ(md.retrieve_next_sibling[at], row.retrieve_next_sibling[static_cast<size_t>(i)]);
        EXPECT_EQ(md.logit_token_indices[at], r * d + i);
      }
      EXPECT_EQ(md.seq_lens[static_cast<size_t>(r)], row.prefix_len + d);
      EXPECT_EQ(md.query_start_loc[static_cast<size_t>(r + 1)], (r + 1) * d);
    }
  }
}

forward_batch tree_batch(const ints& next, const ints& sibling) {
  forward_batch b;
  b.mode = forward_mode::kTargetVerify;
  b.draft_len = static_cast<int32_t>(next.size());
  b.is_tree = true;
  b.rows = {make_row(1, 0, 4, b.draft_len), make_row(31, 1, 4, b.draft_len)};
  // Row 0 is a valid chain; row 1 carries the links under test.
  for (int32_t k = 0; k < b.draft_len; ++k) {
    b.rows[0].retrieve_next_token.push_back(k + 1 < b.draft_len ? k + 1 : -1);
    b.rows[0].retrieve_next_sibling.push_back(-1);
  }
  b.rows[1].retrieve_next_token = next;
  b.rows[1].retrieve_next_sibling = sibling;
  return b;
}

TEST(HybridMetadata, TargetVerify_Tree_InvalidLinksRejected) {
  // Cycle through next_token back to the root.
  EXPECT_REJECTED(tree_batch({1, 2, 0}, {-1, -1, -1}), "row 1", "request 31", "cycle");
  // Cycle through next_token below the root: 1 → 2 → 1.
  EXPECT_REJECTED(tree_batch({1, 2, 1}, {-1, -1, -1}), "row 1", "cycle");
  // Cycle in a sibling list: children of 0 are 1, 2, 1, …
  EXPECT_REJECTED(tree_batch({1, -1, -1}, {-1, 2, 1}), "row 1", "cycle");
  // Out of range: D and below -1.
  EXPECT_REJECTED(tree_batch({1, 3, -1}, {-1, -1, -1}), "row 1", "retrieve_next_token[1] = 3", "[-1, 3)");
  EXPECT_REJECTED(tree_batch({1, -2, -1}, {-1, -1, -1}), "row 1", "retrieve_next_token[1] = -2");
  EXPECT_REJECTED(tree_batch({1, -1, -1}, {-1, 5, -1}), "row 1", "retrieve_next_sibling[1] = 5");
  // Unreachable node 2.
  EXPECT_REJECTED(tree_batch({1, -1, -1}, {-1, -1, -1}), "row 1", "node 2", "not reachable");
  // Node 2 reached twice: child of node 0 (as sibling of 1) and of node 1.
  EXPECT_REJECTED(tree_batch({1, 2, -1}, {-1, 2, -1}), "row 1", "node 2", "reached twice");
  // The root has no siblings.
  EXPECT_REJECTED(tree_batch({-1, -1, -1}, {1, -1, -1}), "row 1", "root");
  // Links shorter than D.
  EXPECT_REJECTED(tree_batch({1, 2, -1}, {-1, -1}), "row 1", "lengths");
  // A child listed before its parent: 0 → 2 → 1.
  EXPECT_REJECTED(tree_batch({2, -1, 1}, {-1, -1, -1}), "row 1", "node 1", "parent 2");
}

TEST(HybridMetadata, TargetVerify_ChainRowWithTreeLinksRejected) {
  forward_batch b = tree_batch({1, 2, -1}, {-1, -1, -1});
  b.is_tree = false;
  EXPECT_REJECTED(b, "target_verify", "row 0", "tree links");
}

// ---- DraftExtend ----

TEST(HybridMetadata, DraftExtend_AcceptedTokensOnCommittedState) {
  forward_batch b;
  b.mode = forward_mode::kDraftExtend;
  b.rows = {make_row(1, 1, 12, 3), make_row(2, 0, 0, 5), make_row(3, 4, 7, 1)};
  const hybrid_metadata md = build_hybrid_metadata(b);
  EXPECT_EQ(md.mode, forward_mode::kDraftExtend);
  EXPECT_EQ(md.batch_size, 3);
  EXPECT_EQ(md.num_tokens, 9);
  EXPECT_EQ(md.query_start_loc, ints({0, 3, 8, 9}));
  EXPECT_EQ(md.mamba_slots, ints({1, 0, 4}));
  EXPECT_EQ(md.has_initial_state, bytes({1, 0, 1}));
  EXPECT_EQ(md.prefix_lens, ints({12, 0, 7}));
  EXPECT_EQ(md.seq_lens, ints({15, 5, 8}));
  EXPECT_EQ(md.positions, ints({12, 13, 14, 0, 1, 2, 3, 4, 7}));
  EXPECT_EQ(md.draft_len, 0);
  EXPECT_TRUE(md.draft_steps.empty());
  expect_no_tree(md);
  EXPECT_EQ(md.logit_token_indices, ints({2, 7, 8}));
}

TEST(HybridMetadata, DraftExtend_PaddingAndEmptyRowsRejected) {
  forward_batch b;
  b.mode = forward_mode::kDraftExtend;
  b.rows = {padding_row(2)};
  EXPECT_REJECTED(b, "draft_extend", "row 0", "padding");
  b.rows = {make_row(4, 0, 3, 0)};
  EXPECT_REJECTED(b, "draft_extend", "row 0", "request 4", "0 tokens");
}

// ---- Draft ----

TEST(HybridMetadata, Draft_D3_WithPaddingRow) {
  forward_batch b;
  b.mode = forward_mode::kDraft;
  b.draft_len = 3;
  b.rows = {make_row(1, 2, 8, 1), padding_row(1), make_row(2, 5, 4, 1)};
  b.rows[0].draft_step = 2;
  b.rows[2].draft_step = 1;
  const hybrid_metadata md = build_hybrid_metadata(b);
  EXPECT_EQ(md.mode, forward_mode::kDraft);
  EXPECT_EQ(md.batch_size, 3);
  EXPECT_EQ(md.num_tokens, 3);
  EXPECT_EQ(md.query_start_loc, ints({0, 1, 2, 3}));
  EXPECT_EQ(md.mamba_slots, ints({2, -1, 5}));
  EXPECT_EQ(md.has_initial_state, bytes({1, 0, 1}));
  EXPECT_EQ(md.prefix_lens, ints({8, 0, 4}));
  EXPECT_EQ(md.seq_lens, ints({9, 1, 5}));
  EXPECT_EQ(md.positions, ints({8, 0, 4}));
  EXPECT_EQ(md.draft_len, 3);
  EXPECT_EQ(md.draft_steps, ints({2, 0, 1}));
  expect_no_tree(md);
  EXPECT_EQ(md.logit_token_indices, ints({0, 1, 2}));
}

TEST(HybridMetadata, Draft_InvalidRowsRejected) {
  forward_batch b;
  b.mode = forward_mode::kDraft;
  b.draft_len = 3;
  b.rows = {make_row(1, 0, 4, 1)};
  b.rows[0].draft_step = 3;
  EXPECT_REJECTED(b, "draft", "row 0", "draft_step 3", "[0, draft_len 3)");
  b.rows[0].draft_step = -1;
  EXPECT_REJECTED(b, "draft", "row 0", "draft_step -1");

  b.rows = {make_row(6, 0, 4, 2)};
  EXPECT_REJECTED(b, "draft", "row 0", "request 6", "2 tokens");

  b.draft_len = 0;
  b.rows = {make_row(1, 0, 4, 1)};
  EXPECT_REJECTED(b, "draft", "draft_len 0");
}

// ---- purity ----

TEST(HybridMetadata, SameBatchGivesSameMetadataForEveryMode) {
  for (forward_mode m : kAllForwardModes) {
    forward_batch b;
    b.mode = m;
    b.draft_len = 2;
    if (m != forward_mode::kIdle) {
      const int32_t n = m == forward_mode::kTargetVerify ? 2 : 1;
      b.rows = {make_row(1, 0, 3, n), make_row(2, 1, 4, n)};
    }
    const hybrid_metadata a = build_hybrid_metadata(b);
    const hybrid_metadata c = build_hybrid_metadata(b);
    EXPECT_EQ(a.query_start_loc, c.query_start_loc) << forward_mode_name(m);
    EXPECT_EQ(a.positions, c.positions) << forward_mode_name(m);
    EXPECT_EQ(a.logit_token_indices, c.logit_token_indices) << forward_mode_name(m);
    EXPECT_EQ(a.num_tokens, b.num_tokens()) << forward_mode_name(m);
  }
}

}  // namespace
}  // namespace hyserve::worker

namespace hyserve::worker {
namespace {

// ---- TargetVerify carrying prefill chunks (extend rows after the verify rows) ----

TEST(HybridMetadata, TargetVerify_WithExtendRows_TreeVerifyRowsAndChainExtendRows) {
  forward_batch b;
  b.mode = forward_mode::kTargetVerify;
  b.draft_len = 3;
  b.is_tree = true;
  batch_row v = make_row(1, 4, 10, 3);  // root → 1, root → 2
  v.retrieve_next_token = {1, -1, -1};
  v.retrieve_next_sibling = {-1, 2, -1};
  b.rows = {v, make_row(2, 0, 0, 5), make_row(3, 2, 16, 2)};
  b.extend_rows = 2;
  const hybrid_metadata md = build_hybrid_metadata(b);
  EXPECT_EQ(md.verify_rows, 1);
  EXPECT_EQ(md.query_start_loc, (ints{0, 3, 8, 10}));
  EXPECT_EQ(md.has_initial_state, (bytes{1, 0, 1}));
  EXPECT_EQ(md.seq_lens, (ints{13, 5, 18}));
  // Tree depths for the verify row, chain positions for the prefill chunks.
  EXPECT_EQ(md.positions, (ints{10, 11, 11, 0, 1, 2, 3, 4, 16, 17}));
  EXPECT_EQ(md.retrieve_parent, (ints{-1, 0, 0}));  // verify rows only
  // D logit rows for the verify row, one (the last token) per extend row.
  EXPECT_EQ(md.logit_token_indices, (ints{0, 1, 2, 7, 9}));
  EXPECT_EQ(md.logit_row_start, (ints{0, 3, 4, 5}));
}

TEST(HybridMetadata, TargetVerify_ExtendRowsAreValidated) {
  forward_batch b;
  b.mode = forward_mode::kTargetVerify;
  b.draft_len = 2;
  b.rows = {make_row(1, 0, 4, 2), make_row(2, 1, 0, 0)};
  b.extend_rows = 1;
  EXPECT_REJECTED(b, "row 1", "0 tokens");
  b.rows[1] = padding_row(3);
  EXPECT_REJECTED(b, "row 1", "padding");
  b.rows[1] = make_row(2, 1, 0, 3);
  b.extend_rows = 2;  // no verify row left
  EXPECT_REJECTED(b, "extend_rows 2");
  b.extend_rows = 1;
  b.mode = forward_mode::kExtend;
  EXPECT_REJECTED(b, "extend_rows");
  b.mode = forward_mode::kTargetVerify;
  const hybrid_metadata md = build_hybrid_metadata(b);
  EXPECT_EQ(md.verify_rows, 1);
  EXPECT_EQ(md.logit_row_start, (ints{0, 2, 3}));
}

}  // namespace
}  // namespace hyserve::worker
