// Decode-path kernels on the device, as ratios to the copy bandwidth measured in the same run
// (DESIGN §12: decode kernels >= 90% of measured HBM copy bandwidth at batch >= 64).
//
// For each op and batch 1/16/64/256 at production shapes (decode attention also at 32K and 128K
// context, batch 8): 32 calls (rotating over input sets
// so that the working set exceeds L2) are captured in one CUDA graph; the graph is replayed
// 10 times, each replay timed with CUDA events; the median per call is reported with the
// fewest bytes the op must move (each input read once, each output written once), the
// achieved GB/s and its share of the device-to-device copy bandwidth (bytes read + written
// of a 1 GiB cudaMemcpy, median of 10).
//
//   hyserve-bench-cuda            all ops
//   hyserve-bench-cuda <op>...    some of: ssm_update, attention_decode, ssd_scan, rmsnorm,
//                                 skinny_gemm (bf16-weight GEMM at m = 1..8 rows, the 9B decode
//                                 and verify shapes, each rows-per-warp choice of the FMA kernel
//                                 and the tensor-core path), moe (the Qwen3-Next MoE layer: hidden
//                                 2048, 512 experts top 10 of width 512, shared expert 512, bf16
//                                 weights, at 1, 64 and 8192 tokens; the routed-experts op alone
//                                 (at 1 token also its split decode path) and the whole layer
//                                 with router and shared expert; at 8192 tokens the many-row
//                                 path's choices, also under skewed routing),
//                                 linear_rows (the 9B linear layers at m = 1..256 and 2048 rows,
//                                 determinism fast and batch_invariant),
//                                 norm_linear (the fused linear kernel at m = 1..4 on the 9B
//                                 shapes, Qwen3-Next's out_proj and Falcon-H1's in_proj and
//                                 down: registers,
//                                 norm_linear_wide, norm_linear_rows 4, norm_linear_spread)
//   --kv=f32|bf16|both            attention_decode's KV cache element type (default both)
//   --ssm-io=f32|bf16|both        ssm_update and ssd_scan: x/dt/B/C/y element type (default both)
//   --ssm-state=f32|bf16|both     ssm_update and ssd_scan: state element type (default both)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_moe_skew.h"
#include "bench_util.cuh"
#include "cuda/attention_paths.h"
#include "cuda/gemm_paths.h"
#include "cuda/ssd_scan_paths.h"
#include "cuda/stream_alloc.h"
#include "hyserve/common/dtype.h"
#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/device.h"
#include "hyserve/kernels/gemm.h"
#include "hyserve/kernels/moe.h"
#include "hyserve/kernels/row_ops.h"
#include "hyserve/kernels/norm.h"
#include "hyserve/kernels/paths.h"
#include "hyserve/kernels/ssm.h"

