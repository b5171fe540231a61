// Backend ops: causal conv1d, varlen prefill and single-token update, CUDA against CPU.
// Tolerance (fp32): |Δ| <= 1e-5 + 1e-4·|want| on outputs (K-term sums, fused multiply-adds on
// the device); the saved windows are copies of inputs and must match exactly.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hyserve/kernels/device.h"

#if defined(HYSERVE_HAVE_CUDA)

#include "cuda_test_util.h"
#include "hyserve/kernels/causal_conv1d.h"

namespace hyserve::kernels {
namespace {

using cuda_test::expect_match;
using cuda_test::join;
using cuda_test::poison;
using cuda_test::random_floats;
using cuda_test::to_device;

struct varlen_case {
  int dim, width;
  std::vector<int> lens;
  int init;  // 0: none (has_initial_state null), 1: all, 2: alternate rows
  bool pad;  // a padding row (slot -1) is appended
  bool bias, silu;
  int x_pad = 0;
};

std::string varlen_name(const testing::TestParamInfo<varlen_case>& info) {
  const auto& c = info.param;
  std::string s = "Cuda_f32_dim" + std::to_string(c.dim) + "_width" + std::to_string(c.width) + "_len" + join(c.lens);
  s += c.init == 0 ? "_noinit" : c.init == 1 ? "_init" : "_mixedinit";
  if (c.pad) s += "_pad";
  if (!c.bias) s += "_nobias";
  if (!c.silu) s += "_nosilu";
  if (c.x_pad) s += "_strided";
  return s;
}

class Conv1dVarlenCuda : public testing::TestWithParam<varlen_case> {};

TEST_P(Conv1dVarlenCuda, MatchesCpu) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const varlen_case& c = GetParam();
  std::vector<int32_t> qsl{0};
  for (int len : c.lens) qsl.push_back(qsl.back() + len);
  if (c.pad) qsl.push_back(qsl.back() + 3);
  const int64_t batch = static_cast<int64_t>(qsl.size()) - 1;
  const int64_t tokens = qsl.back();
  const int64_t n_slots = 2 * batch + 1;
  const int64_t W = c.width - 1;
  const int64_t xs = c.dim + c.x_pad, os = c.dim + 2 * c.x_pad;

  const auto x = random_floats(static_cast<size_t>(tokens * xs), 71, -2.0f, 2.0f);
  const auto w = random_floats(static_cast<size_t>(c.dim * c.width), 72);
  const auto bias = random_floats(static_cast<size_t>(c.dim), 73);
  std::vector<float> states = random_floats(static_cast<size_t>((n_slots + 1) * c.dim * W), 74);
  std::vector<int32_t> slots(static_cast<size_t>(batch));
  std::vector<uint8_t> has_init(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    slots[b] = static_cast<int32_t>(n_slots - 2 * b);
    has_init[b] = c.init == 1 || (c.init == 2 && b % 2 == 0);
  }
  if (c.pad) slots[batch - 1] = -1;
  std::vector<float> out(static_cast<size_t>(tokens * os), poison());

  auto dx = to_device(x), dw = to_device(w), dbias = to_device(bias), dstates = to_device(states);
  auto dqsl = to_device(qsl), dslots = to_device(slots);
  auto dinit = to_device(has_init);
  device_array<float> dout(out.size());
  dout.fill_bytes(0xff);

