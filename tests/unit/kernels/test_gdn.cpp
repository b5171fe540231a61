// Gated DeltaNet chunked prefill and decode update against the per-token recurrence, in double:
//   q̂ = q / sqrt(Σq² + 1e-6) · K^-1/2,  k̂ = k / sqrt(Σk² + 1e-6)
//   g = -exp(A_log)·softplus(a + dt_bias);  beta = sigmoid(b)
//   S ← exp(g)·S;  S ← S + beta·(v − S·k̂) ⊗ k̂;  o = S·q̂          S: [V, K] per value head
// Tolerance: |got − want| <= 2e-6 + 1e-5·|want| on outputs and final states (outputs are
// O(0.1)–O(1), states O(1); the largest observed error of the fp32 kernels on this grid is 2e-7).
#include "hyserve/kernels/gdn.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernel_test_util.h"

namespace hyserve::kernels {
namespace {

using test::expect_close;
using test::random_floats;

constexpr double kAtol = 2e-6;
constexpr double kRtol = 1e-5;
constexpr float kSentinel = 12345.0f;  // marks rows and slots a padding row must not touch

double softplus_ref(double v) { return v > 20.0 ? v : std::log1p(std::exp(v)); }

// All tensors of one test problem. q | k | v share one buffer with a padded row stride, as the
// conv output does in the model; a and b share another.
struct gdn_problem {
  int64_t tokens = 0, heads_k = 0, heads_v = 0, k_dim = 0, v_dim = 0, n_slots = 0;
  int64_t qkv_stride = 0, ab_stride = 0, out_stride = 0;
  std::vector<float> qkv, ab, A_log, dt_bias, out, states;

  gdn_problem(int64_t tokens_, int64_t hk, int64_t hv, int64_t kd, int64_t vd, int64_t n_slots_, uint32_t seed)
      : tokens(tokens_), heads_k(hk), heads_v(hv), k_dim(kd), v_dim(vd), n_slots(n_slots_) {
    qkv_stride = 2 * hk * kd + hv * vd + 3;  // padded strides catch stride mix-ups
    ab_stride = 2 * hv + 1;
    out_stride = hv * vd + 5;
    qkv = random_floats(static_cast<size_t>(tokens * qkv_stride), seed + 1);
    ab = random_floats(static_cast<size_t>(tokens * ab_stride), seed + 2, -3.0f, 2.0f);
    A_log = random_floats(static_cast<size_t>(hv), seed + 3, -1.0f, 1.0f);
    dt_bias = random_floats(static_cast<size_t>(hv), seed + 4, -0.5f, 0.5f);
    out.assign(static_cast<size_t>(tokens * out_stride), kSentinel);
    states = random_floats(static_cast<size_t>((n_slots + 1) * state_elems()), seed + 5);
  }

  int64_t state_elems() const { return heads_v * v_dim * k_dim; }
  const float* q(int64_t t) const { return qkv.data() + t * qkv_stride; }
  const float* k(int64_t t) const { return q(t) + heads_k * k_dim; }
  const float* v(int64_t t) const { return q(t) + 2 * heads_k * k_dim; }
  const float* b(int64_t t) const { return ab.data() + t * ab_stride; }
  const float* a(int64_t t) const { return b(t) + heads_v; }

  void fill(gdn_common_params& p, const int32_t* state_indices, int64_t batch, bool qk_l2norm) {
    p.q = qkv.data();
    p.k = qkv.data() + heads_k * k_dim;
    p.v = qkv.data() + 2 * heads_k * k_dim;
    p.b = ab.data();
    p.a = ab.data() + heads_v;
    p.A_log = A_log.data();
    p.dt_bias = dt_bias.data();
    p.out = out.data();
    p.states = states.data();
    p.state_indices = state_indices;
    p.batch = batch;
    p.heads_k = heads_k;
    p.heads_v = heads_v;
    p.k_dim = k_dim;
    p.v_dim = v_dim;
    p.q_stride = p.k_stride = p.v_stride = qkv_stride;
    p.a_stride = p.b_stride = ab_stride;
    p.out_stride = out_stride;
    p.qk_l2norm = qk_l2norm;
  }

