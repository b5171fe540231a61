// Backend ops: SSD chunk scan and selective state update, CUDA against CPU.
// bf16 io and/or state (the Cuda_bf16 suites): both backends read the same bf16 inputs and
// compute in f32; y is compared at |Δ| <= 3e-2 + 2e-2·|want| (about two bf16 ulps: the CUDA
// scan also rounds the operands of its tensor-core products, C·Bᵀ-weights, dt·x and the entering
// state, to bf16) and the states at 1e-2 + 1e-2·|want|.
// Tolerance (fp32): |Δ| <= 2e-5 + 1e-4·|want| on y and on the states for the update (d_state-
// term dot products in another order); 5e-5 + 1e-4·|want| for the scan, whose chunked sums and
// state carries over hundreds of tokens reorder more additions (values are O(0.1)–O(10)).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "hyserve/kernels/device.h"

#if defined(HYSERVE_HAVE_CUDA)

#include "cuda/ssd_scan_paths.h"
#include "cuda_test_util.h"
#include "hyserve/common/dtype.h"
#include "hyserve/kernels/paths.h"
#include "hyserve/kernels/ssm.h"

namespace hyserve::kernels {
namespace {

using cuda_test::expect_match;
using cuda_test::expect_match_bf16_pipeline;
using cuda_test::join;
using cuda_test::poison;
using cuda_test::random_floats;
using cuda_test::to_device;

// Host and device copies of one problem; padded strides catch stride mix-ups.
struct ssm_problem {
  int64_t tokens, heads, head_dim, d_state, n_groups, n_slots;
  int64_t x_stride, dt_stride, bc_stride, y_stride;
  std::vector<float> x, dt, dt_bias, A_log, B, C, D, y, states;
  device_array<float> dx, ddt, ddt_bias, dA_log, dB, dC, dD, dy, dstates;

  ssm_problem(int64_t tokens_, int64_t heads_, int64_t head_dim_, int64_t d_state_, int64_t n_groups_,
              int64_t n_slots_, uint32_t seed, float dt_shift = 0.0f)
      : tokens(tokens_), heads(heads_), head_dim(head_dim_), d_state(d_state_), n_groups(n_groups_), n_slots(n_slots_) {
    x_stride = heads * head_dim + 3;
    dt_stride = heads + 1;
    bc_stride = n_groups * d_state + 2;
    y_stride = heads * head_dim + 5;
    x = random_floats(static_cast<size_t>(tokens * x_stride), seed + 1);
    dt = random_floats(static_cast<size_t>(tokens * dt_stride), seed + 2, -3.0f + dt_shift, 1.0f + dt_shift);
    dt_bias = random_floats(static_cast<size_t>(heads), seed + 3, -0.5f, 0.5f);
    A_log = random_floats(static_cast<size_t>(heads), seed + 4, -1.0f, 1.0f);
    B = random_floats(static_cast<size_t>(tokens * bc_stride), seed + 5);
    C = random_floats(static_cast<size_t>(tokens * bc_stride), seed + 6);
    D = random_floats(static_cast<size_t>(heads), seed + 7);
    y.assign(static_cast<size_t>(tokens * y_stride), poison());
    states = random_floats(static_cast<size_t>((n_slots + 1) * heads * head_dim * d_state), seed + 8);
    dx = to_device(x);
    ddt = to_device(dt);
    ddt_bias = to_device(dt_bias);
    dA_log = to_device(A_log);
    dB = to_device(B);
    dC = to_device(C);
    dD = to_device(D);
    dy = device_array<float>(y.size());
    dy.fill_bytes(0xff);
    dstates = to_device(states);
  }

  void fill_host(ssm_common_params& p, const int32_t* slots, int64_t batch, bool bias, bool skip) {
    fill(p, slots, batch, bias, skip, x.data(), dt.data(), dt_bias.data(), A_log.data(), B.data(), C.data(),
         D.data(), y.data(), states.data());
  }
  void fill_device(ssm_common_params& p, const int32_t* slots, int64_t batch, bool bias, bool skip) {
    fill(p, slots, batch, bias, skip, dx.data(), ddt.data(), ddt_bias.data(), dA_log.data(), dB.data(), dC.data(),
         dD.data(), dy.data(), dstates.data());
  }

  void check(const std::string& what, double atol, double rtol) {
    expect_match(dy.download(), y, atol, rtol, what + " y");
    expect_match(dstates.download(), states, atol, rtol, what + " states");
  }

