// CPU emulation of the chunk-parallel SSD scan (kernels/cuda/ssd_scan_parallel.cuh) against the
// CPU op. The emulation is a plain-loop transcription of the three CUDA phases with the same
// chunking (256-token chunks relative to each sequence start, 64-row output tiles), the same
// device-side plan (chunk offsets per row, global chunk → row by binary search), the same
// initial-state, empty-row and padding-row handling, and (for bf16 io) the same bf16 rounding of
// the tensor-core operands (coef·x, the C·Bᵀ weights, S_in). It proves the decomposition and the
// varlen bookkeeping on the CPU.
// Tolerance: f32 io |Δ| <= 1e-4 + 1e-4·|want| (the state chain over chunks reorders additions of
// O(10) values); bf16 io as the CUDA tests: y 3e-2 + 2e-2·|want|, states 1e-2 + 1e-2·|want|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "hyserve/common/dtype.h"
#include "hyserve/kernels/ssm.h"
#include "kernel_test_util.h"

namespace hyserve::kernels {
namespace {

using test::expect_close;
using test::random_floats;
using test::round_bf16;

constexpr int kQ = 256;    // chunk length of the parallel path
constexpr int kTile = 64;  // output row tile

float load(const void* base, int64_t i, dtype t) {
  if (t == dtype::kF32) return static_cast<const float*>(base)[i];
  return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
}

void store(void* base, int64_t i, float v, dtype t) {
  if (t == dtype::kF32) static_cast<float*>(base)[i] = v;
  else static_cast<uint16_t*>(base)[i] = f32_to_bf16(v);
}

float softplus(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }

float step_size(const ssm_common_params& p, float raw, int64_t h) {
  float v = raw + (p.dt_bias != nullptr ? p.dt_bias[h] : 0.0f);
  if (p.dt_softplus) v = softplus(v);
  return std::min(std::max(v, p.dt_min), p.dt_max);
}

// The three phases of the parallel path on host memory.
void emulate_parallel(const ssd_chunk_scan_params& p) {
  const bool round_ops = p.io_dtype == dtype::kBF16;  // bf16 mma operands
  auto op = [&](float v) { return round_ops ? round_bf16(v) : v; };
  const int64_t H = p.heads, P = p.head_dim, N = p.d_state, PN = P * N;

  // Plan: chunk offsets per row (0 chunks for padding and empty rows).
  std::vector<int> chunk_off(static_cast<size_t>(p.batch + 1), 0);
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t len = p.query_start_loc[b + 1] - p.query_start_loc[b];
    const int n = p.state_indices[b] < 0 || len <= 0 ? 0 : static_cast<int>((len + kQ - 1) / kQ);
    chunk_off[b + 1] = chunk_off[b] + n;
  }
  const int total = chunk_off[p.batch];
  std::vector<float> states(static_cast<size_t>(total * H * PN));
  std::vector<float> decay(static_cast<size_t>(total * H));

  struct geom {
    int64_t b, t0, grp;
    int L;
    double A;
    float dtv[kQ];
    double cum[kQ];
  };
  auto resolve = [&](int gc, int64_t h, geom& c) {
    int64_t lo = 0, hi = p.batch;  // off[lo] <= gc < off[hi]
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (chunk_off[mid] <= gc) lo = mid;
      else hi = mid;
    }
    c.b = lo;
    const int64_t k = gc - chunk_off[lo];
    const int64_t start = p.query_start_loc[lo], len = p.query_start_loc[lo + 1] - start;
    c.t0 = start + k * kQ;
    c.L = static_cast<int>(std::min<int64_t>(kQ, len - k * kQ));
    EXPECT_GT(c.L, 0) << "chunk " << gc << " resolved to an empty chunk";
    c.grp = h / (p.heads / p.n_groups);
    c.A = -std::exp(static_cast<double>(p.A_log[h]));
    double run = 0.0;
    for (int j = 0; j < kQ; ++j) {
      c.dtv[j] = j < c.L ? step_size(p, load(p.dt, (c.t0 + j) * p.dt_stride + h, p.io_dtype), h) : 0.0f;
      run += static_cast<double>(c.dtv[j]) * c.A;
      c.cum[j] = run;
    }
  };
  auto X = [&](int64_t tok, int64_t h, int64_t pp) { return load(p.x, tok * p.x_stride + h * P + pp, p.io_dtype); };
  auto Bv = [&](int64_t tok, int64_t g, int64_t n) { return load(p.B, tok * p.bc_stride + g * N + n, p.io_dtype); };
  auto Cv = [&](int64_t tok, int64_t g, int64_t n) { return load(p.C, tok * p.bc_stride + g * N + n, p.io_dtype); };

