#pragma once
// Paged decode attention (q_len = 1), streamed from device memory straight into registers; also
// the short query runs of verify steps (q_len <= qmax): query j of a row of q_len queries and
// seq_len keys is a decode query over the first seq_len − q_len + 1 + j keys (causal), one block
// per (slice, kv head, row · qmax + j). The slicing of each query is the decode step's (the same
// slice count, keys_per_slice of its own length), so a verify query computes what a decode step
// at that position computes, in the same order.
//
// Block = (slice, kv head, row), 4 warps; the slice's keys are split over the warps, and inside
// a warp over key groups of kLanesPerKey consecutive lanes: each group takes one key per step,
// each lane of it kDims = D / kLanesPerKey dimensions as 16-byte loads (a group reads the key's
// 512-byte fp32 row as coalesced 128-byte pieces). Every lane keeps the G query heads of its
// kv head for its dimensions, so each K/V element is loaded once and used for all G heads (the
// extend kernel's warp-per-head layout re-reads K/V from shared memory G times). Scores are
// reduced inside the group by xor shuffles; softmax is online per group (running max m, sum l,
// unnormalised acc), then merged over the warp's groups (shuffles) and the block's warps
// (shared memory). With several slices the block writes a partial (m, l, acc) that the combine
// kernel merges; with one, the normalised output. Slices past the row's length exit at once.
//
// kLanesPerKey is chosen so that acc (G × kDims floats) stays at 32 registers (q takes as many):
// G = 4, D = 128 gives 16 lanes per key, 8 dims per lane, 2 keys per warp step, and ~100
// registers, so that 4+ blocks per SM keep enough 16-byte loads in flight.
//
// Cache element type KV: float or __nv_bfloat16 (q and out are f32, arithmetic f32). A lane's
// dimensions come in chunks of E consecutive elements, one load each: 4 f32 (16 bytes), 8 bf16
// (16 bytes) when G <= 4, else 4 bf16 (8 bytes; keeps acc at the register budget). A bf16 cache
// moves half the bytes of an f32 one for the same work.
#include <cstdint>
#include <type_traits>

#include "async_copy.cuh"
#include "common.cuh"
#include "hyserve/kernels/attention.h"
#include "launch.cuh"

namespace hyserve::kernels::cuda_detail {
namespace attn_decode {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kMinKeysPerSlice = 32;

// Keys per slice of a row of len keys over n_slices slices (a multiple of 16, at least
// kMinKeysPerSlice); slices at or past len are empty: their blocks exit and the combine skips them.
__host__ __device__ __forceinline__ int64_t keys_per_slice(int64_t len, int n_slices) {
  const int64_t even = ceil_div(ceil_div(len, n_slices), 16) * 16;
  return even > kMinKeysPerSlice ? even : kMinKeysPerSlice;
}

// Elements per load of a KV cache element type for G heads per kv head.
template <class KV, int G>
inline constexpr int kChunkElems = (sizeof(KV) == 2 && G <= 4) ? 8 : 4;

template <int D, int G, int E>
struct shape {
  static constexpr int kMaxAcc = 32;  // acc floats per lane: at most G·kDims (q takes as many)
  // G rounded up to a power of two: kDims then divides D (a power of two).
  static constexpr int kG2 = G <= 1 ? 1 : G <= 2 ? 2 : G <= 4 ? 4 : 8;
  static constexpr int kDimsWanted = kMaxAcc / kG2 < E ? E : kMaxAcc / kG2;
  static constexpr int kDimsMin = D / 32 < E ? E : D / 32;  // at most 32 lanes per key
  static constexpr int kDims = kDimsWanted < kDimsMin ? kDimsMin : (kDimsWanted > D ? D : kDimsWanted);
  static constexpr int kLanesPerKey = D / kDims;
  static constexpr int kGroups = 32 / kLanesPerKey;  // keys per warp step
  static constexpr int kChunks = kDims / E;          // loads per lane per key
  static_assert(D % kDims == 0 && kDims % E == 0 && kLanesPerKey <= 32 && 32 % kLanesPerKey == 0, "layout");
};

// One load of E cache elements (8 or 16 bytes), streamed (__ldcs: read once), widened to f32.
template <class KV, int E>
struct kv_chunk {
  static constexpr int kBytes = E * static_cast<int>(sizeof(KV));
  static_assert(kBytes == 8 || kBytes == 16, "8- or 16-byte loads");
  using raw_t = std::conditional_t<kBytes == 16, uint4, uint2>;
  static constexpr int kWords = kBytes / 4;