 private:
  void fill(ssm_common_params& p, const int32_t* slots, int64_t batch, bool bias, bool skip, const float* x_,
            const float* dt_, const float* dt_bias_, const float* A_log_, const float* B_, const float* C_,
            const float* D_, float* y_, float* states_) const {
    p.x = x_;
    p.dt = dt_;
    p.dt_bias = bias ? dt_bias_ : nullptr;
    p.A_log = A_log_;
    p.B = B_;
    p.C = C_;
    p.D = skip ? D_ : nullptr;
    p.y = y_;
    p.ssm_states = states_;
    p.state_indices = slots;
    p.batch = batch;
    p.heads = heads;
    p.head_dim = head_dim;
    p.d_state = d_state;
    p.n_groups = n_groups;
    p.x_stride = x_stride;
    p.dt_stride = dt_stride;
    p.bc_stride = bc_stride;
    p.y_stride = y_stride;
  }
};

// ---------------------------------------------------------------------------------------------
// SSD chunk scan

struct scan_case {
  int n_groups, heads, head_dim, d_state;
  std::vector<int> lens;
  int chunk;
  int init;  // 0: none, 1: all rows, 2: alternate rows
  bool pad;  // a padding row (slot -1) is appended
  float dt_min = 0.0f, dt_max = 3.4e38f;
  bool with_bias = true, with_d = true;
  float dt_shift = 0.0f;  // large steps: cum(dt·A) reaches -1e3 within a chunk
};

std::string scan_name(const testing::TestParamInfo<scan_case>& info) {
  const auto& c = info.param;
  std::string s = "Cuda_f32_heads" + std::to_string(c.heads) + "_hd" + std::to_string(c.head_dim) + "_dstate" +
                  std::to_string(c.d_state) + "_ngroups" + std::to_string(c.n_groups) + "_len" + join(c.lens) +
                  "_chunk" + std::to_string(c.chunk);
  s += c.init == 0 ? "_noinit" : c.init == 1 ? "_init" : "_mixedinit";
  if (c.pad) s += "_pad";
  if (c.dt_max < 1e30f) s += "_dtclamp";
  if (!c.with_bias) s += "_nobias";
  if (!c.with_d) s += "_noD";
  if (c.dt_shift != 0.0f) s += "_largedt";
  return s;
}

class SsdScanCuda : public testing::TestWithParam<scan_case> {};

TEST_P(SsdScanCuda, MatchesCpu) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const scan_case& c = GetParam();
  std::vector<int32_t> qsl{0};
  for (int len : c.lens) qsl.push_back(qsl.back() + len);
  if (c.pad) qsl.push_back(qsl.back() + 4);
  const int64_t batch = static_cast<int64_t>(qsl.size()) - 1;
  const int64_t n_slots = 2 * batch + 2;
  ssm_problem prob(qsl.back(), c.heads, c.head_dim, c.d_state, c.n_groups, n_slots, 1000u + qsl.back(), c.dt_shift);
  std::vector<int32_t> slots(static_cast<size_t>(batch));
  std::vector<uint8_t> has_init(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    slots[b] = static_cast<int32_t>(n_slots - 2 * b);
    has_init[b] = c.init == 1 || (c.init == 2 && b % 2 == 0);
  }
  if (c.pad) slots[batch - 1] = -1;
  auto dqsl = to_device(qsl), dslots = to_device(slots);
  auto dinit = to_device(has_init);