  // Phase 1: chunk states from zero, S_c = (coef ∘ X)ᵀ·B, and the chunk decays.
  for (int gc = 0; gc < total; ++gc) {
    for (int64_t h = 0; h < H; ++h) {
      geom c;
      resolve(gc, h, c);
      const double cum_end = c.cum[kQ - 1];
      decay[gc * H + h] = static_cast<float>(std::exp(cum_end));
      float* S = states.data() + (gc * H + h) * PN;
      std::fill(S, S + PN, 0.0f);
      for (int j = 0; j < c.L; ++j) {
        const float coef = static_cast<float>(std::exp(cum_end - c.cum[j])) * c.dtv[j];
        for (int64_t pp = 0; pp < P; ++pp) {
          const float xc = op(coef * X(c.t0 + j, h, pp));
          for (int64_t n = 0; n < N; ++n) S[pp * N + n] += xc * Bv(c.t0 + j, c.grp, n);
        }
      }
    }
  }

  // Phase 2: the state pass; S_in overwrites S_c, the final state goes to the slot.
  const size_t es = dtype_size(p.state_dtype);
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t slot = p.state_indices[b];
    if (slot < 0) continue;
    const bool init = p.has_initial_state != nullptr && p.has_initial_state[b] != 0;
    for (int64_t h = 0; h < H; ++h) {
      auto* st = static_cast<uint8_t*>(p.ssm_states) + static_cast<size_t>((slot * H + h) * PN) * es;
      for (int64_t e = 0; e < PN; ++e) {
        float s = init ? load(st, e, p.state_dtype) : 0.0f;
        for (int k = chunk_off[b]; k < chunk_off[b + 1]; ++k) {
          float& slot_k = states[static_cast<size_t>((k * H + h) * PN + e)];
          const float sc = slot_k;
          slot_k = s;
          s = decay[k * H + h] * s + sc;
        }
        store(st, e, s, p.state_dtype);
      }
    }
  }

  // Phase 3: outputs per (chunk, row tile, head).
  for (int gc = 0; gc < total; ++gc) {
    for (int it = 0; it < kQ / kTile; ++it) {
      for (int64_t h = 0; h < H; ++h) {
        geom c;
        resolve(gc, h, c);
        const int i0 = kTile * it;
        if (i0 >= c.L) continue;
        const float* S = states.data() + (gc * H + h) * PN;
        const float d_skip = p.D != nullptr ? p.D[h] : 0.0f;
        for (int i = i0; i < std::min(i0 + kTile, c.L); ++i) {
          const int64_t ti = c.t0 + i;
          const float ecum = static_cast<float>(std::exp(c.cum[i]));
          std::vector<float> w(static_cast<size_t>(i + 1));
          for (int j = 0; j <= i; ++j) {
            float cb = 0.0f;
            for (int64_t n = 0; n < N; ++n) cb += Cv(ti, c.grp, n) * Bv(c.t0 + j, c.grp, n);
            w[j] = op(cb * std::exp(static_cast<float>(c.cum[i] - c.cum[j])) * c.dtv[j]);
          }
          for (int64_t pp = 0; pp < P; ++pp) {
            float cs = 0.0f;
            for (int64_t n = 0; n < N; ++n) cs += Cv(ti, c.grp, n) * op(S[pp * N + n]);
            float acc = ecum * cs;
            for (int j = 0; j <= i; ++j) acc += w[j] * X(c.t0 + j, h, pp);
            store(p.y, ti * p.y_stride + h * P + pp, acc + d_skip * X(ti, h, pp), p.io_dtype);
          }
        }
      }
    }
  }
}

