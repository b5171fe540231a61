#include <gtest/gtest.h>

#include <vector>

#include "hyserve/common/error.h"
#include "hyserve/worker/memory_pools.h"

namespace hyserve::worker {
namespace {


TEST(ReqToTokenPool, TableStartsAtMinusOne) {
  req_to_token_pool pool(3, 5);
  EXPECT_EQ(pool.max_requests(), 3);
  EXPECT_EQ(pool.max_context(), 5);
  EXPECT_EQ(pool.available(), 3);
  for (int32_t s = 0; s < 3; ++s)
    for (int32_t t = 0; t < 5; ++t) EXPECT_EQ(pool.row(s)[t], -1);
}

TEST(ReqToTokenPool, AllocGivesLowestFreeSlotFirst) {
  req_to_token_pool pool(4, 2);
  EXPECT_EQ(pool.alloc(), 0);
  EXPECT_EQ(pool.alloc(), 1);
  EXPECT_EQ(pool.alloc(), 2);
  pool.free(1);
  EXPECT_EQ(pool.available(), 2);
  EXPECT_EQ(pool.alloc(), 1);
  pool.free(2);
  pool.free(0);
  EXPECT_EQ(pool.alloc(), 0);
  EXPECT_EQ(pool.alloc(), 2);
  EXPECT_EQ(pool.alloc(), 3);
  EXPECT_EQ(pool.alloc(), std::nullopt);
  EXPECT_EQ(pool.available(), 0);
}

TEST(ReqToTokenPool, FreeResetsOnlyThatRow) {
  req_to_token_pool pool(2, 3);
  const int32_t a = *pool.alloc();
  const int32_t b = *pool.alloc();
  for (int32_t t = 0; t < 3; ++t) {
    pool.row(a)[t] = 10 + t;
    pool.row(b)[t] = 20 + t;
  }
  pool.free(a);
  const req_to_token_pool& cpool = pool;
  for (int32_t t = 0; t < 3; ++t) {
    EXPECT_EQ(cpool.row(a)[t], -1);
    EXPECT_EQ(cpool.row(b)[t], 20 + t);
  }
}

TEST(ReqToTokenPool, DoubleFreeAndOutOfRangeThrow) {
  req_to_token_pool pool(2, 4);
  const int32_t s = *pool.alloc();
  pool.free(s);
  EXPECT_THROW(pool.free(s), invalid_argument_error);
  EXPECT_THROW(pool.free(1), invalid_argument_error);  // never allocated
  EXPECT_THROW(pool.free(2), invalid_argument_error);
  EXPECT_THROW(pool.free(-1), invalid_argument_error);
  EXPECT_THROW((void)pool.row(2), invalid_argument_error);
  EXPECT_THROW((void)pool.row(-1), invalid_argument_error);
  EXPECT_EQ(pool.available(), 2);
}

TEST(KvCache, ShapesLayers3Pages5PageSize4Heads2HeadDim8) {
  kv_cache cache(3, 5, 4, 2, 8);
  EXPECT_EQ(cache.page_size(), 4);
  EXPECT_EQ(cache.num_pages(), 5);
  for (int32_t l = 0; l < 3; ++l) {
    EXPECT_EQ(cache.layer(l).k.shape(), shape_t({5, 4, 2, 8}));
    EXPECT_EQ(cache.layer(l).v.shape(), shape_t({5, 4, 2, 8}));
    EXPECT_EQ(cache.layer(l).k.type(), dtype::kF32);
    EXPECT_EQ(cache.layer(l).v.type(), dtype::kF32);
  }
  EXPECT_THROW((void)cache.layer(3), std::out_of_range);
  EXPECT_THROW(kv_cache(1, 5, 0, 2, 8), invalid_argument_error);
}

mamba_state_shape small_shape() {
  mamba_state_shape s;
  s.conv_dim = 6;
  s.conv_width = 4;
  s.heads = 2;
  s.head_dim = 3;
  s.d_state = 5;
  return s;
}

TEST(MambaStateCache, ShapesLayers2Slots4ConvDim6Width4Heads2HeadDim3DState5) {
  mamba_state_cache cache(2, 4, small_shape());
  EXPECT_EQ(cache.n_slots(), 4);
  EXPECT_EQ(cache.shape().conv_width, 4);
  for (int32_t l = 0; l < 2; ++l) {
    EXPECT_EQ(cache.layer(l).conv.shape(), shape_t({5, 6, 3}));
    EXPECT_EQ(cache.layer(l).ssm.shape(), shape_t({5, 2, 3, 5}));
    EXPECT_EQ(cache.layer(l).conv.type(), dtype::kF32);
    EXPECT_EQ(cache.layer(l).ssm.type(), dtype::kF32);
  }
}

TEST(MambaStateCache, ResetSlotZeroesOnlyThatSlotInEveryLayer) {
  const int32_t n_slots = 4;
  mamba_state_cache cache(3, n_slots, small_shape());
  for (int32_t l = 0; l < 3; ++l)
    for (host_tensor* t : {&cache.layer(l).conv, &cache.layer(l).ssm})
      for (int64_t i = 0; i < t->numel(); ++i) t->as<float>()[i] = 1.0f + static_cast<float>(i);

  for (int32_t slot : {2, n_slots}) {  // a regular slot and the padding slot
    cache.reset_slot(slot);
    for (int32_t l = 0; l < 3; ++l) {
      for (host_tensor* t : {&cache.layer(l).conv, &cache.layer(l).ssm}) {
        const int64_t per_slot = t->numel() / t->shape()[0];
        for (int64_t i = 0; i < t->numel(); ++i) {
          const int64_t s = i / per_slot;
          const bool cleared = s == 2 || (slot == n_slots && s == n_slots);
          EXPECT_EQ(t->as<float>()[i], cleared ? 0.0f : 1.0f + static_cast<float>(i))
              << "layer " << l << " slot " << s << " element " << i;
        }
      }
    }
  }
  EXPECT_THROW(cache.reset_slot(n_slots + 1), invalid_argument_error);
  EXPECT_THROW(cache.reset_slot(-1), invalid_argument_error);
}

}  // namespace
}  // namespace hyserve::worker
