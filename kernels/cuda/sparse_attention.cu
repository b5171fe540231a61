// Sparse Top-K decode attention on CUDA: page summary update and fused Quest scoring + selection.
//
// Summary update: two launches on the stream. The first resets the summary of every page whose
// first slot is written this step to that token's key; the second folds every other written
// token in with float atomic min/max (order-independent, so the result equals the CPU op's
// bit for bit). Decode writes one token per row: the atomics are uncontended.
//
// Selection: one launch for the whole batch, grid (slice, row), 256 threads. Every block
// decides the row's plan on the device (plan_sparse_row, the CPU op's rule); a dense row is
// copied by its slice 0. For a sparse row, each block computes q̄ (mean of each kv group's
// query heads) in shared memory and scores its slice of the middle pages: a page is scored by
// a group of `lanes` threads (the power of two nearest above its summary's float4 count, at
// most a warp), so a warp scores 32 / lanes pages at once with 16-byte loads of key_min/key_max
// and small summaries are not latency-bound; scores go to a workspace. The last block of the
// row to finish (atomic counter after a fence, the threadfence-reduction pattern) selects: the
// row's scores are turned into order-preserving 32-bit keys, in shared memory when the row fits
// (kMaxSmemKeys), then radix select (4 passes of 8 bits; shared-memory histogram, warp-
// aggregated with __match_any_sync so keys that share a digit do not serialise) finds the
// n_top-th largest score T and how many equal T must be taken; a segmented block scan then
// writes the chosen pages in ascending order, ties to the lower index. No host synchronisation: the workspace is stream-ordered (cudaMallocAsync), so the
// op can be captured in a CUDA graph.
#include <algorithm>
#include <string>

#include "../cpu/sparse_validate.h"
#include "common.cuh"
#include "hyserve/kernels/sparse_attention.h"

namespace hyserve::kernels {
namespace cuda_detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxGridY = 65535;
constexpr int64_t kMaxSmemKeys = 16384;  // a row's keys kept in shared memory up to this many pages

// ---- page summaries ----

__device__ __forceinline__ void atomic_min_float(float* addr, float v) {
  if (__float_as_int(v) >= 0) {
    atomicMin(reinterpret_cast<int*>(addr), __float_as_int(v));
  } else {
    atomicMax(reinterpret_cast<unsigned*>(addr), __float_as_uint(v));
  }
}

__device__ __forceinline__ void atomic_max_float(float* addr, float v) {
  if (__float_as_int(v) >= 0) {
    atomicMax(reinterpret_cast<int*>(addr), __float_as_int(v));
  } else {
    atomicMin(reinterpret_cast<unsigned*>(addr), __float_as_uint(v));
  }
}

// first_slot: reset pass (tokens in the first slot of their page); otherwise the min/max pass
// over the other tokens.
__global__ void summary_kernel(const page_summary_update_params p, bool first_slot) {
  const int64_t row = p.kv_heads * p.head_dim;
  const int64_t total = p.n_tokens * row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / row, e = i % row;
    const int64_t loc = p.locs[t];
    if (loc < 0) continue;
    const bool is_first = loc % p.page_size == 0;
    if (is_first != first_slot) continue;
    const float k = p.k[t * p.k_stride + e];
    const int64_t idx = (loc / p.page_size) * row + e;
    if (first_slot) {
      p.key_min[idx] = k;
      p.key_max[idx] = k;
    } else {
      atomic_min_float(p.key_min + idx, k);
      atomic_max_float(p.key_max + idx, k);
    }
  }
}

// ---- selection ----

struct select_ws {
  float* scores = nullptr;       // [batch, page_table_stride] scores of the middle pages
  unsigned* counters = nullptr;  // [batch] finished blocks per row
};

// Larger float → larger key (total order of the non-NaN floats).
__device__ __forceinline__ unsigned order_key(float f) {
  const unsigned u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix sum of v over the block (kThreads threads); *total gets the sum.
__device__ int block_exclusive_scan(int v, int* total) {
  __shared__ int s_warp[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) s_warp[warp] = x;
  __syncthreads();
  int before = 0, sum = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const int c = s_warp[w];
    if (w < warp) before += c;
    sum += c;
  }
  __syncthreads();  // s_warp is reused by the next call
  if (total) *total = sum;
  return before + x - v;
}

