// Backend ops: seeded sampling (greedy / temperature / top-k / top-p) batched over rows with
// the settings in device memory (sample_rows_params, what a step runs inside its graph), CUDA
// against sample_cpu row by row. Tokens must be identical (same candidate order, same
// counter-based generator): the CUDA op adds the candidates' probabilities in another order, so
// a draw can differ only when it lands within ~1e-16 (relative) of a boundary between two
// candidates; the tests count such near-boundary draws (none occur in these cases) and require
// every other draw to match. Logprobs agree to |Δ| <= 1e-5 (double sums in another order).
// A chi-square test checks the GPU's temperature / top-p draws against the distribution.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "hyserve/kernels/device.h"

#if defined(HYSERVE_HAVE_CUDA)

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
sample_settings settings(int r, int vocab) {
  sample_settings s;
  const float temps[] = {0.0f, 1.0f, 0.7f, 1.5f, 0.3f};
  const int32_t ks[] = {0, 0, 1, 50, -3, 0, 20};
  const float ps[] = {1.0f, 0.9f, 0.5f, 1.0f, 1e-6f, 0.99f};
  s.temperature = temps[r % 5];
  s.top_k = r % 11 == 10 ? vocab + 5 : ks[r % 7];
  s.top_p = ps[r % 6];
  s.seed = 1234567ull * static_cast<uint64_t>(r + 1);
  s.counter = static_cast<uint64_t>(r * 3);
  s.want_logprob = r % 4 == 3 ? 0 : 1;
  return s;
}

sample_params as_params(const sample_settings& s, const float* logits, int64_t vocab) {
  sample_params p;
  p.logits = logits;
  p.vocab = vocab;
  p.temperature = s.temperature;
  p.top_k = s.top_k;
  p.top_p = s.top_p;
  p.seed = s.seed;
  p.counter = s.counter;
  p.want_logprob = s.want_logprob != 0;
  return p;
}

// Runs the CUDA op over host logits [rows, stride] and settings; returns its outputs.
std::vector<sample_output> sample_on_device(const std::vector<float>& logits, int64_t rows, int64_t vocab,
                                            int64_t stride, const std::vector<sample_settings>& s) {
  auto dlogits = to_device(logits);
  device_array<sample_settings> dsettings(s.size());
  dsettings.upload(s);
  device_array<sample_output> dout(static_cast<size_t>(rows));
  dout.fill_bytes(0xff);
  sample_rows_params p;
  p.logits = dlogits.data();
  p.settings = dsettings.data();
  p.out = dout.data();
  p.rows = rows;
  p.vocab = vocab;
  p.stride = stride;
  run_cuda(p);
  device_synchronize();
  return dout.download();
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
  std::vector<sample_settings> rows(static_cast<size_t>(c.rows));
  std::vector<sample_output> want(static_cast<size_t>(c.rows));
  for (int r = 0; r < c.rows; ++r) {
    rows[r] = settings(r, c.vocab);
    want[r] = sample_cpu(as_params(rows[r], logits.data() + static_cast<size_t>(r) * c.vocab, c.vocab));
  }
  const std::vector<sample_output> got = sample_on_device(logits, c.rows, c.vocab, c.vocab, rows);
  for (int r = 0; r < c.rows; ++r) {
    EXPECT_EQ(got[r].token, want[r].token) << "row " << r << " (temperature " << rows[r].temperature << ", top_k "
                                           << rows[r].top_k << ", top_p " << rows[r].top_p << ")";
    if (rows[r].want_logprob) EXPECT_NEAR(got[r].logprob, want[r].logprob, 1e-5) << "row " << r;
    else EXPECT_EQ(got[r].logprob, 0.0f) << "row " << r;
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
  const int n = 512;
  const auto V = static_cast<int64_t>(logits.size());
  std::vector<float> rows_logits;  // the same row n times (row stride V)
  std::vector<sample_settings> rows(n);
  std::vector<int32_t> want(n);
  for (int i = 0; i < n; ++i) {
    sample_settings s;
    s.temperature = 0.8f;
    s.top_k = i % 2 == 0 ? 40 : 0;
    s.top_p = i % 3 == 0 ? 0.8f : 1.0f;
    s.seed = 99;
    s.counter = static_cast<uint64_t>(i);
    want[i] = sample_cpu(as_params(s, logits.data(), V)).token;
    rows[i] = s;
    rows_logits.insert(rows_logits.end(), logits.begin(), logits.end());
  }
  const auto got = sample_on_device(rows_logits, n, V, V, rows);
  for (int i = 0; i < n; ++i) EXPECT_EQ(got[i].token, want[i]) << "counter " << i;
}

// Rows at a stride wider than the vocabulary (a logits buffer of a larger bucket): only the
// first vocab columns of each row count.
TEST(SampleCudaSeeds, Cuda_f32_RowStrideWiderThanVocab) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t V = 300, stride = 512, rows = 40;
  std::vector<float> logits(static_cast<size_t>(rows * stride), 100.0f);  // padding columns would win
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<sample_settings> s(static_cast<size_t>(rows));
  std::vector<sample_output> want(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t v = 0; v < V; ++v) logits[static_cast<size_t>(r * stride + v)] = normal(gen);
    s[r] = settings(static_cast<int>(r), static_cast<int>(V));
    want[r] = sample_cpu(as_params(s[r], logits.data() + r * stride, V));
  }
  const auto got = sample_on_device(logits, rows, V, stride, s);
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(got[r].token, want[r].token) << "row " << r;
}

