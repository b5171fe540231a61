// Synthetic weights: a slice (any dimension) and fused row ranges generate exactly the elements
// of the whole tensor they select, and every tensor depends on (seed, name) alone; residual_scale
// scales exactly the residual branches' output projections.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "model/weights.h"

namespace hyserve::worker {
namespace {

TEST(SyntheticWeights, SlicesEqualTheWholeTensorsElements) {
  const auto src = make_synthetic_weights(7);
  const shape_t full({6, 5, 4});
  for (const std::string name : {"layers.0.mixer.in_proj.weight", "layers.1.mixer.dt_bias", "layers.0.mixer.A_log",
                                 "layers.2.input_layernorm.weight", "layers.0.mixer.conv1d.bias"}) {
    const host_tensor whole = src->load(name, full);
    const float* w = whole.as<float>();
    for (int dim = 0; dim < 3; ++dim) {
      const int64_t begin = 1, end = full[dim] - 1;
      const host_tensor part = src->load_slice(name, full, dim, begin, end);
      ASSERT_EQ(part.shape()[dim], end - begin);
      const float* s = part.as<float>();
      int64_t j = 0;
      for (int64_t a = 0; a < full[0]; ++a)
        for (int64_t b = 0; b < full[1]; ++b)
          for (int64_t c = 0; c < full[2]; ++c) {
            const int64_t idx[3] = {a, b, c};
            if (idx[dim] < begin || idx[dim] >= end) continue;
            ASSERT_EQ(s[j++], w[(a * full[1] + b) * full[2] + c]) << name << " dim " << dim;
          }
      EXPECT_EQ(j, part.numel());
    }
    // Fused row ranges are the rows of the whole tensor, in range order.
    const host_tensor rows = src->load_row_ranges(name, full, {{4, 6}, {0, 1}});
    const int64_t row = full[1] * full[2];
    EXPECT_EQ(std::memcmp(rows.as<float>(), w + 4 * row, 2 * row * sizeof(float)), 0) << name;
    EXPECT_EQ(std::memcmp(rows.as<float>() + 2 * row, w, row * sizeof(float)), 0) << name;
  }
  // The same (seed, name) gives the same tensor; another seed another one.
  const host_tensor a = make_synthetic_weights(7)->load("x.weight", shape_t({64}));
  const host_tensor b = src->load("x.weight", shape_t({64}));
  const host_tensor c = make_synthetic_weights(8)->load("x.weight", shape_t({64}));
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
  EXPECT_NE(std::memcmp(a.data(), c.data(), a.nbytes()), 0);
}

TEST(SyntheticWeights, ResidualScaleScalesOnlyTheBranchOutputProjections) {
  const auto plain = make_synthetic_weights(7);
  const auto scaled = make_synthetic_weights(7, 1e-3);
  const shape_t shape({16, 32});
  for (const std::string name : {"model.layers.0.self_attn.o_proj.weight", "model.layers.1.mamba.out_proj.weight",
                                 "model.layers.2.feed_forward.down_proj.weight"}) {
    const host_tensor a = plain->load(name, shape), b = scaled->load(name, shape);
    double max_rel = 0, norm_a = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      norm_a += std::fabs(a.as<float>()[i]);
      if (a.as<float>()[i] != 0.0f)
        max_rel = std::max(max_rel, std::fabs(b.as<float>()[i] / a.as<float>()[i] * 1e3 - 1.0));
    }
    EXPECT_GT(norm_a, 0.0) << name;
    EXPECT_LT(max_rel, 1e-5) << name << ": elements are not scaled by residual_scale";
  }
  for (const std::string name : {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.mamba.in_proj.weight",
                                 "model.layers.2.feed_forward.up_proj.weight", "model.embed_tokens.weight",
                                 "lm_head.weight", "model.layers.0.input_layernorm.weight"}) {
    const host_tensor a = plain->load(name, shape), b = scaled->load(name, shape);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << name << " changed";
  }
}

}  // namespace
}  // namespace hyserve::worker
