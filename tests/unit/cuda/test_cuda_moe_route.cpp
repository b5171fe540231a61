// moe_route on CUDA against the CPU op over tokens × experts × top_k (the production expert
// counts included: 512 experts, top 10), normalised and not; weights within 1e-6 + 1e-5·|cpu|,
// the routed set identical (a weight is 0 on one side exactly when it is 0 on the other).
// Skips without a CUDA device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hyserve/kernels/device.h"

#if defined(HYSERVE_HAVE_CUDA)

#include "cuda_test_util.h"
#include "hyserve/kernels/row_ops.h"

namespace hyserve::kernels {
namespace {

TEST(CudaMoeRoute, MatchesCpuOverShapes) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 1;
  for (int64_t tokens : {1, 5, 33})
    for (int64_t experts : {4, 16, 64, 512})
      for (int64_t top_k : {1, 2, 10})
        for (bool norm : {true, false}) {
          if (top_k > experts) continue;
          const std::string what = "tokens " + std::to_string(tokens) + " experts " + std::to_string(experts) +
                                   " top_k " + std::to_string(top_k) + (norm ? " norm" : " raw");
          const std::vector<float> logits = cuda_test::random_floats(static_cast<size_t>(tokens * experts), seed++, -4, 4);
          moe_route_params p;
          p.tokens = tokens;
          p.experts = experts;
          p.top_k = top_k;
          p.logits_stride = experts;
          p.weights_stride = tokens;
          p.norm_topk_prob = norm;
          std::vector<float> want(static_cast<size_t>(experts * tokens));
          p.logits = logits.data();
          p.weights = want.data();
          run_cpu(p);
          device_array<float> d_logits(logits), d_w(want.size());
          d_w.fill_bytes(0xff);
          p.logits = d_logits.data();
          p.weights = d_w.data();
          run_cuda(p);
          device_synchronize();
          const std::vector<float> got = d_w.download();
          int64_t mismatched_sets = 0;
          for (size_t i = 0; i < want.size(); ++i)
            if ((want[i] == 0.0f) != (got[i] == 0.0f)) ++mismatched_sets;
          EXPECT_EQ(mismatched_sets, 0) << what;
          cuda_test::expect_match(got, want, 1e-6, 1e-5, what);
        }
}

}  // namespace
}  // namespace hyserve::kernels

#endif  // HYSERVE_HAVE_CUDA