// Pearson's chi-square of N GPU draws (temperature 0.7, top-p 0.9 over a 64-token vocabulary)
// against the distribution sample_cpu defines: softmax(logits / 0.7) restricted to the smallest
// prefix of mass >= 0.9 and renormalised. Tokens outside the nucleus must never be drawn. The
// statistic must stay below the 0.999 quantile of chi-square with (nucleus - 1) degrees of
// freedom (Wilson–Hilferty), so a correct sampler fails this one time in a thousand seeds (the
// seed is fixed: the test is deterministic).
TEST(SampleCudaDistribution, Cuda_f32_ChiSquareTemperatureTopP) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t V = 64, N = 40000;
  const float temperature = 0.7f, top_p = 0.9f;
  std::vector<float> row(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v) row[static_cast<size_t>(v)] = 2.5f * std::cos(0.37f * static_cast<float>(v * v % 61));
  // The expected distribution, computed as sample_cpu defines it.
  std::vector<int32_t> order(static_cast<size_t>(V));
  for (int32_t v = 0; v < V; ++v) order[static_cast<size_t>(v)] = v;
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
  std::vector<double> prob(static_cast<size_t>(V), 0.0);
  double total = 0.0;
  for (int32_t v : order) total += std::exp(static_cast<double>(row[v] - row[order[0]]) / temperature);
  double acc = 0.0;
  size_t nucleus = 0;
  for (int32_t v : order) {
    prob[static_cast<size_t>(v)] = std::exp(static_cast<double>(row[v] - row[order[0]]) / temperature);
    acc += prob[static_cast<size_t>(v)] / total;
    ++nucleus;
    if (acc >= top_p) break;
  }
  double kept = 0.0;
  for (size_t i = 0; i < nucleus; ++i) kept += prob[static_cast<size_t>(order[i])];
  for (size_t i = nucleus; i < order.size(); ++i) prob[static_cast<size_t>(order[i])] = 0.0;
  ASSERT_GE(nucleus, 5u);

  std::vector<float> logits;
  std::vector<sample_settings> s(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    logits.insert(logits.end(), row.begin(), row.end());
    s[static_cast<size_t>(i)].temperature = temperature;
    s[static_cast<size_t>(i)].top_p = top_p;
    s[static_cast<size_t>(i)].seed = 20261204;
    s[static_cast<size_t>(i)].counter = static_cast<uint64_t>(i);
  }
  const auto got = sample_on_device(logits, N, V, V, s);
  std::vector<int64_t> count(static_cast<size_t>(V), 0);
  for (const sample_output& o : got) {
    ASSERT_GE(o.token, 0);
    ASSERT_LT(o.token, V);
    ++count[static_cast<size_t>(o.token)];
  }
  double chi2 = 0.0;
  for (int64_t v = 0; v < V; ++v) {
    const double p = prob[static_cast<size_t>(v)] / kept;
    if (p == 0.0) {
      EXPECT_EQ(count[static_cast<size_t>(v)], 0) << "token " << v << " lies outside the top-p nucleus";
      continue;
    }
    const double e = p * static_cast<double>(N);
    chi2 += (static_cast<double>(count[static_cast<size_t>(v)]) - e) * (static_cast<double>(count[static_cast<size_t>(v)]) - e) / e;
  }
  const double k = static_cast<double>(nucleus - 1), z999 = 3.0902;
  const double bound = k * std::pow(1.0 - 2.0 / (9.0 * k) + z999 * std::sqrt(2.0 / (9.0 * k)), 3.0);
  EXPECT_LT(chi2, bound) << nucleus << " candidates, " << N << " draws";
  std::printf("[sample-chi2] nucleus %zu, draws %lld, chi2 %.2f, 0.999 bound %.2f\n", nucleus,
              static_cast<long long>(N), chi2, bound);
}

