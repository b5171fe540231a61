// The MoE block (worker/model/moe_layer.h) with device routing (every expert over every token,
// weighted 0 where not routed; what CUDA-graph decode uses) against host routing, on the CPU:
// the same output within 1e-5·(1 + |host|) for top-1 and top-2 routing, with and without
// renormalisation, with a shared expert.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "../../../worker/model/moe_layer.h"

namespace hyserve::worker::layers {
namespace {

tensor random_tensor(shape_t s, std::mt19937& gen, float scale) {
  tensor t = tensor::f32(s);
  std::uniform_real_distribution<float> d(-scale, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] = d(gen);
  return t;
}

moe_weights random_moe(int64_t E, int64_t H, int64_t I, int64_t k, bool norm, std::mt19937& gen) {
  moe_weights w;
  w.router = random_tensor({E, H}, gen, 1.0f);
  for (int64_t e = 0; e < E; ++e)
    w.experts.push_back(mlp_weights{random_tensor({I, H}, gen, 0.3f), random_tensor({I, H}, gen, 0.3f),
                                    random_tensor({H, I}, gen, 0.3f)});
  w.shared = mlp_weights{random_tensor({I, H}, gen, 0.3f), random_tensor({I, H}, gen, 0.3f),
                         random_tensor({H, I}, gen, 0.3f)};
  w.shared_gate = random_tensor({1, H}, gen, 0.5f);
  w.top_k = k;
  w.norm_topk_prob = norm;
  return w;
}

TEST(MoeRouting, DeviceRoutingEqualsHostRouting) {
  std::mt19937 gen(5);
  const int64_t T = 7, H = 16, I = 8, E = 4;
  for (int64_t k : {1, 2})
    for (bool norm : {true, false}) {
      moe_weights w = random_moe(E, H, I, k, norm, gen);
      const tensor x = random_tensor({T, H}, gen, 1.0f);
      const exec_context cpu{};
      const tensor host = moe_forward(w, x, nullptr, cpu);
      w.device_routing = true;
      const tensor dense = moe_forward(w, x, nullptr, cpu);
      ASSERT_EQ(host.shape(), dense.shape());
      double worst = 0;
      for (int64_t i = 0; i < host.numel(); ++i)
        worst = std::max(worst, std::abs(static_cast<double>(dense.as<float>()[i]) - host.as<float>()[i]) /
                                    (1.0 + std::abs(host.as<float>()[i])));
      EXPECT_LE(worst, 1e-5) << "top_k " << k << (norm ? " norm" : " raw");
    }
}

TEST(MoeRouting, DeviceRoutingPaysOnlyOnCudaForFewExperts) {
  EXPECT_TRUE(dense_routing_pays(4, device_kind::kCuda));
  EXPECT_TRUE(dense_routing_pays(16, device_kind::kCuda));
  EXPECT_FALSE(dense_routing_pays(512, device_kind::kCuda));
  EXPECT_FALSE(dense_routing_pays(4, device_kind::kCpu));
}

}  // namespace
}  // namespace hyserve::worker::layers
