// Backend ops: Gated DeltaNet chunked prefill and decode update, CUDA against CPU.
// GdnChunkScanCuda runs the default prefill path (tc; a context's kernels.gdn_prefill may name another);
// GdnChunkScanCudaPaths each path explicitly. The recurrent CUDA prefill walks the tokens one by one (the per-token recurrence) where the CPU
// op uses the chunked WY form, so the two differ by fp32 rounding in a different order: over
// hundreds of tokens with states O(1) and outputs O(0.1)–O(1) we allow |Δ| <= 2e-5 + 2e-4·|want|
// on outputs and final states for the prefill, and 1e-5 + 1e-4·|want| for the decode update (one
// token: only the order of the K-term dot products differs).
// The tensor-core prefill (cuda/gdn_paths.cuh) is checked per path: tc (3xTF32, fp32-level
// products) against the same elementwise tolerance as the recurrent kernel; tf32 (one TF32
// product per term, about 5e-4 relative per product) against relative L2 <= 5e-3 with every
// element within 3e-2·rms(want) + 2e-2·|want|. Measured on the H200 over this grid: relative L2
// <= 5.5e-4 everywhere; the worst element of the outputs of K = 128 cases is 4.8e-5 against an
// rms of 4.0e-3 (1.2e-2·rms: a 128-term dot product whose terms cancel keeps the terms' TF32
// error, not the sum's size), which an element bound of 5e-3·rms rejected. bf16 (every product's
// operands rounded to bf16, 2^-9 relative, as the flash-linear-attention kernels compute; f32
// accumulation and state) against relative L2 <= 2e-2 with every element within
// 1e-1·rms(want) + 5e-2·|want|. Measured on the H200 over this grid: relative L2 <= 9.2e-3 (the
// worst: outputs of one token from a zero state, a single bf16 q̂·k̂ product each), the worst
// element 6.4e-2·(rms + |want|) (an output of 0.048 in a case of rms 6.8e-3); with bf16 io
// (below) 5.2e-3 and 5.4e-2.
// Every tensor-core case prints its measured relative L2 and worst element ("[gdn-tc] ...").
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "hyserve/kernels/device.h"

#if defined(HYSERVE_HAVE_CUDA)

#include "cuda/gdn_paths.cuh"
#include "cuda_test_util.h"
#include "hyserve/kernels/gdn.h"

namespace hyserve::kernels {
namespace {

using cuda_test::expect_invalid;
using cuda_test::expect_match;
using cuda_test::join;
using cuda_test::poison;
using cuda_test::random_floats;
using cuda_test::to_device;

constexpr double kScanAtol = 2e-5, kScanRtol = 2e-4;
constexpr double kUpdateAtol = 1e-5, kUpdateRtol = 1e-4;

// The precision class of a path's products, for its tolerance (see the top of the file).
enum class products { fp32, tf32, bf16 };
products products_of(gdn_prefill_path path) {
  return path == gdn_prefill_path::tf32 ? products::tf32
         : path == gdn_prefill_path::bf16 ? products::bf16
                                          : products::fp32;
}

// Host and device copies of one problem. q | k | v share one buffer with a padded row stride
// (as the conv output does in the model), b | a another; padded strides catch stride mix-ups.
struct gdn_problem {
  int64_t tokens, heads_k, heads_v, k_dim, v_dim, n_slots;
  int64_t qkv_stride, ab_stride, out_stride;
  std::vector<float> qkv, ab, A_log, dt_bias, out, states;
  device_array<float> dqkv, dab, dA_log, ddt_bias, dout, dstates;

