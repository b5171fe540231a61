// weight_loader::stack_rows: the fused attention projection's weight is q | k | v stacked row
// for row, bit for bit as loaded; parts of another width or type are refused. stack_cols: the
// same side by side (Falcon-H1's out_proj | o_proj), parts of another height or type refused.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "hyserve/common/error.h"
#include "model/weight_loader.h"
#include "model/weights.h"

namespace hyserve::worker {
namespace {

TEST(WeightLoader, StackRowsConcatenatesTheLoadedRowsInOrder) {
  const auto src = make_synthetic_weights(11);
  kernels::exec_context ctx;  // the CPU
  weight_loader ld(*src, ctx);
  const shape_t qs({6, 8}), kvs({2, 8});
  std::vector<tensor> parts;
  parts.push_back(ld.load("q_proj.weight", qs, dtype::kF32));
  parts.push_back(ld.load("k_proj.weight", kvs, dtype::kF32));
  parts.push_back(ld.load_slice("v_proj.weight", shape_t({4, 8}), 0, 1, 3, dtype::kF32));
  const tensor stacked = ld.stack_rows(std::move(parts));
  ASSERT_EQ(stacked.shape()[0], 10);
  ASSERT_EQ(stacked.shape()[1], 8);
  const tensor q = src->load("q_proj.weight", qs), k = src->load("k_proj.weight", kvs);
  const tensor v = src->load_slice("v_proj.weight", shape_t({4, 8}), 0, 1, 3);
  const float* s = stacked.as<float>();
  for (int64_t i = 0; i < 48; ++i) ASSERT_EQ(s[i], q.as<float>()[i]) << i;
  for (int64_t i = 0; i < 16; ++i) ASSERT_EQ(s[48 + i], k.as<float>()[i]) << i;
  for (int64_t i = 0; i < 16; ++i) ASSERT_EQ(s[64 + i], v.as<float>()[i]) << i;
}

TEST(WeightLoader, StackRowsRefusesPartsOfAnotherWidthOrType) {
  const auto src = make_synthetic_weights(11);
  kernels::exec_context ctx;
  weight_loader ld(*src, ctx);
  std::vector<tensor> widths;
  widths.push_back(ld.load("a.weight", shape_t({2, 8}), dtype::kF32));
  widths.push_back(ld.load("b.weight", shape_t({2, 4}), dtype::kF32));
  EXPECT_THROW(ld.stack_rows(std::move(widths)), error);
  std::vector<tensor> types;
  types.push_back(ld.load("a.weight", shape_t({2, 8}), dtype::kF32));
  types.push_back(ld.load("b.weight", shape_t({2, 8}), dtype::kBF16));
  EXPECT_THROW(ld.stack_rows(std::move(types)), error);
  EXPECT_THROW(ld.stack_rows({}), error);
}

TEST(WeightLoader, StackColsPlacesEachPartsColumnsSideBySideInEveryRow) {
  const auto src = make_synthetic_weights(11);
  kernels::exec_context ctx;
  weight_loader ld(*src, ctx);
  const shape_t as({5, 6}), bs({5, 3});
  std::vector<tensor> parts;
  parts.push_back(ld.load("out_proj.weight", as, dtype::kF32));
  parts.push_back(ld.load("o_proj.weight", bs, dtype::kF32));
  parts.push_back(ld.load_slice("x_proj.weight", shape_t({5, 8}), 1, 2, 4, dtype::kF32));  // columns 2, 3
  const tensor stacked = ld.stack_cols(std::move(parts));
  ASSERT_EQ(stacked.shape()[0], 5);
  ASSERT_EQ(stacked.shape()[1], 11);
  const tensor a = src->load("out_proj.weight", as), b = src->load("o_proj.weight", bs);
  const tensor x = src->load("x_proj.weight", shape_t({5, 8}));
  const float* s = stacked.as<float>();
  for (int64_t r = 0; r < 5; ++r) {
    for (int64_t c = 0; c < 6; ++c) ASSERT_EQ(s[r * 11 + c], a.as<float>()[r * 6 + c]) << r << "," << c;
    for (int64_t c = 0; c < 3; ++c) ASSERT_EQ(s[r * 11 + 6 + c], b.as<float>()[r * 3 + c]) << r << "," << c;
    for (int64_t c = 0; c < 2; ++c) ASSERT_EQ(s[r * 11 + 9 + c], x.as<float>()[r * 8 + 2 + c]) << r << "," << c;
  }
}

TEST(WeightLoader, StackColsRefusesPartsOfAnotherHeightOrType) {
  const auto src = make_synthetic_weights(11);
  kernels::exec_context ctx;
  weight_loader ld(*src, ctx);
  std::vector<tensor> heights;
  heights.push_back(ld.load("a.weight", shape_t({4, 2}), dtype::kF32));
  heights.push_back(ld.load("b.weight", shape_t({3, 2}), dtype::kF32));
  EXPECT_THROW(ld.stack_cols(std::move(heights)), error);
  std::vector<tensor> types;
  types.push_back(ld.load("a.weight", shape_t({4, 2}), dtype::kF32));
  types.push_back(ld.load("b.weight", shape_t({4, 2}), dtype::kBF16));
  EXPECT_THROW(ld.stack_cols(std::move(types)), error);
  EXPECT_THROW(ld.stack_cols({}), error);
}

}  // namespace
}  // namespace hyserve::worker
