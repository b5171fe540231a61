// Sparse Top-K decode attention on the device (docs/ARCHITECTURE.md, Sparse Top-K attention), as times, GB/s and ratios to the
// device-to-device copy bandwidth measured in the same run (same method as hyserve-bench-cuda:
// 32 calls captured in one CUDA graph, replayed 10 times, median per call).
//
//   attention: batch 8, 32 q heads over 8 kv heads, head_dim 128, page 16, fp32 cache, at 32K
//     and 128K context: dense paged decode attention, and sparse (Quest selection + paged
//     decode attention over the compact page table) with a budget of 4096 tokens (256 pages:
//     1 sink, 4 recent, 251 by score), in the same run; `x_dense` is the dense time over the
//     sparse time. Bytes: dense = K + V of every token; select = both summaries of every page;
//     sparse = summaries + K + V of the selected pages.
//   select: scoring + selection alone for batch 64 × 8192 pages, at the production summary
//     shape (8 kv heads × 128: 8 KiB of summaries per page, 4.3 GB in all, so the time is
//     bound by that read) and at a minimal one (1 kv head × 4 dims) where selection dominates.
//     Both selection kernels are timed (kernels.sparse_select v2, the default, and v1); their
//     page tables must be identical (same scores, exact selection), which is checked.
//
//   hyserve-bench-sparse            everything
//   hyserve-bench-sparse <part>...  some of: attention, select
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "hyserve/common/error.h"
#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/device.h"
#include "hyserve/kernels/paths.h"
#include "hyserve/kernels/sparse_attention.h"

namespace hyserve::kernels {
namespace {

using bench::copy_bandwidth;

// The kernel paths of every op here: main runs the parts inside a paths_scope of g_paths (the
// ops are called through run_cuda, not kernels::run). set_select_variant picks the selection
// kernel, which the op reads at every call.
kernel_paths g_paths;
void set_select_variant(const char* v) {
  g_paths.sparse_select = std::string(v) == "v1" ? kernel_paths::sparse_select_kind::kV1 : kernel_paths::sparse_select_kind::kV2;
}

// The working sets here (≥ 0.5 GB) exceed L2 many times over, so no input rotation is needed;
// except select at 1 kv head × 4 dims (19 MB), whose summaries stay in L2 across calls.
double time_call_us(cudaStream_t stream, const std::function<void()>& call) {
  return bench::time_call_us(stream, 1, [&](int) { call(); });
}

device_array<float> random_device(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  return bench::random_device_hash(n, seed, lo, hi);
}

struct row {
  std::string op, shape;
  int batch;
  double us, bytes;
  double x_dense = 0.0;  // dense time / this time (sparse rows)
};

// Decode rows: one query per row, pages scattered over the pool.
struct decode_setup {
  int64_t bs, len, qh, kvh, d, ps, pages_per_row;
  std::vector<int32_t> qsl, lens, table;
  device_array<int32_t> dqsl, dlens, dtable, sel_table, sel_lens;
  device_array<float> q, out, key_min, key_max;

  decode_setup(int64_t bs_, int64_t len_, int64_t qh_, int64_t kvh_, int64_t d_, int64_t ps_)
      : bs(bs_), len(len_), qh(qh_), kvh(kvh_), d(d_), ps(ps_), pages_per_row(len_ / ps_) {
    qsl.resize(static_cast<size_t>(bs + 1));
    for (int64_t b = 0; b <= bs; ++b) qsl[b] = static_cast<int32_t>(b);
    lens.assign(static_cast<size_t>(bs), static_cast<int32_t>(len));
    table.resize(static_cast<size_t>(bs * pages_per_row));
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
    std::shuffle(table.begin(), table.end(), std::mt19937(3));
    dqsl = device_array<int32_t>(qsl);
    dlens = device_array<int32_t>(lens);
    dtable = device_array<int32_t>(table);
    sel_table = device_array<int32_t>(table.size());
    sel_lens = device_array<int32_t>(lens.size());
    q = random_device(static_cast<size_t>(bs * qh * d), 6);
    out = device_array<float>(static_cast<size_t>(bs * qh * d));
    const size_t summary = static_cast<size_t>(bs * pages_per_row * kvh * d);
    key_min = random_device(summary, 7, -1.0f, 0.0f);
    key_max = random_device(summary, 8, 0.0f, 1.0f);
  }