  conv1d_varlen_params p;
  p.batch = batch;
  p.dim = c.dim;
  p.width = c.width;
  p.x_stride = xs;
  p.out_stride = os;
  p.silu = c.silu;
  conv1d_varlen_params pc = p;
  pc.x = x.data();
  pc.weight = w.data();
  pc.bias = c.bias ? bias.data() : nullptr;
  pc.out = out.data();
  pc.query_start_loc = qsl.data();
  pc.state_indices = slots.data();
  pc.has_initial_state = c.init == 0 ? nullptr : has_init.data();
  pc.conv_states = states.data();
  run_cpu(pc);
  conv1d_varlen_params pg = p;
  pg.x = dx.data();
  pg.weight = dw.data();
  pg.bias = c.bias ? dbias.data() : nullptr;
  pg.out = dout.data();
  pg.query_start_loc = dqsl.data();
  pg.state_indices = dslots.data();
  pg.has_initial_state = c.init == 0 ? nullptr : dinit.data();
  pg.conv_states = dstates.data();
  run_cuda(pg);
  device_synchronize();
  expect_match(dout.download(), out, 1e-5, 1e-4, "out");
  expect_match(dstates.download(), states, 0.0, 0.0, "conv_states");
}

INSTANTIATE_TEST_SUITE_P(
    Grid, Conv1dVarlenCuda,
    testing::Values(
        // Mamba2 conv dim (intermediate + 2·groups·state) with tails; sequences shorter than
        // the width (1, 2), exactly the width, and long ones cut into several token splits.
        varlen_case{4096 + 32, 4, {1, 2, 4, 300}, 2, true, true, true},
        varlen_case{4096 + 32, 4, {37, 16, 1}, 0, false, true, true},
        varlen_case{8192 + 256, 4, {1000}, 1, false, true, true},
        varlen_case{64, 4, {300, 3, 0, 17}, 1, true, false, false, 5},  // small dim: many splits; an empty row
        varlen_case{100, 3, {5, 33}, 2, false, true, true, 1},
        varlen_case{130, 2, {1, 64}, 1, true, true, false},
        // Four channels a thread (dim and strides multiples of 4) with strided rows.
        varlen_case{256, 4, {40, 1, 17}, 2, true, true, true, 4}),
    varlen_name);

struct update_case {
  int dim, width, batch;
  bool pad;  // row 1 is padding
  bool bias, silu;
};

class Conv1dUpdateCuda : public testing::TestWithParam<update_case> {};

TEST_P(Conv1dUpdateCuda, MatchesCpu) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const update_case& c = GetParam();
  const int64_t n_slots = c.batch + 2;
  const int64_t W = c.width - 1;
  const int64_t xs = c.dim + 1;
  const auto x = random_floats(static_cast<size_t>(c.batch * xs), 81, -2.0f, 2.0f);
  const auto w = random_floats(static_cast<size_t>(c.dim * c.width), 82);
  const auto bias = random_floats(static_cast<size_t>(c.dim), 83);
  std::vector<float> states = random_floats(static_cast<size_t>((n_slots + 1) * c.dim * W), 84);
  std::vector<int32_t> slots(static_cast<size_t>(c.batch));
  for (int b = 0; b < c.batch; ++b) slots[b] = static_cast<int32_t>(n_slots - b);
  if (c.pad && c.batch > 1) slots[1] = -1;
  std::vector<float> out(static_cast<size_t>(c.batch * c.dim), poison());
  auto dx = to_device(x), dw = to_device(w), dbias = to_device(bias), dstates = to_device(states);
  auto dslots = to_device(slots);
  device_array<float> dout(out.size());
  dout.fill_bytes(0xff);

  conv1d_update_params p;
  p.batch = c.batch;
  p.dim = c.dim;
  p.width = c.width;
  p.x_stride = xs;
  p.out_stride = c.dim;
  p.silu = c.silu;
  conv1d_update_params pc = p;
  pc.x = x.data();
  pc.weight = w.data();
  pc.bias = c.bias ? bias.data() : nullptr;
  pc.out = out.data();
  pc.state_indices = slots.data();
  pc.conv_states = states.data();
  run_cpu(pc);
  conv1d_update_params pg = p;
  pg.x = dx.data();
  pg.weight = dw.data();
  pg.bias = c.bias ? dbias.data() : nullptr;
  pg.out = dout.data();
  pg.state_indices = dslots.data();
  pg.conv_states = dstates.data();
  run_cuda(pg);
  device_synchronize();
  expect_match(dout.download(), out, 1e-5, 1e-4, "out");
  expect_match(dstates.download(), states, 0.0, 0.0, "conv_states");
}

INSTANTIATE_TEST_SUITE_P(Grid, Conv1dUpdateCuda,
                         testing::Values(update_case{4096 + 32, 4, 1, false, true, true},
                                         update_case{8192 + 256, 4, 64, true, true, true},
                                         update_case{100, 3, 5, true, false, true},
                                         update_case{33, 2, 256, true, true, false}),
                         [](const testing::TestParamInfo<update_case>& tp) {
                           const auto& c = tp.param;
                           return "Cuda_f32_dim" + std::to_string(c.dim) + "_width" + std::to_string(c.width) +
                                  "_bs" + std::to_string(c.batch) + (c.pad ? "_pad" : "") +
                                  (c.bias ? "" : "_nobias") + (c.silu ? "" : "_nosilu");
                         });

}  // namespace
}  // namespace hyserve::kernels

#endif
