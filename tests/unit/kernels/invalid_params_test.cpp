// Every op rejects malformed params with invalid_argument_error naming the field.
#include <gtest/gtest.h>

#include <vector>

#include "hyserve/kernels/activation.h"
#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/causal_conv1d.h"
#include "hyserve/kernels/embedding.h"
#include "hyserve/kernels/gemm.h"
#include "hyserve/kernels/norm.h"
#include "hyserve/kernels/rope.h"
#include "hyserve/kernels/sampling.h"
#include "hyserve/kernels/ssm.h"
#include "kernel_test_util.h"

namespace hyserve::kernels {
namespace {

using test::expect_invalid;

std::vector<float> buf(4096, 0.0f);  // backing store for params that must not be read
float* f() { return buf.data(); }

TEST(InvalidParams, Gemm) {
  gemm_params ok;
  ok.a = f();
  ok.b = f();
  ok.c = f();
  ok.m = ok.n = ok.k = 4;
  ok.lda = ok.ldb = ok.ldc = 4;
  EXPECT_NO_THROW(run_cpu(ok));
  auto p = ok;
  p.a = nullptr;
  expect_invalid([&] { run_cpu(p); }, "a = null");
  p = ok;
  p.k = 0;
  expect_invalid([&] { run_cpu(p); }, "k = 0");
  p = ok;
  p.m = -3;
  expect_invalid([&] { run_cpu(p); }, "m = -3");
  p = ok;
  p.trans_b = true;
  p.n = 8;
  p.ldc = 8;
  p.ldb = 2;
  expect_invalid([&] { run_cpu(p); }, "ldb = 2");
  p = ok;
  p.ldc = 3;
  expect_invalid([&] { run_cpu(p); }, "ldc = 3");
}

TEST(InvalidParams, Embedding) {
  const std::vector<int32_t> ids{1, -4};
  embedding_params p;
  p.ids = ids.data();
  p.table = f();
  p.out = f();
  p.n_tokens = 2;
  p.hidden = 4;
  p.vocab_end = 10;
  expect_invalid([&] { run_cpu(p); }, "ids[1] = -4");
  p.n_tokens = 1;
  p.vocab_start = 10;
  expect_invalid([&] { run_cpu(p); }, "vocab_end = 10");
  p.vocab_start = 0;
  p.hidden = 0;
  expect_invalid([&] { run_cpu(p); }, "hidden = 0");
  p.hidden = 4;
  p.table = nullptr;
  expect_invalid([&] { run_cpu(p); }, "table = null");
}

TEST(InvalidParams, Norms) {
  rmsnorm_params r;
  r.x = f();
  r.weight = f();
  r.out = f();
  r.rows = 2;
  r.cols = 8;
  r.x_stride = r.out_stride = 8;
  EXPECT_NO_THROW(run_cpu(r));
  r.x_stride = 7;
  expect_invalid([&] { run_cpu(r); }, "x_stride = 7");
  r.x_stride = 8;
  r.weight = nullptr;
  expect_invalid([&] { run_cpu(r); }, "weight = null");

  gated_rmsnorm_params g;
  g.x = g.weight = f();
  g.gate = f();
  g.out = f();
  g.rows = 2;
  g.cols = 12;
  g.x_stride = g.gate_stride = g.out_stride = 12;
  g.group_size = 5;
  expect_invalid([&] { run_cpu(g); }, "group_size = 5");
  g.group_size = 0;
  expect_invalid([&] { run_cpu(g); }, "group_size = 0");
  g.group_size = 6;
  EXPECT_NO_THROW(run_cpu(g));
  std::vector<float> sums(4);
  g.sumsq_out = sums.data();
  g.sumsq_in = sums.data();
  expect_invalid([&] { run_cpu(g); }, "sumsq_in");
  g.sumsq_out = nullptr;
  g.group_count = -1;
  expect_invalid([&] { run_cpu(g); }, "group_count = -1");
}

TEST(InvalidParams, Rope) {
  const std::vector<int32_t> pos{0, 1};
  rope_params p;
  p.q = f();
  p.k = f();
  p.positions = pos.data();
  p.n_tokens = 2;
  p.n_q_heads = 2;
  p.n_kv_heads = 1;
  p.head_dim = 8;
  p.rotary_dim = 8;
  p.q_stride = 16;
  p.k_stride = 8;
  EXPECT_NO_THROW(run_cpu(p));
  p.rotary_dim = 5;
  expect_invalid([&] { run_cpu(p); }, "rotary_dim = 5");
  p.rotary_dim = 10;
  expect_invalid([&] { run_cpu(p); }, "rotary_dim = 10");
  p.rotary_dim = 8;
  p.k = nullptr;
  expect_invalid([&] { run_cpu(p); }, "k = null");
  p.k = f();
  p.positions = nullptr;
  expect_invalid([&] { run_cpu(p); }, "positions = null");
}

TEST(InvalidParams, Conv) {
  const std::vector<int32_t> qsl{0, 3, 2};
  const std::vector<int32_t> slots{0, -2};
  conv1d_varlen_params p;
  p.x = p.weight = f();
  p.out = f();
  p.conv_states = f();
  p.query_start_loc = qsl.data();
  p.state_indices = slots.data();
  p.batch = 1;
  p.dim = 4;
  p.width = 4;
  p.x_stride = p.out_stride = 4;
  EXPECT_NO_THROW(run_cpu(p));
  p.width = 0;
  expect_invalid([&] { run_cpu(p); }, "width = 0");
  p.width = 4;
  p.batch = 2;
  expect_invalid([&] { run_cpu(p); }, "state_indices[1] = -2");
  p.state_indices = qsl.data();  // slots {0, 3}
  expect_invalid([&] { run_cpu(p); }, "query_start_loc[2] = 2");
  p.query_start_loc = nullptr;
  expect_invalid([&] { run_cpu(p); }, "query_start_loc = null");

  conv1d_update_params u;
  u.x = u.weight = f();
  u.out = f();
  u.conv_states = f();
  u.state_indices = slots.data();
  u.batch = 1;
  u.dim = 4;
  u.width = 3;
  u.x_stride = u.out_stride = 4;
  EXPECT_NO_THROW(run_cpu(u));
  u.conv_states = nullptr;
  expect_invalid([&] { run_cpu(u); }, "conv_states = null");
  u.conv_states = f();
  u.out_stride = 2;
  expect_invalid([&] { run_cpu(u); }, "out_stride = 2");
}

template <class Params>
Params ssm_ok(const int32_t* slots) {
  Params p;
  p.A_log = f();
  p.x = p.dt = p.B = p.C = p.A_log;
  p.y = f();
  p.ssm_states = f();
  p.state_indices = slots;
  p.batch = 1;
  p.heads = 4;
  p.head_dim = 2;
  p.d_state = 4;
  p.n_groups = 2;
  p.x_stride = p.y_stride = 8;
  p.dt_stride = 4;
  p.bc_stride = 8;
  return p;
}

TEST(InvalidParams, Ssm) {
  const std::vector<int32_t> slots{0};
  const std::vector<int32_t> qsl{0, 3};
  auto s = ssm_ok<ssd_chunk_scan_params>(slots.data());
  s.query_start_loc = qsl.data();
  EXPECT_NO_THROW(run_cpu(s));
  auto p = s;
  p.chunk_size = 0;
  expect_invalid([&] { run_cpu(p); }, "chunk_size = 0");
  p = s;
  p.n_groups = 3;
  expect_invalid([&] { run_cpu(p); }, "n_groups = 3");
  p = s;
  p.bc_stride = 4;
  expect_invalid([&] { run_cpu(p); }, "bc_stride = 4");
  p = s;
  p.A_log = nullptr;
  expect_invalid([&] { run_cpu(p); }, "A_log = null");
  p = s;
  p.query_start_loc = nullptr;
  expect_invalid([&] { run_cpu(p); }, "query_start_loc = null");
  p = s;
  p.dt_min = 2.0f;
  p.dt_max = 1.0f;
  expect_invalid([&] { run_cpu(p); }, "dt_min = 2");
  p = s;
  p.head_dim = 0;
  expect_invalid([&] { run_cpu(p); }, "head_dim = 0");

  auto u = ssm_ok<selective_state_update_params>(slots.data());
  EXPECT_NO_THROW(run_cpu(u));
  u.ssm_states = nullptr;
  expect_invalid([&] { run_cpu(u); }, "ssm_states = null");
  u.ssm_states = f();
  u.n_groups = 0;
  expect_invalid([&] { run_cpu(u); }, "n_groups = 0");
}

TEST(InvalidParams, Attention) {
  const std::vector<int32_t> qsl{0, 2};
  const std::vector<int32_t> seq_lens{5};
  const std::vector<int32_t> pages{0, 1, -1};
  paged_attention_params p;
  p.q = f();
  p.k_cache = p.v_cache = f();
  p.out = f();
  p.query_start_loc = qsl.data();
  p.seq_lens = seq_lens.data();
  p.page_table = pages.data();
  p.batch = 1;
  p.q_heads = 4;
  p.kv_heads = 2;
  p.head_dim = 4;
  p.page_size = 4;
  p.page_table_stride = 3;
  p.q_stride = p.out_stride = 16;
  EXPECT_NO_THROW(run_cpu(p));
  auto bad = p;
  bad.kv_heads = 3;
  expect_invalid([&] { run_cpu(bad); }, "kv_heads = 3");
  bad = p;
  bad.page_size = 0;
  expect_invalid([&] { run_cpu(bad); }, "page_size = 0");
  bad = p;
  bad.page_size = 2;  // 5 tokens need 3 pages; the third entry is -1
  expect_invalid([&] { run_cpu(bad); }, "page_table[0][2] = -1");
  bad = p;
  bad.page_table_stride = 1;
  expect_invalid([&] { run_cpu(bad); }, "page_table_stride = 1");
  bad = p;
  const std::vector<int32_t> short_len{1};
  bad.seq_lens = short_len.data();
  expect_invalid([&] { run_cpu(bad); }, "seq_lens[0] = 1");
  bad = p;
  bad.q_stride = 8;
  expect_invalid([&] { run_cpu(bad); }, "q_stride = 8");

  // A row without queries reads no pages: a padding row with an unset page table is accepted.
  const std::vector<int32_t> qsl2{0, 2, 2};
  const std::vector<int32_t> seq_lens2{5, 9};
  const std::vector<int32_t> pages2{0, 1, -1, -1, -1, -1};
  bad = p;
  bad.batch = 2;
  bad.query_start_loc = qsl2.data();
  bad.seq_lens = seq_lens2.data();
  bad.page_table = pages2.data();
  EXPECT_NO_THROW(run_cpu(bad));

  const std::vector<int32_t> locs{0, -3};
  kv_write_params w;
  w.k = w.v = f();
  w.k_cache = f();
  w.v_cache = f();
  w.locs = locs.data();
  w.n_tokens = 2;
  w.kv_heads = 1;
  w.head_dim = 4;
  w.k_stride = w.v_stride = 4;
  expect_invalid([&] { run_cpu(w); }, "locs[1] = -3");
  w.locs = nullptr;
  expect_invalid([&] { run_cpu(w); }, "locs = null");
  // The rotary embedding folded into the write rotates these very k rows.
  const std::vector<int32_t> locs_ok{0, 1}, pos{3, 4};
  std::vector<float> q(8, 1.0f), other(8, 1.0f);
  w.locs = locs_ok.data();
  w.rope.q = q.data();
  w.rope.k = other.data();
  w.rope.positions = pos.data();
  w.rope.n_tokens = 2;
  w.rope.n_q_heads = 1;
  w.rope.n_kv_heads = 1;
  w.rope.head_dim = 4;
  w.rope.rotary_dim = 4;
  w.rope.q_stride = w.rope.k_stride = 4;
  expect_invalid([&] { run_cpu(w); }, "rope.k = another pointer");
  w.rope.k = f();
  w.rope.n_tokens = 1;
  expect_invalid([&] { run_cpu(w); }, "rope.n_tokens = 1");
  w.rope.n_tokens = 2;
  w.rope.rotary_dim = 3;
  expect_invalid([&] { run_cpu(w); }, "rotary_dim = 3");
}

TEST(InvalidParams, SwigluAndArgmax) {
  swiglu_params s;
  s.gate = s.up = f();
  s.out = f();
  s.rows = 1;
  s.cols = 4;
  s.gate_stride = s.up_stride = s.out_stride = 4;
  EXPECT_NO_THROW(run_cpu(s));
  s.up = nullptr;
  expect_invalid([&] { run_cpu(s); }, "up = null");
  s.up = f();
  s.cols = -1;
  expect_invalid([&] { run_cpu(s); }, "cols = -1");

  std::vector<int32_t> out(2);
  argmax_params a;
  a.logits = f();
  a.out = out.data();
  a.rows = 2;
  a.vocab = 8;
  a.stride = 4;
  expect_invalid([&] { run_cpu(a); }, "stride = 4");
  a.stride = 8;
  a.vocab = 0;
  expect_invalid([&] { run_cpu(a); }, "vocab = 0");
}

}  // namespace
}  // namespace hyserve::kernels