  // row_pad: extra floats per q | k | v row; 3 leaves rows unaligned, 4 keeps 16-byte rows (the
  // tensor-core prefill copies them with cp.async then).
  gdn_problem(int64_t tokens_, int64_t hk, int64_t hv, int64_t kd, int64_t vd, int64_t n_slots_, uint32_t seed,
              float a_shift = 0.0f, int64_t row_pad = 3)
      : tokens(tokens_), heads_k(hk), heads_v(hv), k_dim(kd), v_dim(vd), n_slots(n_slots_) {
    qkv_stride = 2 * hk * kd + hv * vd + row_pad;
    ab_stride = 2 * hv + 1;
    out_stride = hv * vd + 5;
    qkv = random_floats(static_cast<size_t>(tokens * qkv_stride), seed + 1);
    ab = random_floats(static_cast<size_t>(tokens * ab_stride), seed + 2, -3.0f, 2.0f);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t h = 0; h < hv; ++h) ab[static_cast<size_t>(t * ab_stride + hv + h)] += a_shift;
    A_log = random_floats(static_cast<size_t>(hv), seed + 3, -1.0f, 1.0f);
    dt_bias = random_floats(static_cast<size_t>(hv), seed + 4, -0.5f, 0.5f);
    out.assign(static_cast<size_t>(tokens * out_stride), poison());
    states = random_floats(static_cast<size_t>((n_slots + 1) * hv * vd * kd), seed + 5);
    dqkv = to_device(qkv);
    dab = to_device(ab);
    dA_log = to_device(A_log);
    ddt_bias = to_device(dt_bias);
    dout = device_array<float>(out.size());
    dout.fill_bytes(0xff);
    dstates = to_device(states);
  }

  void fill_host(gdn_common_params& p, const int32_t* slots, int64_t batch, bool l2, bool bias) {
    fill(p, slots, batch, l2, bias, qkv.data(), ab.data(), A_log.data(), dt_bias.data(), out.data(), states.data());
  }
  void fill_device(gdn_common_params& p, const int32_t* slots, int64_t batch, bool l2, bool bias) {
    fill(p, slots, batch, l2, bias, dqkv.data(), dab.data(), dA_log.data(), ddt_bias.data(), dout.data(),
         dstates.data());
  }

  void check(const std::string& what, double atol, double rtol) {
    expect_match(dout.download(), out, atol, rtol, what + " out");
    expect_match(dstates.download(), states, atol, rtol, what + " states");
  }

  // Prints relative L2 and the worst element of outputs and states; with a products class other
  // than fp32 checks its tolerance (see the top of the file), else the elementwise atol/rtol.
  void check_measured(const std::string& what, double atol, double rtol, products loose) {
    const auto got_out = dout.download();
    const auto got_states = dstates.download();
    measure(got_out, out, what + " out", loose);
    measure(got_states, states, what + " states", loose);
    if (loose == products::fp32) {
      expect_match(got_out, out, atol, rtol, what + " out");
      expect_match(got_states, states, atol, rtol, what + " states");
    }
  }

