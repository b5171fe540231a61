// Speculative-decoding ops against a naive per-step reference: every draft node is run through
// the single-token decode op (itself tested against the double-precision recurrence) starting
// from a copy of its parent's state. Chain and tree layouts, Draft-mode start columns, padding
// rows, the persistent state left untouched, zero-draft verify + commit equal to one decode
// step bit for bit, and the fused commit. Tree attention: spec_tree_attention_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "hyserve/kernels/causal_conv1d.h"
#include "hyserve/kernels/gdn.h"
#include "hyserve/kernels/ssm.h"
#include "kernel_test_util.h"

namespace hyserve::kernels {
namespace {

using test::expect_close;
using test::random_floats;
using test::to_bf16;

constexpr double kTol = 1e-6;

struct layout {
  int64_t batch = 3, T = 4, steps = 4;
  std::vector<int32_t> slots = {2, -1, 4};
  std::vector<int32_t> parent;      // [batch, T]; empty = chain
  std::vector<int32_t> first_step;  // [batch]; empty = 0
  int32_t parent_of(int64_t b, int64_t t) const {
    return parent.empty() ? static_cast<int32_t>(t - 1) : parent[static_cast<size_t>(b * T + t)];
  }
  int64_t first(int64_t b) const { return first_step.empty() ? 0 : first_step[static_cast<size_t>(b)]; }
};

std::vector<layout> layouts() {
  std::vector<layout> out;
  layout chain;
  out.push_back(chain);
  layout tree;  // node 0 root; 1, 2 children of 0; 3 child of 2
  tree.parent = {-1, 0, 0, 2, -1, 0, 1, 1, -1, 0, 0, 0};
  out.push_back(tree);
  layout one;  // zero drafts: one token per row
  one.T = 1;
  one.steps = 1;
  out.push_back(one);
  layout draft;  // Draft mode: one token per row at step columns 0, -, 2 of 3
  draft.T = 1;
  draft.steps = 3;
  draft.first_step = {0, 0, 2};
  out.push_back(draft);
  return out;
}

// Fills the columns that Draft-mode rows start from (first_step − 1), so they are read.
void seed_columns(const layout& L, std::vector<float>& steps_buf, int64_t elems, uint32_t seed) {
  const std::vector<float> r = random_floats(steps_buf.size(), seed);
  for (int64_t b = 0; b < L.batch; ++b)
    if (L.first(b) > 0) {
      const int64_t col = b * L.steps + L.first(b) - 1;
      std::memcpy(steps_buf.data() + col * elems, r.data() + col * elems, static_cast<size_t>(elems) * sizeof(float));
    }
}

// Start state of node t of row b for the reference: the slot, a seeded step column, or a node.
const float* ref_start(const layout& L, int64_t b, int64_t t, const float* slot_states, const float* steps_buf,
                       const std::vector<std::vector<float>>& node_states, int64_t elems) {
  const int32_t q = L.parent_of(b, t);
  if (q >= 0) return node_states[static_cast<size_t>(b * L.T + q)].data();
  if (L.first(b) > 0) return steps_buf + (b * L.steps + L.first(b) - 1) * elems;
  return slot_states + L.slots[static_cast<size_t>(b)] * elems;
}

class SpecDecodeLayout : public ::testing::TestWithParam<int> {};

TEST_P(SpecDecodeLayout, SelectiveStateUpdateMultiMatchesPerStepDecode) {
  const layout L = layouts()[static_cast<size_t>(GetParam())];
  const int64_t H = 4, P = 8, N = 16, G = 2, n_slots = 5, tokens = L.batch * L.T;
  const int64_t elems = H * P * N, xs = H * P + 1, dts = H + 2, bcs = G * N + 3, ys = H * P;
  auto x = random_floats(static_cast<size_t>(tokens * xs), 1);
  auto dt = random_floats(static_cast<size_t>(tokens * dts), 2, -3.0f, 1.0f);
  auto dt_bias = random_floats(static_cast<size_t>(H), 3, -0.5f, 0.5f);
  auto A_log = random_floats(static_cast<size_t>(H), 4);
  auto B = random_floats(static_cast<size_t>(tokens * bcs), 5);
  auto C = random_floats(static_cast<size_t>(tokens * bcs), 6);
  auto D = random_floats(static_cast<size_t>(H), 7);
  auto states = random_floats(static_cast<size_t>((n_slots + 1) * elems), 8);
  const auto states_before = states;
  std::vector<float> steps_buf(static_cast<size_t>(L.batch * L.steps * elems), 0.0f);
  seed_columns(L, steps_buf, elems, 9);
  std::vector<float> y(static_cast<size_t>(tokens * ys), 777.0f);

  auto common = [&](ssm_common_params& p) {
    p.dt_bias = dt_bias.data();
    p.A_log = A_log.data();
    p.D = D.data();
    p.heads = H;
    p.head_dim = P;
    p.d_state = N;
    p.n_groups = G;
    p.x_stride = xs;
    p.dt_stride = dts;
    p.bc_stride = bcs;
    p.y_stride = ys;
  };
  selective_state_update_multi_params p;
  common(p);
  p.x = x.data();
  p.dt = dt.data();
  p.B = B.data();
  p.C = C.data();
  p.y = y.data();
  p.ssm_states = states.data();
  p.state_indices = L.slots.data();
  p.batch = L.batch;
  p.step_states = steps_buf.data();
  p.retrieve_parent = L.parent.empty() ? nullptr : L.parent.data();
  p.first_step = L.first_step.empty() ? nullptr : L.first_step.data();
  p.tokens_per_row = L.T;
  p.steps = L.steps;
  run_cpu(p);

  EXPECT_EQ(states, states_before) << "the persistent state must not change";
  std::vector<std::vector<float>> node(static_cast<size_t>(tokens));
  for (int64_t b = 0; b < L.batch; ++b) {
    if (L.slots[static_cast<size_t>(b)] < 0) {
      for (int64_t t = 0; t < L.T; ++t)
        for (int64_t i = 0; i < ys; ++i) EXPECT_EQ(y[static_cast<size_t>((b * L.T + t) * ys + i)], 777.0f);
      continue;
    }
    for (int64_t t = 0; t < L.T; ++t) {
      const int64_t tok = b * L.T + t;
      std::vector<float> s(ref_start(L, b, t, states.data(), steps_buf.data(), node, elems),
                           ref_start(L, b, t, states.data(), steps_buf.data(), node, elems) + elems);
      std::vector<float> yr(static_cast<size_t>(ys));
      const int32_t zero = 0;
      selective_state_update_params r;
      common(r);
      r.x = x.data() + tok * xs;
      r.dt = dt.data() + tok * dts;
      r.B = B.data() + tok * bcs;
      r.C = C.data() + tok * bcs;
      r.y = yr.data();
      r.ssm_states = s.data();
      r.state_indices = &zero;
      r.batch = 1;
      run_cpu(r);
      node[static_cast<size_t>(tok)] = s;
      const std::string what = "row " + std::to_string(b) + " node " + std::to_string(t);
      expect_close(y.data() + tok * ys, yr.data(), static_cast<size_t>(ys), kTol, kTol, what + " y");
      expect_close(steps_buf.data() + (b * L.steps + L.first(b) + t) * elems, s.data(), static_cast<size_t>(elems),
                   kTol, kTol, what + " state");
    }
  }
}

TEST_P(SpecDecodeLayout, ConvUpdateMultiMatchesPerStepDecode) {
  const layout L = layouts()[static_cast<size_t>(GetParam())];
  const int64_t dim = 24, K = 4, W = K - 1, n_slots = 5, tokens = L.batch * L.T, xs = dim + 3, os = dim + 1;
  const int64_t elems = dim * W;
  auto x = random_floats(static_cast<size_t>(tokens * xs), 11);
  auto w = random_floats(static_cast<size_t>(dim * K), 12);
  auto bias = random_floats(static_cast<size_t>(dim), 13);
  auto states = random_floats(static_cast<size_t>((n_slots + 1) * elems), 14);
  const auto states_before = states;
  std::vector<float> steps_buf(static_cast<size_t>(L.batch * L.steps * elems), 0.0f);
  seed_columns(L, steps_buf, elems, 15);
  std::vector<float> out(static_cast<size_t>(tokens * os), 777.0f);
  conv1d_update_multi_params p;
  p.x = x.data();
  p.weight = w.data();
  p.bias = bias.data();
  p.out = out.data();
  p.state_indices = L.slots.data();
  p.conv_states = states.data();
  p.step_windows = steps_buf.data();
  p.retrieve_parent = L.parent.empty() ? nullptr : L.parent.data();
  p.first_step = L.first_step.empty() ? nullptr : L.first_step.data();
  p.batch = L.batch;
  p.dim = dim;
  p.width = K;
  p.tokens_per_row = L.T;
  p.steps = L.steps;
  p.x_stride = xs;
  p.out_stride = os;
  run_cpu(p);
  EXPECT_EQ(states, states_before);
  std::vector<std::vector<float>> node(static_cast<size_t>(tokens));
  for (int64_t b = 0; b < L.batch; ++b) {
    if (L.slots[static_cast<size_t>(b)] < 0) continue;
    for (int64_t t = 0; t < L.T; ++t) {
      const int64_t tok = b * L.T + t;
      const float* st = ref_start(L, b, t, states.data(), steps_buf.data(), node, elems);
      std::vector<float> s(st, st + elems), o(static_cast<size_t>(dim));
      const int32_t zero = 0;
      conv1d_update_params r;
      r.x = x.data() + tok * xs;
      r.weight = w.data();
      r.bias = bias.data();
      r.out = o.data();
      r.state_indices = &zero;
      r.conv_states = s.data();
      r.batch = 1;
      r.dim = dim;
      r.width = K;
      r.x_stride = xs;
      r.out_stride = dim;
      run_cpu(r);
      node[static_cast<size_t>(tok)] = s;
      expect_close(out.data() + tok * os, o.data(), static_cast<size_t>(dim), kTol, kTol, "conv out");
      expect_close(steps_buf.data() + (b * L.steps + L.first(b) + t) * elems, s.data(), static_cast<size_t>(elems), 0,
                   0, "conv window");
    }
  }
}

TEST_P(SpecDecodeLayout, GdnUpdateMultiMatchesPerStepDecode) {
  const layout L = layouts()[static_cast<size_t>(GetParam())];
  const int64_t HK = 2, HV = 4, K = 8, V = 6, n_slots = 5, tokens = L.batch * L.T;
  const int64_t elems = HV * V * K, qs = HK * K + 1, vs = HV * V + 2, ab = HV + 1, os = HV * V;
  auto q = random_floats(static_cast<size_t>(tokens * qs), 21);
  auto k = random_floats(static_cast<size_t>(tokens * qs), 22);
  auto v = random_floats(static_cast<size_t>(tokens * vs), 23);
  auto a = random_floats(static_cast<size_t>(tokens * ab), 24);
  auto bb = random_floats(static_cast<size_t>(tokens * ab), 25);
  auto A_log = random_floats(static_cast<size_t>(HV), 26);
  auto dt_bias = random_floats(static_cast<size_t>(HV), 27);
  auto states = random_floats(static_cast<size_t>((n_slots + 1) * elems), 28);
  const auto states_before = states;
  std::vector<float> steps_buf(static_cast<size_t>(L.batch * L.steps * elems), 0.0f);
  seed_columns(L, steps_buf, elems, 29);
  std::vector<float> out(static_cast<size_t>(tokens * os), 777.0f);
  auto common = [&](gdn_common_params& p) {
    p.A_log = A_log.data();
    p.dt_bias = dt_bias.data();
    p.heads_k = HK;
    p.heads_v = HV;
    p.k_dim = K;
    p.v_dim = V;
    p.q_stride = p.k_stride = qs;
    p.v_stride = vs;
    p.a_stride = p.b_stride = ab;
    p.out_stride = os;
  };
  gdn_state_update_multi_params p;
  common(p);
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.a = a.data();
  p.b = bb.data();
  p.out = out.data();
  p.states = states.data();
  p.state_indices = L.slots.data();
  p.batch = L.batch;
  p.step_states = steps_buf.data();
  p.retrieve_parent = L.parent.empty() ? nullptr : L.parent.data();
  p.first_step = L.first_step.empty() ? nullptr : L.first_step.data();
  p.tokens_per_row = L.T;
  p.steps = L.steps;
  run_cpu(p);
  EXPECT_EQ(states, states_before);
  std::vector<std::vector<float>> node(static_cast<size_t>(tokens));
  for (int64_t b = 0; b < L.batch; ++b) {
    if (L.slots[static_cast<size_t>(b)] < 0) continue;
    for (int64_t t = 0; t < L.T; ++t) {
      const int64_t tok = b * L.T + t;
      const float* st = ref_start(L, b, t, states.data(), steps_buf.data(), node, elems);
      std::vector<float> s(st, st + elems), o(static_cast<size_t>(os));
      const int32_t zero = 0;
      gdn_state_update_params r;
      common(r);
      r.q = q.data() + tok * qs;
      r.k = k.data() + tok * qs;
      r.v = v.data() + tok * vs;
      r.a = a.data() + tok * ab;
      r.b = bb.data() + tok * ab;
      r.out = o.data();
      r.states = s.data();
      r.state_indices = &zero;
      r.batch = 1;
      run_cpu(r);
      node[static_cast<size_t>(tok)] = s;
      expect_close(out.data() + tok * os, o.data(), static_cast<size_t>(os), kTol, kTol, "gdn out");
      expect_close(steps_buf.data() + (b * L.steps + L.first(b) + t) * elems, s.data(), static_cast<size_t>(elems),
                   kTol, kTol, "gdn state");
    }
  }
}

std::string layout_name(const ::testing::TestParamInfo<int>& i) {
  static const char* const names[] = {"chain", "tree", "zero_drafts", "draft_steps"};
  return names[i.param];
}

INSTANTIATE_TEST_SUITE_P(Layouts, SpecDecodeLayout, ::testing::Values(0, 1, 2, 3), layout_name);

// A verify of one token (no drafts) followed by a commit of step 0 leaves exactly the state and
// output of one decode step.
TEST(SpecDecode, ZeroDraftVerifyPlusCommitEqualsDecodeBitForBit) {
  const int64_t H = 2, P = 4, N = 16, elems = H * P * N, dim = 10, K = 4, W = K - 1;
  auto x = random_floats(static_cast<size_t>(H * P), 31);
  auto dt = random_floats(static_cast<size_t>(H), 32);
  auto A_log = random_floats(static_cast<size_t>(H), 33);
  auto B = random_floats(static_cast<size_t>(N), 34);
  auto C = random_floats(static_cast<size_t>(N), 35);
  auto states = random_floats(static_cast<size_t>(2 * elems), 36);
  auto decode_states = states;
  std::vector<float> scratch(static_cast<size_t>(elems)), y1(static_cast<size_t>(H * P)), y2(y1);
  const int32_t slot = 1;
  auto fill = [&](ssm_common_params& p, float* st, float* y) {
    p.x = x.data();
    p.dt = dt.data();
    p.A_log = A_log.data();
    p.B = B.data();
    p.C = C.data();
    p.y = y;
    p.ssm_states = st;
    p.state_indices = &slot;
    p.batch = 1;
    p.heads = H;
    p.head_dim = P;
    p.d_state = N;
    p.x_stride = p.y_stride = H * P;
    p.dt_stride = H;
    p.bc_stride = N;
  };
  selective_state_update_params d;
  fill(d, decode_states.data(), y1.data());
  run_cpu(d);
  selective_state_update_multi_params m;
  fill(m, states.data(), y2.data());
  m.step_states = scratch.data();
  run_cpu(m);
  EXPECT_EQ(y1, y2);

  auto xc = random_floats(static_cast<size_t>(dim), 37);
  auto wc = random_floats(static_cast<size_t>(dim * K), 38);
  auto win = random_floats(static_cast<size_t>(2 * dim * W), 39);
  auto decode_win = win;
  std::vector<float> win_scratch(static_cast<size_t>(dim * W)), o1(static_cast<size_t>(dim)), o2(o1);
  conv1d_update_params cd;
  cd.x = xc.data();
  cd.weight = wc.data();
  cd.out = o1.data();
  cd.state_indices = &slot;
  cd.conv_states = decode_win.data();
  cd.batch = 1;
  cd.dim = dim;
  cd.width = K;
  cd.x_stride = cd.out_stride = dim;
  run_cpu(cd);
  conv1d_update_multi_params cm;
  cm.x = xc.data();
  cm.weight = wc.data();
  cm.out = o2.data();
  cm.state_indices = &slot;
  cm.conv_states = win.data();
  cm.step_windows = win_scratch.data();
  cm.batch = 1;
  cm.dim = dim;
  cm.width = K;
  cm.x_stride = cm.out_stride = dim;
  run_cpu(cm);
  EXPECT_EQ(o1, o2);

  void* ssm_layers[] = {states.data()};
  const void* ssm_steps[] = {scratch.data()};
  float* conv_layers[] = {win.data()};
  const float* conv_steps[] = {win_scratch.data()};
  const int32_t row = 0, step = 0;
  state_commit_params c;
  c.n_layers = 1;
  c.ssm_states = ssm_layers;
  c.ssm_steps = ssm_steps;
  c.conv_states = conv_layers;
  c.conv_steps = conv_steps;
  c.state_elems = elems;
  c.conv_elems = dim * W;
  c.steps = 1;
  c.slots = &slot;
  c.rows = &row;
  c.steps_taken = &step;
  c.n_commits = 1;
  run_cpu(c);
  EXPECT_EQ(states, decode_states);
  EXPECT_EQ(win, decode_win);
}

TEST(SpecDecode, CommitCopiesTheAcceptedStepOfEveryLayer) {
  const int64_t layers = 3, n_slots = 4, rows = 3, steps = 5, se = 7, ce = 3;
  std::vector<std::vector<float>> st, sc, cv, cs;
  std::vector<void*> st_p;
  std::vector<float*> cv_p;
  std::vector<const void*> sc_p;
  std::vector<const float*> cs_p;
  for (int64_t l = 0; l < layers; ++l) {
    st.push_back(random_floats(static_cast<size_t>((n_slots + 1) * se), 40 + static_cast<uint32_t>(l)));
    sc.push_back(random_floats(static_cast<size_t>(rows * steps * se), 50 + static_cast<uint32_t>(l)));
    cv.push_back(random_floats(static_cast<size_t>((n_slots + 1) * ce), 60 + static_cast<uint32_t>(l)));
    cs.push_back(random_floats(static_cast<size_t>(rows * steps * ce), 70 + static_cast<uint32_t>(l)));
  }
  const auto st0 = st, cv0 = cv;
  for (int64_t l = 0; l < layers; ++l) {
    st_p.push_back(st[static_cast<size_t>(l)].data());
    sc_p.push_back(sc[static_cast<size_t>(l)].data());
    cv_p.push_back(cv[static_cast<size_t>(l)].data());
    cs_p.push_back(cs[static_cast<size_t>(l)].data());
  }
  const std::vector<int32_t> slots = {3, -1, 0}, crow = {2, 1, 0}, cstep = {4, 0, 1};
  state_commit_params c;
  c.n_layers = layers;
  c.ssm_states = st_p.data();
  c.ssm_steps = sc_p.data();
  c.conv_states = cv_p.data();
  c.conv_steps = cs_p.data();
  c.state_elems = se;
  c.conv_elems = ce;
  c.steps = steps;
  c.slots = slots.data();
  c.rows = crow.data();
  c.steps_taken = cstep.data();
  c.n_commits = 3;
  run_cpu(c);
  for (int64_t l = 0; l < layers; ++l) {
    const auto L = static_cast<size_t>(l);
    for (int64_t s = 0; s <= n_slots; ++s) {
      int64_t i = -1;
      for (int64_t j = 0; j < 3; ++j)
        if (slots[static_cast<size_t>(j)] == s) i = j;
      for (int64_t e = 0; e < se; ++e) {
        const float want = i < 0 ? st0[L][static_cast<size_t>(s * se + e)]
                                 : sc[L][static_cast<size_t>((crow[static_cast<size_t>(i)] * steps +
                                                              cstep[static_cast<size_t>(i)]) * se + e)];
        EXPECT_EQ(st[L][static_cast<size_t>(s * se + e)], want);
      }
      for (int64_t e = 0; e < ce; ++e) {
        const float want = i < 0 ? cv0[L][static_cast<size_t>(s * ce + e)]
                                 : cs[L][static_cast<size_t>((crow[static_cast<size_t>(i)] * steps +
                                                              cstep[static_cast<size_t>(i)]) * ce + e)];
        EXPECT_EQ(cv[L][static_cast<size_t>(s * ce + e)], want);
      }
    }
  }
  // A step column outside [0, steps) is rejected by name.
  const std::vector<int32_t> bad_step = {5, 0, 0};
  c.steps_taken = bad_step.data();
  EXPECT_THROW(run_cpu(c), error);
}

TEST(SpecDecode, RejectsParentsThatDoNotPrecedeTheirNode) {
  std::vector<float> buf(4096, 0.0f);
  const std::vector<int32_t> slots = {0};
  const std::vector<int32_t> parent = {-1, 2, 0};
  conv1d_update_multi_params p;
  p.x = p.out = buf.data();
  p.weight = buf.data();
  p.state_indices = slots.data();
  p.conv_states = buf.data();
  p.step_windows = buf.data() + 1024;
  p.retrieve_parent = parent.data();
  p.batch = 1;
  p.dim = 4;
  p.width = 4;
  p.tokens_per_row = 3;
  p.steps = 3;
  p.x_stride = p.out_stride = 4;
  try {
    run_cpu(p);
    FAIL() << "expected a rejection";
  } catch (const error& e) {
    EXPECT_NE(std::string(e.what()).find("retrieve_parent[0, 1]"), std::string::npos) << e.what();
  }
}

// bf16 io and/or state: the multi-token update stores every step's state rounded to bf16 and the
// next token starts from the stored value, so it equals a sequence of single-token decode steps
// (each storing its state in the slot) bit for bit, in every layout.
struct bf16_case {
  int layout;
  dtype io, state;
};

// Element storage of one dtype: the f32 values or their bf16 patterns, behind one void*.
struct typed_buf {
  dtype type;
  std::vector<float> f;
  std::vector<uint16_t> h;
  typed_buf(dtype t, const std::vector<float>& v) : type(t) {
    if (t == dtype::kBF16) h = to_bf16(v);
    else f = v;
  }
  void* data() { return type == dtype::kBF16 ? static_cast<void*>(h.data()) : static_cast<void*>(f.data()); }
  const void* data() const {
    return type == dtype::kBF16 ? static_cast<const void*>(h.data()) : static_cast<const void*>(f.data());
  }
  size_t esize() const { return type == dtype::kBF16 ? 2 : 4; }
  char* at(int64_t i) { return static_cast<char*>(data()) + static_cast<size_t>(i) * esize(); }
  bool same(int64_t i, const void* other, int64_t n) const {
    return std::memcmp(static_cast<const char*>(data()) + static_cast<size_t>(i) * esize(), other,
                       static_cast<size_t>(n) * esize()) == 0;
  }
};

class SpecDecodeBf16 : public ::testing::TestWithParam<bf16_case> {};

TEST_P(SpecDecodeBf16, SelectiveStateUpdateMultiEqualsDecodeStepsBitForBit) {
  const bf16_case c = GetParam();
  const layout L = layouts()[static_cast<size_t>(c.layout)];
  const int64_t H = 4, P = 8, N = 16, G = 2, n_slots = 5, tokens = L.batch * L.T;
  const int64_t elems = H * P * N, xs = H * P + 1, dts = H + 2, bcs = G * N + 3, ys = H * P;
  typed_buf x(c.io, random_floats(static_cast<size_t>(tokens * xs), 1));
  typed_buf dt(c.io, random_floats(static_cast<size_t>(tokens * dts), 2, -3.0f, 1.0f));
  auto dt_bias = random_floats(static_cast<size_t>(H), 3, -0.5f, 0.5f);
  auto A_log = random_floats(static_cast<size_t>(H), 4);
  typed_buf B(c.io, random_floats(static_cast<size_t>(tokens * bcs), 5));
  typed_buf C(c.io, random_floats(static_cast<size_t>(tokens * bcs), 6));
  auto D = random_floats(static_cast<size_t>(H), 7);
  typed_buf states(c.state, random_floats(static_cast<size_t>((n_slots + 1) * elems), 8));
  const typed_buf states_before = states;
  std::vector<float> seeded(static_cast<size_t>(L.batch * L.steps * elems), 0.0f);
  seed_columns(L, seeded, elems, 9);
  typed_buf steps_buf(c.state, seeded);
  typed_buf y(c.io, std::vector<float>(static_cast<size_t>(tokens * ys), 777.0f));

  auto common = [&](ssm_common_params& p) {
    p.dt_bias = dt_bias.data();
    p.A_log = A_log.data();
    p.D = D.data();
    p.heads = H;
    p.head_dim = P;
    p.d_state = N;
    p.n_groups = G;
    p.x_stride = xs;
    p.dt_stride = dts;
    p.bc_stride = bcs;
    p.y_stride = ys;
    p.io_dtype = c.io;
    p.state_dtype = c.state;
  };
  selective_state_update_multi_params p;
  common(p);
  p.x = x.data();
  p.dt = dt.data();
  p.B = B.data();
  p.C = C.data();
  p.y = y.data();
  p.ssm_states = states.data();
  p.state_indices = L.slots.data();
  p.batch = L.batch;
  p.step_states = steps_buf.data();
  p.retrieve_parent = L.parent.empty() ? nullptr : L.parent.data();
  p.first_step = L.first_step.empty() ? nullptr : L.first_step.data();
  p.tokens_per_row = L.T;
  p.steps = L.steps;
  run_cpu(p);
  EXPECT_TRUE(states.same(0, states_before.data(), (n_slots + 1) * elems))
      << "the persistent state must not change";

  // Reference: node by node with the single-token op, each starting from a copy of its start
  // state (the slot, the seeded column, or its parent's stored state).
  std::vector<typed_buf> node;
  node.reserve(static_cast<size_t>(tokens));
  for (int64_t i = 0; i < tokens; ++i) node.emplace_back(c.state, std::vector<float>(static_cast<size_t>(elems)));
  for (int64_t b = 0; b < L.batch; ++b) {
    if (L.slots[static_cast<size_t>(b)] < 0) continue;
    for (int64_t t = 0; t < L.T; ++t) {
      const int64_t tok = b * L.T + t;
      const int32_t q = L.parent_of(b, t);
      typed_buf& s = node[static_cast<size_t>(tok)];
      const char* start = q >= 0 ? node[static_cast<size_t>(b * L.T + q)].at(0)
                          : L.first(b) > 0 ? steps_buf.at((b * L.steps + L.first(b) - 1) * elems)
                                           : states.at(L.slots[static_cast<size_t>(b)] * elems);
      std::memcpy(s.at(0), start, static_cast<size_t>(elems) * s.esize());
      typed_buf yr(c.io, std::vector<float>(static_cast<size_t>(ys)));
      const int32_t zero = 0;
      selective_state_update_params r;
      common(r);
      r.x = x.at(tok * xs);
      r.dt = dt.at(tok * dts);
      r.B = B.at(tok * bcs);
      r.C = C.at(tok * bcs);
      r.y = yr.data();
      r.ssm_states = s.data();
      r.state_indices = &zero;
      r.batch = 1;
      run_cpu(r);
      const std::string what = "row " + std::to_string(b) + " node " + std::to_string(t);
      EXPECT_TRUE(y.same(tok * ys, yr.data(), ys)) << what << " y";
      EXPECT_TRUE(steps_buf.same((b * L.steps + L.first(b) + t) * elems, s.data(), elems)) << what << " state";
    }
  }
}

std::string bf16_case_name(const ::testing::TestParamInfo<bf16_case>& info) {
  return layout_name(::testing::TestParamInfo<int>(info.param.layout, info.index)) + "_io_" +
         std::string(dtype_name(info.param.io)) + "_state_" + std::string(dtype_name(info.param.state));
}

std::vector<bf16_case> bf16_cases() {
  std::vector<bf16_case> out;
  for (int l = 0; l < 4; ++l)
    for (auto [io, st] : {std::pair{dtype::kBF16, dtype::kF32}, std::pair{dtype::kF32, dtype::kBF16},
                          std::pair{dtype::kBF16, dtype::kBF16}})
      out.push_back({l, io, st});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Layouts, SpecDecodeBf16, ::testing::ValuesIn(bf16_cases()), bf16_case_name);

// The fused commit copies bf16 states bit for bit (the conv windows stay f32).
TEST(SpecDecode, CommitCopiesBf16States) {
  const int64_t layers = 2, n_slots = 3, rows = 2, steps = 3, se = 9, ce = 4;
  std::vector<std::vector<uint16_t>> st, sc;
  std::vector<std::vector<float>> cv, cs;
  std::vector<void*> st_p;
  std::vector<const void*> sc_p;
  std::vector<float*> cv_p;
  std::vector<const float*> cs_p;
  for (int64_t l = 0; l < layers; ++l) {
    st.push_back(to_bf16(random_floats(static_cast<size_t>((n_slots + 1) * se), 140 + static_cast<uint32_t>(l))));
    sc.push_back(to_bf16(random_floats(static_cast<size_t>(rows * steps * se), 150 + static_cast<uint32_t>(l))));
    cv.push_back(random_floats(static_cast<size_t>((n_slots + 1) * ce), 160 + static_cast<uint32_t>(l)));
    cs.push_back(random_floats(static_cast<size_t>(rows * steps * ce), 170 + static_cast<uint32_t>(l)));
  }
  const auto st0 = st;
  for (int64_t l = 0; l < layers; ++l) {
    st_p.push_back(st[static_cast<size_t>(l)].data());
    sc_p.push_back(sc[static_cast<size_t>(l)].data());
    cv_p.push_back(cv[static_cast<size_t>(l)].data());
    cs_p.push_back(cs[static_cast<size_t>(l)].data());
  }
  const std::vector<int32_t> slots = {2, 0}, crow = {1, 0}, cstep = {2, 1};
  state_commit_params c;
  c.n_layers = layers;
  c.ssm_states = st_p.data();
  c.ssm_steps = sc_p.data();
  c.conv_states = cv_p.data();
  c.conv_steps = cs_p.data();
  c.state_elems = se;
  c.conv_elems = ce;
  c.steps = steps;
  c.slots = slots.data();
  c.rows = crow.data();
  c.steps_taken = cstep.data();
  c.n_commits = 2;
  c.state_dtype = dtype::kBF16;
  run_cpu(c);
  for (size_t l = 0; l < static_cast<size_t>(layers); ++l) {
    for (int64_t e = 0; e < se; ++e) {
      EXPECT_EQ(st[l][static_cast<size_t>(2 * se + e)], sc[l][static_cast<size_t>((1 * steps + 2) * se + e)]);
      EXPECT_EQ(st[l][static_cast<size_t>(0 * se + e)], sc[l][static_cast<size_t>((0 * steps + 1) * se + e)]);
      EXPECT_EQ(st[l][static_cast<size_t>(1 * se + e)], st0[l][static_cast<size_t>(1 * se + e)]);
    }
    for (int64_t e = 0; e < ce; ++e)
      EXPECT_EQ(cv[l][static_cast<size_t>(2 * ce + e)], cs[l][static_cast<size_t>((1 * steps + 2) * ce + e)]);
  }
  c.state_dtype = dtype::kF16;
  EXPECT_THROW(run_cpu(c), invalid_argument_error);
}

}  // namespace
}  // namespace hyserve::kernels
