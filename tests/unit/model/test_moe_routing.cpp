// The MoE block (worker/model/moe_layer.h) on the CPU against a naive per-token reference in
// double: the input RMSNorm, router logits, softmax, the top k (ties to the lower index), renormalised or not, the
// selected experts' SwiGLU MLPs, plus the shared expert scaled by sigmoid(shared_gate · x).
// Within 1e-5·(1 + |ref|), for top-1 and top-2 routing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
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
  expert_stack stack(E, I, H, dtype::kF32, device_kind::kCpu);
  for (int64_t e = 0; e < E; ++e)
    stack.set(e, random_tensor({I, H}, gen, 0.3f), random_tensor({I, H}, gen, 0.3f), random_tensor({H, I}, gen, 0.3f));
  stack.finish(w);
  w.shared = mlp_weights{random_tensor({I, H}, gen, 0.3f), random_tensor({I, H}, gen, 0.3f),
                         random_tensor({H, I}, gen, 0.3f)};
  w.shared_gate = random_tensor({1, H}, gen, 0.5f);
  w.top_k = k;
  w.norm_topk_prob = norm;
  return w;
}

// down · (silu(gate · x) ⊙ up · x) for one token, gate/up [I, H], down [H, I] row-major.
std::vector<double> swiglu_ref(const float* gate, const float* up, const float* down, const float* x, int64_t H,
                               int64_t I) {
  std::vector<double> act(static_cast<size_t>(I)), y(static_cast<size_t>(H));
  for (int64_t i = 0; i < I; ++i) {
    double g = 0, u = 0;
    for (int64_t h = 0; h < H; ++h) {
      g += static_cast<double>(gate[i * H + h]) * x[h];
      u += static_cast<double>(up[i * H + h]) * x[h];
    }
    act[static_cast<size_t>(i)] = g / (1 + std::exp(-g)) * u;
  }
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < I; ++i) y[static_cast<size_t>(h)] += static_cast<double>(down[h * I + i]) * act[static_cast<size_t>(i)];
  return y;
}

TEST(MoeRouting, MatchesNaivePerToken) {
  std::mt19937 gen(5);
  const int64_t T = 7, H = 16, I = 8, E = 4;
  for (int64_t k : {1, 2})
    for (bool norm : {true, false}) {
      const moe_weights w = random_moe(E, H, I, k, norm, gen);
      const tensor h = random_tensor({T, H}, gen, 2.0f);
      tensor g = random_tensor({H}, gen, 0.5f);
      for (int64_t i = 0; i < H; ++i) g.as<float>()[i] += 1.0f;
      constexpr float kEps = 1e-6f;
      const tensor got = moe_forward(w, h, g, kEps, nullptr, exec_context{});
      ASSERT_EQ(got.shape(), (shape_t{T, H}));
      double worst = 0;
      for (int64_t t = 0; t < T; ++t) {
        // x = rmsnorm(h; g, eps), the block's input
        const float* ht = h.as<float>() + t * H;
        double ss = 0;
        for (int64_t i = 0; i < H; ++i) ss += static_cast<double>(ht[i]) * ht[i];
        const double inv = 1.0 / std::sqrt(ss / static_cast<double>(H) + kEps);
        std::vector<float> xn(static_cast<size_t>(H));
        for (int64_t i = 0; i < H; ++i) xn[static_cast<size_t>(i)] = static_cast<float>(ht[i] * inv * g.as<float>()[i]);
        const float* xt = xn.data();
        std::vector<double> p(static_cast<size_t>(E));
        for (int64_t e = 0; e < E; ++e)
          for (int64_t h = 0; h < H; ++h) p[static_cast<size_t>(e)] += static_cast<double>(w.router.as<float>()[e * H + h]) * xt[h];
        const double mx = *std::max_element(p.begin(), p.end());
        double sum = 0;
        for (double& v : p) sum += (v = std::exp(v - mx));
        for (double& v : p) v /= sum;
        std::vector<int> order(static_cast<size_t>(E));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)]; });
        double top = 0;
        for (int64_t j = 0; j < k; ++j) top += p[static_cast<size_t>(order[static_cast<size_t>(j)])];
        std::vector<double> ref(static_cast<size_t>(H));
        for (int64_t j = 0; j < k; ++j) {
          const int e = order[static_cast<size_t>(j)];
          const double wt = norm ? p[static_cast<size_t>(e)] / top : p[static_cast<size_t>(e)];
          const float* g = w.gate_up.as<float>() + e * 2 * I * H;
          const std::vector<double> y = swiglu_ref(g, g + I * H, w.down.as<float>() + e * H * I, xt, H, I);
          for (int64_t h = 0; h < H; ++h) ref[static_cast<size_t>(h)] += wt * y[static_cast<size_t>(h)];
        }
        double gl = 0;
        for (int64_t h = 0; h < H; ++h) gl += static_cast<double>(w.shared_gate.as<float>()[h]) * xt[h];
        const std::vector<double> ys =
            swiglu_ref(w.shared.gate.as<float>(), w.shared.up.as<float>(), w.shared.down.as<float>(), xt, H, I);
        for (int64_t h = 0; h < H; ++h) {
          const double r = ref[static_cast<size_t>(h)] + ys[static_cast<size_t>(h)] / (1 + std::exp(-gl));
          worst = std::max(worst, std::abs(got.as<float>()[t * H + h] - r) / (1.0 + std::abs(r)));
        }
      }
      EXPECT_LE(worst, 1e-5) << "top_k " << k << (norm ? " norm" : " raw");
    }
}

}  // namespace
}  // namespace hyserve::worker::layers
