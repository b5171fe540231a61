// Timings of the CPU kernels at a few serving-relevant sizes. Memory-bound ops report bytes/s
// (SetBytesProcessed counts the bytes each call must move at least once), compute-bound ops
// report FLOP/s, and the scans also tokens/s.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cstdint>
#include <random>
#include <vector>

#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/causal_conv1d.h"
#include "hyserve/kernels/gemm.h"
#include "hyserve/kernels/norm.h"
#include "hyserve/kernels/ssm.h"

namespace hyserve::kernels {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& e : v) e = dist(gen);
  return v;
}

void flops_counter(benchmark::State& state, double flops_per_iter) {
  state.counters["FLOP/s"] =
      benchmark::Counter(flops_per_iter * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

// Mamba2-like head shape: head_dim 64, d_state 128, one B/C group.
constexpr int64_t kHeadDim = 64, kDState = 128;

// args: total tokens, heads, sequences (equal lengths)
void BM_SsdChunkScan(benchmark::State& state) {
  const int64_t tokens = state.range(0), heads = state.range(1), seqs = state.range(2);
  const int64_t row = heads * kHeadDim;
  const auto x = random_floats(static_cast<size_t>(tokens * row), 1);
  const auto dt = random_floats(static_cast<size_t>(tokens * heads), 2, -3.0f, 1.0f);
  const auto a_log = random_floats(static_cast<size_t>(heads), 3);
  const auto bc = random_floats(static_cast<size_t>(tokens * kDState), 4);
  std::vector<float> y(static_cast<size_t>(tokens * row));
  std::vector<float> states(static_cast<size_t>((seqs + 1) * heads * kHeadDim * kDState));
  std::vector<int32_t> qsl, slots;
  for (int64_t b = 0; b <= seqs; ++b) qsl.push_back(static_cast<int32_t>(b * tokens / seqs));
  for (int64_t b = 0; b < seqs; ++b) slots.push_back(static_cast<int32_t>(b));

  ssd_chunk_scan_params p;
  p.x = x.data();
  p.dt = dt.data();
  p.A_log = a_log.data();
  p.B = bc.data();
  p.C = bc.data();
  p.y = y.data();
  p.ssm_states = states.data();
  p.state_indices = slots.data();
  p.query_start_loc = qsl.data();
  p.batch = seqs;
  p.heads = heads;
  p.head_dim = kHeadDim;
  p.d_state = kDState;
  p.x_stride = p.y_stride = row;
  p.dt_stride = heads;
  p.bc_stride = kDState;
  p.chunk_size = 256;
  for (auto _ : state) {
    run_cpu(p);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * tokens);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(sizeof(float)) *
                          (2 * tokens * row + 2 * tokens * kDState + tokens * heads));
}
BENCHMARK(BM_SsdChunkScan)->Args({512, 16, 1})->Args({2048, 32, 1})->Args({2048, 32, 8})->UseRealTime();

// args: batch, heads
void BM_SelectiveStateUpdate(benchmark::State& state) {
  const int64_t batch = state.range(0), heads = state.range(1);
  const int64_t row = heads * kHeadDim;
  const auto x = random_floats(static_cast<size_t>(batch * row), 1);
  const auto dt = random_floats(static_cast<size_t>(batch * heads), 2, -3.0f, 1.0f);
  const auto a_log = random_floats(static_cast<size_t>(heads), 3);
  const auto bc = random_floats(static_cast<size_t>(batch * kDState), 4);
  std::vector<float> y(static_cast<size_t>(batch * row));
  auto states = random_floats(static_cast<size_t>((batch + 1) * heads * kHeadDim * kDState), 5);
  std::vector<int32_t> slots(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) slots[b] = static_cast<int32_t>(b);

  selective_state_update_params p;
  p.x = x.data();
  p.dt = dt.data();
  p.A_log = a_log.data();
  p.B = bc.data();
  p.C = bc.data();
  p.y = y.data();
  p.ssm_states = states.data();
  p.state_indices = slots.data();
  p.batch = batch;
  p.heads = heads;
  p.head_dim = kHeadDim;
  p.d_state = kDState;
  p.x_stride = p.y_stride = row;
  p.dt_stride = heads;
  p.bc_stride = kDState;
  for (auto _ : state) {
    run_cpu(p);
    benchmark::DoNotOptimize(states.data());
  }
  // The state is read and written once per step and dominates the traffic.
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(sizeof(float)) * 2 * batch * heads * kHeadDim *
                          kDState);
}
BENCHMARK(BM_SelectiveStateUpdate)->Args({1, 32})->Args({16, 32})->Args({64, 64})->UseRealTime();