  static void measure(const std::vector<float>& got, const std::vector<float>& want, const std::string& what,
                      products loose) {
    const double l2_max = loose == products::bf16 ? 2e-2 : 5e-3;
    const double el_rms = loose == products::bf16 ? 1e-1 : 3e-2, el_rel = loose == products::bf16 ? 5e-2 : 2e-2;
    ASSERT_EQ(got.size(), want.size()) << what;
    double d2 = 0.0, r2 = 0.0, worst_abs = 0.0, worst_rel = 0.0;
    size_t n = 0, untouched_bad = 0, nonfinite = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (cuda_test::is_poison(want[i])) {
        if (!cuda_test::is_poison(got[i])) ++untouched_bad;
        continue;
      }
      if (!std::isfinite(got[i])) {
        ++nonfinite;
        continue;
      }
      const double d = static_cast<double>(got[i]) - want[i];
      d2 += d * d;
      r2 += static_cast<double>(want[i]) * want[i];
      ++n;
    }
    const double rms = n > 0 ? std::sqrt(r2 / static_cast<double>(n)) : 0.0;
    size_t beyond = 0, worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (cuda_test::is_poison(want[i]) || !std::isfinite(got[i])) continue;
      const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
      if (err > worst_abs) {
        worst_abs = err;
        worst = i;
      }
      worst_rel = std::max(worst_rel, err / (rms + std::fabs(static_cast<double>(want[i]))));
      if (err > el_rms * rms + el_rel * std::fabs(static_cast<double>(want[i]))) ++beyond;
    }
    const double rel_l2 = std::sqrt(d2 / std::max(r2, 1e-30));
    std::printf("[gdn-tc] %s: rel_l2 %.3e, max |d| %.3e at %zu (cuda %.6g, cpu %.6g), max |d|/(rms+|want|) %.3e, rms %.3e, n %zu\n",
                what.c_str(), rel_l2, worst_abs, worst, n > 0 ? got[worst] : 0.0f, n > 0 ? want[worst] : 0.0f,
                worst_rel, rms, n);
    EXPECT_EQ(untouched_bad, 0u) << what << ": elements written where the CPU op wrote nothing";
    EXPECT_EQ(nonfinite, 0u) << what << ": non-finite elements";
    EXPECT_GT(n, 0u) << what << ": the CPU op wrote nothing (vacuous comparison)";
    if (loose != products::fp32) {
      EXPECT_LE(rel_l2, l2_max) << what << ": relative L2 error";
      EXPECT_EQ(beyond, 0u) << what << ": elements beyond " << el_rms << "·rms + " << el_rel << "·|want| (worst at "
                            << worst << ")";
    }
  }

 private:
  void fill(gdn_common_params& p, const int32_t* slots, int64_t batch, bool l2, bool bias, const float* qkv_,
            const float* ab_, const float* A_log_, const float* dt_bias_, float* out_, float* states_) const {
    p.q = qkv_;
    p.k = qkv_ + heads_k * k_dim;
    p.v = qkv_ + 2 * heads_k * k_dim;
    p.b = ab_;
    p.a = ab_ + heads_v;
    p.A_log = A_log_;
    p.dt_bias = bias ? dt_bias_ : nullptr;
    p.out = out_;
    p.states = states_;
    p.state_indices = slots;
    p.batch = batch;
    p.heads_k = heads_k;
    p.heads_v = heads_v;
    p.k_dim = k_dim;
    p.v_dim = v_dim;
    p.q_stride = p.k_stride = p.v_stride = qkv_stride;
    p.a_stride = p.b_stride = ab_stride;
    p.out_stride = out_stride;
    p.qk_l2norm = l2;
  }
};

// ---------------------------------------------------------------------------------------------
// Chunked prefill

struct scan_case {
  int heads_k, heads_v, k_dim, v_dim;
  std::vector<int> lens;
  int chunk;
  int init;  // 0: none, 1: all rows, 2: alternate rows
  bool pad;  // a padding row (slot -1) is appended
  bool l2 = true, bias = true;
  float a_shift = 0.0f;  // strong decay: the per-token log decay reaches about -1e3 per chunk
  float scale = 0.0f;
  bool aligned = false;  // 16-byte aligned q | k | v rows
};

std::string scan_name(const testing::TestParamInfo<scan_case>& info) {
  const auto& c = info.param;
  std::string s = "Cuda_f32_hk" + std::to_string(c.heads_k) + "_hv" + std::to_string(c.heads_v) + "_K" +
                  std::to_string(c.k_dim) + "_V" + std::to_string(c.v_dim) + "_len" + join(c.lens) + "_chunk" +
                  std::to_string(c.chunk);
  s += c.init == 0 ? "_noinit" : c.init == 1 ? "_init" : "_mixedinit";
  if (c.pad) s += "_pad";
  if (!c.l2) s += "_nol2";
  if (!c.bias) s += "_nobias";
  if (c.a_shift != 0.0f) s += "_strongdecay";
  if (c.scale != 0.0f) s += "_scale";
  if (c.aligned) s += "_aligned";
  return s;
}

// One scan_case's batch on both sides: packed token offsets (a padding row of 5 tokens last when
// c.pad), scattered descending slots (-1 for the padding row), initial-state flags, the problem
// (seed + tokens; row_pad as gdn_problem's), and the CPU and CUDA params over them.
struct scan_setup {
  std::vector<int32_t> qsl;
  int64_t batch;
  std::vector<int32_t> slots;
  std::vector<uint8_t> has_init;
  gdn_problem prob;
  device_array<int32_t> dqsl, dslots;
  device_array<uint8_t> dinit;
  gdn_chunk_scan_params pc, pg;

