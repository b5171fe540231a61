// Speculative-decoding ops, CUDA against CPU: the multi-token selective state update (chain,
// tree and Draft-mode layouts, a padding row; io and state each f32 or bf16), the multi-token
// conv update (the same layouts, widths 2-4), the fused commit (f32 and bf16 states) and
// tree-masked attention (f32 and bf16 KV cache; on the decode kernels and, for GQA 3, the
// warp-per-node kernel).
// Tolerances: f32 storage |Δ| <= 1e-5 + 1e-4·|want| (fused multiply-adds on the device); bf16
// storage 1e-2 + 1e-2·|want| (a value may round to the neighbouring bf16, ~0.4% relative, and a
// later token starts from it); the commit copies bits and must match exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "hyserve/kernels/device.h"

#if defined(HYSERVE_HAVE_CUDA)

#include "cuda_test_util.h"
#include "hyserve/common/dtype.h"
#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/causal_conv1d.h"
#include "hyserve/kernels/ssm.h"

namespace hyserve::kernels {
namespace {

using cuda_test::expect_equal;
using cuda_test::expect_match;
using cuda_test::random_floats;
using cuda_test::to_device;

// Values stored as `t` (f32 or bf16 bit patterns) in a byte vector, and back to f32.
std::vector<uint8_t> encode(const std::vector<float>& v, dtype t) {
  std::vector<uint8_t> out(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == dtype::kBF16) {
      const uint16_t h = f32_to_bf16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    }
  }
  return out;
}

std::vector<float> decode(const std::vector<uint8_t>& bytes, dtype t) {
  const size_t n = bytes.size() / dtype_size(t);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == dtype::kBF16) {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      out[i] = bf16_to_f32(h);
    } else {
      std::memcpy(&out[i], bytes.data() + 4 * i, 4);
    }
  }
  return out;
}

double tol(dtype t) { return t == dtype::kBF16 ? 1e-2 : 1e-5; }
double rtol(dtype t) { return t == dtype::kBF16 ? 1e-2 : 1e-4; }

struct multi_case {
  dtype io, st;
  int layout;  // 0 chain, 1 tree, 2 Draft-mode start columns
  int d_state;
};

std::string multi_name(const testing::TestParamInfo<multi_case>& info) {
  static const char* const layouts[] = {"chain", "tree", "draft_steps"};
  const auto& c = info.param;
  return std::string("io_") + std::string(dtype_name(c.io)) + "_state_" + std::string(dtype_name(c.st)) + "_" +
         layouts[c.layout] + "_dstate" + std::to_string(c.d_state);
}

class SsmUpdateMultiCuda : public testing::TestWithParam<multi_case> {};