std::vector<uint8_t> encode(const std::vector<float>& v, dtype t) {
  std::vector<uint8_t> raw(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) store(raw.data(), static_cast<int64_t>(i), v[i], t);
  return raw;
}

std::vector<float> decode(const std::vector<uint8_t>& raw, dtype t) {
  std::vector<float> v(raw.size() / dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) v[i] = load(raw.data(), static_cast<int64_t>(i), t);
  return v;
}

struct decomp_case {
  dtype io, st;
  int heads, n_groups, head_dim, d_state;
  std::vector<int> lens;
  int init;  // 0 none, 1 all rows, 2 alternate rows
  bool pad;  // a padding row (slot -1) at the end
};

std::string case_name(const testing::TestParamInfo<decomp_case>& info) {
  const auto& c = info.param;
  std::string s = std::string("io") + std::string(dtype_name(c.io)) + "_state" + std::string(dtype_name(c.st)) + "_h" +
                  std::to_string(c.heads) + "_g" + std::to_string(c.n_groups) + "_hd" + std::to_string(c.head_dim) +
                  "_ds" + std::to_string(c.d_state) + "_len";
  for (size_t i = 0; i < c.lens.size(); ++i) s += (i ? "x" : "") + std::to_string(c.lens[i]);
  s += c.init == 0 ? "_noinit" : c.init == 1 ? "_init" : "_mixedinit";
  if (c.pad) s += "_pad";
  return s;
}

class SsdDecomposition : public testing::TestWithParam<decomp_case> {};

TEST_P(SsdDecomposition, MatchesCpuOp) {
  const decomp_case& c = GetParam();
  std::vector<int32_t> qsl{0};
  for (int len : c.lens) qsl.push_back(qsl.back() + len);
  if (c.pad) qsl.push_back(qsl.back() + 5);
  const int64_t batch = static_cast<int64_t>(qsl.size()) - 1;
  const int64_t tokens = std::max(qsl.back(), 1);
  const int64_t n_slots = 2 * batch + 2;
  const int64_t H = c.heads, P = c.head_dim, N = c.d_state, G = c.n_groups;
  const int64_t x_stride = H * P + 3, dt_stride = H + 1, bc_stride = 2 * G * N + 2, y_stride = H * P + 5;
  const uint32_t seed = 11u + static_cast<uint32_t>(qsl.back());
  const auto dt_bias = random_floats(static_cast<size_t>(H), seed + 3, -0.5f, 0.5f);
  const auto A_log = random_floats(static_cast<size_t>(H), seed + 4, -1.0f, 1.0f);
  const auto D = random_floats(static_cast<size_t>(H), seed + 7);
  const auto x = encode(random_floats(static_cast<size_t>(tokens * x_stride), seed + 1), c.io);
  const auto dt = encode(random_floats(static_cast<size_t>(tokens * dt_stride), seed + 2, -3.0f, 1.0f), c.io);
  const auto bc = encode(random_floats(static_cast<size_t>(tokens * bc_stride), seed + 5), c.io);
  const auto y0 = encode(std::vector<float>(static_cast<size_t>(tokens * y_stride), 12345.0f), c.io);
  const auto s0 = encode(random_floats(static_cast<size_t>((n_slots + 1) * H * P * N), seed + 8), c.st);
  std::vector<int32_t> slots(static_cast<size_t>(batch));
  std::vector<uint8_t> has_init(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    slots[b] = static_cast<int32_t>(n_slots - 2 * b);
    has_init[b] = c.init == 1 || (c.init == 2 && b % 2 == 0);
  }
  if (c.pad) slots[batch - 1] = -1;

  std::vector<uint8_t> y_ref = y0, y_emu = y0, s_ref = s0, s_emu = s0;
  auto fill = [&](ssd_chunk_scan_params& p, std::vector<uint8_t>& y, std::vector<uint8_t>& s) {
    const size_t es = dtype_size(c.io);
    p.x = x.data();
    p.dt = dt.data();
    p.dt_bias = dt_bias.data();
    p.A_log = A_log.data();
    p.B = bc.data();
    p.C = bc.data() + static_cast<size_t>(G * N) * es;
    p.D = D.data();
    p.y = y.data();
    p.ssm_states = s.data();
    p.state_indices = slots.data();
    p.batch = batch;
    p.heads = H;
    p.head_dim = P;
    p.d_state = N;
    p.n_groups = G;
    p.x_stride = x_stride;
    p.dt_stride = dt_stride;
    p.bc_stride = bc_stride;
    p.y_stride = y_stride;
    p.io_dtype = c.io;
    p.state_dtype = c.st;
    p.query_start_loc = qsl.data();
    p.has_initial_state = c.init == 0 ? nullptr : has_init.data();
  };
  ssd_chunk_scan_params pr, pe;
  fill(pr, y_ref, s_ref);
  fill(pe, y_emu, s_emu);
  run_cpu(pr);
  emulate_parallel(pe);
  const bool bf = c.io == dtype::kBF16;
  const bool bfs = bf || c.st == dtype::kBF16;
  expect_close(decode(y_emu, c.io), decode(y_ref, c.io), bf ? 3e-2 : 1e-4, bf ? 2e-2 : 1e-4, "y");
  expect_close(decode(s_emu, c.st), decode(s_ref, c.st), bfs ? 1e-2 : 1e-4, bfs ? 1e-2 : 1e-4, "states");
}

