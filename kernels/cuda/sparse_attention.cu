// Sparse Top-K decode attention on CUDA: page summary update and fused Quest scoring + selection.
//
// Summary update: two launches on the stream. The first resets the summary of every page whose
// first slot is written this step to that token's key; the second folds every other written
// token in with float atomic min/max (order-independent, so the result equals the CPU op's
// bit for bit). Decode writes one token per row: the atomics are uncontended.
//
// Selection (v2, the default): two launches for the whole batch, no host synchronisation. The
// workspace is stream-ordered (cudaMallocAsync), so the op can be captured in a CUDA graph.
// Every block decides its row's plan on the device (plan_sparse_row, the CPU op's rule).
//  1. Scoring, grid (slice, row), 256 threads: each block computes q̄ (mean of each kv group's
//     query heads) in shared memory and scores its slice of the middle pages: a page is scored
//     by a group of `lanes` threads (the power of two nearest above its summary's float4 count,
//     at most a warp), so a warp scores 32 / lanes pages at once with 16-byte loads of
//     key_min/key_max and small summaries are not latency-bound; each score goes to a workspace
//     as an order-preserving 32-bit key.
//  2. Selection, one 1024-thread block per row (see sparse_select_v2_kernel; launched with
//     programmatic dependent launch where it applies, so its launch overlaps the scoring): keys in registers,
//     an adaptive radix select over the keys' range (1–3 histogram passes), and a block scan that
//     writes the chosen pages in ascending order, ties to the lower index; dense rows copied.
// Selection v1 (kernels.sparse_select: v1, kept for comparison): one launch; the same scoring
// blocks write float scores, and the last block of the row to finish (atomic counter after a
// fence) selects with 256 threads: radix select (4 passes of 8 bits, shared-memory histogram
// warp-aggregated with __match_any_sync) and a segmented block scan.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "../cpu/sparse_validate.h"
#include "common.cuh"
#include "launch.cuh"
#include "hyserve/kernels/paths.h"
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

// The plan of row b, decided on the device with the CPU op's rule.
__device__ __forceinline__ sparse_row_plan device_row_plan(const sparse_select_params& p, int64_t b, int64_t* q0,
                                                           int64_t* len) {
  *q0 = p.query_start_loc[b];
  const int64_t q_len = p.query_start_loc[b + 1] - *q0;
  const int64_t raw_len = p.seq_lens.data[b];
  *len = raw_len < 0 ? 0 : raw_len;  // negative: rejected on the host when visible
  const bool dense = p.dense_rows != nullptr && p.dense_rows[b] != 0;
  return plan_sparse_row(*len, q_len, dense, p);
}

// A dense row: its page table and length copied unchanged (all threads of the block).
__device__ __forceinline__ void copy_dense_row(const sparse_select_params& p, const sparse_row_plan& plan, int64_t b,
                                               int64_t len) {
  const int32_t* in = p.page_table + b * p.page_table_stride;
  int32_t* out = p.out_page_table + b * p.out_page_table_stride;
  const int64_t n = plan.n_pages < p.page_table_stride ? plan.n_pages : p.page_table_stride;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = in[i];
  if (threadIdx.x == 0) p.out_seq_lens[b] = static_cast<int32_t>(len);
}

// q̄ of the query at token q0 (the mean of each kv group's query heads) into shared memory.
__device__ __forceinline__ void load_qbar(const sparse_select_params& p, int64_t q0, float* s_qbar) {
  const int64_t D = p.head_dim, G = p.q_heads / p.kv_heads, E = p.kv_heads * D;
  const float* q = p.q + q0 * p.q_stride;
  const float inv_g = 1.0f / static_cast<float>(G);
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    const int64_t h = e / D, d = e % D;
    float s = 0.0f;
    for (int64_t g = 0; g < G; ++g) s += q[(h * G + g) * D + d];
    s_qbar[e] = s * inv_g;
  }
}