  scan_setup(const scan_case& c, uint32_t seed, int64_t row_pad)
      : qsl(offsets(c)),
        batch(static_cast<int64_t>(qsl.size()) - 1),
        slots(static_cast<size_t>(batch)),
        has_init(static_cast<size_t>(batch)),
        prob(qsl.back(), c.heads_k, c.heads_v, c.k_dim, c.v_dim, 2 * batch + 2, seed + static_cast<uint32_t>(qsl.back()),
             c.a_shift, row_pad) {
    const int64_t n_slots = 2 * batch + 2;
    for (int64_t b = 0; b < batch; ++b) {
      slots[static_cast<size_t>(b)] = static_cast<int32_t>(n_slots - 2 * b);
      has_init[static_cast<size_t>(b)] = c.init == 1 || (c.init == 2 && b % 2 == 0);
    }
    if (c.pad) slots[static_cast<size_t>(batch - 1)] = -1;
    dqsl = to_device(qsl);
    dslots = to_device(slots);
    dinit = to_device(has_init);
    prob.fill_host(pc, slots.data(), batch, c.l2, c.bias);
    pc.query_start_loc = qsl.data();
    pc.has_initial_state = c.init == 0 ? nullptr : has_init.data();
    pc.chunk_size = c.chunk;
    pc.scale = c.scale;
    pg = pc;
    prob.fill_device(pg, dslots.data(), batch, c.l2, c.bias);
    pg.query_start_loc = dqsl.data();
    pg.has_initial_state = c.init == 0 ? nullptr : dinit.data();
  }

  static std::vector<int32_t> offsets(const scan_case& c) {
    std::vector<int32_t> q{0};
    for (int len : c.lens) q.push_back(q.back() + len);
    if (c.pad) q.push_back(q.back() + 5);
    return q;
  }
};

class GdnChunkScanCuda : public testing::TestWithParam<scan_case> {};

TEST_P(GdnChunkScanCuda, MatchesCpu) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const scan_case& c = GetParam();
  scan_setup u(c, 3000u, 3);
  run_cpu(u.pc);
  run_cuda(u.pg);
  device_synchronize();
  u.prob.check("scan", kScanAtol, kScanRtol);
}

std::vector<scan_case> scan_grid() {
  std::vector<scan_case> g;
  // Every length around the chunk size, both head ratios, with and without initial states.
  for (const auto& [hk, hv] : {std::pair{1, 1}, std::pair{1, 2}, std::pair{2, 2}}) {
    for (int len : {1, 63, 64, 65, 130}) {
      for (int init : {0, 1}) g.push_back({hk, hv, 32, 32, {len}, 64, init, false});
    }
    // Several sequences of mixed lengths, mixed initial states and a padding row.
    g.push_back({hk, hv, 32, 32, {1, 63, 64, 65, 130}, 64, 2, true});
  }
  g.push_back({2, 4, 16, 48, {37, 16, 1}, 16, 2, true});         // V not a multiple of a block's rows
  g.push_back({1, 3, 64, 20, {70, 5}, 64, 2, true});             // K > V, ratio 3
  g.push_back({2, 2, 256, 64, {129, 2}, 64, 1, false});          // largest key dim: 2 float4 per lane
  g.push_back({2, 2, 32, 16, {129}, 64, 1, false, false});       // unnormalised q, k
  g.push_back({2, 4, 64, 32, {130, 64}, 64, 2, false, true, false, 6.0f});  // strong decay, no dt_bias
  g.push_back({1, 2, 32, 32, {65, 3}, 64, 1, true, true, true, 0.0f, 0.3f});  // explicit scale
  g.push_back({1, 1, 32, 32, {0, 9}, 64, 1, false});            // an empty sequence keeps (or zeroes) its slot
  // Qwen3-Next head shape, one tensor-parallel shard of 32 value heads.
  g.push_back({16, 32, 128, 128, {300, 17, 64, 1}, 64, 2, true});
  return g;
}