  raw_t raw;

  __device__ __forceinline__ void load(const KV* p) { raw = __ldcs(reinterpret_cast<const raw_t*>(p)); }
  __device__ __forceinline__ void zero() {
    if constexpr (kBytes == 16)
      raw = make_uint4(0u, 0u, 0u, 0u);
    else
      raw = make_uint2(0u, 0u);
  }
  __device__ __forceinline__ void widen(float (&f)[E]) const {
    const auto* w = reinterpret_cast<const uint32_t*>(&raw);
    if constexpr (sizeof(KV) == 4) {
#pragma unroll
      for (int i = 0; i < kWords; ++i) f[i] = __uint_as_float(w[i]);
    } else {  // bf16: element 2i in the low half of word i (little-endian)
#pragma unroll
      for (int i = 0; i < kWords; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
      }
    }
  }
};

struct partials {
  float* acc = nullptr;  // [batch · qmax, q_heads, n_slices, D] unnormalised Σ p·v
  float2* ml = nullptr;  // [batch · qmax, q_heads, n_slices] (running max, Σ p)
};

// Tree verify on the decode kernels (paged_attention_tree): every row has `nodes` queries, the
// draft nodes, whose keys sit at positions prefix .. prefix + nodes − 1 in node order (prefix =
// seq_len − nodes). Query j is a decode query over prefix + depth[j] + 1 keys: the row's first
// prefix keys, then its ancestors root .. itself, key prefix + i at position prefix + path[j][i].
// A decode step at that position reads the same keys in the same order, so the node's result is
// the decode step's bits whenever the slicing is (determinism: batch_invariant).
struct tree_keys {
  const int32_t* path = nullptr;   // [batch · nodes, nodes]: node at depth i on node j's path
  const int32_t* depth = nullptr;  // [batch · nodes]
  int nodes = 0;                   // 0: not a tree call (causal rows)
};

// What block (slice, kv head, row · qmax + j) of a decode kernel serves: query j of row b (at
// token q_start) over keys [kb, ke) of its causal prefix (tree calls: of its path, see tree_keys).
struct block_keys {
  int slice;
  int64_t kvh, bq, b, q_start, kb, ke;
  const int32_t* path;  // tree calls: the query's path (key prefix + i at prefix + path[i]); else null
  int64_t prefix;
};

// Keys a decode query attends: causal, query j of a row of q_len over seq_len keys; tree calls:
// prefix + 1 + depth.
__device__ __forceinline__ int64_t query_keys(const paged_attention_params& p, const tree_keys& tree, int64_t b,
                                              int64_t q_len, int j) {
  if (tree.nodes > 0) return p.seq_lens[b] - q_len + 1 + tree.depth[b * tree.nodes + j];
  return p.seq_lens[b] - q_len + 1 + j;
}

// Cache position of the query's key s (kTree: a tree call, whose keys past the prefix map onto
// the path; the decode kernels are instantiated apart for it, so causal calls pay nothing).
template <bool kTree>
__device__ __forceinline__ int64_t key_position(const block_keys& r, int64_t s) {
  if constexpr (kTree) return s >= r.prefix ? r.prefix + r.path[s - r.prefix] : s;
  return s;
}

// False when the block has nothing to do: its row is not a decode kernel's (the extend
// kernel's), has no query j, or the slice lies past the query's keys (the combine kernel reads
// only the first ceil(len / keys_per_slice) slices). kKeepEmpty: a slice past the keys is kept,
// empty (kb = ke = len), for a block that must still join its cluster's barriers.
template <bool kTree, bool kKeepEmpty = false>
__device__ __forceinline__ bool locate_block(const paged_attention_params& p, int n_slices, int qmax,
                                             const tree_keys& tree, block_keys& r) {
  r.slice = static_cast<int>(blockIdx.x);
  r.kvh = blockIdx.y;
  r.bq = blockIdx.z;
  r.b = r.bq / qmax;
  const int j = static_cast<int>(r.bq % qmax);
  const int64_t row_start = p.query_start_loc[r.b];
  const int64_t q_len = p.query_start_loc[r.b + 1] - row_start;
  if (q_len < 1 || q_len > qmax || j >= q_len) return false;
  r.q_start = row_start + j;
  int64_t len = p.seq_lens[r.b] - q_len + 1 + j;  // keys of query j (causal)
  if constexpr (kTree) {
    r.path = tree.path + (r.b * tree.nodes + j) * tree.nodes;
    r.prefix = p.seq_lens[r.b] - q_len;
    len = r.prefix + 1 + tree.depth[r.b * tree.nodes + j];
  }
  if (len < 1) return false;
  const int64_t per_slice = keys_per_slice(len, n_slices);
  r.kb = r.slice * per_slice;
  if (r.kb >= len) {
    if constexpr (!kKeepEmpty) return false;
    r.kb = r.ke = len;
    return true;
  }
  r.ke = len < r.kb + per_slice ? len : r.kb + per_slice;
  return true;
}

// Parts i < n of an online softmax, each (m_i, l_i) = ml_of(i) (natural-log units; m = -inf: an
// empty part, skipped) and acc_of(i) one dimension of its unnormalised Σ p·v, merged in part
// order: m = max m_i, l = Σ l_i·e^{m_i−m}, acc = Σ acc_i·e^{m_i−m}.
struct merged_parts {
  float m, l, acc;
};
template <class MlOf, class AccOf>
__device__ __forceinline__ merged_parts merge_parts(int n, MlOf ml_of, AccOf acc_of) {
  merged_parts r{-INFINITY, 0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < n; ++i) r.m = fmaxf(r.m, ml_of(i).x);
#pragma unroll
  for (int i = 0; i < n; ++i) {
    const float2 ml = ml_of(i);
    if (ml.x != -INFINITY) {
      const float f = expf(ml.x - r.m);
      r.l += ml.y * f;
      r.acc += acc_of(i) * f;
    }
  }
  return r;
}

// The block's last step, shared by the decode kernels: every warp has left its (m, l) per head
// (natural-log units; m = -inf for a warp without keys) in s_ml[warp][h] and its unnormalised
// acc in s_acc[warp][h][·], and the block has synchronised. Merges the warps and writes the
// slice's partial (several slices) or the normalised output (one slice).
template <int D, int G>
__device__ __forceinline__ void merge_warps_and_store(const paged_attention_params& p, const float2 (&s_ml)[kWarps][G],
                                                      const float (&s_acc)[kWarps][G][D], int n_slices,
                                                      const partials& part, int slice, int64_t kvh, int64_t bq,
                                                      int64_t q_start) {
  for (int e = threadIdx.x; e < G * D; e += kThreads) {
    const int h = e / D, d = e % D;
    const merged_parts mp = merge_parts(
        kWarps, [&](int w) { return s_ml[w][h]; }, [&](int w) { return s_acc[w][h][d]; });
    const int64_t head = kvh * G + h;
    if (n_slices > 1) {
      const int64_t idx = (bq * p.q_heads + head) * n_slices + slice;
      if (d == 0) part.ml[idx] = make_float2(mp.m, mp.l);
      part.acc[idx * D + d] = mp.acc;
    } else {
      p.out[q_start * p.out_stride + head * D + d] = mp.acc / mp.l;
    }
  }
}

// A float (float2) at p's offset in the shared memory of CTA `rank` of the cluster.
__device__ __forceinline__ float ld_cluster(const float* p, uint32_t rank) {
  uint32_t remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_addr(p)), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
  return v;
}
__device__ __forceinline__ float2 ld_cluster(const float2* p, uint32_t rank) {
  uint32_t remote;
  float2 v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_addr(p)), "r"(rank));
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(remote) : "memory");
  return v;
}