// Scores this slice of the row's middle pages (kThreads threads) and calls store(i, score) for
// each, i the index among the middle pages: groups of `lanes` threads, kP pages per group at a
// time (lanes is a power of two ≤ 32, so a warp holds 32 / lanes groups; kP > 1 issues the
// page-table reads and summary loads of several pages together). A page's score does not depend
// on kP (same terms, same order).
template <int kP, class Store>
__device__ __forceinline__ void score_slice(const sparse_select_params& p, const sparse_row_plan& plan,
                                            const int32_t* in, const float4* s_qbar4, int slice, int n_slices,
                                            int lanes, Store store) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t E4 = p.kv_heads * p.head_dim / 4;
  const int64_t n_mid = plan.n_mid();
  const int64_t per = (n_mid + n_slices - 1) / n_slices;
  const int64_t m0 = slice * per, m1 = min(n_mid, m0 + per);
  const float4* kmin = reinterpret_cast<const float4*>(p.key_min);
  const float4* kmax = reinterpret_cast<const float4*>(p.key_max);
  const int groups = 32 / lanes, group = lane / lanes, gl = lane % lanes;
  const int64_t step = static_cast<int64_t>(kWarps) * groups;  // pages per block per round
  for (int64_t base = m0 + static_cast<int64_t>(warp) * groups; base < m1; base += kP * step) {
    int64_t page[kP];
#pragma unroll
    for (int u = 0; u < kP; ++u) {
      const int64_t i = base + u * step + group;
      page[u] = i < m1 ? in[plan.n_sink + i] : 0;
    }
    float acc[kP];
#pragma unroll
    for (int u = 0; u < kP; ++u) {
      acc[u] = 0.0f;
      if (base + u * step + group < m1) {
        const float4* mn = kmin + page[u] * E4;
        const float4* mx = kmax + page[u] * E4;
#pragma unroll 4
        for (int64_t c = gl; c < E4; c += lanes) {
          const float4 a = __ldg(mn + c), z = __ldg(mx + c), qb = s_qbar4[c];
          acc[u] += fmaxf(qb.x * a.x, qb.x * z.x) + fmaxf(qb.y * a.y, qb.y * z.y) + fmaxf(qb.z * a.z, qb.z * z.z) +
                    fmaxf(qb.w * a.w, qb.w * z.w);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kP; ++u) {
      const int64_t i = base + u * step + group;
      float v = acc[u];
      for (int o = lanes / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (i < m1 && gl == 0) store(i, v);
    }
  }
}

// ---- v1: scoring blocks, the last block of the row selects (256 threads) ----

__global__ void __launch_bounds__(kThreads) sparse_select_kernel(const sparse_select_params p, int n_slices,
                                                                 int lanes, int key_cap, const select_ws ws) {
  extern __shared__ float4 s_qbar4[];  // [kv_heads · head_dim / 4], then key_cap unsigned keys
  __shared__ bool s_last;
  const int slice = blockIdx.x;
  const int64_t b = blockIdx.y;
  const int tid = threadIdx.x;
  int64_t q0 = 0, len = 0;
  const sparse_row_plan plan = device_row_plan(p, b, &q0, &len);
  const int32_t* in = p.page_table + b * p.page_table_stride;
  if (!plan.sparse) {
    if (slice == 0) copy_dense_row(p, plan, b, len);
    return;
  }

  load_qbar(p, q0, reinterpret_cast<float*>(s_qbar4));
  __syncthreads();
  const int64_t n_mid = plan.n_mid();
  float* scores = ws.scores + b * p.page_table_stride;
  score_slice<1>(p, plan, in, s_qbar4, slice, n_slices, lanes, [&](int64_t i, float s) { scores[i] = s; });

  // The last block of the row to finish selects.
  __threadfence();
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(ws.counters + b, 1u) == static_cast<unsigned>(n_slices - 1);
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  if (tid == 0) ws.counters[b] = 0;
  const int64_t E4 = p.kv_heads * p.head_dim / 4;
  select_row(p, plan, b, len, scores, n_mid <= key_cap ? reinterpret_cast<unsigned*>(s_qbar4 + E4) : nullptr);
}

// ---- v2: a scoring kernel over (slice, row), then one 1024-thread block per row selects ----
//
// Scoring writes each middle page's order key (order_key of the score, −0 folded into +0 so
// that equal scores have equal keys) to a workspace row. Selection holds a row's keys in
// registers (kRegKeys consecutive pages per thread, so thread order is page order; longer rows
// re-read their keys from the workspace in every pass) and finds the n_top-th largest key by an
// adaptive radix select over the key range: each pass reduces the candidates' minimum and
// maximum (all equal → done), histograms (key − min) >> shift into 2048 bins with shift
// chosen so that the range fills them, and keeps the bin holding the n_top-th largest (a
// descending block scan of the bins). Keys above the bin are taken; the bin becomes the new
// candidate interval, until its candidates are all equal or are all taken; at most 3
// histogram passes (32 → 21 → 10 → 0 bits of range), usually 1–2 since the bins follow the
// data's spread, not fixed key bits. A block scan of (above, candidate) counts per thread
// then writes the chosen pages in page order, the first `remaining` candidates by page index
// taken (ties to the lower index), with no sort.

constexpr int kSelThreads = 1024;
constexpr int kSelWarps = kSelThreads / 32;
constexpr int kRegKeys = 8;  // keys per thread in registers: rows of up to 8192 middle pages
constexpr int kBinBits = 11;
constexpr int kBins = 1 << kBinBits;
static_assert(kBins == 2 * kSelThreads, "each thread scans two bins");

// Equal scores give equal keys (−0 and +0 included); larger score → larger key.
__device__ __forceinline__ unsigned select_key(float f) {
  unsigned u = __float_as_uint(f);
  if ((u << 1) == 0u) u = 0u;  // −0 → +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ int warp_inclusive_scan(int x) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  return x;
}

struct select_smem {
  int hist[kBins];
  int warp_a[kSelWarps], warp_b[kSelWarps];
  unsigned warp_lo[kSelWarps], warp_hi[kSelWarps];
  int bin, above, count;
};

// kP: pages per scoring group at a time (score_slice).
// raw: the phase::kScore output (the scores themselves, row stride page_table_stride) instead
// of keys.
template <int kP>
__global__ void __launch_bounds__(kThreads) sparse_score_kernel(const sparse_select_params p, int n_slices, int lanes,
                                                                unsigned* keys, int64_t key_stride, float* raw) {
  extern __shared__ float4 s_qbar4[];  // [kv_heads · head_dim / 4]
  // The selection kernel (launched with PDL) may be scheduled as SMs free up; it waits for this
  // grid to complete before it reads anything.
  pdl_launch_dependents();
  const int64_t b = blockIdx.y;
  int64_t q0 = 0, len = 0;
  const sparse_row_plan plan = device_row_plan(p, b, &q0, &len);
  // Only rows that choose among their middle pages need scores (the selection kernel skips the others).
  if (!plan.sparse || plan.n_pages > p.page_table_stride || plan.n_top <= 0 || plan.n_top >= plan.n_mid()) return;
  load_qbar(p, q0, reinterpret_cast<float*>(s_qbar4));
  __syncthreads();
  const int32_t* in = p.page_table + b * p.page_table_stride;
  if (raw != nullptr) {
    float* row = raw + b * p.page_table_stride;
    score_slice<kP>(p, plan, in, s_qbar4, static_cast<int>(blockIdx.x), n_slices, lanes,
                    [&](int64_t i, float s) { row[i] = s; });
    return;
  }
  unsigned* row_keys = keys + b * key_stride;
  score_slice<kP>(p, plan, in, s_qbar4, static_cast<int>(blockIdx.x), n_slices, lanes,
                  [&](int64_t i, float s) { row_keys[i] = select_key(s); });
}

// phase::kSelect: the keys of the summed scores, for the rows that choose among their middle
// pages (grid: slices × batch).
__global__ void __launch_bounds__(kThreads) sparse_keys_kernel(const sparse_select_params p, unsigned* keys,
                                                               int64_t key_stride) {
  const int64_t b = blockIdx.y;
  int64_t q0 = 0, len = 0;
  const sparse_row_plan plan = device_row_plan(p, b, &q0, &len);
  if (!plan.sparse || plan.n_pages > p.page_table_stride || plan.n_top <= 0 || plan.n_top >= plan.n_mid()) return;
  const float* row = p.scores + b * p.page_table_stride;
  unsigned* row_keys = keys + b * key_stride;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < plan.n_mid();
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    row_keys[i] = select_key(row[i]);
}

// Picks n_top of the row's n_mid middle pages (0 < n_top < n_mid) and writes them in page order
// after the sink pages. kRegs > 0: keys held in registers, kRegs per thread (n_mid ≤ kRegs ·
// kSelThreads); 0: each thread re-reads its segment of keys from the workspace in every pass.
template <int kRegs>
__device__ __forceinline__ void select_middle_v2(const sparse_select_params& p, const sparse_row_plan& plan, int64_t b,
                                                 const unsigned* row_keys, select_smem& s) {
  constexpr int kN = kRegs > 0 ? kRegs : 1;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n_mid = static_cast<int>(plan.n_mid());
  const int seg = kRegs > 0 ? kRegs : (n_mid + kSelThreads - 1) / kSelThreads;
  const int i0 = min(n_mid, tid * seg);
  const int cnt = min(seg, n_mid - i0);  // this thread's pages: middle indices [i0, i0 + cnt)
  const unsigned* g = row_keys + i0;
  const int32_t* in_mid = p.page_table + b * p.page_table_stride + plan.n_sink + i0;
  int32_t* out_mid = p.out_page_table + b * p.out_page_table_stride + plan.n_sink;

  unsigned key[kN];
  int32_t page[kN];
  if constexpr (kRegs > 0) {
    static_assert(kRegs % 4 == 0, "whole uint4 loads");
    if (cnt == kRegs) {
      // 16-byte aligned: the workspace row stride is a multiple of 4 keys and i0 of kRegs.
#pragma unroll
      for (int j = 0; j < kRegs; j += 4) {
        const uint4 v = __ldcg(reinterpret_cast<const uint4*>(g + j));
        key[j] = v.x;
        key[j + 1] = v.y;
        key[j + 2] = v.z;
        key[j + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int j = 0; j < kRegs; ++j) key[j] = j < cnt ? __ldcg(g + j) : 0u;
    }
    // The page ids, loaded now so that their latency hides behind the passes.
#pragma unroll
    for (int j = 0; j < kRegs; ++j) page[j] = j < cnt ? in_mid[j] : 0;
  }
  // f(j, key) for each of this thread's pages in page order.
  auto for_each = [&](auto&& f) {
    if constexpr (kRegs > 0) {
#pragma unroll
      for (int j = 0; j < kRegs; ++j)
        if (j < cnt) f(j, key[j]);
    } else {
      for (int j = 0; j < cnt; ++j) f(j, __ldcg(g + j));
    }
  };

  // Candidates: keys in [lo, hi]; every key above hi is taken; `remaining` (≥ 1 and at most the
  // number of candidates) is how many candidates still belong to the top n_top.
  unsigned lo = 0u, hi = 0xffffffffu;
  int remaining = static_cast<int>(plan.n_top);
  for (;;) {
    // The candidates' minimum and maximum (every thread gets them); the bins are cleared here,
    // ordered before this pass's counting by the barrier below.
    unsigned cmin = 0xffffffffu, cmax = 0u;
    for_each([&](int, unsigned k) {
      if (k >= lo && k <= hi) {
        cmin = min(cmin, k);
        cmax = max(cmax, k);
      }
    });
    s.hist[tid] = 0;
    s.hist[tid + kSelThreads] = 0;
    cmin = __reduce_min_sync(0xffffffffu, cmin);
    cmax = __reduce_max_sync(0xffffffffu, cmax);
    if (lane == 0) {
      s.warp_lo[warp] = cmin;
      s.warp_hi[warp] = cmax;
    }
    __syncthreads();
    cmin = __reduce_min_sync(0xffffffffu, s.warp_lo[lane]);
    cmax = __reduce_max_sync(0xffffffffu, s.warp_hi[lane]);
    if (cmin == cmax) {  // the candidates are all equal: the first `remaining` by index are taken
      lo = hi = cmin;
      break;
    }
    const unsigned range = cmax - cmin;
    const int bits = 32 - __clz(static_cast<int>(range));
    const int shift = bits > kBinBits ? bits - kBinBits : 0;  // (range >> shift) < kBins
    for_each([&](int, unsigned k) {
      if (k >= lo && k <= hi) atomicAdd(&s.hist[(k - cmin) >> shift], 1);
    });
    __syncthreads();
    // Thread t scans bins 2047 − 2t and 2046 − 2t: thread order is descending bin order.
    const int c_hi = s.hist[kBins - 1 - 2 * tid], c_lo = s.hist[kBins - 2 - 2 * tid];
    const int own = c_hi + c_lo;
    const int incl = warp_inclusive_scan(own);
    if (lane == 31) s.warp_a[warp] = incl;
    __syncthreads();
    const int wt = s.warp_a[lane];
    const int wincl = warp_inclusive_scan(wt);
    const int above = __shfl_sync(0xffffffffu, wincl - wt, warp) + incl - own;  // keys in higher bins
    if (above < remaining && above + own >= remaining) {  // exactly one thread
      if (above + c_hi >= remaining) {
        s.bin = kBins - 1 - 2 * tid;
        s.above = above;
        s.count = c_hi;
      } else {
        s.bin = kBins - 2 - 2 * tid;
        s.above = above + c_hi;
        s.count = c_lo;
      }
    }
    __syncthreads();
    const unsigned bin = static_cast<unsigned>(s.bin);
    remaining -= s.above;
    const int count = s.count;
    const unsigned width_m1 = (1u << shift) - 1u;
    lo = cmin + (bin << shift);
    hi = cmax - lo <= width_m1 ? cmax : lo + width_m1;
    if (count == remaining) break;  // the bin's candidates are all taken
  }

  // Per thread, in page order: keys above hi (all taken) and candidates (the first `remaining`
  // of the row by index taken); a block scan gives each thread its output position.
  int gt = 0, eq = 0;
  for_each([&](int, unsigned k) {
    gt += k > hi;
    eq += k >= lo && k <= hi;
  });
  const int gt_incl = warp_inclusive_scan(gt), eq_incl = warp_inclusive_scan(eq);
  if (lane == 31) {
    s.warp_a[warp] = gt_incl;
    s.warp_b[warp] = eq_incl;
  }
  __syncthreads();
  const int ta = s.warp_a[lane], tb = s.warp_b[lane];
  const int xa = warp_inclusive_scan(ta), xb = warp_inclusive_scan(tb);
  const int gt_before = __shfl_sync(0xffffffffu, xa - ta, warp) + gt_incl - gt;
  int eq_rank = __shfl_sync(0xffffffffu, xb - tb, warp) + eq_incl - eq;  // candidates before this thread
  int pos = gt_before + min(eq_rank, remaining);
  for_each([&](int j, unsigned k) {
    bool take = k > hi;
    if (!take && k >= lo && k <= hi) take = eq_rank++ < remaining;
    if (take) {
      if constexpr (kRegs > 0) {
        out_mid[pos++] = page[j];
      } else {
        out_mid[pos++] = in_mid[j];
      }
    }
  });
}

__global__ void __launch_bounds__(kSelThreads, 1) sparse_select_v2_kernel(const sparse_select_params p,
                                                                          const unsigned* keys, int64_t key_stride) {
  __shared__ select_smem s;
  pdl_begin();  // launched with programmatic dependent launch after the scoring kernel
  const int64_t b = blockIdx.x;
  int64_t q0 = 0, len = 0;
  const sparse_row_plan plan = device_row_plan(p, b, &q0, &len);
  if (!plan.sparse || plan.n_pages > p.page_table_stride) {  // the latter: an invalid length, kept in bounds
    copy_dense_row(p, plan, b, len);
    return;
  }
  const int32_t* in = p.page_table + b * p.page_table_stride;
  int32_t* out = p.out_page_table + b * p.out_page_table_stride;
  const int64_t n_mid = plan.n_mid(), K = plan.n_top;
  if (K > 0 && K < n_mid) {
    const unsigned* row_keys = keys + b * key_stride;
    if (n_mid <= static_cast<int64_t>(kRegKeys) * kSelThreads) {
      select_middle_v2<kRegKeys>(p, plan, b, row_keys, s);
    } else {
      select_middle_v2<0>(p, plan, b, row_keys, s);
    }
  } else if (K > 0) {  // every middle page
    for (int64_t i = threadIdx.x; i < n_mid; i += kSelThreads) out[plan.n_sink + i] = in[plan.n_sink + i];
  }
  for (int64_t i = threadIdx.x; i < plan.n_sink; i += kSelThreads) out[i] = in[i];
  const int64_t first_recent = plan.n_pages - plan.n_recent;
  for (int64_t i = threadIdx.x; i < plan.n_recent; i += kSelThreads) out[plan.n_sink + K + i] = in[first_recent + i];
  if (threadIdx.x == 0) p.out_seq_lens[b] = static_cast<int32_t>(sparse_effective_len(len, plan, p.page_size));
}

}  // namespace
}  // namespace cuda_detail

using namespace cuda_detail;

void run_cuda(const page_summary_update_params& p, void* stream) {
  constexpr const char* op = "page_summary_update";
  cpu_detail::check_page_summary_update(p, op);
  if (p.n_tokens == 0) return;
  const int64_t total = p.n_tokens * p.kv_heads * p.head_dim;
  const auto blocks = static_cast<unsigned>(std::clamp<int64_t>(ceil_div(total, 256), 1, 8 * sm_count()));
  const cudaStream_t s = as_stream(stream);
  summary_kernel<<<blocks, 256, 0, s>>>(p, true);
  HYSERVE_CUDA_CHECK_LAUNCH();
  summary_kernel<<<blocks, 256, 0, s>>>(p, false);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

namespace {

// kernels.sparse_select: v1 takes the previous selection kernel (last scoring block selects);
// default and v2 the v2 kernels. Per call (the op's paths), so that one process can compare both.
bool select_v1() { return current_paths().sparse_select == kernel_paths::sparse_select_kind::kV1; }

void launch_select_v1(const sparse_select_params& p, size_t qbar_bytes, int lanes, cudaStream_t s) {
  // The row's keys live in shared memory when they fit (else the selecting block re-reads the
  // scores from global memory in every radix pass).
  int64_t key_cap = std::min(p.page_table_stride, kMaxSmemKeys);
  if (qbar_bytes + static_cast<size_t>(key_cap) * sizeof(unsigned) > static_cast<size_t>(max_shared_per_block_optin())) {
    key_cap = 0;
  }
  const size_t smem = qbar_bytes + static_cast<size_t>(key_cap) * sizeof(unsigned);
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

template <int kP>
void launch_score_v2(const sparse_select_params& p, size_t qbar_bytes, int lanes, unsigned* keys, int64_t key_stride,
                     float* raw, cudaStream_t s) {
  const auto kernel = &sparse_score_kernel<kP>;
  reserve_dynamic_shared(reinterpret_cast<const void*>(kernel), qbar_bytes);
  // Slices per row: the resident scoring blocks of the device over the batch (one wave), each
  // slice scoring at least one round of pages.
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, qbar_bytes));
  const int64_t resident = static_cast<int64_t>(sm_count()) * std::max(per_sm, 1);
  const int64_t pages_per_round = static_cast<int64_t>(kWarps) * (32 / lanes) * kP;
  const int64_t max_slices = std::max<int64_t>(1, ceil_div(p.page_table_stride, pages_per_round));
  const auto n_slices = static_cast<int>(std::clamp<int64_t>(resident / p.batch, 1, max_slices));
  const dim3 grid(static_cast<unsigned>(n_slices), static_cast<unsigned>(p.batch));
  kernel<<<grid, kThreads, qbar_bytes, s>>>(p, n_slices, lanes, keys, key_stride, raw);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

// Scores of the middle pages: as keys into `keys`, or (raw set) as floats into raw.
void launch_score(const sparse_select_params& p, size_t qbar_bytes, int lanes, unsigned* keys, int64_t key_stride,
                  float* raw, cudaStream_t s) {
  // A page of at most 2 float4s per lane is a short dependent chain (page id, then summaries):
  // 4 pages per group at a time keep enough loads in flight.
  if (ceil_div(p.kv_heads * p.head_dim / 4, lanes) <= 2) {
    launch_score_v2<4>(p, qbar_bytes, lanes, keys, key_stride, raw, s);
  } else {
    launch_score_v2<1>(p, qbar_bytes, lanes, keys, key_stride, raw, s);
  }
}

// The selection of v2 from scores computed elsewhere (phase::kSelect) or by its scoring kernel.
void launch_select_v2(const sparse_select_params& p, size_t qbar_bytes, int lanes, cudaStream_t s) {
  const int64_t key_stride = ceil_div(p.page_table_stride, 4) * 4;  // 16-byte aligned rows
  void* keys = nullptr;
  CUDA_CHECK(cudaMallocAsync(&keys, static_cast<size_t>(p.batch * key_stride) * sizeof(unsigned), s));
  if (p.mode == sparse_select_params::phase::kSelect) {
    const int64_t slices = std::clamp<int64_t>(ceil_div(p.page_table_stride, kThreads), 1, 64);
    sparse_keys_kernel<<<dim3(static_cast<unsigned>(slices), static_cast<unsigned>(p.batch)), kThreads, 0, s>>>(
        p, static_cast<unsigned*>(keys), key_stride);
    HYSERVE_CUDA_CHECK_LAUNCH();
  } else {
    launch_score(p, qbar_bytes, lanes, static_cast<unsigned*>(keys), key_stride, nullptr, s);
  }
  // With PDL (where it applies) the selecting blocks start as the scoring blocks finish.
  launch_pdl(sparse_select_v2_kernel, dim3(static_cast<unsigned>(p.batch)), dim3(kSelThreads), 0, s, p,
             static_cast<const unsigned*>(keys), key_stride);
  CUDA_CHECK(cudaFreeAsync(keys, s));
}

}  // namespace

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
  const cudaStream_t s = as_stream(stream);
  // Threads per page: the summary's float4 count rounded up to a power of two, at most a warp.
  int lanes = 1;
  while (lanes < 32 && lanes < p.kv_heads * p.head_dim / 4) lanes *= 2;
  // The phases of a sharded layer (score, all-reduce, select) run v2's kernels.
  if (p.mode == sparse_select_params::phase::kScore) {
    launch_score(p, qbar_bytes, lanes, nullptr, 0, p.scores, s);
  } else if (p.mode == sparse_select_params::phase::kFused && select_v1()) {
    launch_select_v1(p, qbar_bytes, lanes, s);
  } else {
    launch_select_v2(p, qbar_bytes, lanes, s);
  }
}

}  // namespace hyserve::kernels