  ssd_chunk_scan_params pc;
  prob.fill_host(pc, slots.data(), batch, c.with_bias, c.with_d);
  pc.query_start_loc = qsl.data();
  pc.has_initial_state = c.init == 0 ? nullptr : has_init.data();
  pc.chunk_size = c.chunk;
  pc.dt_min = c.dt_min;
  pc.dt_max = c.dt_max;
  ssd_chunk_scan_params pg = pc;
  prob.fill_device(pg, dslots.data(), batch, c.with_bias, c.with_d);
  pg.query_start_loc = dqsl.data();
  pg.has_initial_state = c.init == 0 ? nullptr : dinit.data();
  run_cpu(pc);
  run_cuda(pg);
  device_synchronize();
  prob.check("scan", 5e-5, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    Grid, SsdScanCuda,
    testing::Values(
        // Mamba2 production head shape: 128 heads × head_dim 64 × d_state 128.
        scan_case{1, 128, 64, 128, {300, 70}, 256, 1, true},
        scan_case{8, 128, 64, 128, {1, 40, 33}, 256, 2, false},
        // Tails around the kernel's 32-token chunk: 31, 32, 33, 64, and a single token.
        scan_case{1, 4, 32, 16, {31, 32, 33, 64, 1}, 16, 2, true},
        scan_case{2, 4, 32, 64, {37, 16, 1}, 1, 0, false},  // chunk_size 1: a chunk boundary at every token
        scan_case{1, 8, 128, 256, {100}, 256, 1, false},    // largest state tile (shared memory bound)
        scan_case{2, 6, 50, 32, {5, 100, 33}, 32, 2, true}, // odd head_dim
        scan_case{1, 4, 64, 128, {37, 16, 1}, 16, 1, true, 0.1f, 0.5f},
        scan_case{2, 4, 64, 128, {40, 9}, 16, 1, false, 0.0f, 3.4e38f, false, false},
        scan_case{1, 2, 64, 128, {300}, 256, 1, false, 0.0f, 3.4e38f, true, true, 4.0f},
        // Tensor-core kernel (head_dim 64, d_state 128; 64-token chunks passed through the
        // slot): a long chain of chunks, a live row with no tokens (its state is zeroed or
        // kept), chunk tails 63/64/65/129, a padding row, and heads in 4 groups.
        scan_case{4, 16, 64, 128, {2000, 63, 0, 64, 65, 129}, 256, 2, true},
        scan_case{2, 8, 64, 128, {1000, 0}, 256, 1, false, 0.0f, 3.4e38f, true, true, 4.0f}),
    scan_name);

// ---------------------------------------------------------------------------------------------
// Selective state update (decode)

struct update_case {
  int n_groups, heads, head_dim, d_state, batch;
  bool pad;  // row 1 is padding (-1)
  float dt_min = 0.0f, dt_max = 3.4e38f;
  bool softplus = true;
};

std::string update_name(const testing::TestParamInfo<update_case>& info) {
  const auto& c = info.param;
  std::string s = "Cuda_f32_heads" + std::to_string(c.heads) + "_hd" + std::to_string(c.head_dim) + "_dstate" +
                  std::to_string(c.d_state) + "_ngroups" + std::to_string(c.n_groups) + "_bs" + std::to_string(c.batch);
  if (c.pad) s += "_pad";
  if (c.dt_max < 1e30f) s += "_dtclamp";
  if (!c.softplus) s += "_nosoftplus";
  return s;
}

class SsmUpdateCuda : public testing::TestWithParam<update_case> {};

TEST_P(SsmUpdateCuda, MatchesCpu) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const update_case& c = GetParam();
  const int64_t n_slots = c.batch + 3;
  ssm_problem prob(c.batch, c.heads, c.head_dim, c.d_state, c.n_groups, n_slots, 500u + c.batch);
  std::vector<int32_t> slots(static_cast<size_t>(c.batch));
  for (int b = 0; b < c.batch; ++b) slots[b] = static_cast<int32_t>(n_slots - b);
  if (c.pad && c.batch > 1) slots[1] = -1;
  auto dslots = to_device(slots);
  selective_state_update_params pc;
  prob.fill_host(pc, slots.data(), c.batch, true, true);
  pc.dt_min = c.dt_min;
  pc.dt_max = c.dt_max;
  pc.dt_softplus = c.softplus;
  selective_state_update_params pg = pc;
  prob.fill_device(pg, dslots.data(), c.batch, true, true);
  run_cpu(pc);
  run_cuda(pg);
  device_synchronize();
  prob.check("update", 2e-5, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Grid, SsmUpdateCuda,
                         testing::Values(update_case{1, 128, 64, 128, 64, true},  // production decode shape
                                         update_case{8, 128, 64, 128, 1, false},
                                         update_case{1, 8, 64, 128, 256, true},
                                         update_case{1, 4, 32, 16, 5, true},  // tiny model shape
                                         update_case{2, 8, 50, 32, 7, false},  // odd head_dim
                                         update_case{4, 8, 128, 64, 3, true, 0.2f, 0.4f},
                                         update_case{1, 16, 64, 256, 9, true, 0.001f, 0.1f, false}),
                         update_name);

// A prefill scan followed by decode updates equals one scan over the whole sequence (both CUDA).
TEST(SsmCudaConsistency, Cuda_f32_ScanThenUpdatesEqualsLongScan) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t len = 45, tail = 3, heads = 4, hd = 64, ds = 128;
  ssm_problem whole(len, heads, hd, ds, 2, 1, 31u);
  ssm_problem split(len, heads, hd, ds, 2, 1, 31u);  // same seed: same inputs and states
  const std::vector<int32_t> slot{1};
  const std::vector<int32_t> qsl_whole{0, static_cast<int32_t>(len)}, qsl_head{0, static_cast<int32_t>(len - tail)};
  auto dslot = to_device(slot), dqsl_whole = to_device(qsl_whole), dqsl_head = to_device(qsl_head);