// The last block of a sparse row: picks n_top of the n_mid scores and writes the compact row.
// s_keys: shared memory for the row's keys (n_mid ≤ its capacity), or null to read the scores
// from global memory in every pass.
__device__ void select_row(const sparse_select_params& p, const sparse_row_plan& plan, int64_t b, int64_t len,
                           const float* scores, unsigned* s_keys) {
  __shared__ int s_hist[256];
  __shared__ unsigned s_digit;
  __shared__ int s_above;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int32_t* in = p.page_table + b * p.page_table_stride;
  int32_t* out = p.out_page_table + b * p.out_page_table_stride;
  const int n_mid = static_cast<int>(plan.n_mid());
  const int K = static_cast<int>(plan.n_top);
  const bool take_all = K >= n_mid;
  if (s_keys != nullptr && K > 0 && !take_all) {
    for (int i = tid; i < n_mid; i += kThreads) s_keys[i] = order_key(__ldcg(scores + i));
    __syncthreads();
  }
  auto key = [&](int i) { return s_keys != nullptr ? s_keys[i] : order_key(__ldcg(scores + i)); };

  // Radix select: after the passes, prefix = the K-th largest key T and `remaining` = how many
  // keys equal to T belong to the top K.
  unsigned prefix = 0, mask = 0;
  int remaining = K;
  if (K > 0 && !take_all) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      s_hist[tid] = 0;  // kThreads == 256 bins
      __syncthreads();
      // Warp-uniform trip count, so every lane takes part in __match_any_sync.
      for (int base = warp * 32; base < n_mid; base += kThreads) {
        const int i = base + lane;
        unsigned bin = 256u;  // none
        if (i < n_mid) {
          const unsigned k = key(i);
          if ((k & mask) == prefix) bin = (k >> shift) & 255u;
        }
        const unsigned peers = __match_any_sync(0xffffffffu, bin);
        if (bin != 256u && lane == __ffs(peers) - 1) atomicAdd(&s_hist[bin], __popc(peers));
      }
      __syncthreads();
      if (warp == 0) {
        // Lane l owns bins 255 − 8l … 248 − 8l (descending digits).
        int local[8], own = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          local[j] = s_hist[255 - 8 * lane - j];
          own += local[j];
        }
        int incl = own;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const int y = __shfl_up_sync(0xffffffffu, incl, o);
          if (lane >= o) incl += y;
        }
        const int excl = incl - own;
        if (excl < remaining && incl >= remaining) {  // exactly one lane
          int above = excl;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            if (above + local[j] >= remaining) {
              s_digit = static_cast<unsigned>(255 - 8 * lane - j);
              s_above = above;
              break;
            }
            above += local[j];
          }
        }
      }
      __syncthreads();
      remaining -= s_above;
      prefix |= s_digit << shift;
      mask |= 255u << shift;
      __syncthreads();  // s_digit / s_above / s_hist are rewritten by the next pass
    }
  }

  // Segment per thread, in index order: count the keys above T and equal to T.
  const int seg = (n_mid + kThreads - 1) / kThreads;
  const int i0 = min(n_mid, tid * seg), i1 = min(n_mid, i0 + seg);
  int gt = 0, eq = 0;
  if (K > 0 && !take_all) {
    for (int i = i0; i < i1; ++i) {
      const unsigned k = key(i);
      gt += k > prefix;
      eq += k == prefix;
    }
  }
  const int eq_before = block_exclusive_scan(eq, nullptr);
  const int eq_take = min(eq, max(0, remaining - eq_before));
  const int mine = take_all ? i1 - i0 : (K > 0 ? gt + eq_take : 0);
  int total = 0;
  int pos = block_exclusive_scan(mine, &total);
  if (mine > 0) {
    int eq_seen = 0;
    for (int i = i0; i < i1; ++i) {
      bool pick = take_all;
      if (!pick) {
        const unsigned k = key(i);
        pick = k > prefix || (k == prefix && eq_seen++ < eq_take);
      }
      if (pick) out[plan.n_sink + pos++] = in[plan.n_sink + i];
    }
  }
  for (int64_t i = tid; i < plan.n_sink; i += kThreads) out[i] = in[i];
  const int64_t first_recent = plan.n_pages - plan.n_recent;
  for (int64_t i = tid; i < plan.n_recent; i += kThreads) out[plan.n_sink + K + i] = in[first_recent + i];
  if (tid == 0) p.out_seq_lens[b] = static_cast<int32_t>(sparse_effective_len(len, plan, p.page_size));
}