TEST(SampleCudaValidation, Cuda_f32_RejectsBadShapesAndSettings) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  device_array<float> logits(4);
  device_array<sample_settings> settings(1);
  device_array<sample_output> out(1);
  sample_rows_params p;
  p.logits = logits.data();
  p.settings = settings.data();
  p.out = out.data();
  p.rows = 1;
  p.vocab = 4;
  p.stride = 4;
  p.vocab = 0;
  expect_invalid([&] { run_cuda(p); }, "vocab");
  p.vocab = 4;
  p.stride = 3;
  expect_invalid([&] { run_cuda(p); }, "stride");
  p.stride = 4;
  p.settings = nullptr;
  expect_invalid([&] { run_cuda(p); }, "settings");
  // Values are checked on the host before they are uploaded (check_sample_settings).
  sample_settings s;
  s.temperature = -1.0f;
  expect_invalid([&] { check_sample_settings(s); }, "temperature");
  s.temperature = 1.0f;
  s.top_p = 0.0f;
  expect_invalid([&] { check_sample_settings(s); }, "top_p");
  s.top_p = 1.0f;
  s.top_k = -2;
  expect_invalid([&] { check_sample_settings(s); }, "top_k");
}

// A captured step cannot fail on the device: settings outside their ranges act as the nearest
// valid ones (a negative or non-finite temperature greedy, top_p above 1 as 1).
TEST(SampleCudaValidation, Cuda_f32_OutOfRangeSettingsActAsNearestValid) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const std::vector<float> row = {0.5f, 3.0f, 1.0f, 2.9f, -1.0f};
  std::vector<float> logits;
  std::vector<sample_settings> s(3);
  for (int i = 0; i < 3; ++i) logits.insert(logits.end(), row.begin(), row.end());
  s[0].temperature = -1.0f;
  s[1].temperature = std::numeric_limits<float>::quiet_NaN();
  s[2].temperature = 1.0f;
  s[2].top_p = 7.0f;
  s[2].seed = 5;
  const auto got = sample_on_device(logits, 3, 5, 5, s);
  EXPECT_EQ(got[0].token, 1);
  EXPECT_EQ(got[1].token, 1);
  sample_settings valid = s[2];
  valid.top_p = 1.0f;
  EXPECT_EQ(got[2].token, sample_cpu(as_params(valid, row.data(), 5)).token);
}

// The overlapped step loop's token feed: scatter by slot, then placeholders resolved.
TEST(LastTokenCuda, Cuda_i32_ScatterThenResolveEqualsCpu) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const std::vector<sample_output> sampled = {{11, 0.f}, {22, 0.f}, {33, 0.f}, {44, 0.f}};
  const std::vector<int32_t> slots = {3, -1, 0, 7};
  std::vector<int32_t> last(8, 5);
  std::vector<int32_t> ids = {1, -4, -1, -8, 9, -2, 0};
  std::vector<int32_t> want_last = last, want_ids = ids;
  run_cpu(last_token_scatter_params{sampled.data(), slots.data(), want_last.data(), 4, 8});
  run_cpu(token_resolve_params{want_ids.data(), want_last.data(), static_cast<int64_t>(ids.size()), 8});
  EXPECT_EQ(want_ids, (std::vector<int32_t>{1, 11, 33, 44, 9, 5, 0}));
  device_array<sample_output> dsampled(sampled.size());
  dsampled.upload(sampled);
  auto dslots = to_device(slots);
  auto dlast = to_device(last);
  auto dids = to_device(ids);
  run_cuda(last_token_scatter_params{dsampled.data(), dslots.data(), dlast.data(), 4, 8});
  run_cuda(token_resolve_params{dids.data(), dlast.data(), static_cast<int64_t>(ids.size()), 8});
  device_synchronize();
  EXPECT_EQ(dlast.download(), want_last);
  EXPECT_EQ(dids.download(), want_ids);
}

}  // namespace
}  // namespace hyserve::kernels

#endif