// kernels.attn_decode_cluster: the blocks of a query's slices are one thread-block cluster (a
// slice a block, cluster rank = slice). Each block merges its warps into its own shared memory
// (merge_warps_and_store's arithmetic), then, after a cluster barrier, block c merges the
// outputs c·kThreads + tid, c·kThreads + tid + n·kThreads, … over the cluster's slices in slice
// order, reading the other blocks' shared memory; a second barrier keeps every block's shared
// memory until all have read it. No partials in global memory and no combine kernel. Every
// block of the cluster calls it (an empty slice with m = -inf, which the merge skips).
// A thread's 2n remote loads (n <= kMaxCluster) all go out before the first is used: a loop
// over the run-time n (which the compiler unrolled only in part) waited on the distributed
// shared memory's latency once for each group of loads. merge_parts then runs over kMaxCluster
// parts, those past n empty: the same order and bits as over n.
constexpr int kMaxCluster = 16;
template <int D, int G>
__device__ __forceinline__ void merge_cluster(const paged_attention_params& p, const float2 (&s_ml)[kWarps][G],
                                              const float (&s_acc)[kWarps][G][D], const block_keys& r) {
  __shared__ float2 c_ml[G];
  __shared__ float c_acc[G][D];
  for (int e = threadIdx.x; e < G * D; e += kThreads) {
    const int h = e / D, d = e % D;
    const merged_parts mp = merge_parts(
        kWarps, [&](int w) { return s_ml[w][h]; }, [&](int w) { return s_acc[w][h][d]; });
    c_acc[h][d] = mp.acc;
    if (d == 0) c_ml[h] = make_float2(mp.m, mp.l);
  }
  cluster_sync();  // also every thread of this block
  const uint32_t rank = cluster_rank(), n = cluster_size();
  for (int e = static_cast<int>(rank) * kThreads + static_cast<int>(threadIdx.x); e < G * D;
       e += static_cast<int>(n) * kThreads) {
    const int h = e / D, d = e % D;
    float2 ml[kMaxCluster];
    float acc[kMaxCluster];
#pragma unroll
    for (int s = 0; s < kMaxCluster; ++s) {
      ml[s] = make_float2(-INFINITY, 0.0f);
      acc[s] = 0.0f;
      if (s < static_cast<int>(n)) {
        ml[s] = ld_cluster(&c_ml[h], static_cast<uint32_t>(s));
        acc[s] = ld_cluster(&c_acc[h][d], static_cast<uint32_t>(s));
      }
    }
    const merged_parts mp = merge_parts(kMaxCluster, [&](int s) { return ml[s]; }, [&](int s) { return acc[s]; });
    p.out[r.q_start * p.out_stride + (r.kvh * G + h) * D + d] = mp.acc / mp.l;
  }
  cluster_sync();
}