INSTANTIATE_TEST_SUITE_P(Grid, GdnChunkScanCuda, testing::ValuesIn(scan_grid()), scan_name);

// ---------------------------------------------------------------------------------------------
// Chunked prefill, each CUDA path explicitly (the tensor-core kernels: K in {32, 64, 128}; other
// key dims take the recurrent kernel whichever path is asked, and are checked the same way).

using path_case = std::tuple<scan_case, gdn_prefill_path>;

std::string path_case_name(const testing::TestParamInfo<path_case>& info) {
  const scan_case& c = std::get<0>(info.param);
  testing::TestParamInfo<scan_case> inner(c, info.index);
  return std::string(gdn_prefill_path_name(std::get<1>(info.param))) + "_" + scan_name(inner);
}

class GdnChunkScanCudaPaths : public testing::TestWithParam<path_case> {};

TEST_P(GdnChunkScanCudaPaths, MatchesCpu) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const scan_case& c = std::get<0>(GetParam());
  const gdn_prefill_path path = std::get<1>(GetParam());
  scan_setup u(c, 5000u + static_cast<uint32_t>(c.k_dim), c.aligned ? 4 : 3);
  run_cpu(u.pc);
  run_cuda(u.pg, path);
  device_synchronize();
  const bool tc = gdn_prefill_tc_supports(u.pg) && path != gdn_prefill_path::recurrent;
  const std::string what = std::string(gdn_prefill_path_name(path)) + (tc ? "" : "(recurrent kernel)") + " " +
                           testing::UnitTest::GetInstance()->current_test_info()->name();
  u.prob.check_measured(what, kScanAtol, kScanRtol, tc ? products_of(path) : products::fp32);
}

std::vector<scan_case> tc_grid() {
  std::vector<scan_case> g = scan_grid();
  // Lengths around the chunk size, both head ratios, each tensor-core key dim.
  for (const auto& [hk, hv] : {std::pair{1, 1}, std::pair{2, 4}}) {
    for (int kd : {32, 64, 128}) {
      for (int len : {1, 63, 64, 65, 200}) {
        for (int init : {0, 1}) g.push_back({hk, hv, kd, kd == 32 ? 48 : kd, {len}, 64, init, false});
      }
    }
  }
  // Several sequences, mixed initial states, a padding row; value dims that are not whole
  // 32-row slices; many chunks per row.
  g.push_back({2, 4, 64, 48, {200, 1, 63, 64, 65}, 64, 2, true});
  g.push_back({1, 2, 32, 20, {130, 7, 64}, 64, 1, true});
  g.push_back({2, 2, 128, 96, {1000, 300}, 64, 2, false});
  g.push_back({4, 8, 128, 128, {200, 0, 65, 1}, 64, 2, true});  // an empty sequence among others
  g.push_back({2, 4, 128, 128, {200, 63}, 64, 1, false, true, true, 6.0f});  // strong decay
  g.push_back({16, 32, 128, 128, {200, 1, 63, 64, 65, 17}, 64, 2, true});  // Qwen3-Next shape
  // 16-byte aligned rows: q, k, v staged with cp.async, overlapping the next chunk's copies.
  g.push_back({16, 32, 128, 128, {200, 1, 63, 64, 65, 17}, 64, 2, true, true, true, 0.0f, 0.0f, true});
  g.push_back({1, 2, 32, 48, {130, 64, 1}, 64, 2, true, true, true, 0.0f, 0.0f, true});
  g.push_back({2, 4, 64, 20, {63, 0, 65}, 64, 2, true, true, true, 0.0f, 0.0f, true});
  g.push_back({2, 2, 128, 64, {1000}, 64, 1, false, true, true, 0.0f, 0.0f, true});
  // More chunks than the default reservation (16384 tokens + one per row): the recurrent kernel
  // runs instead, gated on the device.
  g.push_back({1, 2, 32, 32, {16500, 200}, 64, 2, false});
  return g;
}