  ssd_chunk_scan_params pw;
  whole.fill_device(pw, dslot.data(), 1, true, true);
  pw.query_start_loc = dqsl_whole.data();
  run_cuda(pw);
  ssd_chunk_scan_params ph;
  split.fill_device(ph, dslot.data(), 1, true, true);
  ph.query_start_loc = dqsl_head.data();
  run_cuda(ph);
  for (int64_t t = len - tail; t < len; ++t) {
    selective_state_update_params pu;
    split.fill_device(pu, dslot.data(), 1, true, true);
    pu.x = split.dx.data() + t * split.x_stride;
    pu.dt = split.ddt.data() + t * split.dt_stride;
    pu.B = split.dB.data() + t * split.bc_stride;
    pu.C = split.dC.data() + t * split.bc_stride;
    pu.y = split.dy.data() + t * split.y_stride;
    run_cuda(pu);
  }
  device_synchronize();
  expect_match(split.dy.download(), whole.dy.download(), 5e-5, 1e-4, "y");
  expect_match(split.dstates.download(), whole.dstates.download(), 5e-5, 1e-4, "states");
}

// ---------------------------------------------------------------------------------------------
// bf16 io and/or bf16 state

// Raw bytes of floats in one element type; bf16 0xffff (the poison pattern) decodes to poison().
std::vector<uint8_t> encode(const std::vector<float>& v, dtype t) {
  std::vector<uint8_t> raw(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == dtype::kF32) {
      std::memcpy(raw.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t h = f32_to_bf16(v[i]);
      std::memcpy(raw.data() + 2 * i, &h, 2);
    }
  }
  return raw;
}

std::vector<float> decode(const std::vector<uint8_t>& raw, dtype t) {
  std::vector<float> v(raw.size() / dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == dtype::kF32) {
      std::memcpy(&v[i], raw.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      v[i] = h == 0xffffu ? poison() : bf16_to_f32(h);
    }
  }
  return v;
}

// One problem in (io, state) types, host and device copies of the same bytes.
struct typed_problem {
  dtype io, st;
  int64_t heads, head_dim, d_state, n_groups;
  int64_t x_stride, dt_stride, bc_stride, y_stride;
  std::vector<float> dt_bias, A_log, D;
  std::vector<uint8_t> x, dt, bc, y, states;
  device_array<float> ddt_bias, dA_log, dD;
  device_array<uint8_t> dx, ddt, dbc, dy, dstates;

  // aligned: row strides keep 16-byte rows (the vector path); otherwise odd strides.
  typed_problem(dtype io_, dtype st_, int64_t tokens, int64_t heads_, int64_t head_dim_, int64_t d_state_,
                int64_t n_groups_, int64_t n_slots, bool aligned, uint32_t seed)
      : io(io_), st(st_), heads(heads_), head_dim(head_dim_), d_state(d_state_), n_groups(n_groups_) {
    const int64_t pad = aligned ? 8 : 3;
    x_stride = heads * head_dim + pad;
    dt_stride = heads + 1;
    bc_stride = 2 * n_groups * d_state + pad;
    y_stride = heads * head_dim + pad;
    dt_bias = random_floats(static_cast<size_t>(heads), seed + 3, -0.5f, 0.5f);
    A_log = random_floats(static_cast<size_t>(heads), seed + 4, -1.0f, 1.0f);
    D = random_floats(static_cast<size_t>(heads), seed + 7);
    x = encode(random_floats(static_cast<size_t>(tokens * x_stride), seed + 1), io);
    dt = encode(random_floats(static_cast<size_t>(tokens * dt_stride), seed + 2, -3.0f, 1.0f), io);
    bc = encode(random_floats(static_cast<size_t>(tokens * bc_stride), seed + 5), io);
    y.assign(static_cast<size_t>(tokens * y_stride) * dtype_size(io), 0xff);
    states = encode(random_floats(static_cast<size_t>((n_slots + 1) * heads * head_dim * d_state), seed + 8), st);
    ddt_bias = to_device(dt_bias);
    dA_log = to_device(A_log);
    dD = to_device(D);
    dx = to_device(x);
    ddt = to_device(dt);
    dbc = to_device(bc);
    dy = to_device(y);
    dstates = to_device(states);
  }

  // A bf16 model's scan (f32 io, bf16_operands) rounds x, B and C to bf16 as it loads them: the
  // CPU reference gets the same operand values (its host copies rounded; the device keeps f32).
  void round_host_operands_to_bf16() {
    // In place: the CPU params already point at these buffers.
    for (std::vector<uint8_t>* v : {&x, &bc}) {
      const std::vector<uint8_t> rounded = encode(test_support::round_bf16(decode(*v, io)), io);
      std::copy(rounded.begin(), rounded.end(), v->begin());
    }
    bf16_pipeline = true;
  }