TEST_P(SsmUpdateMultiCuda, MatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const multi_case& c = GetParam();
  const int64_t batch = 3, H = 8, P = 16, N = c.d_state, G = 2, n_slots = 6;
  const int64_t T = c.layout == 2 ? 1 : 5, steps = c.layout == 2 ? 4 : 5, tokens = batch * T;
  const int64_t elems = H * P * N, xs = H * P + 2, dts = H + 1, bcs = G * N + 3, ys = H * P;
  const std::vector<int32_t> slots = {4, -1, 1};
  std::vector<int32_t> parent;  // tree: 0 root; 1, 2 under 0; 3 under 1; 4 under 2
  if (c.layout == 1)
    for (int64_t b = 0; b < batch; ++b) parent.insert(parent.end(), {-1, 0, 0, 1, 2});
  std::vector<int32_t> first;
  if (c.layout == 2) first = {2, 0, 3};

  const auto x = encode(random_floats(static_cast<size_t>(tokens * xs), 201), c.io);
  const auto dt = encode(random_floats(static_cast<size_t>(tokens * dts), 202, -3.0f, 1.0f), c.io);
  const auto bc = encode(random_floats(static_cast<size_t>(tokens * bcs), 203), c.io);
  const auto cc = encode(random_floats(static_cast<size_t>(tokens * bcs), 204), c.io);
  const auto dt_bias = random_floats(static_cast<size_t>(H), 205, -0.5f, 0.5f);
  const auto A_log = random_floats(static_cast<size_t>(H), 206);
  const auto D = random_floats(static_cast<size_t>(H), 207);
  const auto states = encode(random_floats(static_cast<size_t>((n_slots + 1) * elems), 208), c.st);
  // Step columns start seeded (Draft-mode rows read column first − 1).
  std::vector<uint8_t> step_buf = encode(random_floats(static_cast<size_t>(batch * steps * elems), 209), c.st);
  std::vector<uint8_t> y = encode(std::vector<float>(static_cast<size_t>(tokens * ys), 512.0f), c.io);

  auto dx = to_device(x), ddt = to_device(dt), dbc = to_device(bc), dcc = to_device(cc);
  auto dbias = to_device(dt_bias), dA = to_device(A_log), dD = to_device(D);
  auto dstates = to_device(states), dsteps = to_device(step_buf), dy = to_device(y);
  auto dslots = to_device(slots);
  device_array<int32_t> dparent, dfirst;
  if (!parent.empty()) dparent = to_device(parent);
  if (!first.empty()) dfirst = to_device(first);

  auto fill = [&](selective_state_update_multi_params& p, bool dev) {
    p.x = dev ? static_cast<const void*>(dx.data()) : x.data();
    p.dt = dev ? static_cast<const void*>(ddt.data()) : dt.data();
    p.B = dev ? static_cast<const void*>(dbc.data()) : bc.data();
    p.C = dev ? static_cast<const void*>(dcc.data()) : cc.data();
    p.dt_bias = dev ? dbias.data() : dt_bias.data();
    p.A_log = dev ? dA.data() : A_log.data();
    p.D = dev ? dD.data() : D.data();
    p.y = dev ? static_cast<void*>(dy.data()) : y.data();
    p.ssm_states = dev ? static_cast<void*>(dstates.data()) : const_cast<uint8_t*>(states.data());
    p.step_states = dev ? static_cast<void*>(dsteps.data()) : step_buf.data();
    p.state_indices = dev ? dslots.data() : slots.data();
    p.retrieve_parent = parent.empty() ? nullptr : dev ? dparent.data() : parent.data();
    p.first_step = first.empty() ? nullptr : dev ? dfirst.data() : first.data();
    p.batch = batch;
    p.heads = H;
    p.head_dim = P;
    p.d_state = N;
    p.n_groups = G;
    p.x_stride = xs;
    p.dt_stride = dts;
    p.bc_stride = bcs;
    p.y_stride = ys;
    p.tokens_per_row = T;
    p.steps = steps;
    p.io_dtype = c.io;
    p.state_dtype = c.st;
  };
  selective_state_update_multi_params cpu, gpu;
  fill(cpu, false);
  fill(gpu, true);
  run_cpu(cpu);
  run_cuda(gpu);
  device_synchronize();

  // y: the padding row keeps its fill value (512, exact in bf16) on both sides.
  expect_match(decode(dy.download(), c.io), decode(y, c.io), 3 * tol(c.io), 2 * rtol(c.io), "y");
  expect_match(decode(dsteps.download(), c.st), decode(step_buf, c.st), tol(c.st), rtol(c.st), "step states");
  expect_equal(dstates.download(), states, "persistent states (read only)");
}

std::vector<multi_case> multi_cases() {
  std::vector<multi_case> out;
  for (auto [io, st] : {std::pair{dtype::kF32, dtype::kF32}, std::pair{dtype::kBF16, dtype::kF32},
                        std::pair{dtype::kF32, dtype::kBF16}, std::pair{dtype::kBF16, dtype::kBF16}})
    for (int layout = 0; layout < 3; ++layout) out.push_back({io, st, layout, layout == 1 ? 128 : 16});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cuda, SsmUpdateMultiCuda, testing::ValuesIn(multi_cases()), multi_name);