const dtype kF = dtype::kF32, kB = dtype::kBF16;
const std::vector<int> kLens{1, 63, 64, 65, 127, 128, 129, 255, 256, 257, 700, 4096};

INSTANTIATE_TEST_SUITE_P(
    Grid, SsdDecomposition,
    testing::Values(
        // Every length of the grid in one varlen batch, with an empty live row and a padding row.
        decomp_case{kF, kF, 4, 2, 8, 16, {1, 63, 64, 65, 0, 127, 128, 129, 255, 256, 257, 700, 4096}, 2, true},
        decomp_case{kF, kB, 4, 2, 8, 16, {1, 63, 64, 65, 0, 127, 128, 129, 255, 256, 257, 700, 4096}, 1, true},
        decomp_case{kB, kF, 4, 2, 8, 16, {1, 63, 64, 65, 0, 127, 128, 129, 255, 256, 257, 700, 4096}, 2, true},
        decomp_case{kB, kB, 4, 2, 8, 16, {1, 63, 64, 65, 0, 127, 128, 129, 255, 256, 257, 700, 4096}, 0, true},
        // Each length alone (chunk tails at every boundary), with an initial state.
        decomp_case{kF, kF, 2, 1, 8, 16, {1}, 1, false}, decomp_case{kF, kF, 2, 1, 8, 16, {63}, 1, false},
        decomp_case{kF, kF, 2, 1, 8, 16, {64}, 1, false}, decomp_case{kF, kF, 2, 1, 8, 16, {65}, 1, false},
        decomp_case{kF, kF, 2, 1, 8, 16, {127}, 1, false}, decomp_case{kF, kF, 2, 1, 8, 16, {128}, 1, false},
        decomp_case{kF, kF, 2, 1, 8, 16, {129}, 1, false}, decomp_case{kF, kF, 2, 1, 8, 16, {255}, 1, false},
        decomp_case{kF, kF, 2, 1, 8, 16, {256}, 1, false}, decomp_case{kF, kF, 2, 1, 8, 16, {257}, 1, false},
        decomp_case{kF, kF, 2, 1, 8, 16, {700}, 0, false}, decomp_case{kF, kF, 2, 1, 8, 16, {4096}, 1, false},
        // The production head shape (head_dim 64, d_state 128), few heads.
        decomp_case{kB, kF, 2, 1, 64, 128, {257, 0, 700}, 2, true},
        decomp_case{kB, kB, 2, 2, 64, 128, {129, 513}, 1, false}),
    case_name);

}  // namespace
}  // namespace hyserve::kernels