namespace hyserve::kernels {
namespace {

using bench::copy_bandwidth;
using bench::random_device;
using bench::random_device_hash;
using bench::sets_for;
using bench::time_call_us;
using row = bench::bench_row;

constexpr int kBatches[] = {1, 16, 64, 256};

// Random values of element type t (f32, or bf16 rounded to nearest even) as raw device bytes.
device_array<uint8_t> random_typed(size_t n, uint32_t seed, hyserve::dtype t, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<uint8_t> raw(n * hyserve::dtype_size(t));
  for (size_t i = 0; i < n; ++i) {
    const float v = dist(gen);
    if (t == hyserve::dtype::kBF16) {
      const uint16_t h = hyserve::f32_to_bf16(v);
      std::memcpy(raw.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(raw.data() + 4 * i, &v, 4);
    }
  }
  return device_array<uint8_t>(raw);
}

std::string ssm_types(hyserve::dtype io, hyserve::dtype st) {
  return " io=" + std::string(hyserve::dtype_name(io)) + " st=" + std::string(hyserve::dtype_name(st));
}

// Mamba2 decode: 128 heads × head_dim 64 × d_state 128, 8 groups; x/dt/B/C/y in io, states in st.
// Bytes: the state read and written at its element size, x, y, B, C, dt at the io size.
void bench_ssm_update(cudaStream_t stream, std::vector<row>& rows, hyserve::dtype io, hyserve::dtype st) {
  const int64_t H = 128, P = 64, N = 128, G = 8;
  const double es = static_cast<double>(hyserve::dtype_size(io)), ss = static_cast<double>(hyserve::dtype_size(st));
  for (int bs : kBatches) {
    const size_t state_elems = static_cast<size_t>(bs) * H * P * N;
    const int n_sets = sets_for(state_elems * hyserve::dtype_size(st));
    std::vector<device_array<uint8_t>> states;
    for (int s = 0; s < n_sets; ++s) states.push_back(random_typed(state_elems, 10 + s, st, -0.5f, 0.5f));
    auto x = random_typed(static_cast<size_t>(bs * H * P), 1, io);
    auto dt = random_typed(static_cast<size_t>(bs * H), 2, io, -3.0f, 0.0f);
    auto bc = random_typed(static_cast<size_t>(bs * 2 * G * N), 3, io);
    auto a_log = random_device(static_cast<size_t>(H), 4);
    auto d = random_device(static_cast<size_t>(H), 5);
    device_array<uint8_t> y(static_cast<size_t>(bs * H * P) * hyserve::dtype_size(io));
    std::vector<int32_t> slots(static_cast<size_t>(bs));
    for (int b = 0; b < bs; ++b) slots[b] = b;
    device_array<int32_t> dslots(slots);
    selective_state_update_params p;
    p.x = x.data();
    p.dt = dt.data();
    p.A_log = a_log.data();
    p.B = bc.data();
    p.C = bc.data() + G * N * hyserve::dtype_size(io);
    p.D = d.data();
    p.y = y.data();
    p.state_indices = dslots.data();
    p.batch = bs;
    p.heads = H;
    p.head_dim = P;
    p.d_state = N;
    p.n_groups = G;
    p.x_stride = p.y_stride = H * P;
    p.dt_stride = H;
    p.bc_stride = 2 * G * N;
    p.io_dtype = io;
    p.state_dtype = st;
    const double us = time_call_us(stream, n_sets, [&](int s) {
      p.ssm_states = states[static_cast<size_t>(s)].data();
      run_cuda(p, stream);
    });
    const double bytes =
        ss * 2.0 * static_cast<double>(state_elems) + es * (2.0 * bs * H * P + 2.0 * bs * G * N + bs * H);
    rows.push_back({"ssm_update", "H128 P64 N128 G8" + ssm_types(io, st), bs, us, bytes});
  }
}

// Decode attention over a paged cache: 32 q heads over 8 kv heads, head_dim 128, page 16,
// LEN cached tokens per row (4096 at every batch; 32768 and 131072 at batch 8). kv_dtype: the
// cache's element type (f32 or bf16); the bytes reported are those the op moves with it (the
// cache at its element size, q and out in f32, the page table).
void bench_attention_decode(cudaStream_t stream, std::vector<row>& rows, int64_t LEN, std::vector<int> batches,
                            hyserve::dtype kv_dtype = hyserve::dtype::kF32) {
  const int64_t QH = 32, KVH = 8, D = 128, PS = 16;
  const int64_t pages_per_row = LEN / PS;
  const bool bf16 = kv_dtype == hyserve::dtype::kBF16;
  const size_t esz = hyserve::dtype_size(kv_dtype);
  for (int bs : batches) {
    const size_t cache_elems = static_cast<size_t>(bs * pages_per_row * PS * KVH * D);
    const int n_sets = sets_for(2 * cache_elems * esz);
    std::vector<device_array<float>> k, v;
    std::vector<device_array<uint16_t>> k16, v16;
    for (int s = 0; s < n_sets; ++s) {
      if (!bf16) {
        k.push_back(random_device_hash(cache_elems, 20 + s));
        v.push_back(random_device_hash(cache_elems, 40 + s));
        continue;
      }
      // bf16 sets: the same random f32 values rounded by the kv_write op (one token per cache row).
      const int64_t row_elems = KVH * D, n_rows = static_cast<int64_t>(cache_elems) / row_elems;
      std::vector<int32_t> locs(static_cast<size_t>(n_rows));
      for (int64_t i = 0; i < n_rows; ++i) locs[static_cast<size_t>(i)] = static_cast<int32_t>(i);
      device_array<int32_t> dlocs(locs);
      k16.emplace_back(cache_elems);
      v16.emplace_back(cache_elems);
      for (int kv = 0; kv < 2; ++kv) {
        device_array<float> src = random_device_hash(cache_elems, (kv == 0 ? 20 : 40) + s);
        kv_write_params w;
        w.k = w.v = src.data();
        w.locs = dlocs.data();
        w.k_cache = w.v_cache = (kv == 0 ? k16 : v16).back().data();
        w.n_tokens = n_rows;
        w.kv_heads = KVH;
        w.head_dim = D;
        w.k_stride = w.v_stride = row_elems;
        w.kv_dtype = kv_dtype;
        run_cuda(w, stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));
      }
    }
    auto q = random_device(static_cast<size_t>(bs * QH * D), 6);
    device_array<float> out(static_cast<size_t>(bs * QH * D));
    std::vector<int32_t> qsl(static_cast<size_t>(bs + 1)), lens(static_cast<size_t>(bs), static_cast<int32_t>(LEN));
    std::vector<int32_t> table(static_cast<size_t>(bs * pages_per_row));
    for (int b = 0; b <= bs; ++b) qsl[b] = b;
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
    std::shuffle(table.begin(), table.end(), std::mt19937(3));  // pages scattered over the pool
    device_array<int32_t> dqsl(qsl), dlens(lens), dtable(table);
    paged_attention_params p;
    p.q = q.data();
    p.out = out.data();
    p.query_start_loc = dqsl.data();
    p.seq_lens = dlens.data();
    p.page_table = dtable.data();
    p.batch = bs;
    p.q_heads = QH;
    p.kv_heads = KVH;
    p.head_dim = D;
    p.page_size = PS;
    p.page_table_stride = pages_per_row;
    p.q_stride = p.out_stride = QH * D;
    p.scale = 1.0f / std::sqrt(static_cast<float>(D));
    p.kv_dtype = kv_dtype;
    const double bytes = static_cast<double>(esz) * 2.0 * static_cast<double>(cache_elems) + 4.0 * 2.0 * bs * QH * D +
                         4.0 * static_cast<double>(table.size());
    // A bf16 cache: both decode kernels (CUDA-core and tensor-core), the default last.
    std::vector<attn_decode_path> paths{attn_decode_path::kDefault};
    if (bf16) paths = {attn_decode_path::kSimt, attn_decode_path::kMma};
    for (const attn_decode_path path : paths) {
      set_attn_decode_path(path);
      const double us = time_call_us(stream, n_sets, [&](int s) {
        p.k_cache = bf16 ? static_cast<const void*>(k16[static_cast<size_t>(s)].data()) : k[static_cast<size_t>(s)].data();
        p.v_cache = bf16 ? static_cast<const void*>(v16[static_cast<size_t>(s)].data()) : v[static_cast<size_t>(s)].data();
        run_cuda(p, stream);
      });
      const char* kv = !bf16 ? "" : path == attn_decode_path::kMma ? "kv bf16 mma " : "kv bf16 simt ";
      rows.push_back({"attention_decode", std::string("QH32 KVH8 D128 page16 ") + kv + "ctx" + std::to_string(LEN), bs,
                      us, bytes});
    }
    set_attn_decode_path(attn_decode_path::kDefault);
  }
}

// Prefill chunk scan, Mamba2 shape (128 heads × 64 × state 128, 8 groups) and Falcon-H1-7B's
// (24 heads × 128 × state 256, one group); sequences of max(256, 16384 / batch) tokens, each
// with an initial state; x/dt/B/C/y in io, states in st. Bytes: inputs read and y written once
// at the io size, the initial states read and the final states written at the state size.
struct ssd_shape {
  int64_t H, P, N, G;
};
void bench_ssd_scan_shape(cudaStream_t stream, std::vector<row>& rows, hyserve::dtype io, hyserve::dtype st,
                          const ssd_shape& sh) {
  const int64_t H = sh.H, P = sh.P, N = sh.N, G = sh.G;
  const bool mamba2 = P == 64 && N == 128;
  const std::string shape_label = "H" + std::to_string(H) + " P" + std::to_string(P) + " N" + std::to_string(N) +
                                  " G" + std::to_string(G) + " len";
  const double es = static_cast<double>(hyserve::dtype_size(io)), ss = static_cast<double>(hyserve::dtype_size(st));
  for (int bs : kBatches) {
    if (!mamba2 && bs > 16) continue;  // the other shape: the prefill sizes
    const int64_t len = std::max<int64_t>(256, 16384 / bs);
    const int64_t T = bs * len;
    auto x = random_typed(static_cast<size_t>(T * H * P), 1, io);
    auto dt = random_typed(static_cast<size_t>(T * H), 2, io, -3.0f, 0.0f);
    auto bc = random_typed(static_cast<size_t>(T * 2 * G * N), 3, io);
    auto a_log = random_device(static_cast<size_t>(H), 4);
    auto d = random_device(static_cast<size_t>(H), 5);
    device_array<uint8_t> y(static_cast<size_t>(T * H * P) * hyserve::dtype_size(io));
    auto states = random_typed(static_cast<size_t>(bs * H * P * N), 6, st, -0.5f, 0.5f);
    std::vector<int32_t> slots(static_cast<size_t>(bs)), qsl(static_cast<size_t>(bs + 1));
    std::vector<uint8_t> init(static_cast<size_t>(bs), 1);
    for (int b = 0; b < bs; ++b) slots[b] = b;
    for (int b = 0; b <= bs; ++b) qsl[b] = static_cast<int32_t>(b * len);
    device_array<int32_t> dslots(slots), dqsl(qsl);
    device_array<uint8_t> dinit(init);
    ssd_chunk_scan_params p;
    p.x = x.data();
    p.dt = dt.data();
    p.A_log = a_log.data();
    p.B = bc.data();
    p.C = bc.data() + G * N * hyserve::dtype_size(io);
    p.D = d.data();
    p.y = y.data();
    p.ssm_states = states.data();
    p.state_indices = dslots.data();
    p.query_start_loc = dqsl.data();
    p.has_initial_state = dinit.data();
    p.batch = bs;
    p.heads = H;
    p.head_dim = P;
    p.d_state = N;
    p.n_groups = G;
    p.x_stride = p.y_stride = H * P;
    p.dt_stride = H;
    p.bc_stride = 2 * G * N;
    p.io_dtype = io;
    p.state_dtype = st;
    const double bytes = es * static_cast<double>(T) * (2.0 * H * P + 2.0 * G * N + H) + ss * 2.0 * bs * H * P * N;
    // bf16 io: the scan paths in the same run (the default is ssd_scan_default_path()).
    // The other shape: its one tensor-core path (sequential) against the CUDA-core kernel.
    const bool two = io == hyserve::dtype::kBF16;
    for (const ssd_scan_path path : {ssd_scan_path::sequential, ssd_scan_path::parallel, ssd_scan_path::parallel_fast,
                                     ssd_scan_path::parallel_pair, ssd_scan_path::parallel_quad,
                                     ssd_scan_path::parallel_y, ssd_scan_path::parallel_quad_y,
                                     ssd_scan_path::parallel_oct_y, ssd_scan_path::general}) {
      if (!two && path != ssd_scan_path::sequential) continue;
      if (two && mamba2 && path == ssd_scan_path::general) continue;
      if (two && !mamba2 && path != ssd_scan_path::sequential && path != ssd_scan_path::general) continue;
      const ssd_scan_path use = two ? path : ssd_scan_path::automatic;
      const double us = time_call_us(stream, 1, [&](int) { run_cuda(p, use, stream); });
      const std::string tag = !two                                  ? ""
                              : path == ssd_scan_path::parallel      ? " par"
                              : path == ssd_scan_path::parallel_fast ? " parf"
                              : path == ssd_scan_path::parallel_pair ? " par2"
                              : path == ssd_scan_path::parallel_quad ? " par4"
                              : path == ssd_scan_path::parallel_y ? " pary"
                              : path == ssd_scan_path::parallel_quad_y ? " par4y"
                              : path == ssd_scan_path::parallel_oct_y ? " par8y"
                              : path == ssd_scan_path::general ? " general"
                                                                     : " seq";
      rows.push_back({"ssd_scan", shape_label + std::to_string(len) + ssm_types(io, st) + tag, bs, us, bytes});
    }
  }
}

void bench_ssd_scan(cudaStream_t stream, std::vector<row>& rows, hyserve::dtype io, hyserve::dtype st) {
  for (const ssd_shape sh : {ssd_shape{128, 64, 128, 8}, ssd_shape{24, 128, 256, 1}})
    bench_ssd_scan_shape(stream, rows, io, st, sh);
}

// RMSNorm over the hidden size 4096.
void bench_rmsnorm(cudaStream_t stream, std::vector<row>& rows) {
  const int64_t C = 4096;
  for (int bs : kBatches) {
    const size_t elems = static_cast<size_t>(bs * C);
    const int n_sets = sets_for(2 * elems * sizeof(float));
    std::vector<device_array<float>> x, out;
    for (int s = 0; s < n_sets; ++s) {
      x.push_back(random_device(elems, 60 + s));
      out.emplace_back(elems);
    }
    auto w = random_device(static_cast<size_t>(C), 7, 0.5f, 1.5f);
    rmsnorm_params p;
    p.weight = w.data();
    p.rows = bs;
    p.cols = C;
    p.x_stride = p.out_stride = C;
    const double us = time_call_us(stream, n_sets, [&](int s) {
      p.x = x[static_cast<size_t>(s)].data();
      p.out = out[static_cast<size_t>(s)].data();
      run_cuda(p, stream);
    });
    rows.push_back({"rmsnorm", "cols4096", bs, us, 4.0 * (2.0 * static_cast<double>(elems) + C)});
  }
}

// A bf16-weight linear layer of the 9B-shaped model (SwiGLU: the MLP's fused gate/up, two
// weights), its weight sets (rotated so that the working set exceeds L2), activations and output
// for up to max_rows rows, and one call at m rows.
struct linear_layer {
  const char* name;
  int64_t n, k;
  bool swiglu;
};
const linear_layer kLinearLayers[] = {{"in_proj", 16768, 4096, false},
                                      {"out_proj", 4096, 8192, false},
                                      {"gate_up", 14336, 4096, true},
                                      {"down", 4096, 14336, false},
                                      {"lm_head", 128256, 4096, false}};

struct linear_bench {
  linear_layer sh;
  int64_t weights;  // elements over both weights
  int n_sets;
  std::vector<device_array<uint8_t>> w;
  device_array<float> a, c;

