// index_pool: the allocator behind the worker's memory pools and the coordinator's memory
// bookkeeping (hyserve/common/index_pool.h).
#include <gtest/gtest.h>

#include <vector>

#include "common_test_support.h"
#include "hyserve/common/error.h"
#include "hyserve/common/index_pool.h"

namespace hyserve {
namespace {

TEST(IndexPool, HandsOutTheLowestFreeIndexWhateverTheOrderOfFrees) {
  index_pool p("kv page", 5);
  EXPECT_EQ(*p.alloc(3), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(*p.alloc(), 3);
  p.free(2);
  p.free(0);
  p.free(3);
  EXPECT_EQ(p.available(), 4);
  EXPECT_EQ(*p.alloc(), 0);
  EXPECT_EQ(*p.alloc(2), (std::vector<int32_t>{2, 3}));
  EXPECT_TRUE(p.allocated(1));
  EXPECT_FALSE(p.allocated(4));
}

TEST(IndexPool, AllocOfManyIsAllOrNothing) {
  index_pool p("kv page", 3);
  EXPECT_FALSE(p.alloc(4).has_value());
  EXPECT_EQ(p.available(), 3);
  EXPECT_EQ(p.alloc(0)->size(), 0u);
  EXPECT_EQ(p.alloc(3)->size(), 3u);
  EXPECT_FALSE(p.alloc().has_value());
  EXPECT_ERROR_WITH((void)p.alloc(-1), invalid_argument_error, "kv page count -1 is negative");
}

TEST(IndexPool, OffsetRangeAndFreeErrorsNameThePool) {
  index_pool p("checkpoint slot", 2, 8);  // indices 8 and 9
  EXPECT_EQ(p.first(), 8);
  EXPECT_EQ(*p.alloc(), 8);
  EXPECT_ERROR_WITH(p.free(7), invalid_argument_error, "cannot free checkpoint slot 7: outside [8, 10)");
  EXPECT_ERROR_WITH(p.free(9), invalid_argument_error, "cannot free checkpoint slot 9: it is not allocated (double free)");
  EXPECT_EQ(*p.alloc(), 9);
  // A list is checked whole before any of it is freed.
  EXPECT_ERROR_WITH(p.free(std::vector<int32_t>{8, 8}), invalid_argument_error,
                    "cannot free checkpoint slot 8: listed twice (double free)");
  EXPECT_EQ(p.available(), 0);
  p.free(std::vector<int32_t>{9, 8});
  EXPECT_EQ(p.available(), 2);
  EXPECT_ERROR_WITH(index_pool("mamba slot", -1), invalid_argument_error, "mamba slot pool size -1 is negative");
}

}  // namespace
}  // namespace hyserve