  void fill(ssm_common_params& p, const int32_t* slots, int64_t batch, bool device) {
    const size_t es = dtype_size(io);
    const uint8_t* bcp = device ? dbc.data() : bc.data();
    p.x = device ? dx.data() : x.data();
    p.dt = device ? ddt.data() : dt.data();
    p.dt_bias = device ? ddt_bias.data() : dt_bias.data();
    p.A_log = device ? dA_log.data() : A_log.data();
    p.B = bcp;
    p.C = bcp + static_cast<size_t>(n_groups * d_state) * es;
    p.D = device ? dD.data() : D.data();
    p.y = device ? dy.data() : y.data();
    p.ssm_states = device ? dstates.data() : states.data();
    p.state_indices = slots;
    p.batch = batch;
    p.heads = heads;
    p.head_dim = head_dim;
    p.d_state = d_state;
    p.n_groups = n_groups;
    p.x_stride = x_stride;
    p.dt_stride = dt_stride;
    p.bc_stride = bc_stride;
    p.y_stride = y_stride;
    p.io_dtype = io;
    p.state_dtype = st;
  }

  bool bf16_pipeline = false;  // y from bf16 MMA operands: the bf16 pipeline's tolerance

  void check(const std::string& what) {
    if (io == dtype::kBF16 || bf16_pipeline)
      expect_match_bf16_pipeline(decode(dy.download(), io), decode(y, io), 3e-2, 2e-2, what + " y");
    else
      expect_match(decode(dy.download(), io), decode(y, io), 3e-2, 2e-2, what + " y");
    expect_match(decode(dstates.download(), st), decode(states, st), 1e-2, 1e-2, what + " states");
  }
};

struct typed_case {
  dtype io, st;
  int n_groups, heads, head_dim, d_state;
  std::vector<int> lens;  // scan: per row; update: {batch}
  int init;               // scan: 0 none, 1 all rows, 2 alternate rows
  bool pad;               // a padding row (slot -1)
  bool aligned;
  bool bf16_operands = false;  // ssd_chunk_scan_params::bf16_operands (f32 io: a bf16 model's scan)
  bool seq_bf16 = false;       // kernels.ssd_seq_bf16
  int seq_slice = 0;           // kernels.ssd_seq_slice
};

std::string typed_name(const testing::TestParamInfo<typed_case>& info) {
  const auto& c = info.param;
  std::string s = "Cuda_bf16_io" + std::string(dtype_name(c.io)) + "_state" + std::string(dtype_name(c.st)) +
                  "_heads" + std::to_string(c.heads) + "_hd" + std::to_string(c.head_dim) + "_dstate" +
                  std::to_string(c.d_state) + "_ngroups" + std::to_string(c.n_groups) + "_len" + join(c.lens);
  s += c.init == 0 ? "_noinit" : c.init == 1 ? "_init" : "_mixedinit";
  if (c.pad) s += "_pad";
  s += c.aligned ? "_aligned" : "_oddstrides";
  if (c.bf16_operands) s += "_bf16operands";
  if (c.seq_bf16) s += "_seqbf16";
  if (c.seq_slice != 0) s += "_slice" + std::to_string(c.seq_slice);
  return s;
}

class SsdScanTypedCuda : public testing::TestWithParam<typed_case> {};

TEST_P(SsdScanTypedCuda, MatchesCpu) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const typed_case& c = GetParam();
  std::vector<int32_t> qsl{0};
  for (int len : c.lens) qsl.push_back(qsl.back() + len);
  if (c.pad) qsl.push_back(qsl.back() + 4);
  const int64_t batch = static_cast<int64_t>(qsl.size()) - 1;
  const int64_t n_slots = 2 * batch + 2;
  typed_problem prob(c.io, c.st, std::max(qsl.back(), 1), c.heads, c.head_dim, c.d_state, c.n_groups, n_slots,
                     c.aligned, 3000u + static_cast<uint32_t>(qsl.back()));
  std::vector<int32_t> slots(static_cast<size_t>(batch));
  std::vector<uint8_t> has_init(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    slots[b] = static_cast<int32_t>(n_slots - 2 * b);
    has_init[b] = c.init == 1 || (c.init == 2 && b % 2 == 0);
  }
  if (c.pad) slots[batch - 1] = -1;
  auto dqsl = to_device(qsl), dslots = to_device(slots);
  auto dinit = to_device(has_init);
  ssd_chunk_scan_params pc, pg;
  prob.fill(pc, slots.data(), batch, false);
  pc.query_start_loc = qsl.data();
  pc.has_initial_state = c.init == 0 ? nullptr : has_init.data();
  prob.fill(pg, dslots.data(), batch, true);
  pg.query_start_loc = dqsl.data();
  pg.has_initial_state = c.init == 0 ? nullptr : dinit.data();
  pg.bf16_operands = c.bf16_operands;
  // The sequential kernel rounds the operands (every shape but 64 × 128, and that one with
  // kernels.ssd_seq_bf16); the 3xTF32 kernel takes them in f32.
  const bool rounds = c.bf16_operands && c.io == dtype::kF32 && (c.seq_bf16 || c.head_dim != 64 || c.d_state != 128);
  if (rounds) prob.round_host_operands_to_bf16();
  kernel_paths paths;
  paths.ssd_seq_bf16 = c.seq_bf16;
  paths.ssd_seq_slice = c.seq_slice;
  const paths_scope scope(paths);
  run_cpu(pc);
  run_cuda(pg);
  device_synchronize();
  prob.check("scan");
}