// kCluster: launched in clusters of n_slices blocks along x (merge_cluster); causal calls only.
template <class KV, int D, int G, bool kTree, bool kCluster = false>
__global__ void __launch_bounds__(kThreads) decode_kernel(const paged_attention_params p, int n_slices, int qmax,
                                                          const partials part, const tree_keys tree) {
  pdl_begin();
  constexpr int E = kChunkElems<KV, G>;
  using sh = shape<D, G, E>;
  using chunk = kv_chunk<KV, E>;
  constexpr int LPK = sh::kLanesPerKey, NG = sh::kGroups, NC = sh::kChunks;
  static_assert(!(kTree && kCluster), "the cluster merge serves causal calls");
  block_keys r;
  // A cluster's blocks share their query: all of them leave here or none (empty slices stay).
  if (!locate_block<kTree, kCluster>(p, n_slices, qmax, tree, r)) return;
  const int slice = r.slice;
  const int64_t kvh = r.kvh, bq = r.bq, b = r.b, q_start = r.q_start, kb = r.kb, ke = r.ke;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int li = lane % LPK, grp = lane / LPK;

  // q of the G heads at this lane's dimensions, pre-scaled. Dimension of (chunk c, element e):
  // E·(li + LPK·c) + e.
  float q[G][NC][E];
  const float* qrow = p.q + q_start * p.q_stride + kvh * G * D;
#pragma unroll
  for (int h = 0; h < G; ++h)
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
      for (int e = 0; e < E; ++e) q[h][c][e] = qrow[h * D + E * (li + LPK * c) + e] * p.scale;

  float m[G], l[G], acc[G][NC][E];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.0f;
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
      for (int e = 0; e < E; ++e) acc[h][c][e] = 0.0f;
  }

  const int32_t* pages = p.page_table + b * p.page_table_stride;
  const int64_t ps = p.page_size;
  const KV* k_cache = static_cast<const KV*>(p.k_cache);
  const KV* v_cache = static_cast<const KV*>(p.v_cache);
  // Each step a group takes two keys (s and s + NG), both loaded before either is used: twice
  // the bytes in flight per warp.
  constexpr int kStep = kWarps * NG * 2;  // keys per block step
  for (int64_t s0 = kb; s0 < ke; s0 += kStep) {
    chunk kv[2][NC], vv[2][NC];
    bool valid[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int64_t s = s0 + (2 * warp + u) * NG + grp;  // this group's key u
      valid[u] = s < ke;
      if (valid[u]) {
        const int64_t sp = key_position<kTree>(r, s);
        const int64_t loc = static_cast<int64_t>(pages[sp / ps]) * ps + sp % ps;
        const int64_t base = (loc * p.kv_heads + kvh) * D + E * li;  // elements
#pragma unroll
        for (int c = 0; c < NC; ++c) kv[u][c].load(k_cache + base + E * LPK * c);
#pragma unroll
        for (int c = 0; c < NC; ++c) vv[u][c].load(v_cache + base + E * LPK * c);
      } else {
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          kv[u][c].zero();
          vv[u][c].zero();
        }
      }
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      float kf[NC][E];
#pragma unroll
      for (int c = 0; c < NC; ++c) kv[u][c].widen(kf[c]);
      float sc[G];
#pragma unroll
      for (int h = 0; h < G; ++h) {
        float d = 0.0f;
#pragma unroll
        for (int c = 0; c < NC; ++c)
#pragma unroll
          for (int e = 0; e < E; ++e) d += q[h][c][e] * kf[c][e];
#pragma unroll
        for (int o = 1; o < LPK; o <<= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        sc[h] = d;
      }
      if (valid[u]) {  // uniform inside a group
        float vf[NC][E];
#pragma unroll
        for (int c = 0; c < NC; ++c) vv[u][c].widen(vf[c]);
#pragma unroll
        for (int h = 0; h < G; ++h) {
          const float m_new = fmaxf(m[h], sc[h]);
          const float corr = expf(m[h] - m_new);  // m = -inf first: exp(-inf) = 0, acc is 0 anyway
          const float pk = expf(sc[h] - m_new);
          m[h] = m_new;
          l[h] = l[h] * corr + pk;
#pragma unroll
          for (int c = 0; c < NC; ++c)
#pragma unroll
            for (int e = 0; e < E; ++e) acc[h][c][e] = acc[h][c][e] * corr + pk * vf[c][e];
        }
      }
    }
  }

  // Merge the warp's groups: lanes li of different groups hold the same dimensions.