  sparse_select_params select(int64_t budget_pages, int64_t sink, int64_t recent) const {
    sparse_select_params p;
    p.q = q.data();
    p.query_start_loc = dqsl.data();
    p.seq_lens = {dlens.data(), bs, lens.data()};
    p.page_table = dtable.data();
    p.key_min = key_min.data();
    p.key_max = key_max.data();
    p.out_page_table = sel_table.data();
    p.out_seq_lens = sel_lens.data();
    p.batch = bs;
    p.q_heads = qh;
    p.kv_heads = kvh;
    p.head_dim = d;
    p.page_size = ps;
    p.page_table_stride = p.out_page_table_stride = pages_per_row;
    p.q_stride = qh * d;
    p.page_budget = budget_pages;
    p.sink_pages = sink;
    p.recent_pages = recent;
    p.min_seq_len = 0;
    return p;
  }
};

void bench_attention(cudaStream_t stream, std::vector<row>& rows, int64_t LEN) {
  const int64_t BS = 8, QH = 32, KVH = 8, D = 128, PS = 16, BUDGET_TOKENS = 4096;
  const int64_t budget = BUDGET_TOKENS / PS;
  decode_setup s(BS, LEN, QH, KVH, D, PS);
  const size_t cache_elems = static_cast<size_t>(BS * LEN * KVH * D);
  auto k = random_device(cache_elems, 20), v = random_device(cache_elems, 40);
  paged_attention_params a;
  a.q = s.q.data();
  a.k_cache = k.data();
  a.v_cache = v.data();
  a.out = s.out.data();
  a.query_start_loc = s.dqsl.data();
  a.batch = BS;
  a.q_heads = QH;
  a.kv_heads = KVH;
  a.head_dim = D;
  a.page_size = PS;
  a.page_table_stride = s.pages_per_row;
  a.q_stride = a.out_stride = QH * D;
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));
  paged_attention_params dense = a;
  dense.seq_lens = s.dlens.data();
  dense.page_table = s.dtable.data();
  paged_attention_params sparse = a;
  sparse.seq_lens = s.sel_lens.data();
  sparse.page_table = s.sel_table.data();
  const sparse_select_params sel = s.select(budget, 1, 4);

  const double dense_us = time_call_us(stream, [&] { run_cuda(dense, stream); });
  set_select_variant("v1");
  const double select_v1_us = time_call_us(stream, [&] { run_cuda(sel, stream); });
  set_select_variant("v2");
  const double select_us = time_call_us(stream, [&] { run_cuda(sel, stream); });
  const double sparse_us = time_call_us(stream, [&] {
    run_cuda(sel, stream);
    run_cuda(sparse, stream);
  });
  // Every row is sparse: check the effective lengths once.
  const auto eff = s.sel_lens.download();
  for (int32_t e : eff) {
    if (e != BUDGET_TOKENS) throw error("bench_sparse: effective length " + std::to_string(e) + ", expected 4096");
  }
  const double qo = 4.0 * 2.0 * BS * QH * D;
  const double kv_all = 4.0 * 2.0 * static_cast<double>(cache_elems);
  const double summaries = 4.0 * 2.0 * BS * s.pages_per_row * KVH * D;
  const double kv_sel = 4.0 * 2.0 * BS * BUDGET_TOKENS * KVH * D;
  const std::string shape = "QH32 KVH8 D128 page16 ctx" + std::to_string(LEN);
  rows.push_back({"attn_dense", shape, static_cast<int>(BS), dense_us, kv_all + qo, 1.0});
  rows.push_back({"attn_select", shape + " budget4096", static_cast<int>(BS), select_us, summaries + qo / 2,
                  dense_us / select_us});
  rows.push_back({"attn_sel_v1", shape + " budget4096", static_cast<int>(BS), select_v1_us, summaries + qo / 2,
                  dense_us / select_v1_us});
  rows.push_back({"attn_sparse", shape + " budget4096", static_cast<int>(BS), sparse_us, summaries + kv_sel + qo,
                  dense_us / sparse_us});
}

