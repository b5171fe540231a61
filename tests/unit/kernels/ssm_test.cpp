// SSD chunk scan and selective state update against the per-token recurrence, in double:
//   dt = clamp(softplus(dt_raw + dt_bias), dt_min, dt_max); A = -exp(A_log)
//   S_t = exp(dt·A)·S_{t-1} + dt·x_t ⊗ B_t;  y_t = S_t·C_t + D·x_t
// Tolerance: |got − want| <= 1e-5 + 1e-5·|want| on outputs and final states (values are O(0.1)
// to O(10); the largest observed error of the fp32 kernels is 1.5e-6, at d_state 128).
// bf16 variants (SsmBf16): inputs are bf16 values, the reference runs on the same values in
// double; y and bf16 states are compared at 1e-2 + 8e-3·|want| (one bf16 rounding of the result,
// 2^-8 relative at most, plus the f32 error), f32 states at the fp32 tolerance. With bf16 states
// the decode update rounds the state once per step, as the reference does.
#include "hyserve/kernels/ssm.h"

#include <gtest/gtest.h>

#include <cstdint>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "hyserve/common/dtype.h"
#include "kernel_test_util.h"

namespace hyserve::kernels {
namespace {

using test::expect_close;
using test::random_floats;
using test::round_bf16;

constexpr double kAtol = 1e-5;
constexpr double kRtol = 1e-5;
constexpr float kSentinel = 12345.0f;  // marks rows and slots a padding row must not touch

double softplus_ref(double v) { return v > 20.0 ? v : std::log1p(std::exp(v)); }

// All tensors of one test problem, with room for padded row strides.
struct ssm_problem {
  int64_t tokens = 0, heads = 0, head_dim = 0, d_state = 0, n_groups = 1, n_slots = 0;
  int64_t x_stride = 0, dt_stride = 0, bc_stride = 0, y_stride = 0;
  std::vector<float> x, dt, dt_bias, A_log, B, C, D, y, states;

  ssm_problem(int64_t tokens_, int64_t heads_, int64_t head_dim_, int64_t d_state_, int64_t n_groups_, int64_t n_slots_,
              uint32_t seed)
      : tokens(tokens_), heads(heads_), head_dim(head_dim_), d_state(d_state_), n_groups(n_groups_), n_slots(n_slots_) {
    x_stride = heads * head_dim + 3;  // padded strides catch stride mix-ups
    dt_stride = heads + 1;
    bc_stride = n_groups * d_state + 2;
    y_stride = heads * head_dim + 5;
    x = random_floats(static_cast<size_t>(tokens * x_stride), seed + 1);
    dt = random_floats(static_cast<size_t>(tokens * dt_stride), seed + 2, -3.0f, 1.0f);
    dt_bias = random_floats(static_cast<size_t>(heads), seed + 3, -0.5f, 0.5f);
    A_log = random_floats(static_cast<size_t>(heads), seed + 4, -1.0f, 1.0f);
    B = random_floats(static_cast<size_t>(tokens * bc_stride), seed + 5);
    C = random_floats(static_cast<size_t>(tokens * bc_stride), seed + 6);
    D = random_floats(static_cast<size_t>(heads), seed + 7);
    y.assign(static_cast<size_t>(tokens * y_stride), kSentinel);
    states = random_floats(static_cast<size_t>((n_slots + 1) * heads * head_dim * d_state), seed + 8);
  }