// args: tokens, dim (one sequence, width 4, initial window)
void BM_ConvVarlen(benchmark::State& state) {
  const int64_t tokens = state.range(0), dim = state.range(1), K = 4;
  const auto x = random_floats(static_cast<size_t>(tokens * dim), 1);
  const auto w = random_floats(static_cast<size_t>(dim * K), 2);
  const auto bias = random_floats(static_cast<size_t>(dim), 3);
  std::vector<float> out(static_cast<size_t>(tokens * dim));
  std::vector<float> win(static_cast<size_t>(2 * dim * (K - 1)));
  const std::vector<int32_t> qsl{0, static_cast<int32_t>(tokens)};
  const int32_t slot = 1;
  const uint8_t init = 1;
  conv1d_varlen_params p;
  p.x = x.data();
  p.weight = w.data();
  p.bias = bias.data();
  p.out = out.data();
  p.query_start_loc = qsl.data();
  p.state_indices = &slot;
  p.has_initial_state = &init;
  p.conv_states = win.data();
  p.batch = 1;
  p.dim = dim;
  p.width = K;
  p.x_stride = p.out_stride = dim;
  for (auto _ : state) {
    run_cpu(p);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(sizeof(float)) * 2 * tokens * dim);
}
BENCHMARK(BM_ConvVarlen)->Args({512, 4096})->Args({4096, 8192})->UseRealTime();

// args: batch, dim
void BM_ConvUpdate(benchmark::State& state) {
  const int64_t batch = state.range(0), dim = state.range(1), K = 4;
  const auto x = random_floats(static_cast<size_t>(batch * dim), 1);
  const auto w = random_floats(static_cast<size_t>(dim * K), 2);
  std::vector<float> out(static_cast<size_t>(batch * dim));
  auto win = random_floats(static_cast<size_t>((batch + 1) * dim * (K - 1)), 3);
  std::vector<int32_t> slots(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) slots[b] = static_cast<int32_t>(b);
  conv1d_update_params p;
  p.x = x.data();
  p.weight = w.data();
  p.out = out.data();
  p.state_indices = slots.data();
  p.conv_states = win.data();
  p.batch = batch;
  p.dim = dim;
  p.width = K;
  p.x_stride = p.out_stride = dim;
  for (auto _ : state) {
    run_cpu(p);
    benchmark::DoNotOptimize(out.data());
  }
  // input + output + window read and write
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(sizeof(float)) * batch * dim * (2 + 2 * (K - 1)));
}
BENCHMARK(BM_ConvUpdate)->Args({1, 8192})->Args({64, 8192})->UseRealTime();

// args: batch, context length (decode: one query per row; 32 q heads, 8 kv heads, head_dim 128)
void BM_PagedDecodeAttention(benchmark::State& state) {
  const int64_t batch = state.range(0), len = state.range(1);
  const int64_t qh = 32, kvh = 8, D = 128, ps = 16;
  const int64_t pages_per_row = (len + ps - 1) / ps;
  const int64_t num_pages = batch * pages_per_row;
  const auto k_cache = random_floats(static_cast<size_t>(num_pages * ps * kvh * D), 1);
  const auto v_cache = random_floats(static_cast<size_t>(num_pages * ps * kvh * D), 2);
  const auto q = random_floats(static_cast<size_t>(batch * qh * D), 3);
  std::vector<float> out(static_cast<size_t>(batch * qh * D));
  std::vector<int32_t> qsl, seq_lens(static_cast<size_t>(batch), static_cast<int32_t>(len));
  std::vector<int32_t> table(static_cast<size_t>(num_pages));
  for (int64_t b = 0; b <= batch; ++b) qsl.push_back(static_cast<int32_t>(b));
  for (int64_t i = 0; i < num_pages; ++i) table[i] = static_cast<int32_t>((i * 7919) % num_pages);  // scattered
  paged_attention_params p;
  p.q = q.data();
  p.k_cache = k_cache.data();
  p.v_cache = v_cache.data();
  p.out = out.data();
  p.query_start_loc = qsl.data();
  p.seq_lens = seq_lens.data();
  p.page_table = table.data();
  p.batch = batch;
  p.q_heads = qh;
  p.kv_heads = kvh;
  p.head_dim = D;
  p.page_size = ps;
  p.page_table_stride = pages_per_row;
  p.q_stride = p.out_stride = qh * D;
  p.scale = 0.088f;
  for (auto _ : state) {
    run_cpu(p);
    benchmark::DoNotOptimize(out.data());
  }
  // K and V of every cached token, once.
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(sizeof(float)) * 2 * batch * len * kvh * D);
  flops_counter(state, 4.0 * static_cast<double>(batch * len * qh * D));
}
BENCHMARK(BM_PagedDecodeAttention)->Args({1, 1024})->Args({16, 1024})->Args({4, 8192})->UseRealTime();