#pragma unroll
  for (int h = 0; h < G; ++h) {
    float mx = m[h];
#pragma unroll
    for (int o = LPK; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float f = m[h] == -INFINITY ? 0.0f : expf(m[h] - mx);
    float lh = l[h] * f;
#pragma unroll
    for (int o = LPK; o < 32; o <<= 1) lh += __shfl_xor_sync(0xffffffffu, lh, o);
    l[h] = lh;
    m[h] = mx;
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
      for (int e = 0; e < E; ++e) {
        float a = acc[h][c][e] * f;
#pragma unroll
        for (int o = LPK; o < 32; o <<= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
        acc[h][c][e] = a;
      }
  }

  // Merge the warps through shared memory: [warp][h] (m, l) and [warp][h][D] acc.
  __shared__ float2 s_ml[kWarps][G];
  __shared__ float s_acc[kWarps][G][D];
  if (grp == 0) {
#pragma unroll
    for (int h = 0; h < G; ++h) {
      if (li == 0) s_ml[warp][h] = make_float2(m[h], l[h]);
#pragma unroll
      for (int c = 0; c < NC; ++c)
#pragma unroll
        for (int e = 0; e < E; ++e) s_acc[warp][h][E * (li + LPK * c) + e] = acc[h][c][e];
    }
  }
  __syncthreads();
  if constexpr (kCluster)
    merge_cluster<D, G>(p, s_ml, s_acc, r);
  else
    merge_warps_and_store<D, G>(p, s_ml, s_acc, n_slices, part, slice, kvh, bq, q_start);
}

}  // namespace attn_decode
}  // namespace hyserve::kernels::cuda_detail