  // Per-token recurrence over packed tokens [t0, t1) of one sequence, in place on a double
  // state [HV, V, K]; writes o_ref rows [tokens, HV, V].
  void recurrence(bool qk_l2norm, int64_t t0, int64_t t1, std::vector<double>& S, std::vector<double>& o_ref) const {
    const int64_t K = k_dim, V = v_dim, group = heads_v / heads_k;
    const double scale = 1.0 / std::sqrt(static_cast<double>(K));
    std::vector<double> qn(static_cast<size_t>(K)), kn(static_cast<size_t>(K));
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t h = 0; h < heads_v; ++h) {
        const int64_t hk = h / group;
        double qs = 0.0, ks = 0.0;
        for (int64_t x = 0; x < K; ++x) {
          qs += static_cast<double>(q(t)[hk * K + x]) * q(t)[hk * K + x];
          ks += static_cast<double>(k(t)[hk * K + x]) * k(t)[hk * K + x];
        }
        const double qf = qk_l2norm ? scale / std::sqrt(qs + 1e-6) : scale;
        const double kf = qk_l2norm ? 1.0 / std::sqrt(ks + 1e-6) : 1.0;
        for (int64_t x = 0; x < K; ++x) {
          qn[static_cast<size_t>(x)] = q(t)[hk * K + x] * qf;
          kn[static_cast<size_t>(x)] = k(t)[hk * K + x] * kf;
        }
        const double g = -std::exp(static_cast<double>(A_log[h])) *
                         softplus_ref(static_cast<double>(a(t)[h]) + static_cast<double>(dt_bias[h]));
        const double beta = 1.0 / (1.0 + std::exp(-static_cast<double>(b(t)[h])));
        for (int64_t e = 0; e < V; ++e) {
          double* row = S.data() + (h * V + e) * K;
          double pred = 0.0;
          for (int64_t x = 0; x < K; ++x) {
            row[x] *= std::exp(g);
            pred += row[x] * kn[static_cast<size_t>(x)];
          }
          const double delta = beta * (v(t)[h * V + e] - pred);
          double o = 0.0;
          for (int64_t x = 0; x < K; ++x) {
            row[x] += delta * kn[static_cast<size_t>(x)];
            o += row[x] * qn[static_cast<size_t>(x)];
          }
          o_ref[static_cast<size_t>(t * heads_v * V + h * V + e)] = o;
        }
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Chunked prefill

struct scan_case {
  int heads_k, heads_v, k_dim, v_dim;
  std::vector<int> lens;  // per batch row; a padding row is appended when pad
  int chunk;
  int init;  // 0: no initial states, 1: all rows, 2: alternate rows (has_initial_state mixed)
  bool pad;
  bool qk_l2norm = true;
  float a_shift = 0.0f;  // added to the decay input: strong decay drives the chunk cumsum to -1e3
};

std::string scan_name(const testing::TestParamInfo<scan_case>& info) {
  const auto& c = info.param;
  std::string s = "hk" + std::to_string(c.heads_k) + "_hv" + std::to_string(c.heads_v) + "_K" +
                  std::to_string(c.k_dim) + "_V" + std::to_string(c.v_dim) + "_len" + test::join(c.lens) + "_chunk" +
                  std::to_string(c.chunk);
  s += c.init == 0 ? "_noinit" : c.init == 1 ? "_init" : "_mixedinit";
  if (c.pad) s += "_pad";
  if (!c.qk_l2norm) s += "_nol2";
  if (c.a_shift != 0.0f) s += "_strongdecay";
  return s;
}

class GdnChunkScan : public testing::TestWithParam<scan_case> {};

TEST_P(GdnChunkScan, MatchesRecurrence) {
  const scan_case& c = GetParam();
  std::vector<int32_t> qsl{0};
  for (int len : c.lens) qsl.push_back(qsl.back() + len);
  const int64_t live = static_cast<int64_t>(c.lens.size());
  if (c.pad) qsl.push_back(qsl.back() + 5);
  const int64_t batch = static_cast<int64_t>(qsl.size()) - 1;
  const int64_t tokens = qsl.back();
  const int64_t n_slots = 2 * batch + 2;

  gdn_problem prob(tokens, c.heads_k, c.heads_v, c.k_dim, c.v_dim, n_slots, 2000u + static_cast<uint32_t>(tokens));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < c.heads_v; ++h)
      prob.ab[static_cast<size_t>(t * prob.ab_stride + c.heads_v + h)] += c.a_shift;
  std::vector<int32_t> slots(static_cast<size_t>(batch));
  std::vector<uint8_t> has_init(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    slots[static_cast<size_t>(b)] = static_cast<int32_t>(n_slots - 2 * b);  // scattered, descending slots
    has_init[static_cast<size_t>(b)] = c.init == 1 || (c.init == 2 && b % 2 == 0);
  }
  if (c.pad) slots[static_cast<size_t>(batch - 1)] = -1;

  gdn_chunk_scan_params p;
  prob.fill(p, slots.data(), batch, c.qk_l2norm);
  p.query_start_loc = qsl.data();
  p.has_initial_state = c.init == 0 ? nullptr : has_init.data();
  p.chunk_size = c.chunk;

  const int64_t se = prob.state_elems();
  const std::vector<float> states_before = prob.states;
  std::vector<double> o_ref(static_cast<size_t>(tokens * c.heads_v * c.v_dim), 0.0);
  std::vector<std::vector<double>> final_ref(static_cast<size_t>(live));
  for (int64_t b = 0; b < live; ++b) {
    std::vector<double> S(static_cast<size_t>(se), 0.0);
    if (c.init != 0 && has_init[static_cast<size_t>(b)]) {
      const float* src = states_before.data() + slots[static_cast<size_t>(b)] * se;
      S.assign(src, src + se);
    }
    prob.recurrence(c.qk_l2norm, qsl[static_cast<size_t>(b)], qsl[static_cast<size_t>(b) + 1], S, o_ref);
    final_ref[static_cast<size_t>(b)] = S;
  }

  run_cpu(p);

  const int64_t row = c.heads_v * c.v_dim;
  for (int64_t b = 0; b < live; ++b) {
    for (int64_t t = qsl[static_cast<size_t>(b)]; t < qsl[static_cast<size_t>(b) + 1]; ++t)
      expect_close(prob.out.data() + t * prob.out_stride, o_ref.data() + t * row, static_cast<size_t>(row), kAtol,
                   kRtol, "out token " + std::to_string(t));
    expect_close(prob.states.data() + slots[static_cast<size_t>(b)] * se, final_ref[static_cast<size_t>(b)].data(),
                 static_cast<size_t>(se), kAtol, kRtol, "final state row " + std::to_string(b));
  }
  // Padding rows and slots no row names are untouched.
  if (c.pad) {
    for (int64_t t = qsl[static_cast<size_t>(batch - 1)]; t < tokens; ++t)
      for (int64_t i = 0; i < prob.out_stride; ++i)
        ASSERT_EQ(prob.out[static_cast<size_t>(t * prob.out_stride + i)], kSentinel);
  }
  for (int64_t s = 0; s <= n_slots; ++s) {
    if (std::find(slots.begin(), slots.begin() + live, s) != slots.begin() + live) continue;
    for (int64_t e = 0; e < se; ++e)
      ASSERT_EQ(prob.states[static_cast<size_t>(s * se + e)], states_before[static_cast<size_t>(s * se + e)])
          << "slot " << s;
  }
}

std::vector<scan_case> scan_grid() {
  std::vector<scan_case> g;
  // Every length around the chunk size, for both head ratios, with and without initial states.
  for (const auto& [hk, hv] : {std::pair{2, 2}, std::pair{2, 4}}) {
    for (int len : {1, 63, 64, 65, 130}) {
      for (int init : {0, 1}) g.push_back({hk, hv, 16, 32, {len}, 64, init, false});
    }
    // Several sequences of mixed lengths, mixed initial states and a padding row.
    g.push_back({hk, hv, 16, 32, {1, 63, 64, 65, 130}, 64, 2, true});
    g.push_back({hk, hv, 16, 32, {130, 1, 65}, 64, 1, true});
  }
  g.push_back({1, 3, 32, 16, {70, 5}, 64, 2, true});                 // K > V, ratio 3
  g.push_back({2, 4, 16, 8, {37, 16, 1}, 16, 2, true});              // small chunks, chunk boundary at 16
  g.push_back({2, 2, 8, 8, {129}, 64, 1, false, false});             // unnormalised q, k
  g.push_back({2, 4, 16, 16, {130, 64}, 64, 2, false, true, 6.0f});  // strong decay
  return g;
}

INSTANTIATE_TEST_SUITE_P(Grid, GdnChunkScan, testing::ValuesIn(scan_grid()), scan_name);

// ---------------------------------------------------------------------------------------------
// Decode update: several steps over a batch with a padding row, against the recurrence.

struct update_case {
  int heads_k, heads_v, k_dim, v_dim, batch, steps;
};

class GdnStateUpdate : public testing::TestWithParam<update_case> {};

TEST_P(GdnStateUpdate, MatchesRecurrence) {
  const update_case& c = GetParam();
  const int64_t batch = c.batch + 1;  // last row is padding
  const int64_t n_slots = batch + 3;
  gdn_problem prob(batch * c.steps, c.heads_k, c.heads_v, c.k_dim, c.v_dim, n_slots,
                   77u + static_cast<uint32_t>(c.batch));
  std::vector<int32_t> slots(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) slots[static_cast<size_t>(b)] = static_cast<int32_t>(n_slots - 1 - b);
  slots[static_cast<size_t>(batch - 1)] = -1;

  const int64_t se = prob.state_elems();
  const std::vector<float> states_before = prob.states;
  std::vector<std::vector<double>> S(static_cast<size_t>(batch));
  for (int64_t b = 0; b + 1 < batch; ++b) {
    const float* src = states_before.data() + slots[static_cast<size_t>(b)] * se;
    S[static_cast<size_t>(b)].assign(src, src + se);
  }
  std::vector<double> o_ref(static_cast<size_t>(prob.tokens * c.heads_v * c.v_dim), 0.0);

  const int64_t row = c.heads_v * c.v_dim;
  for (int step = 0; step < c.steps; ++step) {
    // Step `step` reads tokens [step·batch, (step+1)·batch): token of row b = step·batch + b.
    const int64_t t0 = step * batch;
    gdn_state_update_params p;
    prob.fill(p, slots.data(), batch, true);
    p.q += t0 * prob.qkv_stride;
    p.k += t0 * prob.qkv_stride;
    p.v += t0 * prob.qkv_stride;
    p.a += t0 * prob.ab_stride;
    p.b += t0 * prob.ab_stride;
    p.out += t0 * prob.out_stride;
    run_cpu(p);
    for (int64_t b = 0; b + 1 < batch; ++b) {
      prob.recurrence(true, t0 + b, t0 + b + 1, S[static_cast<size_t>(b)], o_ref);
      expect_close(prob.out.data() + (t0 + b) * prob.out_stride, o_ref.data() + (t0 + b) * row,
                   static_cast<size_t>(row), kAtol, kRtol,
                   "step " + std::to_string(step) + " row " + std::to_string(b));
    }
    for (int64_t i = 0; i < prob.out_stride; ++i)
      ASSERT_EQ(prob.out[static_cast<size_t>((t0 + batch - 1) * prob.out_stride + i)], kSentinel) << "padding row";
  }
  for (int64_t b = 0; b + 1 < batch; ++b)
    expect_close(prob.states.data() + slots[static_cast<size_t>(b)] * se, S[static_cast<size_t>(b)].data(),
                 static_cast<size_t>(se), kAtol, kRtol, "state row " + std::to_string(b));
  for (int64_t s : {int64_t{0}, int64_t{1}, int64_t{2}, n_slots})  // slots no row names
    for (int64_t e = 0; e < se; ++e)
      ASSERT_EQ(prob.states[static_cast<size_t>(s * se + e)], states_before[static_cast<size_t>(s * se + e)]);
}

std::string update_name(const testing::TestParamInfo<update_case>& info) {
  const auto& c = info.param;
  return "hk" + std::to_string(c.heads_k) + "_hv" + std::to_string(c.heads_v) + "_K" + std::to_string(c.k_dim) + "_V" +
         std::to_string(c.v_dim) + "_bs" + std::to_string(c.batch) + "_steps" + std::to_string(c.steps);
}

INSTANTIATE_TEST_SUITE_P(Grid, GdnStateUpdate,
                         testing::Values(update_case{2, 2, 16, 32, 3, 4}, update_case{2, 4, 16, 32, 5, 3},
                                         update_case{1, 2, 32, 16, 1, 6}, update_case{4, 8, 8, 8, 7, 2}),
                         update_name);

// A prefill of n tokens followed by decode steps equals one prefill over all of them.
TEST(GdnPrefillThenDecode, EqualsOnePrefill) {
  const int64_t hk = 2, hv = 4, K = 16, V = 16, n = 70, extra = 3;
  gdn_problem prob(n + extra, hk, hv, K, V, 2, 99u);
  std::vector<float> states_two = prob.states;
  const std::vector<int32_t> slot = {1};

  gdn_chunk_scan_params whole;
  prob.fill(whole, slot.data(), 1, true);
  const std::vector<int32_t> qsl_all = {0, static_cast<int32_t>(n + extra)};
  whole.query_start_loc = qsl_all.data();
  run_cpu(whole);
  const std::vector<float> out_whole = prob.out;
  const std::vector<float> state_whole = prob.states;

  prob.states = states_two;
  std::fill(prob.out.begin(), prob.out.end(), kSentinel);
  gdn_chunk_scan_params pre;
  prob.fill(pre, slot.data(), 1, true);
  const std::vector<int32_t> qsl_pre = {0, static_cast<int32_t>(n)};
  pre.query_start_loc = qsl_pre.data();
  run_cpu(pre);
  for (int64_t t = n; t < n + extra; ++t) {
    gdn_state_update_params d;
    prob.fill(d, slot.data(), 1, true);
    d.q += t * prob.qkv_stride;
    d.k += t * prob.qkv_stride;
    d.v += t * prob.qkv_stride;
    d.a += t * prob.ab_stride;
    d.b += t * prob.ab_stride;
    d.out += t * prob.out_stride;
    run_cpu(d);
  }
  expect_close(prob.out, out_whole, kAtol, kRtol, "outputs");
  expect_close(prob.states, state_whole, kAtol, kRtol, "states");
}

// bf16 io: on bf16-exact inputs the op widens, computes in f32 and rounds the outputs, so its
// outputs are exactly the f32 op's rounded to bf16 and its states exactly the f32 op's; padding
// rows' outputs stay untouched.
TEST(GdnChunkScanBf16Io, EqualsF32OpRounded) {
  gdn_problem prob(200, 2, 4, 16, 24, 4, 77u);
  for (float& x : prob.qkv) x = bf16_to_f32(f32_to_bf16(x));
  const std::vector<int32_t> slots = {3, -1, 1};
  const std::vector<int32_t> qsl = {0, 130, 135, 200};
  const std::vector<uint8_t> init = {1, 0, 0};
  const std::vector<float> states0 = prob.states;

  gdn_chunk_scan_params f;
  prob.fill(f, slots.data(), 3, true);
  f.query_start_loc = qsl.data();
  f.has_initial_state = init.data();
  run_cpu(f);
  const std::vector<float> out_f32 = prob.out, states_f32 = prob.states;

  prob.states = states0;
  std::vector<uint16_t> qkv16(prob.qkv.size());
  for (size_t i = 0; i < qkv16.size(); ++i) qkv16[i] = f32_to_bf16(prob.qkv[i]);
  constexpr uint16_t kUntouched = 0x7fc1;  // a NaN pattern the op never writes
  std::vector<uint16_t> out16(prob.out.size(), kUntouched);
  gdn_chunk_scan_params h = f;
  h.states = prob.states.data();
  h.q = h.k = h.v = nullptr;
  h.out = nullptr;
  h.io_dtype = dtype::kBF16;
  h.q_bf16 = qkv16.data();
  h.k_bf16 = qkv16.data() + prob.heads_k * prob.k_dim;
  h.v_bf16 = qkv16.data() + 2 * prob.heads_k * prob.k_dim;
  h.out_bf16 = out16.data();
  run_cpu(h);
  size_t written = 0;
  for (size_t i = 0; i < out16.size(); ++i) {
    if (out_f32[i] == kSentinel) {
      ASSERT_EQ(out16[i], kUntouched) << "element " << i << " written where the f32 op wrote nothing";
    } else {
      ASSERT_EQ(out16[i], f32_to_bf16(out_f32[i])) << "element " << i;
      ++written;
    }
  }
  EXPECT_EQ(written, static_cast<size_t>(195 * prob.heads_v * prob.v_dim));
  EXPECT_EQ(prob.states, states_f32);
}

TEST(GdnInvalidParams, NamesTheField) {
  gdn_problem prob(4, 2, 3, 8, 8, 2, 5u);
  const std::vector<int32_t> slots = {0};
  const std::vector<int32_t> qsl = {0, 4};
  gdn_chunk_scan_params p;
  prob.fill(p, slots.data(), 1, true);
  p.query_start_loc = qsl.data();
  test::expect_invalid([&] { run_cpu(p); }, "heads_v");  // 3 is not a multiple of 2
  p.heads_v = 4;
  p.v_stride = 3;
  test::expect_invalid([&] { run_cpu(p); }, "v_stride");
  gdn_state_update_params u;
  prob.fill(u, slots.data(), 1, true);
  u.heads_v = 2;
  u.A_log = nullptr;
  test::expect_invalid([&] { run_cpu(u); }, "A_log");
  p = gdn_chunk_scan_params{};
  prob.fill(p, slots.data(), 1, true);
  p.heads_v = 2;
  p.query_start_loc = qsl.data();
  p.chunk_size = 0;
  test::expect_invalid([&] { run_cpu(p); }, "chunk_size");
  p.chunk_size = 64;
  p.io_dtype = dtype::kF16;
  test::expect_invalid([&] { run_cpu(p); }, "io_dtype");
  p.io_dtype = dtype::kBF16;  // the bf16 pointers are required then
  test::expect_invalid([&] { run_cpu(p); }, "q_bf16");
}

}  // namespace
}  // namespace hyserve::kernels