// args: m, n, k (y = x · wᵀ); `multiply(x, w, y, m, n, k)` is the GEMM timed.
template <class F>
void gemm_bench(benchmark::State& state, F multiply) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const auto x = random_floats(static_cast<size_t>(m * k), 1);
  const auto w = random_floats(static_cast<size_t>(n * k), 2);
  std::vector<float> y(static_cast<size_t>(m * n));
  for (auto _ : state) {
    multiply(x.data(), w.data(), y.data(), m, n, k);
    benchmark::DoNotOptimize(y.data());
  }
  flops_counter(state, 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(sizeof(float)) * (m * k + n * k + m * n));
}

void BM_Gemm(benchmark::State& state) {
  gemm_bench(state, [](const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k) {
    linear_cpu(x, w, y, m, n, k);
  });
}
BENCHMARK(BM_Gemm)->Args({1, 4096, 4096})->Args({32, 4096, 4096})->Args({512, 4096, 4096})->UseRealTime();

// The anchor of BM_Gemm: OpenBLAS's sgemm on the same shapes. Its result for a row depends on m
// (it switches kernels with the row count), which is why the CPU op does not call it: the
// difference between the two is what batch invariance costs on the CPU.
void BM_GemmOpenBlas(benchmark::State& state) {
  gemm_bench(state, [](const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                1.0f, x, static_cast<int>(k), w, static_cast<int>(k), 0.0f, y, static_cast<int>(n));
  });
}
BENCHMARK(BM_GemmOpenBlas)->Args({1, 4096, 4096})->Args({32, 4096, 4096})->Args({512, 4096, 4096})->UseRealTime();

// args: rows, cols
void BM_RmsNorm(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const auto x = random_floats(static_cast<size_t>(rows * cols), 1);
  const auto w = random_floats(static_cast<size_t>(cols), 2);
  std::vector<float> out(static_cast<size_t>(rows * cols));
  rmsnorm_params p;
  p.x = x.data();
  p.weight = w.data();
  p.out = out.data();
  p.rows = rows;
  p.cols = cols;
  p.x_stride = p.out_stride = cols;
  for (auto _ : state) {
    run_cpu(p);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(sizeof(float)) * 2 * rows * cols);
}
BENCHMARK(BM_RmsNorm)->Args({1, 4096})->Args({512, 4096})->UseRealTime();

// args: rows, cols, group_size (Mamba2 gated norm)
void BM_GatedRmsNorm(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1), group = state.range(2);
  const auto x = random_floats(static_cast<size_t>(rows * cols), 1);
  const auto z = random_floats(static_cast<size_t>(rows * cols), 2);
  const auto w = random_floats(static_cast<size_t>(cols), 3);
  std::vector<float> out(static_cast<size_t>(rows * cols));
  gated_rmsnorm_params p;
  p.x = x.data();
  p.gate = z.data();
  p.weight = w.data();
  p.out = out.data();
  p.rows = rows;
  p.cols = cols;
  p.x_stride = p.gate_stride = p.out_stride = cols;
  p.group_size = group;
  for (auto _ : state) {
    run_cpu(p);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(sizeof(float)) * 3 * rows * cols);
}
BENCHMARK(BM_GatedRmsNorm)->Args({512, 8192, 1024})->UseRealTime();

}  // namespace
}  // namespace hyserve::kernels