__global__ void __launch_bounds__(kThreads) sparse_select_kernel(const sparse_select_params p, int n_slices,
                                                                 int lanes, int key_cap, const select_ws ws) {
  extern __shared__ float4 s_qbar4[];  // [kv_heads · head_dim / 4], then key_cap unsigned keys
  __shared__ bool s_last;
  const int slice = blockIdx.x;
  const int64_t b = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t q0 = p.query_start_loc[b];
  const int64_t q_len = p.query_start_loc[b + 1] - q0;
  const int64_t raw_len = p.seq_lens.data[b];
  const int64_t len = raw_len < 0 ? 0 : raw_len;  // negative: rejected on the host when visible
  const bool dense = p.dense_rows != nullptr && p.dense_rows[b] != 0;
  const sparse_row_plan plan = plan_sparse_row(len, q_len, dense, p);
  const int32_t* in = p.page_table + b * p.page_table_stride;
  if (!plan.sparse) {
    if (slice == 0) {
      int32_t* out = p.out_page_table + b * p.out_page_table_stride;
      const int64_t n = plan.n_pages < p.page_table_stride ? plan.n_pages : p.page_table_stride;
      for (int64_t i = tid; i < n; i += kThreads) out[i] = in[i];
      if (tid == 0) p.out_seq_lens[b] = static_cast<int32_t>(len);
    }
    return;
  }

  // q̄ of the row's first query.
  const int64_t D = p.head_dim, G = p.q_heads / p.kv_heads, E = p.kv_heads * D, E4 = E / 4;
  float* s_qbar = reinterpret_cast<float*>(s_qbar4);
  const float* q = p.q + q0 * p.q_stride;
  const float inv_g = 1.0f / static_cast<float>(G);
  for (int64_t e = tid; e < E; e += kThreads) {
    const int64_t h = e / D, d = e % D;
    float s = 0.0f;
    for (int64_t g = 0; g < G; ++g) s += q[(h * G + g) * D + d];
    s_qbar[e] = s * inv_g;
  }
  __syncthreads();

  // Score this slice of the middle pages: groups of `lanes` threads, one page per group at a
  // time (lanes is a power of two ≤ 32, so a warp holds 32 / lanes groups).
  const int64_t n_mid = plan.n_mid();
  const int64_t per = (n_mid + n_slices - 1) / n_slices;
  const int64_t m0 = slice * per, m1 = min(n_mid, m0 + per);
  float* scores = ws.scores + b * p.page_table_stride;
  const float4* kmin = reinterpret_cast<const float4*>(p.key_min);
  const float4* kmax = reinterpret_cast<const float4*>(p.key_max);
  const int groups = 32 / lanes, group = lane / lanes, gl = lane % lanes;
  for (int64_t base = m0 + static_cast<int64_t>(warp) * groups; base < m1; base += static_cast<int64_t>(kWarps) * groups) {
    const int64_t i = base + group;
    float acc = 0.0f;
    if (i < m1) {
      const int64_t page = in[plan.n_sink + i];
      const float4* mn = kmin + page * E4;
      const float4* mx = kmax + page * E4;
#pragma unroll 4
      for (int64_t c = gl; c < E4; c += lanes) {
        const float4 a = __ldg(mn + c), z = __ldg(mx + c), qb = s_qbar4[c];
        acc += fmaxf(qb.x * a.x, qb.x * z.x) + fmaxf(qb.y * a.y, qb.y * z.y) + fmaxf(qb.z * a.z, qb.z * z.z) +
               fmaxf(qb.w * a.w, qb.w * z.w);
      }
    }
    for (int o = lanes / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (i < m1 && gl == 0) scores[i] = acc;
  }

  // The last block of the row to finish selects.
  __threadfence();
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(ws.counters + b, 1u) == static_cast<unsigned>(n_slices - 1);
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  if (tid == 0) ws.counters[b] = 0;
  select_row(p, plan, b, len, scores, n_mid <= key_cap ? reinterpret_cast<unsigned*>(s_qbar4 + E4) : nullptr);
}

}  // namespace
}  // namespace cuda_detail

using namespace cuda_detail;

