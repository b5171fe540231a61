// offset_arena (kernels/offset_arena.h): first-fit placement by offset, the plan of the graph
// arenas. Alignment, reuse of released ranges, coalescing, the top lowering when the highest
// block goes, capacity limits, and the property the graph arenas rely on: a sequence replayed
// into an arena of capacity ≥ its unbounded peak gets the same offsets and never fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "hyserve/kernels/offset_arena.h"

namespace hyserve::kernels {
namespace {

constexpr size_t A = offset_arena::kAlignment;

TEST(OffsetArena, AlignsAndStacks) {
  offset_arena a;
  EXPECT_EQ(a.allocate(1), 0u);
  EXPECT_EQ(a.allocate(A), A);
  EXPECT_EQ(a.allocate(A + 1), 2 * A);
  EXPECT_EQ(a.allocate(0), 4 * A);  // zero bytes still take one unit
  EXPECT_EQ(a.peak(), 5 * A);
  EXPECT_EQ(a.live_blocks(), 4u);
  EXPECT_EQ(a.live_bytes(), 5 * A);
}

TEST(OffsetArena, ReusesTheLowestHoleThatFits) {
  offset_arena a;
  const size_t b0 = a.allocate(A), b1 = a.allocate(3 * A), b2 = a.allocate(A), b3 = a.allocate(2 * A);
  (void)b2;
  ASSERT_TRUE(a.release(b1));  // hole [A, 4A)
  ASSERT_TRUE(a.release(b0));  // coalesces: hole [0, 4A)
  EXPECT_EQ(a.holes(), 1u);
  EXPECT_EQ(a.allocate(2 * A), 0u);
  EXPECT_EQ(a.allocate(2 * A), 2 * A);  // the rest of the hole
  EXPECT_EQ(a.allocate(A), 7 * A);      // no hole left: on top
  ASSERT_TRUE(a.release(b3));           // [5A, 7A): a hole below the top block
  EXPECT_EQ(a.allocate(3 * A), 8 * A);  // too big for it
  EXPECT_EQ(a.allocate(A), 5 * A);
  EXPECT_EQ(a.peak(), 11 * A);
}

TEST(OffsetArena, ReleasingTheTopLowersItAndMergesTheHoleBelow) {
  offset_arena a;
  const size_t b0 = a.allocate(A), b1 = a.allocate(A), b2 = a.allocate(A);
  ASSERT_TRUE(a.release(b1));
  EXPECT_EQ(a.holes(), 1u);
  ASSERT_TRUE(a.release(b2));  // top falls to A, swallowing the hole
  EXPECT_EQ(a.holes(), 0u);
  EXPECT_EQ(a.allocate(4 * A), A);
  EXPECT_EQ(a.peak(), 5 * A);
  ASSERT_TRUE(a.release(b0));
  EXPECT_FALSE(a.release(b0));     // not live any more
  EXPECT_FALSE(a.release(A + 1));  // never a block start
  EXPECT_EQ(a.live_blocks(), 1u);
}

TEST(OffsetArena, CapacityLimitsTheTopOnly) {
  offset_arena a(4 * A);
  const size_t b0 = a.allocate(2 * A);
  EXPECT_EQ(a.allocate(2 * A), 2 * A);
  EXPECT_EQ(a.allocate(1), offset_arena::npos);  // full: nothing changes
  EXPECT_EQ(a.live_blocks(), 2u);
  ASSERT_TRUE(a.release(b0));
  EXPECT_EQ(a.allocate(A), 0u);
  EXPECT_EQ(a.allocate(A), A);
  EXPECT_EQ(a.allocate(A), offset_arena::npos);
  EXPECT_EQ(offset_arena(0).allocate(1), offset_arena::npos);
  EXPECT_EQ(a.allocate(SIZE_MAX), offset_arena::npos);
}

// A random sequence (stack-like frees mixed with out-of-order ones, as a model step's
// activations and op scratch), the same with every capacity ≥ its unbounded peak.
TEST(OffsetArena, PlacementDoesNotDependOnCapacity) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    struct op {
      bool alloc;
      size_t bytes_or_index;
    };
    std::vector<op> ops;
    std::mt19937 gen(seed);
    size_t n_allocs = 0;
    std::vector<size_t> live;
    for (int i = 0; i < 400; ++i) {
      if (live.empty() || gen() % 3 != 0) {
        const size_t bytes = 1 + gen() % (64 * A);
        ops.push_back({true, bytes});
        live.push_back(n_allocs++);
      } else {
        const size_t pick = gen() % 4 == 0 ? gen() % live.size() : live.size() - 1;
        ops.push_back({false, live[pick]});
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(pick));
      }
    }
    auto run = [&](offset_arena& a) {
      std::vector<size_t> offsets;
      for (const op& o : ops) {
        if (o.alloc) {
          offsets.push_back(a.allocate(o.bytes_or_index));
        } else if (offsets[o.bytes_or_index] != offset_arena::npos) {
          EXPECT_TRUE(a.release(offsets[o.bytes_or_index]));
        }
      }
      return offsets;
    };
    offset_arena unbounded;
    const std::vector<size_t> want = run(unbounded);
    const size_t peak = unbounded.peak();
    for (size_t capacity : {peak, peak + A, 2 * peak}) {
      offset_arena bounded(capacity);
      EXPECT_EQ(run(bounded), want) << "seed " << seed << " capacity " << capacity;
      EXPECT_EQ(bounded.peak(), peak);
    }
    offset_arena short_one(peak - A);
    const std::vector<size_t> got = run(short_one);
    EXPECT_NE(std::find(got.begin(), got.end(), offset_arena::npos), got.end()) << "seed " << seed;
    // Every live block lies inside the peak and no two overlap (checked on the unbounded run).
    std::vector<std::pair<size_t, size_t>> blocks;
    std::vector<bool> freed(want.size(), false);
    for (const op& o : ops)
      if (!o.alloc) freed[o.bytes_or_index] = true;
    size_t a_i = 0;
    for (const op& o : ops) {
      if (!o.alloc) continue;
      if (!freed[a_i]) blocks.emplace_back(want[a_i], offset_arena::rounded(o.bytes_or_index));
      ++a_i;
    }
    std::sort(blocks.begin(), blocks.end());
    for (size_t i = 0; i + 1 < blocks.size(); ++i)
      EXPECT_LE(blocks[i].first + blocks[i].second, blocks[i + 1].first) << "seed " << seed;
    if (!blocks.empty()) {
      EXPECT_LE(blocks.back().first + blocks.back().second, peak);
    }
  }
}

}  // namespace
}  // namespace hyserve::kernels