  linear_bench(const linear_layer& layer, int64_t max_rows, int seed)
      : sh(layer), weights((layer.swiglu ? 2 : 1) * layer.n * layer.k), n_sets(sets_for(static_cast<size_t>(weights) * 2)),
        a(random_device(static_cast<size_t>(max_rows * layer.k), seed + 10)),
        c(static_cast<size_t>(max_rows * layer.n)) {
    for (int s = 0; s < n_sets; ++s)
      w.push_back(random_typed(static_cast<size_t>(weights), seed + s, hyserve::dtype::kBF16, -0.05f, 0.05f));
  }
  // The bytes a call must move: the weights once, A and C.
  double bytes(int64_t m) const {
    return 2.0 * static_cast<double>(weights) + 4.0 * static_cast<double>(m) * static_cast<double>(sh.k + sh.n);
  }
  std::string label() const { return std::string(sh.name) + " n" + std::to_string(sh.n) + " k" + std::to_string(sh.k); }
  // One call of the rmsnorm_linear op at m rows (norm_weight null: no norm, into the residual).
  double time_us_fused(cudaStream_t stream, int64_t m, const float* norm_weight) const {
    return time_call_us(stream, n_sets, [&](int s) {
      const uint8_t* wb = w[static_cast<size_t>(s)].data();
      rmsnorm_linear_params p;
      p.x = a.data();
      p.norm_weight = norm_weight;
      p.w = wb;
      p.up_w = sh.swiglu ? wb + sh.n * sh.k * 2 : nullptr;
      p.w_dtype = hyserve::dtype::kBF16;
      p.out = c.data();
      p.m = m;
      p.n = sh.n;
      p.k = sh.k;
      p.x_stride = p.w_stride = sh.k;
      p.out_stride = sh.n;
      p.beta = norm_weight == nullptr && !sh.swiglu ? 1.0f : 0.0f;
      run_cuda(p, stream);
    });
  }
  double time_us(cudaStream_t stream, int64_t m) const {
    return time_call_us(stream, n_sets, [&](int s) {
      const uint8_t* wb = w[static_cast<size_t>(s)].data();
      if (sh.swiglu) {
        swiglu_linear_params p;
        p.x = a.data();
        p.gate_w = wb;
        p.up_w = wb + sh.n * sh.k * 2;
        p.out = c.data();
        p.m = m;
        p.n = sh.n;
        p.k = sh.k;
        p.x_stride = sh.k;
        p.w_stride = sh.k;
        p.out_stride = sh.n;
        p.w_dtype = hyserve::dtype::kBF16;
        run_cuda(p, stream);
      } else {
        gemm_params p;
        p.a = a.data();
        p.b = wb;
        p.c = c.data();
        p.m = m;
        p.n = sh.n;
        p.k = sh.k;
        p.lda = sh.k;
        p.ldb = sh.k;
        p.ldc = sh.n;
        p.trans_b = true;
        p.b_dtype = hyserve::dtype::kBF16;
        run_cuda(p, stream);
      }
    });
  }
};

// bf16-weight GEMMs of the 9B-shaped model at m = 1..8 activation rows (decode batches up to 8,
// a batch-1 verify of up to 7 drafts): the MLP's fused gate/up (SwiGLU, 2 × 14336 × 4096), its
// down projection (4096 × 14336) and the lm_head (128256 × 4096), for each choice of the skinny
// FMA kernel's rows of B per warp (2, 4, 8, and "auto": the kernel's own; results identical)
// and the tensor-core path ("mma"), with the Mamba in/out projections beside them.
void bench_skinny_gemm(cudaStream_t stream, std::vector<row>& rows) {
  for (const linear_layer& layer : kLinearLayers) {
    const linear_bench lb(layer, 8, 70);
    for (int m = 1; m <= 8; ++m) {
      for (const int cap : {0, 2, 4, 8, -1}) {  // -1: the tensor-core path
        if ((m <= 2 && cap > 2) || (m <= 4 && cap > 4)) continue;  // not instantiated (the same as a smaller one)
        set_skinny_path(cap < 0 ? skinny_path::kMma : skinny_path::kFma);
        set_skinny_rows(std::max(cap, 0));
        const double us = lb.time_us(stream, m);
        rows.push_back({"skinny_gemm",
                        lb.label() + (cap < 0 ? " mma" : cap == 0 ? " R=auto" : " R=" + std::to_string(cap)), m, us,
                        lb.bytes(m)});
      }
    }
  }
  set_skinny_rows(0);
  set_skinny_path(skinny_path::kDefault);
}

// The 9B-shaped model's bf16-weight linear layers (not the lm_head) at m = 1 .. 256 activation
// rows (decode batches, verify steps) and 2048 (a prefill chunk), in both determinism modes:
// "fast" (the default kernels: the skinny kernel up to 8 rows, cuBLAS above), "batch_invariant"
// (the row-invariant tensor-core kernels: the skinny one below 256 rows, the tiled one from 256)
// "batch_invariant tiled" (the tiled one from 9 rows: the same bits, another speed),
// "batch_invariant lt" (cuBLASLt with split-K 1 for every m, set_invariant_gemm_backend),
// "fast wgmma" (kernels.linear_wgmma: 9..256 rows on the warpgroup-MMA kernel) and
// "batch_invariant wgmma" (kernels.invariant_gemm: wgmma, every m). At 2048 rows the time is
// what matters (compute-bound).
void bench_linear_rows(cudaStream_t stream, std::vector<row>& rows) {
  constexpr int64_t kRows[] = {1, 2, 4, 8, 9, 16, 32, 64, 128, 256, 2048};
  for (const linear_layer& layer : kLinearLayers) {
    if (std::string(layer.name) == "lm_head") continue;
    const linear_bench lb(layer, 2048, 90);
    const invariant_gemm_backend saved = current_invariant_gemm_backend();
    static const char* const kModes[] = {" fast",          " batch_invariant",   " batch_invariant tiled",
                                         " batch_invariant lt", " fast wgmma", " batch_invariant wgmma"};
    static const invariant_gemm_backend kBackends[] = {
        invariant_gemm_backend::kKernels,  invariant_gemm_backend::kKernels, invariant_gemm_backend::kKernels,
        invariant_gemm_backend::kCublasLt, invariant_gemm_backend::kKernels, invariant_gemm_backend::kWgmma};
    for (const int mode : {0, 1, 2, 3, 4, 5}) {
      kernel_paths paths;
      paths.batch_invariant = mode != 0 && mode != 4;
      paths.linear_wgmma = mode == 4;
      const paths_scope scope(paths);
      set_invariant_tiled_rows(mode == 2 ? 9 : 0);
      set_invariant_gemm_backend(kBackends[mode]);
      for (const int64_t m : kRows) {
        if ((mode == 2 || mode == 4) && m <= 8) continue;  // the skinny kernel either way
        const double us = lb.time_us(stream, m);
        rows.push_back({"linear_rows", lb.label() + kModes[mode], static_cast<int>(m), us, lb.bytes(m)});
      }
    }
    set_invariant_tiled_rows(0);
    set_invariant_gemm_backend(saved);
  }
}


// The fused linear kernel (the rmsnorm_linear op: bf16 weights, m = 1..4 rows, the decode path's
// linear layers with their input norm) on the 9B shapes and Qwen3-Next's mixer out_proj (2048 ×
// 4096) and Falcon-H1-7B's in_proj and down (182 and 192 blocks on the default grid), its
// weights loaded by the warps into registers (the default: two weight rows a warp's task), with
// kernels.norm_linear_wide (no norm, k <= 4096), with kernels.norm_linear_rows: 4 (four rows a
// task; not swiglu) and with kernels.norm_linear_spread (the tasks spread over the resident
// blocks). The same bits every way.
void bench_norm_linear(cudaStream_t stream, std::vector<row>& rows) {
  const linear_layer layers[] = {{"in_proj+norm", 16768, 4096, false},
                                 {"out_proj", 4096, 8192, false},
                                 {"gate_up+norm", 14336, 4096, true},
                                 {"down", 4096, 14336, false},
                                 {"qwen3next_out_proj", 2048, 4096, false},
                                 {"falcon_in_proj+norm", 8728, 3072, false},
                                 {"falcon_down", 3072, 12288, false}};
  static const char* const kModes[] = {" registers", " wide", " rows4", " spread"};
  for (const linear_layer& layer : layers) {
    const linear_bench lb(layer, 4, 110);
    const bool norm = std::string(layer.name).find("+norm") != std::string::npos;
    const auto g = random_device(static_cast<size_t>(layer.k), 9, 0.5f, 1.5f);
    for (const int mode : {0, 1, 2, 3}) {
      if (mode == 1 && (norm || layer.swiglu || layer.k > 4096)) continue;  // what norm_linear_wide takes
      if (mode == 2 && layer.swiglu) continue;                               // two rows a task with swiglu
      kernel_paths paths;
      paths.norm_linear_wide = mode == 1;
      paths.norm_linear_rows = mode == 2 ? 4 : 0;
      paths.norm_linear_spread = mode == 3;
      const paths_scope scope(paths);
      for (int64_t m = 1; m <= 4; ++m) {
        const double us = lb.time_us_fused(stream, m, norm ? g.data() : nullptr);
        rows.push_back({"norm_linear", lb.label() + kModes[mode], static_cast<int>(m), us, lb.bytes(m)});
      }
    }
  }
}


// bf16 values uniform in [lo, hi) from a per-element hash, on the device (gigabytes of weights).
__global__ void fill_hash_bf16_kernel(uint16_t* out, size_t n, uint32_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ static_cast<uint32_t>(i >> 32) ^ seed * 0x85EBCA77u;
    h ^= h >> 16;
    h *= 0x7FEB352Du;
    h ^= h >> 15;
    h *= 0x846CA68Bu;
    h ^= h >> 16;
    const float v = lo + (hi - lo) * static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
    out[i] = static_cast<uint16_t>(__float_as_uint(v) >> 16);
  }
}

device_array<uint16_t> random_bf16_device(size_t n, uint32_t seed, float lo, float hi) {
  device_array<uint16_t> a(n);
  fill_hash_bf16_kernel<<<1024, 256>>>(a.data(), n, seed, lo, hi);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  return a;
}

// The Qwen3-Next MoE layer (hidden 2048, 512 experts, top 10, expert width 512, shared expert
// 512 with its sigmoid gate; bf16 weights) at 1, 64 and 8192 tokens: the routed-experts op
// alone (moe_experts) and the layer (router GEMM, then the op with the gated shared expert:
// moe_layer). Bytes: the weights the step touches (the distinct experts the routing picks,
// counted on the host from the same logits, plus router and shared expert for the layer), x
// and out. The experts' FLOPs (2 · tokens · top_k · 3 · hidden · width) give the TFLOP/s
// printed after the table. The op's scratch comes from an arena bound while the calls are
// captured, as in the model's decode graphs (no graph memory nodes).
void bench_moe(cudaStream_t stream, std::vector<row>& rows, std::vector<std::string>& notes) {
  constexpr int64_t H = 2048, E = 512, K = 10, I = 512, IS = 512;
  const float ws = 1.0f / std::sqrt(static_cast<float>(H));
  auto gate_up = random_bf16_device(static_cast<size_t>(E * 2 * I * H), 1, -ws, ws);
  auto down = random_bf16_device(static_cast<size_t>(E * H * I), 2, -ws, ws);
  auto router = random_bf16_device(static_cast<size_t>(E * H), 3, -ws, ws);
  auto sh_gate = random_bf16_device(static_cast<size_t>(IS * H), 4, -ws, ws);
  auto sh_up = random_bf16_device(static_cast<size_t>(IS * H), 5, -ws, ws);
  auto sh_down = random_bf16_device(static_cast<size_t>(H * IS), 6, -ws, ws);
  auto sh_gw = random_bf16_device(static_cast<size_t>(H), 7, -ws, ws);
  const double expert_bytes = 3.0 * I * H * 2;
  constexpr size_t kArenaBytes = size_t{1} << 30;  // the 8192-token call's scratch fits
  device_array<char> arena(kArenaBytes);
  const auto time_in_arena = [&](const std::function<void(int)>& call) {
    cuda_detail::arena_bind(arena.data(), kArenaBytes);
    const double us = time_call_us(stream, 1, call);
    const cuda_detail::arena_result used = cuda_detail::arena_unbind();
    if (used.overflow > 0) std::fprintf(stderr, "bench moe: %zu allocations past the arena\n", used.overflow);
    return us;
  };
  for (const int64_t T : {int64_t{1}, int64_t{64}, int64_t{8192}}) {
    auto x = random_device_hash(static_cast<size_t>(T * H), 10 + static_cast<uint32_t>(T));
    // Logits of the layer's router on x, for the experts-op timing and the distinct-expert count.
    device_array<float> logits(static_cast<size_t>(T * E));
    gemm_params r;
    r.a = x.data();
    r.b = router.data();
    r.b_dtype = hyserve::dtype::kBF16;
    r.c = logits.data();
    r.m = T;
    r.n = E;
    r.k = H;
    r.lda = H;
    r.ldb = H;
    r.ldc = E;
    r.trans_b = true;
    run_cuda(r, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<float> hl = logits.download();
    std::vector<uint8_t> used(static_cast<size_t>(E), 0);
    std::vector<int32_t> ids(static_cast<size_t>(K));
    std::vector<float> w(static_cast<size_t>(K));
    for (int64_t t = 0; t < T; ++t) {
      moe_route_token(hl.data() + t * E, E, K, moe_scoring::kSoftmax, true, ids.data(), w.data());
      for (int32_t e : ids) used[static_cast<size_t>(e)] = 1;
    }
    const double distinct = static_cast<double>(std::count(used.begin(), used.end(), uint8_t{1}));
    device_array<float> out(static_cast<size_t>(T * H));
    moe_experts_params p;
    p.x = x.data();
    p.router_logits = logits.data();
    p.gate_up = gate_up.data();
    p.down = down.data();
    p.out = out.data();
    p.tokens = T;
    p.hidden = H;
    p.inter = I;
    p.experts = E;
    p.top_k = K;
    p.x_stride = p.out_stride = H;
    p.logits_stride = E;
    p.w_dtype = hyserve::dtype::kBF16;
    const double io = 4.0 * 2 * T * H;
    const double us_op = time_in_arena([&](int) { run_cuda(p, stream); });
    rows.push_back({"moe_experts", "qwen3next E512 k10 I512", static_cast<int>(T), us_op, distinct * expert_bytes + io});
    if (T == 1) {  // the decode path's two fused kernels (the default) against its four
      kernel_paths split;
      split.moe_decode = kernel_paths::moe_decode_kind::kSplit;
      const paths_scope scope(split);
      const double us_split = time_in_arena([&](int) { run_cuda(p, stream); });
      rows.push_back({"moe_experts", "qwen3next E512 k10 I512 split", static_cast<int>(T), us_split,
                      distinct * expert_bytes + io});
    }
    // The layer: the router GEMM, then the op with the shared expert and its sigmoid gate (at
    // decode two fused kernels; else the routed kernels and the shared expert's separate ops).
    moe_experts_params pl = p;
    pl.shared_gate = sh_gate.data();
    pl.shared_up = sh_up.data();
    pl.shared_down = sh_down.data();
    pl.shared_gate_w = sh_gw.data();
    pl.shared_inter = IS;
    const double us_layer = time_in_arena([&](int) {
      run_cuda(r, stream);  // router
      run_cuda(pl, stream);
    });
    const double layer_bytes = distinct * expert_bytes + 2.0 * (E * H + 3.0 * IS * H + H) + io;
    rows.push_back({"moe_layer", "qwen3next E512 k10 I512 +shared", static_cast<int>(T), us_layer, layer_bytes});
    if (T == 1) {  // kernels.smem_carveout (one carveout for the three kernels); moe_decode_ring_kb
      kernel_paths carve72, carve100, ring64, ring192;
      carve72.smem_carveout = 72;
      carve100.smem_carveout = 100;
      ring64.moe_decode_ring_kb = 64;
      ring192.moe_decode_ring_kb = 192;
      for (const auto& [label, paths] : {std::pair{"carveout 72", carve72}, std::pair{"carveout 100", carve100},
                                         std::pair{"ring 64 KB", ring64}, std::pair{"ring 192 KB", ring192}}) {
        const paths_scope scope(paths);
        const double us_v = time_in_arena([&](int) {
          run_cuda(r, stream);
          run_cuda(pl, stream);
        });
        rows.push_back({"moe_layer", std::string("qwen3next E512 k10 I512 +shared ") + label, static_cast<int>(T), us_v,
                        layer_bytes});
      }
    }
    const double flops = 2.0 * T * K * 3.0 * H * I;
    if (T == 8192) {  // the many-row path's other choices
      // The default: 192-row tiles, outputs order, a block an SM, the down projection's rows by
      // tensor copies, a stage given back once its own MMAs are done.
      kernel_paths tiles, rows_first, rows_128, block_a_tile, gathered, neither, late, handoff;
      tiles.moe_wgmma = false;  // the mma.sync tiles
      rows_first.moe_tile_order = kernel_paths::moe_tile_order_kind::kRows;
      rows_128.moe_wgmma_rows = 128;
      block_a_tile.moe_wgmma_persistent = false;
      gathered.moe_wgmma_tma_x = false;
      neither.moe_wgmma_persistent = false;
      neither.moe_wgmma_tma_x = false;
      late.moe_wgmma_early_release = false;  // a stage given back once the next stage's MMAs are issued
      handoff.moe_wgmma_tile_handoff = true;  // the consumers take the tile's rows from the producer
      for (const auto& [label, paths] :
           {std::pair{"mma_sync", tiles}, std::pair{"rows_first", rows_first}, std::pair{"tiles_128", rows_128},
            std::pair{"block_a_tile", block_a_tile}, std::pair{"gathered_rows", gathered},
            std::pair{"block_a_tile_gathered", neither}, std::pair{"late_release", late},
            std::pair{"tile_handoff", handoff}}) {
        const paths_scope scope(paths);
        const double us_v = time_in_arena([&](int) { run_cuda(p, stream); });
        rows.push_back({"moe_experts", std::string("qwen3next E512 k10 I512 ") + label, static_cast<int>(T), us_v,
                        distinct * expert_bytes + io});
        const double us_v_layer = time_in_arena([&](int) {
          run_cuda(r, stream);
          run_cuda(pl, stream);
        });
        rows.push_back({"moe_layer", std::string("qwen3next E512 k10 I512 +shared ") + label, static_cast<int>(T),
                        us_v_layer, layer_bytes});
        char wline[160];
        std::snprintf(wline, sizeof wline, "moe_experts T=8192 %s: %.2f TFLOP/s on the experts' FLOPs", label,
                      flops / (us_v * 1e-6) / 1e12);
        notes.push_back(wline);
      }
      const bench::moe_skew_result skew = bench::bench_moe_skewed(stream, hl, p, time_in_arena);
      std::string sline = "moe_experts T=8192 skewed routing (" + std::to_string(skew.distinct) +
                          " distinct experts, the busiest " + std::to_string(skew.busiest) + " rows):";
      for (const auto& [label, us_s] : skew.us) {
        rows.push_back({"moe_experts", "qwen3next E512 k10 I512 skewed " + label, static_cast<int>(T), us_s,
                        static_cast<double>(skew.distinct) * expert_bytes + io});
        char part[80];
        std::snprintf(part, sizeof part, " %s %.2f TFLOP/s", label.c_str(), flops / (us_s * 1e-6) / 1e12);
        sline += part;
      }
      notes.push_back(sline);
    }
    char line[256];
    std::snprintf(line, sizeof line,
                  "moe_experts T=%lld: %.1f distinct experts, %.2f TFLOP/s on the experts' FLOPs (%.1f GFLOP)",
                  static_cast<long long>(T), distinct, flops / (us_op * 1e-6) / 1e12, flops / 1e9);
    notes.push_back(line);
  }
}

}  // namespace
}  // namespace hyserve::kernels