  void fill(ssm_common_params& p, const int32_t* state_indices, int64_t batch, bool with_bias, bool with_d) {
    p.x = x.data();
    p.dt = dt.data();
    p.dt_bias = with_bias ? dt_bias.data() : nullptr;
    p.A_log = A_log.data();
    p.B = B.data();
    p.C = C.data();
    p.D = with_d ? D.data() : nullptr;
    p.y = y.data();
    p.ssm_states = states.data();
    p.state_indices = state_indices;
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

  // Per-token recurrence over packed tokens [t0, t1) of one sequence, in place on a double
  // state [heads, head_dim, d_state]; writes y_ref rows [tokens, heads, head_dim].
  void recurrence(const ssm_common_params& p, int64_t t0, int64_t t1, std::vector<double>& S,
                  std::vector<double>& y_ref) const {
    const int64_t P = head_dim, N = d_state, hpg = heads / n_groups;
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t g = h / hpg;
        double dtv = static_cast<double>(dt[t * dt_stride + h]) + (p.dt_bias ? dt_bias[h] : 0.0);
        if (p.dt_softplus) dtv = softplus_ref(dtv);
        dtv = std::min(std::max(dtv, static_cast<double>(p.dt_min)), static_cast<double>(p.dt_max));
        const double decay = std::exp(dtv * -std::exp(static_cast<double>(A_log[h])));
        for (int64_t pi = 0; pi < P; ++pi) {
          const double xv = x[t * x_stride + h * P + pi];
          double acc = 0.0;
          for (int64_t n = 0; n < N; ++n) {
            double& s = S[(h * P + pi) * N + n];
            s = decay * s + dtv * xv * B[t * bc_stride + g * N + n];
            acc += s * C[t * bc_stride + g * N + n];
          }
          y_ref[t * heads * P + h * P + pi] = acc + (p.D ? D[h] : 0.0) * xv;
        }
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------
// SSD chunk scan

struct scan_case {
  int n_groups, heads, head_dim, d_state;
  std::vector<int> lens;  // per batch row; a padding row is appended when pad
  int chunk;
  int init;  // 0: no initial states, 1: all rows, 2: alternate rows (has_initial_state mixed)
  bool pad;
  float dt_min = 0.0f, dt_max = 3.4e38f;
  bool with_bias = true, with_d = true;
  float dt_shift = 0.0f;  // added to the raw dt: large steps drive cum(dt·A) to -1e3 within a chunk
};

std::string scan_name(const testing::TestParamInfo<scan_case>& info) {
  const auto& c = info.param;
  std::string s = "ngroups" + std::to_string(c.n_groups) + "_heads" + std::to_string(c.heads) + "_hd" +
                  std::to_string(c.head_dim) + "_ds" + std::to_string(c.d_state) + "_len" + test::join(c.lens) +
                  "_chunk" + std::to_string(c.chunk) + "_seqs" + std::to_string(c.lens.size());
  s += c.init == 0 ? "_noinit" : c.init == 1 ? "_init" : "_mixedinit";
  if (c.pad) s += "_pad";
  if (c.dt_max < 1e30f) s += "_dtclamp";
  if (!c.with_bias) s += "_nobias";
  if (!c.with_d) s += "_noD";
  if (c.dt_shift != 0.0f) s += "_largedt";
  return s;
}

class SsdScan : public testing::TestWithParam<scan_case> {};

TEST_P(SsdScan, MatchesRecurrence) {
  const scan_case& c = GetParam();
  std::vector<int32_t> qsl{0};
  for (int len : c.lens) qsl.push_back(qsl.back() + len);
  const int64_t live = static_cast<int64_t>(c.lens.size());
  const int64_t pad_len = 4;
  if (c.pad) qsl.push_back(qsl.back() + pad_len);
  const int64_t batch = static_cast<int64_t>(qsl.size()) - 1;
  const int64_t tokens = qsl.back();
  const int64_t n_slots = 2 * batch + 2;

  ssm_problem prob(tokens, c.heads, c.head_dim, c.d_state, c.n_groups, n_slots, 1000u + static_cast<uint32_t>(tokens));
  for (auto& v : prob.dt) v += c.dt_shift;
  std::vector<int32_t> slots(static_cast<size_t>(batch));
  std::vector<uint8_t> has_init(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    slots[b] = static_cast<int32_t>(n_slots - 2 * b);  // scattered, descending slots
    has_init[b] = c.init == 1 || (c.init == 2 && b % 2 == 0);
  }
  if (c.pad) slots[batch - 1] = -1;

  ssd_chunk_scan_params p;
  prob.fill(p, slots.data(), batch, c.with_bias, c.with_d);
  p.query_start_loc = qsl.data();
  p.has_initial_state = c.init == 0 ? nullptr : has_init.data();
  p.chunk_size = c.chunk;
  p.dt_min = c.dt_min;
  p.dt_max = c.dt_max;

  const int64_t state_elems = c.heads * c.head_dim * c.d_state;
  const std::vector<float> states_before = prob.states;
  std::vector<double> y_ref(static_cast<size_t>(tokens * c.heads * c.head_dim), 0.0);
  std::vector<std::vector<double>> final_ref(static_cast<size_t>(live));
  for (int64_t b = 0; b < live; ++b) {
    std::vector<double> S(static_cast<size_t>(state_elems), 0.0);
    if (c.init != 0 && has_init[b]) {
      const float* src = states_before.data() + slots[b] * state_elems;
      S.assign(src, src + state_elems);
    }
    prob.recurrence(p, qsl[b], qsl[b + 1], S, y_ref);
    final_ref[b] = S;
  }

  run_cpu(p);

  const int64_t row = c.heads * c.head_dim;
  for (int64_t b = 0; b < live; ++b) {
    for (int64_t t = qsl[b]; t < qsl[b + 1]; ++t) {
      expect_close(prob.y.data() + t * prob.y_stride, y_ref.data() + t * row, static_cast<size_t>(row), kAtol, kRtol,
                   "y token " + std::to_string(t));
    }
    expect_close(prob.states.data() + slots[b] * state_elems, final_ref[b].data(), static_cast<size_t>(state_elems),
                 kAtol, kRtol, "final state row " + std::to_string(b));
  }
  // Padding rows and slots no row names are untouched.
  if (c.pad) {
    for (int64_t t = qsl[batch - 1]; t < qsl[batch]; ++t) {
      for (int64_t i = 0; i < prob.y_stride; ++i) ASSERT_EQ(prob.y[t * prob.y_stride + i], kSentinel);
    }
  }
  for (int64_t s = 0; s <= n_slots; ++s) {
    if (std::find(slots.begin(), slots.begin() + live, s) != slots.begin() + live) continue;
    for (int64_t e = 0; e < state_elems; ++e) {
      ASSERT_EQ(prob.states[s * state_elems + e], states_before[s * state_elems + e]) << "slot " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Grid, SsdScan,
    testing::Values(
        // lengths 37 (two full chunks + tail), 16 (exactly one chunk), 1 (single token)
        scan_case{1, 4, 8, 16, {37, 16, 1}, 16, 0, false}, scan_case{1, 4, 8, 16, {37, 16, 1}, 16, 1, true},
        scan_case{2, 4, 8, 16, {37, 16, 1}, 16, 2, true}, scan_case{2, 4, 8, 16, {37, 16, 1}, 16, 1, false},
        scan_case{4, 8, 4, 8, {64}, 16, 1, false},                                   // exact multiple of the chunk
        scan_case{1, 6, 8, 16, {5, 100, 33}, 32, 2, true},                           // hpg 6, mixed init
        scan_case{2, 8, 16, 32, {1}, 8, 1, true},                                    // decode-sized prefill
        scan_case{1, 4, 8, 16, {200}, 256, 1, false},                                // one partial chunk, chunk > len
        scan_case{1, 2, 8, 16, {50, 17}, 1, 2, false},                               // chunk of one token
        scan_case{1, 4, 8, 16, {37, 16, 1}, 16, 1, true, 0.1f, 0.5f},                // dt limits active
        scan_case{2, 4, 8, 16, {40, 9}, 16, 1, false, 0.0f, 3.4e38f, false, false},  // no dt_bias, no D
        scan_case{1, 4, 64, 128, {300, 70}, 128, 1, true},                           // Mamba2-like head shape
        scan_case{1, 2, 8, 16, {300}, 256, 1, false, 0.0f, 3.4e38f, true, true, 4.0f}),
    scan_name);

// Different chunk sizes compute the same function (chunk boundaries at every position).
TEST(SsdScanChunking, ChunkSizeInvariant) {
  const std::vector<int32_t> qsl{0, 45, 46, 90};
  const std::vector<int32_t> slots{0, 1, 2};
  const std::vector<uint8_t> has_init{1, 0, 1};
  std::vector<float> y_first;
  std::vector<float> states_first;
  for (int chunk : {1, 7, 16, 45, 64}) {
    ssm_problem prob(qsl.back(), 4, 8, 16, 2, 3, 77u);
    ssd_chunk_scan_params p;
    prob.fill(p, slots.data(), 3, true, true);
    p.query_start_loc = qsl.data();
    p.has_initial_state = has_init.data();
    p.chunk_size = chunk;
    run_cpu(p);
    if (y_first.empty()) {
      y_first = prob.y;
      states_first = prob.states;
    } else {
      expect_close(prob.y, y_first, kAtol, kRtol, "y chunk " + std::to_string(chunk));
      expect_close(prob.states, states_first, kAtol, kRtol, "states chunk " + std::to_string(chunk));
    }
  }
}

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
  std::string s = "ngroups" + std::to_string(c.n_groups) + "_heads" + std::to_string(c.heads) + "_hd" +
                  std::to_string(c.head_dim) + "_ds" + std::to_string(c.d_state) + "_bs" + std::to_string(c.batch);
  if (c.pad) s += "_pad";
  if (c.dt_max < 1e30f) s += "_dtclamp";
  if (!c.softplus) s += "_nosoftplus";
  return s;
}

class SsmUpdate : public testing::TestWithParam<update_case> {};

TEST_P(SsmUpdate, MatchesRecurrence) {
  const update_case& c = GetParam();
  const int64_t n_slots = c.batch + 3;
  ssm_problem prob(c.batch, c.heads, c.head_dim, c.d_state, c.n_groups, n_slots, 500u + static_cast<uint32_t>(c.batch));
  std::vector<int32_t> slots(static_cast<size_t>(c.batch));
  for (int b = 0; b < c.batch; ++b) slots[b] = static_cast<int32_t>(n_slots - b);  // distinct, descending
  if (c.pad) slots[1] = -1;

  selective_state_update_params p;
  prob.fill(p, slots.data(), c.batch, true, true);
  p.dt_min = c.dt_min;
  p.dt_max = c.dt_max;
  p.dt_softplus = c.softplus;

  const int64_t state_elems = c.heads * c.head_dim * c.d_state;
  const int64_t row = c.heads * c.head_dim;
  const std::vector<float> states_before = prob.states;
  std::vector<double> y_ref(static_cast<size_t>(c.batch * row), 0.0);
  std::vector<std::vector<double>> final_ref(static_cast<size_t>(c.batch));
  for (int b = 0; b < c.batch; ++b) {
    if (slots[b] < 0) continue;
    const float* src = states_before.data() + slots[b] * state_elems;
    std::vector<double> S(src, src + state_elems);
    prob.recurrence(p, b, b + 1, S, y_ref);
    final_ref[b] = S;
  }

  run_cpu(p);

  for (int b = 0; b < c.batch; ++b) {
    if (slots[b] < 0) {
      for (int64_t i = 0; i < prob.y_stride; ++i) ASSERT_EQ(prob.y[b * prob.y_stride + i], kSentinel);
      continue;
    }
    expect_close(prob.y.data() + b * prob.y_stride, y_ref.data() + b * row, static_cast<size_t>(row), kAtol, kRtol,
                 "y row " + std::to_string(b));
    expect_close(prob.states.data() + slots[b] * state_elems, final_ref[b].data(), static_cast<size_t>(state_elems),
                 kAtol, kRtol, "state row " + std::to_string(b));
  }
  for (int64_t s = 0; s <= n_slots; ++s) {
    if (std::find(slots.begin(), slots.end(), s) != slots.end()) continue;
    for (int64_t e = 0; e < state_elems; ++e) {
      ASSERT_EQ(prob.states[s * state_elems + e], states_before[s * state_elems + e]) << "slot " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, SsmUpdate,
                         testing::Values(update_case{1, 4, 8, 16, 1, false}, update_case{1, 4, 8, 16, 5, true},
                                         update_case{2, 8, 8, 16, 5, true}, update_case{4, 8, 16, 32, 3, false},
                                         update_case{1, 4, 8, 16, 5, true, 0.2f, 0.4f},
                                         update_case{2, 4, 8, 16, 4, false, 0.001f, 0.1f, false},
                                         update_case{1, 8, 64, 128, 6, true}),
                         update_name);

// dt limits: with dt_min == dt_max every step uses exactly that step size.
TEST(SsmUpdateLimits, ClampPinsStepSize) {
  ssm_problem prob(1, 1, 1, 1, 1, 0, 9u);
  prob.x[0] = 2.0f;
  prob.B[0] = 3.0f;
  prob.C[0] = 0.5f;
  prob.A_log[0] = 0.0f;  // A = -1
  prob.states[0] = 1.0f;
  prob.dt[0] = 50.0f;  // softplus(50 + bias) ≈ 50, clamped to 0.25
  const int32_t slot = 0;
  selective_state_update_params p;
  prob.fill(p, &slot, 1, true, false);
  p.dt_min = 0.25f;
  p.dt_max = 0.25f;
  run_cpu(p);
  const double s = std::exp(-0.25) * 1.0 + 0.25 * 2.0 * 3.0;
  EXPECT_NEAR(prob.states[0], s, 1e-6);
  EXPECT_NEAR(prob.y[0], s * 0.5, 1e-6);
}

// A prefill scan followed by decode updates equals one scan over the whole sequence.
TEST(SsmConsistency, ScanThenUpdatesEqualsLongScan) {
  const int64_t len = 23, tail = 3;
  ssm_problem whole(len, 4, 8, 16, 2, 1, 31u);
  const int32_t slot = 1;
  const std::vector<int32_t> qsl_whole{0, static_cast<int32_t>(len)};
  ssd_chunk_scan_params ps;
  whole.fill(ps, &slot, 1, true, true);
  ps.query_start_loc = qsl_whole.data();
  ps.chunk_size = 8;
  ssm_problem split = whole;
  run_cpu(ps);

  const std::vector<int32_t> qsl_head{0, static_cast<int32_t>(len - tail)};
  ssd_chunk_scan_params ph;
  split.fill(ph, &slot, 1, true, true);
  ph.query_start_loc = qsl_head.data();
  ph.chunk_size = 8;
  run_cpu(ph);
  for (int64_t t = len - tail; t < len; ++t) {
    selective_state_update_params pu;
    split.fill(pu, &slot, 1, true, true);
    pu.x = split.x.data() + t * split.x_stride;
    pu.dt = split.dt.data() + t * split.dt_stride;
    pu.B = split.B.data() + t * split.bc_stride;
    pu.C = split.C.data() + t * split.bc_stride;
    pu.y = split.y.data() + t * split.y_stride;
    run_cpu(pu);
  }
  expect_close(split.y, whole.y, kAtol, kRtol, "y");
  expect_close(split.states, whole.states, kAtol, kRtol, "states");
}

// ---------------------------------------------------------------------------------------------
// bf16 io and/or bf16 state, against the per-step recurrence on the same (bf16) values

void round_all(std::vector<float>& v) {
  for (auto& e : v) e = round_bf16(e);
}

// Values of v (already bf16-representable when t is bf16) as raw elements of type t.
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
      v[i] = bf16_to_f32(h);
    }
  }
  return v;
}

struct typed_buffers {
  std::vector<uint8_t> x, dt, B, C, y, states;
  // Rounds the problem's io tensors (and states) to bf16 where their type is bf16, then encodes.
  typed_buffers(ssm_problem& prob, dtype io, dtype st) {
    if (io == dtype::kBF16) {
      for (auto* v : {&prob.x, &prob.dt, &prob.B, &prob.C}) round_all(*v);
    }
    if (st == dtype::kBF16) round_all(prob.states);
    x = encode(prob.x, io);
    dt = encode(prob.dt, io);
    B = encode(prob.B, io);
    C = encode(prob.C, io);
    y = encode(prob.y, io);
    states = encode(prob.states, st);
  }
  void fill(ssm_common_params& p, dtype io, dtype st) {
    p.x = x.data();
    p.dt = dt.data();
    p.B = B.data();
    p.C = C.data();
    p.y = y.data();
    p.ssm_states = states.data();
    p.io_dtype = io;
    p.state_dtype = st;
  }
};

struct bf16_case {
  dtype io, st;
};

std::string bf16_name(const testing::TestParamInfo<bf16_case>& info) {
  return "io" + std::string(dtype_name(info.param.io)) + "_state" + std::string(dtype_name(info.param.st));
}

class SsmBf16 : public testing::TestWithParam<bf16_case> {};

constexpr double kBf16Atol = 1e-2;
constexpr double kBf16Rtol = 8e-3;

TEST_P(SsmBf16, ScanMatchesRecurrence) {
  const auto [io, st] = GetParam();
  // Lengths around the chunk (16): 1, 15, 16, 17, 40; an empty row; a padding row; mixed init.
  const std::vector<int32_t> qsl{0, 1, 16, 32, 49, 89, 89, 93};
  const int64_t batch = 7, live = 6, heads = 4, hd = 8, ds = 16, groups = 2;
  const int64_t n_slots = 2 * batch + 2;
  ssm_problem prob(qsl.back(), heads, hd, ds, groups, n_slots, 4242u);
  std::vector<int32_t> slots(static_cast<size_t>(batch));
  std::vector<uint8_t> has_init(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    slots[b] = static_cast<int32_t>(n_slots - 2 * b);
    has_init[b] = b % 2 == 0;
  }
  slots[batch - 1] = -1;
  typed_buffers buf(prob, io, st);
  ssd_chunk_scan_params p;
  prob.fill(p, slots.data(), batch, true, true);
  buf.fill(p, io, st);
  p.query_start_loc = qsl.data();
  p.has_initial_state = has_init.data();
  p.chunk_size = 16;

  const int64_t state_elems = heads * hd * ds, row = heads * hd;
  std::vector<double> y_ref(static_cast<size_t>(qsl.back() * row), 0.0);
  std::vector<std::vector<double>> final_ref(static_cast<size_t>(live));
  for (int64_t b = 0; b < live; ++b) {
    std::vector<double> S(static_cast<size_t>(state_elems), 0.0);
    if (has_init[b]) S.assign(prob.states.begin() + slots[b] * state_elems, prob.states.begin() + (slots[b] + 1) * state_elems);
    prob.recurrence(p, qsl[b], qsl[b + 1], S, y_ref);
    final_ref[b] = S;
  }
  const std::vector<uint8_t> states_before = buf.states, y_before = buf.y;
  run_cpu(p);
  const std::vector<float> y = decode(buf.y, io), states = decode(buf.states, st);
  const double s_atol = st == dtype::kF32 ? kAtol : kBf16Atol, s_rtol = st == dtype::kF32 ? kRtol : kBf16Rtol;
  for (int64_t b = 0; b < live; ++b) {
    for (int64_t t = qsl[b]; t < qsl[b + 1]; ++t) {
      expect_close(y.data() + t * prob.y_stride, y_ref.data() + t * row, static_cast<size_t>(row), kBf16Atol,
                   kBf16Rtol, "y token " + std::to_string(t));
    }
    expect_close(states.data() + slots[b] * state_elems, final_ref[b].data(), static_cast<size_t>(state_elems), s_atol,
                 s_rtol, "final state row " + std::to_string(b));
  }
  // The padding row's outputs and the slots no row names are untouched, bit for bit.
  const size_t es = dtype_size(io), ss = dtype_size(st);
  for (size_t i = static_cast<size_t>(qsl[live] * prob.y_stride) * es; i < buf.y.size(); ++i)
    ASSERT_EQ(buf.y[i], y_before[i]) << "padding row y byte " << i;
  for (int64_t s = 0; s <= n_slots; ++s) {
    if (std::find(slots.begin(), slots.begin() + live, s) != slots.begin() + live) continue;
    for (size_t i = static_cast<size_t>(s * state_elems) * ss; i < static_cast<size_t>((s + 1) * state_elems) * ss; ++i)
      ASSERT_EQ(buf.states[i], states_before[i]) << "slot " << s;
  }
}

TEST_P(SsmBf16, UpdateMatchesRecurrence) {
  const auto [io, st] = GetParam();
  const int64_t batch = 5, heads = 8, hd = 16, ds = 32, groups = 4, n_slots = batch + 3, steps = 4;
  ssm_problem prob(batch * steps, heads, hd, ds, groups, n_slots, 977u);
  std::vector<int32_t> slots(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) slots[b] = static_cast<int32_t>(n_slots - b);
  slots[1] = -1;
  typed_buffers buf(prob, io, st);
  const int64_t state_elems = heads * hd * ds, row = heads * hd;
  // Reference: per row, `steps` single-token updates; with bf16 states the state is rounded to
  // bf16 after every step, as the op stores it.
  std::vector<std::vector<double>> S(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    if (slots[b] >= 0) S[b].assign(prob.states.begin() + slots[b] * state_elems, prob.states.begin() + (slots[b] + 1) * state_elems);
  }
  const size_t es = dtype_size(io);
  for (int64_t k = 0; k < steps; ++k) {
    // Step k reads token rows [k·batch, (k+1)·batch).
    selective_state_update_params p;
    prob.fill(p, slots.data(), batch, true, true);
    buf.fill(p, io, st);
    const int64_t t0 = k * batch;
    p.x = buf.x.data() + static_cast<size_t>(t0 * prob.x_stride) * es;
    p.dt = buf.dt.data() + static_cast<size_t>(t0 * prob.dt_stride) * es;
    p.B = buf.B.data() + static_cast<size_t>(t0 * prob.bc_stride) * es;
    p.C = buf.C.data() + static_cast<size_t>(t0 * prob.bc_stride) * es;
    p.y = buf.y.data() + static_cast<size_t>(t0 * prob.y_stride) * es;
    std::vector<double> y_ref(static_cast<size_t>((t0 + batch) * row), 0.0);
    for (int64_t b = 0; b < batch; ++b) {
      if (slots[b] < 0) continue;
      prob.recurrence(p, t0 + b, t0 + b + 1, S[b], y_ref);
      if (st == dtype::kBF16) {
        for (auto& e : S[b]) e = round_bf16(static_cast<float>(e));
      }
    }
    run_cpu(p);
    const std::vector<float> y = decode(buf.y, io), states = decode(buf.states, st);
    const double s_atol = st == dtype::kF32 ? kAtol : kBf16Atol, s_rtol = st == dtype::kF32 ? kRtol : kBf16Rtol;
    for (int64_t b = 0; b < batch; ++b) {
      if (slots[b] < 0) continue;
      const int64_t t = t0 + b;
      expect_close(y.data() + t * prob.y_stride, y_ref.data() + t * row, static_cast<size_t>(row), kBf16Atol, kBf16Rtol,
                   "y step " + std::to_string(k) + " row " + std::to_string(b));
      expect_close(states.data() + slots[b] * state_elems, S[b].data(), static_cast<size_t>(state_elems), s_atol, s_rtol,
                   "state step " + std::to_string(k) + " row " + std::to_string(b));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, SsmBf16,
                         testing::Values(bf16_case{dtype::kBF16, dtype::kF32}, bf16_case{dtype::kBF16, dtype::kBF16},
                                         bf16_case{dtype::kF32, dtype::kBF16}),
                         bf16_name);

// Element types other than f32 and bf16 are rejected, naming the field.
TEST(SsmBf16Types, UnsupportedTypesAreErrors) {
  ssm_problem prob(3, 2, 4, 8, 1, 1, 5u);
  const std::vector<int32_t> qsl{0, 3};
  const int32_t slot = 0;
  ssd_chunk_scan_params p;
  prob.fill(p, &slot, 1, true, true);
  p.query_start_loc = qsl.data();
  p.io_dtype = dtype::kF16;
  EXPECT_THROW(run_cpu(p), invalid_argument_error);
  p.io_dtype = dtype::kF32;
  p.state_dtype = dtype::kI32;
  EXPECT_THROW(run_cpu(p), invalid_argument_error);
  selective_state_update_params u;
  prob.fill(u, &slot, 1, true, true);
  u.state_dtype = dtype::kF16;
  EXPECT_THROW(run_cpu(u), invalid_argument_error);
}

}  // namespace
}  // namespace hyserve::kernels
