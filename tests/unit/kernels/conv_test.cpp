// Causal depthwise conv1d (varlen prefill and single-token update) against a naive reference
// that materialises (saved window ++ sequence) per channel. Tolerance 1e-5 abs + 1e-5 rel.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "hyserve/kernels/causal_conv1d.h"
#include "kernel_test_util.h"

namespace hyserve::kernels {
namespace {

using test::expect_close;
using test::random_floats;

constexpr double kAtol = 1e-5;
constexpr double kRtol = 1e-5;
constexpr float kSentinel = -777.0f;

double silu_ref(double v) { return v / (1.0 + std::exp(-v)); }

struct conv_case {
  int width, dim;
  std::vector<int> lens;
  int init;  // 0: none (null flags), 1: all rows, 2: alternate rows
  bool pad, bias, silu;
};

std::string conv_name(const testing::TestParamInfo<conv_case>& info) {
  const auto& c = info.param;
  std::string s = "k" + std::to_string(c.width) + "_dim" + std::to_string(c.dim) + "_len" + test::join(c.lens) +
                  "_seqs" + std::to_string(c.lens.size());
  s += c.init == 0 ? "_noinit" : c.init == 1 ? "_init" : "_mixedinit";
  if (c.pad) s += "_pad";
  if (!c.bias) s += "_nobias";
  if (!c.silu) s += "_nosilu";
  return s;
}

class ConvVarlen : public testing::TestWithParam<conv_case> {};

TEST_P(ConvVarlen, MatchesNaive) {
  const conv_case& c = GetParam();
  const int64_t K = c.width, W = K - 1, dim = c.dim;
  std::vector<int32_t> qsl{0};
  for (int len : c.lens) qsl.push_back(qsl.back() + len);
  const int64_t live = static_cast<int64_t>(c.lens.size());
  if (c.pad) qsl.push_back(qsl.back() + 3);
  const int64_t batch = static_cast<int64_t>(qsl.size()) - 1;
  const int64_t tokens = qsl.back();
  const int64_t n_slots = batch + 2;
  const int64_t x_stride = dim + 3, out_stride = dim + 1;
  const uint32_t seed = static_cast<uint32_t>(K * 1000 + dim + tokens);

  const auto x = random_floats(static_cast<size_t>(tokens * x_stride), seed);
  const auto weight = random_floats(static_cast<size_t>(dim * K), seed + 1);
  const auto bias = random_floats(static_cast<size_t>(dim), seed + 2);
  auto states = random_floats(static_cast<size_t>((n_slots + 1) * dim * W), seed + 3);
  const auto states_before = states;
  std::vector<float> out(static_cast<size_t>(tokens * out_stride), kSentinel);
  std::vector<int32_t> slots(static_cast<size_t>(batch));
  std::vector<uint8_t> has_init(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    slots[b] = static_cast<int32_t>(n_slots - b);
    has_init[b] = c.init == 1 || (c.init == 2 && b % 2 == 1);
  }
  if (c.pad) slots[batch - 1] = -1;

  // Reference: ext = window (or zeros) ++ sequence; out[t] = act(bias + Σ_j w_j · ext[t + j]).
  std::vector<double> out_ref(static_cast<size_t>(tokens * dim));
  std::vector<double> states_ref(states.begin(), states.end());
  for (int64_t b = 0; b < live; ++b) {
    const int64_t len = qsl[b + 1] - qsl[b];
    for (int64_t ch = 0; ch < dim; ++ch) {
      std::vector<double> ext;
      for (int64_t j = 0; j < W; ++j) ext.push_back(has_init[b] ? states_before[(slots[b] * dim + ch) * W + j] : 0.0);
      for (int64_t t = 0; t < len; ++t) ext.push_back(x[(qsl[b] + t) * x_stride + ch]);
      for (int64_t t = 0; t < len; ++t) {
        double acc = c.bias ? bias[ch] : 0.0;
        for (int64_t j = 0; j < K; ++j) acc += static_cast<double>(weight[ch * K + j]) * ext[t + j];
        out_ref[(qsl[b] + t) * dim + ch] = c.silu ? silu_ref(acc) : acc;
      }
      for (int64_t j = 0; j < W; ++j) states_ref[(slots[b] * dim + ch) * W + j] = ext[len + j];
    }
  }

  conv1d_varlen_params p;
  p.x = x.data();
  p.weight = weight.data();
  p.bias = c.bias ? bias.data() : nullptr;
  p.out = out.data();
  p.query_start_loc = qsl.data();
  p.state_indices = slots.data();
  p.has_initial_state = c.init == 0 ? nullptr : has_init.data();
  p.conv_states = states.data();
  p.batch = batch;
  p.dim = dim;
  p.width = K;
  p.x_stride = x_stride;
  p.out_stride = out_stride;
  p.silu = c.silu;
  run_cpu(p);

  for (int64_t b = 0; b < live; ++b) {
    for (int64_t t = qsl[b]; t < qsl[b + 1]; ++t) {
      expect_close(out.data() + t * out_stride, out_ref.data() + t * dim, static_cast<size_t>(dim), kAtol, kRtol,
                   "out token " + std::to_string(t));
    }
  }
  if (c.pad) {
    for (int64_t t = qsl[batch - 1]; t < tokens; ++t) {
      for (int64_t i = 0; i < out_stride; ++i) ASSERT_EQ(out[t * out_stride + i], kSentinel);
    }
  }
  // Window copies are exact; untouched slots (incl. the padding row's) keep their contents.
  expect_close(states, states_ref, 0.0, 0.0, "conv_states");
}

INSTANTIATE_TEST_SUITE_P(Grid, ConvVarlen,
                         testing::Values(conv_case{4, 8, {1, 2, 7}, 0, false, true, true},  // lens < K-1
                                         conv_case{4, 8, {1, 2, 7}, 1, true, true, true},
                                         conv_case{4, 70, {1, 2, 7}, 2, true, true, false},  // dim crosses a block
                                         conv_case{2, 5, {1, 9}, 1, false, false, true},
                                         conv_case{2, 5, {1, 9}, 0, true, true, true},
                                         conv_case{3, 130, {40, 1, 2}, 2, false, true, true},
                                         conv_case{3, 16, {2}, 1, false, true, true},  // len == K-1
                                         conv_case{4, 33, {3, 4}, 1, true, false, false},
                                         conv_case{1, 9, {5, 1}, 1, false, true, true},  // no window
                                         conv_case{4, 256, {100, 63}, 1, true, true, true}),
                         conv_name);

struct update_case {
  int width, dim, batch;
  bool pad, bias, silu;
};

std::string update_name(const testing::TestParamInfo<update_case>& info) {
  const auto& c = info.param;
  std::string s = "k" + std::to_string(c.width) + "_dim" + std::to_string(c.dim) + "_bs" + std::to_string(c.batch);
  if (c.pad) s += "_pad";
  if (!c.bias) s += "_nobias";
  if (!c.silu) s += "_nosilu";
  return s;
}

class ConvUpdate : public testing::TestWithParam<update_case> {};

TEST_P(ConvUpdate, MatchesNaive) {
  const update_case& c = GetParam();
  const int64_t K = c.width, W = K - 1, dim = c.dim, batch = c.batch;
  const int64_t n_slots = batch + 1;
  const int64_t x_stride = dim + 2, out_stride = dim + 4;
  const uint32_t seed = static_cast<uint32_t>(K * 100 + dim + batch);
  const auto x = random_floats(static_cast<size_t>(batch * x_stride), seed);
  const auto weight = random_floats(static_cast<size_t>(dim * K), seed + 1);
  const auto bias = random_floats(static_cast<size_t>(dim), seed + 2);
  auto states = random_floats(static_cast<size_t>((n_slots + 1) * dim * W), seed + 3);
  const auto states_before = states;
  std::vector<float> out(static_cast<size_t>(batch * out_stride), kSentinel);
  std::vector<int32_t> slots(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) slots[b] = static_cast<int32_t>(n_slots - b);
  if (c.pad) slots[batch / 2] = -1;

  std::vector<double> out_ref(static_cast<size_t>(batch * dim));
  std::vector<double> states_ref(states.begin(), states.end());
  for (int64_t b = 0; b < batch; ++b) {
    if (slots[b] < 0) continue;
    for (int64_t ch = 0; ch < dim; ++ch) {
      const float* win = states_before.data() + (slots[b] * dim + ch) * W;
      double acc = c.bias ? bias[ch] : 0.0;
      for (int64_t j = 0; j < W; ++j) acc += static_cast<double>(weight[ch * K + j]) * win[j];
      acc += static_cast<double>(weight[ch * K + W]) * x[b * x_stride + ch];
      out_ref[b * dim + ch] = c.silu ? silu_ref(acc) : acc;
      for (int64_t j = 0; j < W; ++j) {
        states_ref[(slots[b] * dim + ch) * W + j] = j + 1 < W ? win[j + 1] : x[b * x_stride + ch];
      }
    }
  }

  conv1d_update_params p;
  p.x = x.data();
  p.weight = weight.data();
  p.bias = c.bias ? bias.data() : nullptr;
  p.out = out.data();
  p.state_indices = slots.data();
  p.conv_states = states.data();
  p.batch = batch;
  p.dim = dim;
  p.width = K;
  p.x_stride = x_stride;
  p.out_stride = out_stride;
  p.silu = c.silu;
  run_cpu(p);

  for (int64_t b = 0; b < batch; ++b) {
    if (slots[b] < 0) {
      for (int64_t i = 0; i < out_stride; ++i) ASSERT_EQ(out[b * out_stride + i], kSentinel);
      continue;
    }
    expect_close(out.data() + b * out_stride, out_ref.data() + b * dim, static_cast<size_t>(dim), kAtol, kRtol,
                 "out row " + std::to_string(b));
  }
  expect_close(states, states_ref, 0.0, 0.0, "conv_states");
}

INSTANTIATE_TEST_SUITE_P(Grid, ConvUpdate,
                         testing::Values(update_case{2, 8, 1, false, true, true},
                                         update_case{3, 70, 4, true, true, true},
                                         update_case{4, 130, 5, true, false, true},
                                         update_case{4, 64, 3, false, true, false}),
                         update_name);

// Varlen prefill of a head then one update per remaining token equals varlen over the whole.
TEST(ConvConsistency, PrefillThenUpdatesEqualsWholePrefill) {
  const int64_t K = 4, W = 3, dim = 20, len = 9, head = 2;
  const auto x = random_floats(static_cast<size_t>(len * dim), 5u);
  const auto weight = random_floats(static_cast<size_t>(dim * K), 6u);
  const auto bias = random_floats(static_cast<size_t>(dim), 7u);
  const auto init = random_floats(static_cast<size_t>(dim * W), 8u);
  const int32_t slot = 0;
  const uint8_t has_init = 1;

  auto varlen = [&](const float* xs, int32_t n, float* out, std::vector<float>& states) {
    const std::vector<int32_t> qsl{0, n};
    conv1d_varlen_params p;
    p.x = xs;
    p.weight = weight.data();
    p.bias = bias.data();
    p.out = out;
    p.query_start_loc = qsl.data();
    p.state_indices = &slot;
    p.has_initial_state = &has_init;
    p.conv_states = states.data();
    p.batch = 1;
    p.dim = dim;
    p.width = K;
    p.x_stride = dim;
    p.out_stride = dim;
    run_cpu(p);
  };

  std::vector<float> whole_out(static_cast<size_t>(len * dim)), whole_states = init;
  varlen(x.data(), static_cast<int32_t>(len), whole_out.data(), whole_states);

  std::vector<float> split_out(static_cast<size_t>(len * dim)), split_states = init;
  varlen(x.data(), static_cast<int32_t>(head), split_out.data(), split_states);
  for (int64_t t = head; t < len; ++t) {
    conv1d_update_params p;
    p.x = x.data() + t * dim;
    p.weight = weight.data();
    p.bias = bias.data();
    p.out = split_out.data() + t * dim;
    p.state_indices = &slot;
    p.conv_states = split_states.data();
    p.batch = 1;
    p.dim = dim;
    p.width = K;
    p.x_stride = dim;
    p.out_stride = dim;
    run_cpu(p);
  }
  expect_close(split_out, whole_out, kAtol, kRtol, "out");
  expect_close(split_states, whole_states, 0.0, 0.0, "conv_states");
}

}  // namespace
}  // namespace hyserve::kernels