const dtype kF = dtype::kF32, kB = dtype::kBF16;

INSTANTIATE_TEST_SUITE_P(
    Grid, SsdScanTypedCuda,
    testing::Values(
        // Tensor-core shape (head_dim 64, d_state 128): lengths around the 64-token kernel chunk
        // and the 256 chunk_size, an empty live row, a padding row, mixed initial states.
        typed_case{kB, kF, 2, 8, 64, 128, {1, 63, 64, 65, 0, 200, 256, 257, 700}, 2, true, true},
        typed_case{kB, kB, 2, 8, 64, 128, {1, 63, 64, 65, 0, 200, 256, 257, 700}, 2, true, true},
        typed_case{kB, kF, 2, 8, 64, 128, {129, 5, 330}, 1, false, false},  // scalar loads and stores
        typed_case{kB, kB, 2, 8, 64, 128, {300, 77}, 0, true, false},
        typed_case{kF, kB, 2, 8, 64, 128, {129, 5, 330}, 2, true, true},   // f32 io, bf16 state (f32 carry)
        // Production head shape: 128 heads, 8 groups.
        typed_case{kB, kF, 8, 128, 64, 128, {1000, 530}, 2, true, true},
        typed_case{kB, kB, 8, 128, 64, 128, {1000, 530}, 1, false, true},
        // The sequential tensor-core kernel alone (every path): Falcon-H1's head_dim 128 with
        // d_state 256 (B and C loaded a chunk at a time), and the other pairs of its tables.
        typed_case{kB, kF, 1, 6, 128, 256, {1, 63, 64, 65, 0, 200, 300}, 2, true, true},
        typed_case{kB, kB, 1, 6, 128, 256, {129, 5, 70}, 1, false, false},
        typed_case{kB, kF, 2, 4, 64, 256, {100, 70}, 1, true, true},
        typed_case{kB, kB, 1, 4, 128, 128, {100, 70}, 0, false, true},
        // A bf16 model's scan (f32 io, bf16_operands): the sequential kernel, x, B and C rounded
        // to bf16 as loaded (the CPU reference gets the rounded values), y in f32 (the bf16
        // pipeline's tolerance, as for bf16 io), at
        // Falcon-H1's heads, with odd strides (scalar loads and stores); at the Mamba2 shape the
        // 3xTF32 kernel, and with kernels.ssd_seq_bf16 the sequential one (also the production
        // shape: 128 heads, 8 groups).
        typed_case{kF, kF, 1, 6, 128, 256, {1, 63, 64, 65, 0, 200, 300}, 2, true, true, true},
        typed_case{kF, kB, 1, 4, 128, 256, {129, 5, 70}, 1, false, false, true},
        typed_case{kF, kF, 2, 8, 64, 128, {129, 5, 330}, 2, true, true, true},
        typed_case{kF, kF, 2, 8, 64, 128, {129, 5, 0, 330}, 2, true, true, true, true},
        typed_case{kF, kB, 8, 128, 64, 128, {1000, 530}, 1, false, true, true, true},
        // kernels.ssd_seq_slice: 16 (a bf16 model's scan at head_dim 128 in slices of 16 head
        // channels): Falcon-H1's heads, and 128 × 128.
        typed_case{kF, kF, 1, 6, 128, 256, {1, 63, 64, 65, 0, 200, 300}, 2, true, true, true, false, 16},
        typed_case{kF, kB, 1, 4, 128, 256, {129, 5, 70}, 1, false, false, true, false, 16},
        typed_case{kF, kF, 2, 4, 128, 128, {100, 70}, 2, true, true, true, false, 16},
        // The general kernel (other head shapes).
        typed_case{kB, kB, 2, 4, 8, 16, {37, 16, 1}, 2, true, false},
        typed_case{kF, kB, 1, 4, 32, 64, {100, 3}, 1, false, true},
        typed_case{kB, kF, 1, 4, 32, 64, {100, 3}, 1, true, true}),
    typed_name);