void bench_select(cudaStream_t stream, std::vector<row>& rows, int64_t KVH, int64_t D) {
  const int64_t BS = 64, PAGES = 8192, PS = 16, QH = 4 * KVH;
  decode_setup s(BS, PAGES * PS, QH, KVH, D, PS);
  const sparse_select_params sel = s.select(256, 1, 4);
  const double bytes = 4.0 * 2.0 * BS * PAGES * KVH * D + 4.0 * BS * PAGES;  // summaries + page table
  const std::string shape = "pages8192 budget256 KVH" + std::to_string(KVH) + " D" + std::to_string(D);
  std::vector<int32_t> tables[2];
  const char* variants[2] = {"v2", "v1"};
  for (int v = 0; v < 2; ++v) {
    set_select_variant(variants[v]);
    const double us = time_call_us(stream, [&] { run_cuda(sel, stream); });
    run_cuda(sel, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    tables[v] = s.sel_table.download();
    rows.push_back({std::string("select_") + variants[v], shape, static_cast<int>(BS), us, bytes});
  }
  set_select_variant("v2");
  size_t differ = 0;
  for (int64_t b = 0; b < BS; ++b) {
    const auto first = static_cast<std::ptrdiff_t>(b * PAGES);
    differ += !std::equal(tables[0].begin() + first, tables[0].begin() + first + 256, tables[1].begin() + first);
  }
  std::printf("select %s: v2 and v1 page tables %s (%zu of %d rows differ)\n", shape.c_str(),
              differ == 0 ? "identical" : "DIFFER", differ, static_cast<int>(BS));
  if (differ != 0) throw error("bench_sparse: v2 and v1 selections differ");
}

}  // namespace
}  // namespace hyserve::kernels

int main(int argc, char** argv) {
  using namespace hyserve::kernels;
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "hyserve-bench-sparse: no CUDA device\n");
    return 1;
  }
  const paths_scope paths(g_paths);
  std::vector<std::string> parts(argv + 1, argv + argc);
  auto want = [&](const char* part) {
    return parts.empty() || std::find(parts.begin(), parts.end(), part) != parts.end();
  };
  try {
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const double copy_bw = copy_bandwidth(stream);
    std::printf("device: %s, %d SMs, L2 %.0f MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1048576.0);
    std::printf("device-to-device copy (1 GiB, read + write): %.1f GB/s\n\n", copy_bw / 1e9);

    std::vector<row> rows;
    if (want("attention")) {
      bench_attention(stream, rows, 32768);
      bench_attention(stream, rows, 131072);
    }
    if (want("select")) {
      bench_select(stream, rows, 8, 128);
      bench_select(stream, rows, 1, 4);
    }

    std::printf("%-12s %-44s %6s %12s %12s %10s %8s %8s\n", "op", "shape", "batch", "time_us", "MB_moved", "GB/s",
                "%copy", "x_dense");
    for (const row& r : rows) {
      const double gbs = r.bytes / (r.us * 1e-6) / 1e9;
      std::printf("%-12s %-44s %6d %12.2f %12.2f %10.1f %7.1f%%", r.op.c_str(), r.shape.c_str(), r.batch, r.us,
                  r.bytes / 1e6, gbs, 100.0 * gbs * 1e9 / copy_bw);
      if (r.x_dense > 0.0)
        std::printf(" %8.2f\n", r.x_dense);
      else
        std::printf(" %8s\n", "-");
    }
    CUDA_CHECK(cudaStreamDestroy(stream));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hyserve-bench-sparse: %s\n", e.what());
    return 1;
  }
  return 0;
}
