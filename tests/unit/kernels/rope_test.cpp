// Partial rotate-half RoPE against the direct formula. The angle follows the Hugging Face
// float32 arithmetic (inv_freq and position·inv_freq in fp32), the rotation is done in double:
// tolerance 1e-5 abs. A second check against an all-double angle for positions < 512 (where
// fp32 angle rounding stays below 1e-4) ties the fp32 recipe to the mathematical definition.
#include "hyserve/kernels/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernel_test_util.h"

namespace hyserve::kernels {
namespace {

using test::random_floats;

struct rope_case {
  int q_heads, kv_heads, head_dim, rotary_dim;
  float theta;
};

// Rotated copy of one head; angle_fp32 selects the HF fp32 angle or an exact double angle.
std::vector<double> rotate_ref(const float* head, int64_t head_dim, int64_t rd, int32_t pos, float theta,
                               bool angle_fp32) {
  std::vector<double> out(head, head + head_dim);
  const int64_t half = rd / 2;
  for (int64_t i = 0; i < half; ++i) {
    double angle;
    if (angle_fp32) {
      const float inv = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(rd));
      angle = static_cast<double>(static_cast<float>(pos) * inv);
    } else {
      angle = pos * std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) / static_cast<double>(rd));
    }
    const double x1 = head[i], x2 = head[i + half];
    out[i] = x1 * std::cos(angle) - x2 * std::sin(angle);
    out[i + half] = x2 * std::cos(angle) + x1 * std::sin(angle);
  }
  return out;
}

class Rope : public testing::TestWithParam<rope_case> {};

TEST_P(Rope, MatchesDirectFormula) {
  const rope_case& c = GetParam();
  const std::vector<int32_t> positions{0, 1, 2, 17, 511, 4095, 32767, 100000};
  const int64_t n_tokens = static_cast<int64_t>(positions.size());
  const int64_t q_stride = c.q_heads * c.head_dim + 5, k_stride = c.kv_heads * c.head_dim + 1;
  const uint32_t seed = static_cast<uint32_t>(c.head_dim * 10 + c.rotary_dim);
  const auto q0 = random_floats(static_cast<size_t>(n_tokens * q_stride), seed);
  const auto k0 = random_floats(static_cast<size_t>(n_tokens * k_stride), seed + 1);
  auto q = q0;
  auto k = k0;

  rope_params p;
  p.q = q.data();
  p.k = c.kv_heads > 0 ? k.data() : nullptr;
  p.positions = positions.data();
  p.n_tokens = n_tokens;
  p.n_q_heads = c.q_heads;
  p.n_kv_heads = c.kv_heads;
  p.head_dim = c.head_dim;
  p.rotary_dim = c.rotary_dim;
  p.q_stride = q_stride;
  p.k_stride = k_stride;
  p.theta = c.theta;
  run_cpu(p);

  auto check = [&](const std::vector<float>& before, const std::vector<float>& after, int64_t stride, int64_t heads,
                   const char* what) {
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t off = t * stride + h * c.head_dim;
        const std::string at =
            std::string(what) + " pos " + std::to_string(positions[t]) + " head " + std::to_string(h);
        const auto want = rotate_ref(before.data() + off, c.head_dim, c.rotary_dim, positions[t], c.theta, true);
        test::expect_close(after.data() + off, want.data(), static_cast<size_t>(c.head_dim), 1e-5, 0.0, at);
        if (positions[t] < 512) {
          const auto exact = rotate_ref(before.data() + off, c.head_dim, c.rotary_dim, positions[t], c.theta, false);
          test::expect_close(after.data() + off, exact.data(), static_cast<size_t>(c.head_dim), 1e-4, 0.0,
                             at + " (double angle)");
        }
        // Dims past rotary_dim are bit-identical.
        for (int64_t d = c.rotary_dim; d < c.head_dim; ++d) ASSERT_EQ(after[off + d], before[off + d]) << at;
      }
      // Stride padding is untouched.
      for (int64_t e = heads * c.head_dim; e < stride; ++e) ASSERT_EQ(after[t * stride + e], before[t * stride + e]);
    }
  };
  check(q0, q, q_stride, c.q_heads, "q");
  if (c.kv_heads > 0) check(k0, k, k_stride, c.kv_heads, "k");
}

INSTANTIATE_TEST_SUITE_P(Grid, Rope,
                         testing::Values(rope_case{4, 2, 64, 64, 10000.0f}, rope_case{4, 1, 64, 16, 10000.0f},
                                         rope_case{2, 2, 32, 2, 10000.0f}, rope_case{8, 2, 128, 32, 1e6f},
                                         rope_case{3, 0, 16, 8, 10000.0f}),
                         [](const testing::TestParamInfo<rope_case>& i) {
                           const auto& c = i.param;
                           return "qh" + std::to_string(c.q_heads) + "_kvh" + std::to_string(c.kv_heads) + "_hd" +
                                  std::to_string(c.head_dim) + "_rd" + std::to_string(c.rotary_dim) + "_theta" +
                                  std::to_string(static_cast<long>(c.theta));
                         });

}  // namespace
}  // namespace hyserve::kernels