// The bf16-io scan paths (sequential: one block per row walking its chunks; parallel and
// parallel_single: one kernel over (chunk, head) items with the state hand-off chained,
// persistent blocks staging ahead or a block per item; general: the CUDA-core kernel) in the
// same run, each against the CPU op from the same inputs.
class SsdScanPathsCuda : public testing::TestWithParam<typed_case> {};

std::string path_label(ssd_scan_path path) {
  switch (path) {
    case ssd_scan_path::sequential: return "sequential";
    case ssd_scan_path::parallel: return "parallel";
    case ssd_scan_path::parallel_single: return "parallel_single";
    case ssd_scan_path::parallel_fast: return "parallel_fast";
    case ssd_scan_path::parallel_pair: return "parallel_pair";
    case ssd_scan_path::parallel_quad: return "parallel_quad";
    case ssd_scan_path::parallel_y: return "parallel_y";
    case ssd_scan_path::parallel_quad_y: return "parallel_quad_y";
    case ssd_scan_path::parallel_oct_y: return "parallel_oct_y";
    case ssd_scan_path::automatic: return "automatic";
    case ssd_scan_path::general: return "general";
  }
  return "?";
}

TEST_P(SsdScanPathsCuda, BothPathsMatchCpu) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const typed_case& c = GetParam();
  std::vector<int32_t> qsl{0};
  for (int len : c.lens) qsl.push_back(qsl.back() + len);
  if (c.pad) qsl.push_back(qsl.back() + 4);
  const int64_t batch = static_cast<int64_t>(qsl.size()) - 1;
  const int64_t n_slots = 2 * batch + 2;
  typed_problem prob(c.io, c.st, std::max(qsl.back(), 1), c.heads, c.head_dim, c.d_state, c.n_groups, n_slots,
                     c.aligned, 5000u + static_cast<uint32_t>(qsl.back()));
  const std::vector<uint8_t> y0 = prob.y, s0 = prob.states;
  std::vector<int32_t> slots(static_cast<size_t>(batch));
  std::vector<uint8_t> has_init(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    slots[b] = static_cast<int32_t>(n_slots - 2 * b);
    has_init[b] = c.init == 1 || (c.init == 2 && b % 2 == 0);
  }
  if (c.pad) slots[batch - 1] = -1;
  auto dqsl = to_device(qsl), dslots = to_device(slots);
  auto dinit = to_device(has_init);
  ssd_chunk_scan_params pc, pg;
  prob.fill(pc, slots.data(), batch, false);
  pc.query_start_loc = qsl.data();
  pc.has_initial_state = c.init == 0 ? nullptr : has_init.data();
  prob.fill(pg, dslots.data(), batch, true);
  pg.query_start_loc = dqsl.data();
  pg.has_initial_state = c.init == 0 ? nullptr : dinit.data();
  run_cpu(pc);
  for (const ssd_scan_path path : {ssd_scan_path::sequential, ssd_scan_path::parallel, ssd_scan_path::parallel_single,
                                    ssd_scan_path::parallel_fast, ssd_scan_path::parallel_pair,
                                    ssd_scan_path::parallel_quad, ssd_scan_path::parallel_y,
                                    ssd_scan_path::parallel_quad_y, ssd_scan_path::parallel_oct_y,
                                    ssd_scan_path::general}) {
    prob.dy.upload(y0);
    prob.dstates.upload(s0);
    run_cuda(pg, path);
    device_synchronize();
    prob.check(path_label(path) + " scan");
  }
}

const std::vector<int> kPathLens{1, 63, 64, 65, 127, 128, 129, 255, 256, 257, 700, 4096};

std::vector<typed_case> path_cases() {
  std::vector<typed_case> v;
  // Every length of the grid in one varlen batch with an empty live row and a padding row.
  std::vector<int> all{1, 63, 64, 65, 0, 127, 128, 129, 255, 256, 257, 700, 4096};
  for (const dtype st : {kF, kB}) {
    v.push_back(typed_case{kB, st, 2, 8, 64, 128, all, 2, true, true});
    v.push_back(typed_case{kB, st, 2, 8, 64, 128, all, 1, true, false});  // scalar loads and stores
  }
  // Each length alone, from an initial state and from zeros.
  for (const int len : kPathLens) {
    v.push_back(typed_case{kB, kF, 1, 4, 64, 128, {len}, 1, false, true});
    v.push_back(typed_case{kB, kB, 2, 4, 64, 128, {len}, 0, false, true});
  }
  // Production head shape: 128 heads, 8 groups, a varlen batch.
  v.push_back(typed_case{kB, kF, 8, 128, 64, 128, {2048, 700, 0, 129}, 2, true, true});
  v.push_back(typed_case{kB, kB, 8, 128, 64, 128, {2048, 700, 0, 129}, 1, true, true});
  // More chunks than the parallel_single path reserves by default (16384 tokens + one
  // per row): the general kernel takes the batch on the device (the parallel path takes it itself).
  v.push_back(typed_case{kB, kF, 1, 2, 64, 128, {17000}, 1, false, true});
  // Falcon-H1's heads (head_dim 128, d_state 256): every path runs the sequential kernel.
  v.push_back(typed_case{kB, kF, 1, 4, 128, 256, {300, 0, 65}, 2, true, true});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Grid, SsdScanPathsCuda, testing::ValuesIn(path_cases()), typed_name);