// Multi-token conv update: chain, tree and Draft-mode start windows, a padding row, strided x
// and out, widths 2, 3, 4. Outputs within 1e-5 + 1e-5·|want| (fused multiply-adds, expf);
// windows are copies and must match exactly; the slots' windows are read only.
struct conv_multi_case {
  int layout;  // 0 chain, 1 tree, 2 Draft-mode start columns
  int width;
};

class ConvUpdateMultiCuda : public testing::TestWithParam<conv_multi_case> {};

TEST_P(ConvUpdateMultiCuda, MatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const conv_multi_case& c = GetParam();
  const int64_t batch = 3, dim = 300, K = c.width, W = K - 1, n_slots = 6;
  const int64_t T = c.layout == 2 ? 1 : 5, steps = c.layout == 2 ? 4 : 5, tokens = batch * T;
  const int64_t xs = dim + 5, os = dim + 3;
  const std::vector<int32_t> slots = {4, -1, 1};
  std::vector<int32_t> parent;  // tree: 0 root; 1, 2 under 0; 3 under 1; 4 under 2
  if (c.layout == 1)
    for (int64_t b = 0; b < batch; ++b) parent.insert(parent.end(), {-1, 0, 0, 1, 2});
  std::vector<int32_t> first;
  if (c.layout == 2) first = {2, 0, 3};
  const auto x = random_floats(static_cast<size_t>(tokens * xs), 301);
  const auto weight = random_floats(static_cast<size_t>(dim * K), 302);
  const auto bias = random_floats(static_cast<size_t>(dim), 303);
  const auto states = random_floats(static_cast<size_t>((n_slots + 1) * dim * W), 304);
  std::vector<float> windows = random_floats(static_cast<size_t>(batch * steps * dim * W), 305);
  std::vector<float> out(static_cast<size_t>(tokens * os), 512.0f);
  auto dx = to_device(x), dw = to_device(weight), db = to_device(bias), dstates = to_device(states);
  auto dwin = to_device(windows), dout = to_device(out);
  auto dslots = to_device(slots);
  device_array<int32_t> dparent, dfirst;
  if (!parent.empty()) dparent = to_device(parent);
  if (!first.empty()) dfirst = to_device(first);
  auto fill = [&](conv1d_update_multi_params& p, bool dev) {
    p.x = dev ? dx.data() : x.data();
    p.weight = dev ? dw.data() : weight.data();
    p.bias = dev ? db.data() : bias.data();
    p.out = dev ? dout.data() : out.data();
    p.state_indices = dev ? dslots.data() : slots.data();
    p.conv_states = dev ? dstates.data() : states.data();
    p.step_windows = dev ? dwin.data() : windows.data();
    p.retrieve_parent = parent.empty() ? nullptr : dev ? dparent.data() : parent.data();
    p.first_step = first.empty() ? nullptr : dev ? dfirst.data() : first.data();
    p.batch = batch;
    p.dim = dim;
    p.width = K;
    p.tokens_per_row = T;
    p.steps = steps;
    p.x_stride = xs;
    p.out_stride = os;
    p.silu = true;
  };
  conv1d_update_multi_params cpu, gpu;
  fill(cpu, false);
  fill(gpu, true);
  run_cpu(cpu);
  run_cuda(gpu);
  device_synchronize();
  expect_match(dout.download(), out, 1e-5, 1e-5, "out");
  expect_equal(dwin.download(), windows, "step windows");
  expect_equal(dstates.download(), states, "slot windows (read only)");
}

std::vector<conv_multi_case> conv_multi_cases() { return {{0, 4}, {1, 4}, {2, 4}, {0, 2}, {1, 3}}; }

std::string conv_multi_name(const testing::TestParamInfo<conv_multi_case>& info) {
  static const char* const layouts[] = {"chain", "tree", "draft_steps"};
  return std::string(layouts[info.param.layout]) + "_width" + std::to_string(info.param.width);
}