INSTANTIATE_TEST_SUITE_P(Grid, GdnChunkScanCudaPaths,
                         testing::Combine(testing::ValuesIn(tc_grid()),
                                          testing::Values(gdn_prefill_path::tc, gdn_prefill_path::tf32,
                                                          gdn_prefill_path::bf16)),
                         path_case_name);

// ---------------------------------------------------------------------------------------------
// Chunked prefill with bf16 io (q, k, v and out in bf16; the bf16 and recurrent paths), against
// the CPU op with the same bf16 io on the same bf16 inputs. The bf16 path: the bf16 tolerance
// above (its products are bf16 whatever the io). The recurrent kernel: f32 arithmetic as for f32
// io, then both sides round the outputs to bf16, where values that differ by the f32 tolerance
// may round one bf16 step (at most 2^-7 relative) apart: outputs within 3e-5 + 1e-2·|want|,
// states (f32) within the f32 tolerance.

// bf16 bits to floats; 0xffff (what fill_bytes(0xff) writes) to the f32 poison pattern, so that
// untouched elements compare as untouched.
std::vector<float> widen(const std::vector<uint16_t>& h) {
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = h[i] == 0xffffu ? poison() : bf16_to_f32(h[i]);
  return f;
}

std::string bf16_io_case_name(const testing::TestParamInfo<path_case>& info) {
  std::string s = path_case_name(info);
  const size_t at = s.find("Cuda_f32_");
  if (at != std::string::npos) s.replace(at, 9, "Cuda_bf16_");
  return s;
}

class GdnChunkScanCudaBf16Io : public testing::TestWithParam<path_case> {};

TEST_P(GdnChunkScanCudaBf16Io, MatchesCpu) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const scan_case& c = std::get<0>(GetParam());
  const gdn_prefill_path path = std::get<1>(GetParam());
  // aligned: rows of a multiple of 8 elements (16 bytes in bf16).
  scan_setup u(c, 7000u + static_cast<uint32_t>(c.k_dim), c.aligned ? 8 : 3);
  std::vector<uint16_t> qkv16(u.prob.qkv.size());
  for (size_t i = 0; i < qkv16.size(); ++i) qkv16[i] = f32_to_bf16(u.prob.qkv[i]);
  std::vector<uint16_t> out16(u.prob.out.size(), 0xffffu);
  auto dqkv16 = to_device(qkv16);
  device_array<uint16_t> dout16(out16.size());
  dout16.fill_bytes(0xff);
  auto bf16_rows = [&](gdn_chunk_scan_params& p, const uint16_t* qkv, uint16_t* out) {
    p.q = p.k = p.v = nullptr;
    p.out = nullptr;
    p.io_dtype = dtype::kBF16;
    p.q_bf16 = qkv;
    p.k_bf16 = qkv + c.heads_k * c.k_dim;
    p.v_bf16 = qkv + 2 * c.heads_k * c.k_dim;
    p.out_bf16 = out;
  };
  bf16_rows(u.pc, qkv16.data(), out16.data());
  bf16_rows(u.pg, dqkv16.data(), dout16.data());
  run_cpu(u.pc);
  run_cuda(u.pg, path);
  device_synchronize();
  const std::vector<float> got = widen(dout16.download()), want = widen(out16);
  const bool tc = gdn_prefill_tc_supports(u.pg) && path != gdn_prefill_path::recurrent;
  const std::string what = std::string(gdn_prefill_path_name(path)) + (tc ? "" : "(recurrent kernel)") + " bf16 io " +
                           testing::UnitTest::GetInstance()->current_test_info()->name();
  if (tc) {
    gdn_problem::measure(got, want, what + " out", products::bf16);
    gdn_problem::measure(u.prob.dstates.download(), u.prob.states, what + " states", products::bf16);
  } else {
    expect_match(got, want, 3e-5, 1e-2, what + " out");
    expect_match(u.prob.dstates.download(), u.prob.states, kScanAtol, kScanRtol, what + " states");
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, GdnChunkScanCudaBf16Io,
                         testing::Combine(testing::ValuesIn(tc_grid()),
                                          testing::Values(gdn_prefill_path::bf16, gdn_prefill_path::recurrent)),
                         bf16_io_case_name);