// The production shape (16384 tokens, 128 heads, head_dim 64, d_state 128, 8 groups): the
// chunk-parallel paths against the sequential one (the CPU op at this size is too slow for a unit
// test; every path is checked against it above).
TEST(SsdScanPathsCuda, Cuda_bf16_ProductionShapeParallelMatchesSequential) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (const dtype st : {kF, kB}) {
    const std::vector<int32_t> qsl{0, 16384};
    const std::vector<int32_t> slots{1};
    const std::vector<uint8_t> has_init{1};
    typed_problem prob(kB, st, 16384, 128, 64, 128, 8, 2, true, 9000u);
    const std::vector<uint8_t> y0 = prob.y, s0 = prob.states;
    auto dqsl = to_device(qsl), dslots = to_device(slots);
    auto dinit = to_device(has_init);
    ssd_chunk_scan_params pg;
    prob.fill(pg, dslots.data(), 1, true);
    pg.query_start_loc = dqsl.data();
    pg.has_initial_state = dinit.data();
    const ssd_scan_path paths[] = {ssd_scan_path::sequential, ssd_scan_path::parallel,
                                   ssd_scan_path::parallel_single,
                                   ssd_scan_path::parallel_fast, ssd_scan_path::parallel_pair,
                                   ssd_scan_path::parallel_quad, ssd_scan_path::parallel_y,
                                   ssd_scan_path::parallel_quad_y, ssd_scan_path::parallel_oct_y};
    constexpr int kPaths = static_cast<int>(sizeof(paths) / sizeof(paths[0]));
    std::vector<float> y[kPaths], states[kPaths];
    for (int k = 0; k < kPaths; ++k) {
      prob.dy.upload(y0);
      prob.dstates.upload(s0);
      run_cuda(pg, paths[k]);
      device_synchronize();
      y[k] = decode(prob.dy.download(), kB);
      states[k] = decode(prob.dstates.download(), st);
    }
    for (int k = 1; k < kPaths; ++k) {
      const std::string what = "production shape, " + path_label(paths[k]) + " vs sequential, state " +
                               std::string(dtype_name(st));
      expect_match_bf16_pipeline(y[k], y[0], 3e-2, 2e-2, what + " y");
      expect_match(states[k], states[0], 1e-2, 1e-2, what + " states");
    }
  }
}

class SsmUpdateTypedCuda : public testing::TestWithParam<typed_case> {};

TEST_P(SsmUpdateTypedCuda, MatchesCpu) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const typed_case& c = GetParam();
  const int64_t batch = c.lens.at(0);
  const int64_t n_slots = batch + 3;
  typed_problem prob(c.io, c.st, batch, c.heads, c.head_dim, c.d_state, c.n_groups, n_slots, c.aligned,
                     700u + static_cast<uint32_t>(batch));
  std::vector<int32_t> slots(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) slots[b] = static_cast<int32_t>(n_slots - b);
  if (c.pad && batch > 1) slots[1] = -1;
  auto dslots = to_device(slots);
  selective_state_update_params pc, pg;
  prob.fill(pc, slots.data(), batch, false);
  prob.fill(pg, dslots.data(), batch, true);
  run_cpu(pc);
  run_cuda(pg);
  device_synchronize();
  prob.check("update");
}

INSTANTIATE_TEST_SUITE_P(Grid, SsmUpdateTypedCuda,
                         testing::Values(typed_case{kB, kB, 1, 128, 64, 128, {64}, 0, true, true},  // production
                                         typed_case{kB, kF, 8, 128, 64, 128, {3}, 0, true, true},
                                         typed_case{kF, kB, 2, 8, 64, 16, {5}, 0, true, false},
                                         typed_case{kB, kB, 2, 8, 64, 256, {7}, 0, false, false},
                                         typed_case{kB, kB, 1, 4, 32, 32, {9}, 0, true, false}),
                         typed_name);

}  // namespace
}  // namespace hyserve::kernels

#endif