int main(int argc, char** argv) {
  using namespace hyserve::kernels;
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "hyserve-bench-cuda: no CUDA device\n");
    return 1;
  }
  std::vector<std::string> ops;
  std::string kv_arg;  // attention_decode: --kv=f32|bf16|both
  std::string ssm_io_arg, ssm_state_arg;  // ssm_update, ssd_scan: --ssm-io=..., --ssm-state=...
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--kv=", 0) == 0)
      kv_arg = a.substr(5);
    else if (a.rfind("--ssm-io=", 0) == 0)
      ssm_io_arg = a.substr(9);
    else if (a.rfind("--ssm-state=", 0) == 0)
      ssm_state_arg = a.substr(12);
    else
      ops.push_back(a);
  }
  // f32 | bf16 | both (default both) → the element types to run.
  auto ssm_type_list = [](const std::string& arg, const char* flag) {
    const std::string v = arg.empty() ? "both" : arg;
    std::vector<hyserve::dtype> types;
    if (v == "f32" || v == "both") types.push_back(hyserve::dtype::kF32);
    if (v == "bf16" || v == "both") types.push_back(hyserve::dtype::kBF16);
    if (types.empty()) throw std::runtime_error(std::string(flag) + " must be f32, bf16 or both, got '" + v + "'");
    return types;
  };
  auto want = [&](const char* op) { return ops.empty() || std::find(ops.begin(), ops.end(), op) != ops.end(); };
  try {
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const double copy_bw = copy_bandwidth(stream);
    bench::print_device(copy_bw);

    std::vector<row> rows;
    const auto ssm_io = ssm_type_list(ssm_io_arg, "--ssm-io");
    const auto ssm_state = ssm_type_list(ssm_state_arg, "--ssm-state");
    if (want("ssm_update")) {
      for (const hyserve::dtype io : ssm_io)
        for (const hyserve::dtype st : ssm_state) bench_ssm_update(stream, rows, io, st);
    }
    if (want("attention_decode")) {
      // --kv=f32 | --kv=bf16 | --kv=both (default): the KV cache element types to run.
      const std::string kv = kv_arg.empty() ? "both" : kv_arg;
      std::vector<hyserve::dtype> kv_types;
      if (kv == "f32" || kv == "both") kv_types.push_back(hyserve::dtype::kF32);
      if (kv == "bf16" || kv == "both") kv_types.push_back(hyserve::dtype::kBF16);
      if (kv_types.empty()) throw std::runtime_error("--kv must be f32, bf16 or both, got '" + kv + "'");
      for (const hyserve::dtype t : kv_types) {
        bench_attention_decode(stream, rows, 4096, {1, 16, 64, 256}, t);
        bench_attention_decode(stream, rows, 32768, {8}, t);
        bench_attention_decode(stream, rows, 131072, {8}, t);
      }
    }
    if (want("ssd_scan")) {
      for (const hyserve::dtype io : ssm_io)
        for (const hyserve::dtype st : ssm_state) bench_ssd_scan(stream, rows, io, st);
    }
    if (want("rmsnorm")) bench_rmsnorm(stream, rows);
    if (want("skinny_gemm")) bench_skinny_gemm(stream, rows);
    if (want("linear_rows")) bench_linear_rows(stream, rows);
    if (want("norm_linear")) bench_norm_linear(stream, rows);
    std::vector<std::string> notes;
    if (want("moe")) bench_moe(stream, rows, notes);

    bench::print_rows(rows, copy_bw);
    for (const std::string& n : notes) std::printf("%s\n", n.c_str());
    CUDA_CHECK(cudaStreamDestroy(stream));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hyserve-bench-cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}
