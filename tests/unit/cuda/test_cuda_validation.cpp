// Host-side parameter checks of the CUDA ops: the CPU op's checks (same field names), plus the
// CUDA-specific limits: values outside a dispatch table are an error naming the field, never a
// silent no-op.
#include <gtest/gtest.h>

#include "hyserve/kernels/device.h"

#if defined(HYSERVE_HAVE_CUDA)

#include "cuda_test_util.h"
#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/causal_conv1d.h"
#include "hyserve/kernels/gemm.h"
#include "hyserve/kernels/norm.h"
#include "hyserve/kernels/ssm.h"

namespace hyserve::kernels {
namespace {

using cuda_test::expect_invalid;

TEST(CudaValidation, Cuda_f32_UnsupportedDispatchValuesAreErrors) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  device_array<float> buf(1 << 16);
  device_array<int32_t> ibuf(64);

  paged_attention_params a;
  a.q = a.out = buf.data();
  a.k_cache = a.v_cache = buf.data();
  a.query_start_loc = a.seq_lens = a.page_table = ibuf.data();
  a.batch = 1;
  a.q_heads = 4;
  a.kv_heads = 2;
  a.head_dim = 80;  // not compiled
  a.page_size = 16;
  a.page_table_stride = 4;
  a.q_stride = a.out_stride = 4 * 80;
  expect_invalid([&] { run_cuda(a); }, "head_dim");
  a.head_dim = 64;
  a.kv_heads = 3;
  a.q_stride = a.out_stride = 4 * 64;
  expect_invalid([&] { run_cuda(a); }, "kv_heads");

  conv1d_update_params c;
  c.x = c.weight = buf.data();
  c.out = c.conv_states = buf.data() + 4096;
  c.state_indices = ibuf.data();
  c.batch = 1;
  c.dim = 8;
  c.width = 5;  // not compiled
  c.x_stride = c.out_stride = 8;
  expect_invalid([&] { run_cuda(c); }, "width");

  selective_state_update_params s;
  s.A_log = buf.data();
  s.x = s.dt = s.B = s.C = s.A_log;
  s.y = s.ssm_states = buf.data() + 8192;
  s.state_indices = ibuf.data();
  s.batch = 1;
  s.heads = 2;
  s.head_dim = 4;
  s.d_state = 24;  // not compiled
  s.x_stride = s.y_stride = 8;
  s.dt_stride = 2;
  s.bc_stride = 24;
  expect_invalid([&] { run_cuda(s); }, "d_state");

  ssd_chunk_scan_params sc;
  static_cast<ssm_common_params&>(sc) = s;
  sc.query_start_loc = ibuf.data();
  sc.d_state = 4096;  // the state tile cannot fit shared memory
  sc.head_dim = 256;
  sc.bc_stride = 4096;
  sc.x_stride = sc.y_stride = 512;
  expect_invalid([&] { run_cuda(sc); }, "d_state");
  sc.d_state = 16;
  sc.bc_stride = 16;
  sc.chunk_size = 0;
  expect_invalid([&] { run_cuda(sc); }, "chunk_size");
}

TEST(CudaValidation, Cuda_f32_CpuChecksApply) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  device_array<float> buf(1024);
  gemm_params g;
  g.a = g.c = buf.data();
  g.b = buf.data();
  g.m = g.n = g.k = 4;
  g.lda = 3;  // shorter than a row of A
  g.ldb = g.ldc = 4;
  expect_invalid([&] { run_cuda(g); }, "lda");

  gated_rmsnorm_params n;
  n.x = n.gate = n.weight = n.out = buf.data();
  n.rows = 2;
  n.cols = 12;
  n.group_size = 5;  // does not divide cols
  n.x_stride = n.gate_stride = n.out_stride = 12;
  expect_invalid([&] { run_cuda(n); }, "group_size");
  n.group_size = 4;
  n.sumsq_out = buf.data();
  n.sumsq_in = buf.data();
  expect_invalid([&] { run_cuda(n); }, "sumsq_in");
}

}  // namespace
}  // namespace hyserve::kernels

#endif