// ---------------------------------------------------------------------------------------------
// Decode update

struct update_case {
  int heads_k, heads_v, k_dim, v_dim, batch;
  bool pad;  // row 1 is padding (-1)
  bool l2 = true, bias = true;
};

std::string update_name(const testing::TestParamInfo<update_case>& info) {
  const auto& c = info.param;
  std::string s = "Cuda_f32_hk" + std::to_string(c.heads_k) + "_hv" + std::to_string(c.heads_v) + "_K" +
                  std::to_string(c.k_dim) + "_V" + std::to_string(c.v_dim) + "_bs" + std::to_string(c.batch);
  if (c.pad) s += "_pad";
  if (!c.l2) s += "_nol2";
  if (!c.bias) s += "_nobias";
  return s;
}

class GdnStateUpdateCuda : public testing::TestWithParam<update_case> {};

TEST_P(GdnStateUpdateCuda, MatchesCpu) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const update_case& c = GetParam();
  // The default kernel, then each decode kernel explicitly, each on fresh inputs.
  for (gdn_decode_path path : {gdn_decode_path::automatic, gdn_decode_path::grid, gdn_decode_path::persistent,
                               gdn_decode_path::persistent8, gdn_decode_path::tiles8}) {
    SCOPED_TRACE(gdn_decode_path_name(path));
    const int64_t n_slots = c.batch + 3;
    gdn_problem prob(c.batch, c.heads_k, c.heads_v, c.k_dim, c.v_dim, n_slots, 700u + static_cast<uint32_t>(c.batch));
    std::vector<int32_t> slots(static_cast<size_t>(c.batch));
    for (int b = 0; b < c.batch; ++b) slots[static_cast<size_t>(b)] = static_cast<int32_t>(n_slots - b);
    if (c.pad && c.batch > 1) slots[1] = -1;
    auto dslots = to_device(slots);
    gdn_state_update_params pc;
    prob.fill_host(pc, slots.data(), c.batch, c.l2, c.bias);
    gdn_state_update_params pg = pc;
    prob.fill_device(pg, dslots.data(), c.batch, c.l2, c.bias);
    run_cpu(pc);
    run_cuda(pg, path);
    device_synchronize();
    prob.check(std::string("update ") + gdn_decode_path_name(path), kUpdateAtol, kUpdateRtol);
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, GdnStateUpdateCuda,
                         testing::Values(update_case{16, 32, 128, 128, 64, true},  // Qwen3-Next decode shape
                                         update_case{16, 32, 128, 128, 1, false},
                                         update_case{1, 1, 32, 32, 5, true},
                                         update_case{1, 2, 64, 48, 7, true},
                                         update_case{2, 2, 16, 20, 3, false, false},
                                         update_case{2, 4, 256, 64, 9, true, true, false},
                                         update_case{16, 32, 128, 128, 256, true},  // more tiles than resident blocks
                                         update_case{2, 4, 32, 40, 300, true},      // partial 32-row tiles
                                         update_case{1, 2, 16, 16, 33, false}),     // K too small for 8 rows per lane
                         update_name);

