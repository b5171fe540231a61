// The coordinator's memory bookkeeping of one group (coordinator/memory_book.h): request slots,
// pages and checkpoint slots from index pools; eviction hands the tree's pages and checkpoints
// back, and every count returns to its start.
#include <gtest/gtest.h>

#include <vector>

#include "coordinator/memory_book.h"
#include "hyserve/common/error.h"

namespace hyserve {
namespace {

wire::hello group(int32_t pages, int32_t requests) {
  wire::hello h;
  h.num_pages = pages;
  h.max_requests = requests;
  h.mamba_slots = requests;
  h.page_size = 2;
  return h;
}

TEST(MemoryBook, RequestSlotsAndPagesGoBackAndAreListedForThePlan) {
  coordinator::memory_book m(group(4, 2), 0);
  EXPECT_FALSE(m.tree.has_value());
  const auto a = m.take_request_slots(), b = m.take_request_slots();
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->req, 0);
  EXPECT_EQ(b->mamba, 1);
  EXPECT_FALSE(m.take_request_slots().has_value());
  const std::vector<int32_t> pages = *m.pages.alloc(3);
  m.release(a->req, a->mamba, pages);
  EXPECT_EQ(m.pages.available(), 4);
  EXPECT_EQ(m.take_released_request_slots(), (std::vector<int32_t>{0}));
  EXPECT_TRUE(m.take_released_request_slots().empty());
  EXPECT_THROW(m.release(a->req, a->mamba, {}), invalid_argument_error);  // twice
}

TEST(MemoryBook, EvictionReturnsTheTreesPagesAndCheckpoints) {
  coordinator::memory_book m(group(4, 2), 2);  // checkpoint slots 2 and 3 follow the state slots
  ASSERT_TRUE(m.tree.has_value());
  const std::vector<int32_t> tokens{1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> pages = *m.pages.alloc(3);
  coordinator::memory_book::evicted freed;
  const auto c0 = m.take_checkpoint(freed), c1 = m.take_checkpoint(freed);
  ASSERT_TRUE(c0 && c1);
  EXPECT_EQ(*c0, 2);
  EXPECT_EQ(*c1, 3);
  // The tree takes the pages with a checkpoint after 2 and 3 pages; the request lets go.
  auto ins = m.tree->insert(tokens, pages, 2, 1);
  ASSERT_TRUE(m.tree->attach_checkpoint(ins.last, *c0, 1));
  auto ins3 = m.tree->insert(tokens, pages, 3, 2);
  ASSERT_TRUE(m.tree->attach_checkpoint(ins3.last, *c1, 2));
  m.tree->release(ins.adopted_nodes, 3);
  m.tree->release(ins3.adopted_nodes, 3);
  EXPECT_EQ(m.pages.available(), 1);
  EXPECT_EQ(m.checkpoints.available(), 0);
  // Short of a checkpoint slot only: the stalest checkpoint goes, its page stays cached.
  const auto c2 = m.take_checkpoint(freed);
  ASSERT_TRUE(c2);
  EXPECT_EQ(freed.checkpoints, 1);
  EXPECT_EQ(m.pages.available(), 1);
  m.checkpoints.free(*c2);
  // Short of pages: leaves go, with their checkpoints.
  EXPECT_TRUE(m.evict_for(2, 0, freed));
  EXPECT_EQ(m.pages.available(), 2);
  const coordinator::memory_book::evicted rest = m.evict_all();
  EXPECT_EQ(rest.nodes, 2);
  EXPECT_EQ(m.pages.available(), 4);
  EXPECT_EQ(m.checkpoints.available(), 2);
  EXPECT_EQ(m.tree->nodes(), 0);
}

}  // namespace
}  // namespace hyserve