INSTANTIATE_TEST_SUITE_P(Cuda, ConvUpdateMultiCuda, testing::ValuesIn(conv_multi_cases()), conv_multi_name);

class StateCommitCuda : public testing::TestWithParam<dtype> {};

TEST_P(StateCommitCuda, CopiesTheSameBitsAsCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const dtype st = GetParam();
  const int64_t layers = 3, n_slots = 5, rows = 4, steps = 3, se = 40, ce = 12;
  std::vector<std::vector<uint8_t>> ssm, ssm_steps;
  std::vector<std::vector<float>> conv, conv_steps;
  std::vector<device_array<uint8_t>> dssm, dssm_steps;
  std::vector<device_array<float>> dconv, dconv_steps;
  for (int64_t l = 0; l < layers; ++l) {
    const auto s = static_cast<uint32_t>(l);
    ssm.push_back(encode(random_floats(static_cast<size_t>((n_slots + 1) * se), 300 + s), st));
    ssm_steps.push_back(encode(random_floats(static_cast<size_t>(rows * steps * se), 310 + s), st));
    conv.push_back(random_floats(static_cast<size_t>((n_slots + 1) * ce), 320 + s));
    conv_steps.push_back(random_floats(static_cast<size_t>(rows * steps * ce), 330 + s));
    dssm.push_back(to_device(ssm.back()));
    dssm_steps.push_back(to_device(ssm_steps.back()));
    dconv.push_back(to_device(conv.back()));
    dconv_steps.push_back(to_device(conv_steps.back()));
  }
  const std::vector<int32_t> slots = {3, -1, 0, 5}, crow = {2, 1, 0, 3}, cstep = {1, 0, 2, 0};
  auto dslots = to_device(slots), drow = to_device(crow), dstep = to_device(cstep);
  std::vector<void*> h_ssm, d_ssm;
  std::vector<const void*> h_ssm_steps, d_ssm_steps;
  std::vector<float*> h_conv, d_conv;
  std::vector<const float*> h_conv_steps, d_conv_steps;
  for (size_t l = 0; l < static_cast<size_t>(layers); ++l) {
    h_ssm.push_back(ssm[l].data());
    h_ssm_steps.push_back(ssm_steps[l].data());
    h_conv.push_back(conv[l].data());
    h_conv_steps.push_back(conv_steps[l].data());
    d_ssm.push_back(dssm[l].data());
    d_ssm_steps.push_back(dssm_steps[l].data());
    d_conv.push_back(dconv[l].data());
    d_conv_steps.push_back(dconv_steps[l].data());
  }
  auto fill = [&](state_commit_params& p, bool dev) {
    p.n_layers = layers;
    p.ssm_states = dev ? d_ssm.data() : h_ssm.data();
    p.ssm_steps = dev ? d_ssm_steps.data() : h_ssm_steps.data();
    p.conv_states = dev ? d_conv.data() : h_conv.data();
    p.conv_steps = dev ? d_conv_steps.data() : h_conv_steps.data();
    p.state_elems = se;
    p.conv_elems = ce;
    p.steps = steps;
    p.slots = dev ? dslots.data() : slots.data();
    p.rows = dev ? drow.data() : crow.data();
    p.steps_taken = dev ? dstep.data() : cstep.data();
    p.n_commits = static_cast<int64_t>(slots.size());
    p.state_dtype = st;
  };
  state_commit_params cpu, gpu;
  fill(cpu, false);
  fill(gpu, true);
  run_cpu(cpu);
  run_cuda(gpu);
  device_synchronize();
  for (size_t l = 0; l < static_cast<size_t>(layers); ++l) {
    expect_equal(dssm[l].download(), ssm[l], "ssm states layer " + std::to_string(l));
    expect_equal(dconv[l].download(), conv[l], "conv windows layer " + std::to_string(l));
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, StateCommitCuda, testing::Values(dtype::kF32, dtype::kBF16),
                         [](const testing::TestParamInfo<dtype>& i) { return std::string(dtype_name(i.param)); });

struct tree_case {
  dtype kv;
  int head_dim;
  int q_heads = 8;  // over 2 kv heads: 8 on the decode kernels, 6 (GQA 3) on the warp-per-node kernel
};

class TreeAttentionCuda : public testing::TestWithParam<tree_case> {};

TEST_P(TreeAttentionCuda, MatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const tree_case& c = GetParam();
  const int64_t batch = 3, Dn = 6, qh = c.q_heads, kvh = 2, hd = c.head_dim, ps = 16, n_pages_total = 12;
  const int64_t kv_row = kvh * hd, stride = 4;
  const std::vector<int32_t> seq = {37, 6, 64};
  const std::vector<int32_t> table = {7, 2, 9, 0,  //
                                      4, 0, 0, 0,  //
                                      1, 11, 5, 3};
  const std::vector<int32_t> qsl = {0, 6, 12, 18};
  const std::vector<int32_t> parent = {-1, 0, 0, 1, 2, 3,  //
                                       -1, 0, 1, 2, 3, 4,  //
                                       -1, 0, 0, 0, 2, 4};
  const auto k = encode(random_floats(static_cast<size_t>(n_pages_total * ps * kv_row), 401), c.kv);
  const auto v = encode(random_floats(static_cast<size_t>(n_pages_total * ps * kv_row), 402), c.kv);
  const auto q = random_floats(static_cast<size_t>(batch * Dn * qh * hd), 403);
  std::vector<float> out(q.size(), 0.0f);
  auto dk = to_device(k), dv = to_device(v);
  auto dq = to_device(q), dout = to_device(out);
  auto dseq = to_device(seq), dtable = to_device(table), dqsl = to_device(qsl), dparent = to_device(parent);
  auto fill = [&](paged_attention_tree_params& p, bool dev) {
    p.q = dev ? dq.data() : q.data();
    p.k_cache = dev ? static_cast<const void*>(dk.data()) : k.data();
    p.v_cache = dev ? static_cast<const void*>(dv.data()) : v.data();
    p.out = dev ? dout.data() : out.data();
    p.query_start_loc = dev ? dqsl.data() : qsl.data();
    p.seq_lens = dev ? dseq.data() : seq.data();
    p.page_table = dev ? dtable.data() : table.data();
    p.retrieve_parent = dev ? dparent.data() : parent.data();
    p.batch = batch;
    p.q_heads = qh;
    p.kv_heads = kvh;
    p.head_dim = hd;
    p.page_size = ps;
    p.page_table_stride = stride;
    p.q_stride = p.out_stride = qh * hd;
    p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    p.tree_nodes = Dn;
    p.kv_dtype = c.kv;
  };
  paged_attention_tree_params cpu, gpu;
  fill(cpu, false);
  fill(gpu, true);
  run_cpu(cpu);
  run_cuda(gpu);
  device_synchronize();
  expect_match(dout.download(), out, 1e-5, 1e-4, "tree attention");
}

INSTANTIATE_TEST_SUITE_P(Cuda, TreeAttentionCuda,
                         testing::Values(tree_case{dtype::kF32, 64}, tree_case{dtype::kBF16, 64},
                                         tree_case{dtype::kBF16, 128}, tree_case{dtype::kF32, 256},
                                         tree_case{dtype::kF32, 64, 6}, tree_case{dtype::kBF16, 128, 6}),
                         [](const testing::TestParamInfo<tree_case>& i) {
                           return std::string(dtype_name(i.param.kv)) + "_hd" + std::to_string(i.param.head_dim) +
                                  (i.param.q_heads != 8 ? "_gqa" + std::to_string(i.param.q_heads / 2) : "");
                         });

}  // namespace
}  // namespace hyserve::kernels

#endif  // HYSERVE_HAVE_CUDA