void run_cuda(const page_summary_update_params& p, void* stream) {
  constexpr const char* op = "page_summary_update";
  require_ptr(p.k, op, "k");
  require_ptr(p.locs, op, "locs");
  require_ptr(p.key_min, op, "key_min");
  require_ptr(p.key_max, op, "key_max");
  require_non_negative(p.n_tokens, op, "n_tokens");
  require_positive(p.kv_heads, op, "kv_heads");
  require_positive(p.head_dim, op, "head_dim");
  require_positive(p.page_size, op, "page_size");
  require_positive(p.num_pages, op, "num_pages");
  require_stride(p.k_stride, p.kv_heads * p.head_dim, op, "k_stride");
  // locs live on the device and are not inspected here (-1 is skipped on the device).
  if (p.n_tokens == 0) return;
  const int64_t total = p.n_tokens * p.kv_heads * p.head_dim;
  const auto blocks = static_cast<unsigned>(std::clamp<int64_t>(ceil_div(total, 256), 1, 8 * sm_count()));
  const cudaStream_t s = as_stream(stream);
  summary_kernel<<<blocks, 256, 0, s>>>(p, true);
  HYSERVE_CUDA_CHECK_LAUNCH();
  summary_kernel<<<blocks, 256, 0, s>>>(p, false);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

void run_cuda(const sparse_select_params& p, void* stream) {
  constexpr const char* op = "sparse_select";
  // query_start_loc, seq_lens.data, the page tables and dense_rows live on the device; the
  // seq_lens size is always checked, the values when seq_lens.host is given.
  cpu_detail::check_sparse_select_params(p, op, false);
  if (p.head_dim % 4 != 0) fail(op, "head_dim", p.head_dim, "must be a multiple of 4 for the CUDA kernel");
  if (p.batch > kMaxGridY) fail(op, "batch", p.batch, "exceeds the CUDA grid (65535)");
  require_aligned16(p.key_min, op, "key_min");
  require_aligned16(p.key_max, op, "key_max");
  const size_t qbar_bytes = static_cast<size_t>(p.kv_heads * p.head_dim) * sizeof(float);
  if (qbar_bytes > static_cast<size_t>(max_shared_per_block_optin())) {
    fail(op, "kv_heads * head_dim", p.kv_heads * p.head_dim, "exceeds the shared memory of a block");
  }
  // The row's keys live in shared memory when they fit (else the selecting block re-reads the
  // scores from global memory in every radix pass).
  int64_t key_cap = std::min(p.page_table_stride, kMaxSmemKeys);
  if (qbar_bytes + static_cast<size_t>(key_cap) * sizeof(unsigned) > static_cast<size_t>(max_shared_per_block_optin())) {
    key_cap = 0;
  }
  const size_t smem = qbar_bytes + static_cast<size_t>(key_cap) * sizeof(unsigned);
  const cudaStream_t s = as_stream(stream);
  // Threads per page: the summary's float4 count rounded up to a power of two, at most a warp.
  int lanes = 1;
  while (lanes < 32 && lanes < p.kv_heads * p.head_dim / 4) lanes *= 2;
  // Slices per row: about 8 blocks per SM over the batch, each scoring at least one page per group.
  const int64_t pages_per_pass = static_cast<int64_t>(kWarps) * (32 / lanes);
  const int64_t max_slices = std::max<int64_t>(1, ceil_div(p.page_table_stride, pages_per_pass));
  const auto n_slices = static_cast<int>(std::clamp<int64_t>(ceil_div(8 * sm_count(), p.batch), 1, max_slices));
  select_ws ws;
  const size_t score_bytes = static_cast<size_t>(p.batch * p.page_table_stride) * sizeof(float);
  void* buf = nullptr;
  CUDA_CHECK(cudaMallocAsync(&buf, score_bytes + static_cast<size_t>(p.batch) * sizeof(unsigned), s));
  ws.scores = static_cast<float*>(buf);
  ws.counters = reinterpret_cast<unsigned*>(static_cast<char*>(buf) + score_bytes);
  CUDA_CHECK(cudaMemsetAsync(ws.counters, 0, static_cast<size_t>(p.batch) * sizeof(unsigned), s));
  reserve_dynamic_shared(reinterpret_cast<const void*>(&sparse_select_kernel), smem);
  const dim3 grid(static_cast<unsigned>(n_slices), static_cast<unsigned>(p.batch));
  sparse_select_kernel<<<grid, kThreads, smem, s>>>(p, n_slices, lanes, static_cast<int>(key_cap), ws);
  HYSERVE_CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaFreeAsync(buf, s));
}

}  // namespace hyserve::kernels
