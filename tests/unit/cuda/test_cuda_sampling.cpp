// Backend ops: seeded sampling (greedy / temperature / top-k / top-p) batched over rows, CUDA
// against sample_cpu row by row. Tokens must be identical (same candidate order, same
// counter-based generator); logprobs agree to |Δ| <= 1e-5 (double sums in another order).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "hyserve/kernels/device.h"

#if defined(HYSERVE_HAVE_CUDA)

#include "cuda/sample_batch.h"
#include "cuda_test_util.h"
#include "hyserve/kernels/sampling.h"

namespace hyserve::kernels {
namespace {

using cuda_test::expect_invalid;
using cuda_test::to_device;

struct sample_case {
  int vocab, rows;
};

class SampleCuda : public testing::TestWithParam<sample_case> {};

// Row r's settings cycle through greedy, plain temperature, top-k, top-p and both, with
// different seeds and counters.
sample_params settings(int r, int vocab) {
  sample_params s;
  const float temps[] = {0.0f, 1.0f, 0.7f, 1.5f, 0.3f};
  const int32_t ks[] = {0, 0, 1, 50, -3, 0, 20};
  const float ps[] = {1.0f, 0.9f, 0.5f, 1.0f, 1e-6f, 0.99f};
  s.temperature = temps[r % 5];
  s.top_k = r % 11 == 10 ? vocab + 5 : ks[r % 7];
  s.top_p = ps[r % 6];
  s.seed = 1234567ull * static_cast<uint64_t>(r + 1);
  s.counter = static_cast<uint64_t>(r * 3);
  return s;
}

TEST_P(SampleCuda, MatchesCpuTokens) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const sample_case& c = GetParam();
  std::mt19937 gen(static_cast<uint32_t>(c.vocab + c.rows));
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(c.vocab) * c.rows);
  for (auto& v : logits) v = normal(gen);
  for (int r = 0; r < c.rows; ++r) {
    float* row = logits.data() + static_cast<size_t>(r) * c.vocab;
    if (c.vocab > 10) {
      row[3] = row[c.vocab - 2] = 12.5f;  // tied top candidates: the lower id comes first
      row[5] = -std::numeric_limits<float>::infinity();
      row[6] = -0.0f;
      row[7] = 0.0f;
    }
  }
  auto dlogits = to_device(logits);
  std::vector<sample_params> rows(static_cast<size_t>(c.rows));
  std::vector<sample_output> want(static_cast<size_t>(c.rows));
  for (int r = 0; r < c.rows; ++r) {
    sample_params s = settings(r, c.vocab);
    s.vocab = c.vocab;
    s.logits = logits.data() + static_cast<size_t>(r) * c.vocab;
    want[r] = sample_cpu(s);
    s.logits = dlogits.data() + static_cast<size_t>(r) * c.vocab;
    rows[r] = s;
  }
  device_array<sample_output> dout(static_cast<size_t>(c.rows));
  dout.fill_bytes(0xff);
  sample_batch_params p;
  p.rows = rows.data();
  p.n_rows = c.rows;
  p.out = dout.data();
  run_cuda(p);
  device_synchronize();
  const std::vector<sample_output> got = dout.download();
  for (int r = 0; r < c.rows; ++r) {
    EXPECT_EQ(got[r].token, want[r].token) << "row " << r << " (temperature " << rows[r].temperature << ", top_k "
                                           << rows[r].top_k << ", top_p " << rows[r].top_p << ")";
    EXPECT_NEAR(got[r].logprob, want[r].logprob, 1e-5) << "row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, SampleCuda,
                         testing::Values(sample_case{152064, 70}, sample_case{32000, 64}, sample_case{4099, 200},
                                         sample_case{7, 33}, sample_case{1, 5}),
                         [](const testing::TestParamInfo<sample_case>& tp) {
                           return "Cuda_f32_vocab" + std::to_string(tp.param.vocab) + "_rows" +
                                  std::to_string(tp.param.rows);
                         });

// Many draws of one distribution: the same tokens as the CPU for every counter.
TEST(SampleCudaSeeds, Cuda_f32_SameTokensForEveryCounter) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i)) * 4.0f;
  auto dlogits = to_device(logits);
  const int n = 512;
  std::vector<sample_params> rows(n);
  std::vector<int32_t> want(n);
  for (int i = 0; i < n; ++i) {
    sample_params s;
    s.vocab = static_cast<int64_t>(logits.size());
    s.temperature = 0.8f;
    s.top_k = i % 2 == 0 ? 40 : 0;
    s.top_p = i % 3 == 0 ? 0.8f : 1.0f;
    s.seed = 99;
    s.counter = static_cast<uint64_t>(i);
    s.logits = logits.data();
    want[i] = sample_cpu(s).token;
    s.logits = dlogits.data();
    rows[i] = s;
  }
  device_array<sample_output> dout(n);
  sample_batch_params p;
  p.rows = rows.data();
  p.n_rows = n;
  p.out = dout.data();
  run_cuda(p);
  device_synchronize();
  const auto got = dout.download();
  for (int i = 0; i < n; ++i) EXPECT_EQ(got[i].token, want[i]) << "counter " << i;
}

TEST(SampleCudaValidation, Cuda_f32_RejectsLikeCpu) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  device_array<float> logits(4);
  device_array<sample_output> out(1);
  sample_params s;
  s.logits = logits.data();
  s.vocab = 4;
  sample_batch_params p;
  p.rows = &s;
  p.n_rows = 1;
  p.out = out.data();
  s.temperature = -1.0f;
  expect_invalid([&] { run_cuda(p); }, "temperature");
  s.temperature = 1.0f;
  s.top_p = 0.0f;
  expect_invalid([&] { run_cuda(p); }, "top_p");
  s.top_p = 1.0f;
  s.vocab = 0;
  expect_invalid([&] { run_cuda(p); }, "vocab");
}

}  // namespace
}  // namespace hyserve::kernels

#endif