// A CUDA prefill followed by CUDA decode steps equals one CUDA prefill over all the tokens.
// Recurrent prefill: the decode kernel's own arithmetic, so equal to 1e-6 + 1e-5·|want|. The
// tensor-core prefills compute the chunked form (as the CPU op does): equal within the
// recurrent-vs-chunked tolerance of the prefill tests (tc), or the tf32 one.
void prefill_then_updates(gdn_prefill_path path, double atol, double rtol) {
  const int64_t len = 70, tail = 3, hk = 2, hv = 4, K = 128, V = 64;
  gdn_problem whole(len, hk, hv, K, V, 1, 41u);
  gdn_problem split(len, hk, hv, K, V, 1, 41u);  // same seed: same inputs and states
  const std::vector<int32_t> slot{1};
  const std::vector<int32_t> qsl_whole{0, static_cast<int32_t>(len)}, qsl_head{0, static_cast<int32_t>(len - tail)};
  auto dslot = to_device(slot), dqsl_whole = to_device(qsl_whole), dqsl_head = to_device(qsl_head);

  gdn_chunk_scan_params pw;
  whole.fill_device(pw, dslot.data(), 1, true, true);
  pw.query_start_loc = dqsl_whole.data();
  run_cuda(pw, path);
  gdn_chunk_scan_params ph;
  split.fill_device(ph, dslot.data(), 1, true, true);
  ph.query_start_loc = dqsl_head.data();
  run_cuda(ph, path);
  for (int64_t t = len - tail; t < len; ++t) {
    gdn_state_update_params pu;
    split.fill_device(pu, dslot.data(), 1, true, true);
    pu.q += t * split.qkv_stride;
    pu.k += t * split.qkv_stride;
    pu.v += t * split.qkv_stride;
    pu.a += t * split.ab_stride;
    pu.b += t * split.ab_stride;
    pu.out += t * split.out_stride;
    run_cuda(pu);
  }
  device_synchronize();
  const std::string what = gdn_prefill_path_name(path);
  expect_match(split.dout.download(), whole.dout.download(), atol, rtol, what + " out");
  expect_match(split.dstates.download(), whole.dstates.download(), atol, rtol, what + " states");
}

TEST(GdnCudaConsistency, Cuda_f32_PrefillThenUpdatesEqualsLongPrefill) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  prefill_then_updates(gdn_prefill_path::recurrent, 1e-6, 1e-5);
  prefill_then_updates(gdn_prefill_path::tc, kScanAtol, kScanRtol);
  prefill_then_updates(gdn_prefill_path::tf32, 2e-3, 2e-2);
  prefill_then_updates(gdn_prefill_path::bf16, 2e-2, 1e-1);
}

// Unsupported key dims and malformed params are errors naming the field, raised before launch.
TEST(GdnCudaInvalidParams, NamesTheField) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  gdn_problem prob(4, 2, 2, 24, 8, 2, 5u);
  const std::vector<int32_t> slots = {0};
  auto dslots = to_device(slots);
  const std::vector<int32_t> qsl = {0, 4};
  auto dqsl = to_device(qsl);
  gdn_chunk_scan_params p;
  prob.fill_device(p, dslots.data(), 1, true, true);
  p.query_start_loc = dqsl.data();
  expect_invalid([&] { run_cuda(p); }, "k_dim");  // 24 is not in the key-dim table
  gdn_state_update_params u;
  prob.fill_device(u, dslots.data(), 1, true, true);
  u.k_dim = 16;
  u.heads_v = 3;
  expect_invalid([&] { run_cuda(u); }, "heads_v");
  u.heads_v = 2;
  u.states = prob.dstates.data() + 1;  // misaligned for the 16-byte state accesses
  expect_invalid([&] { run_cuda(u); }, "states");
  p.k_dim = 16;
  p.chunk_size = 0;
  expect_invalid([&] { run_cuda(p); }, "chunk_size");
  p.chunk_size = 64;
  p.io_dtype = dtype::kF16;
  expect_invalid([&] { run_cuda(p); }, "io_dtype");
  p.io_dtype = dtype::kBF16;  // the bf16 pointers are required then
  expect_invalid([&] { run_cuda(p); }, "q_bf16");
  std::vector<uint16_t> rows16(64 * 64, 0);
  auto d16 = to_device(rows16);
  p.q_bf16 = p.k_bf16 = p.v_bf16 = d16.data();
  p.out_bf16 = d16.data();
  p.k_dim = 32;
  expect_invalid([&] { run_cuda(p, gdn_prefill_path::tc); }, "io_dtype");  // the f32-accurate paths take f32 io
}

}  // namespace
}  // namespace hyserve::kernels

#endif
