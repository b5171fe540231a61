// Paged attention (causal extend with prefix, and decode), GQA, online softmax in fp32.
//
// Block = (slice, kv head, batch row), 128 threads = 4 warps. A block serves all the query
// heads of its kv head, so each K/V tile is loaded once per group: query rows are (token,
// group head) pairs, token-major, in tiles of 16 rows, row r on warp r % 4. K/V tiles of 32
// keys are gathered through the page table with 16-byte cp.async copies into two shared-memory
// stages, the next tile loading while the current one is used. For scores, lane j holds key
// j; for P·V, lane c holds 16-byte column chunk c and the probabilities are broadcast by shuffle.
//
// Element types: q and out are f32; the K/V cache is KV (float or __nv_bfloat16, from
// paged_attention_params::kv_dtype). Shared-memory tiles hold cache elements as stored (a
// 16-byte cp.async chunk is 4 f32 or 8 bf16) and are widened to f32 where used.
//
// The host does not know the rows' query counts (they live on the device), so each block
// decides on the device:
//   q_len == 1 (decode) and G = q_heads / kv_heads in decode_group_table: the block exits; the
//     decode rows are served by attention_decode.cuh (registers instead of shared memory, all G
//     heads per K/V load, up to kMaxDecodeSlices slices).
//   q_len == 1 (decode), other G: slice s takes keys [s·K, (s+1)·K) of the row (split-KV); with more
//     than one slice the block writes an unnormalised partial (m, l, acc) and a combine kernel
//     merges the slices (flash-decoding).
//   q_len > 1 (extend): slice s takes query tiles s, s + n_slices, ... over all their keys. Over a
//     bf16 cache with head_dim 64, 128 or 256 these rows run on the tensor cores instead, any G
//     (attention_extend_mma.cuh: 64-row query tiles, 64-key tiles, 32 at 256), and this kernel serves only
//     the decode rows the decode kernel does not.
//   With the host's promise max_q_len <= kMaxDecodeQueries (a decode or verify step: every row
//     has at most that many queries) and G in decode_group_table, every row is served by the
//     decode kernel, each query as a decode query over its causal prefix (split-KV over the
//     whole device instead of one block per kv head walking the row's keys), and the extend
//     kernel is not launched.
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "../cpu/dense_validate.h"
#include "../cpu/dtype_dispatch.h"
#include "attention_decode.cuh"
#include "attention_decode_mma.cuh"
#include "attention_extend_mma.cuh"
#include "attention_paths.h"
#include "attention_tree.h"
#include "common.cuh"
#include "dispatch.h"
#include "hyserve/common/error.h"
#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/paths.h"
#include "stream_alloc.h"

namespace hyserve::kernels {
namespace cuda_detail {
namespace {

constexpr int kAttnThreads = 128;
constexpr int kAttnWarps = kAttnThreads / 32;
constexpr int kKeysPerTile = 32;  // one key per lane
constexpr int kRowsPerWarp = 4;
constexpr int kRowsPerTile = kAttnWarps * kRowsPerWarp;
constexpr int kMaxSlices = 64;
constexpr int kMaxDecodeSlices = 256;
constexpr int64_t kMaxExtendSlices = 2048;  // the tensor-core extend kernel's tile stride (attn_extend_fill)
// GQA group sizes of the decode kernels (attention_decode.cuh, attention_decode_mma.cuh: up to
// 8 heads per kv head, one MMA n-tile; e.g. 6 for Falcon-H1-7B's 12 / 2 heads, 7 for 28 / 4);
// larger groups take the decode branch of paged_attention_kernel.
using decode_group_table = int_table<1, 2, 3, 4, 5, 6, 7, 8>;
constexpr int64_t kMaxGrid = 65535;

template <class KV, int D>
struct attn_smem {
  static constexpr int kN = pack16<KV>::kN;  // cache elements per 16-byte chunk
  static constexpr int kLd = D + kN;         // one chunk of padding: lane-per-key reads avoid conflicts
  KV k[2][kKeysPerTile][kLd];
  KV v[2][kKeysPerTile][kLd];
  float q[kRowsPerTile][D];
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

struct attn_partials {
  float* acc = nullptr;  // [batch, q_heads, n_slices, D] unnormalised Σ p·v
  float2* ml = nullptr;  // [batch, q_heads, n_slices] (running max, Σ p)
};

template <class KV, int D>
struct attn_block {
  using smem_t = attn_smem<KV, D>;
  static constexpr int kN = smem_t::kN;
  static constexpr int kChunks = D / kN;                    // 16-byte chunks per head row
  static constexpr int kLaneChunks = (kChunks + 31) / 32;  // P·V columns per lane

  const paged_attention_params& p;
  smem_t& sm;
  int64_t b, kvh, q_start, len;
  int q_len, group;

  // Query rows [r0, r0 + kRowsPerTile) ∩ [0, q_len·group) against keys [kb, ke) (and causal).
  // kb is a multiple of kKeysPerTile. slice >= 0: write a partial for the combine kernel.
  __device__ void run(int r0, int64_t kb, int64_t ke, int slice, int n_slices, const attn_partials& part) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int M = q_len * group;
    const KV* k_cache = reinterpret_cast<const KV*>(p.k_cache);
    const KV* v_cache = reinterpret_cast<const KV*>(p.v_cache);
    const float* q = p.q;

    for (int e = tid; e < kRowsPerTile * D; e += kAttnThreads) {
      const int r = e / D, d = e % D, row = r0 + r;
      float v = 0.0f;
      if (row < M) {
        const int64_t head = kvh * group + row % group;
        v = q[(q_start + row / group) * p.q_stride + head * D + d];
      }
      sm.q[r][d] = v;
    }

    bool live[kRowsPerWarp];
    int64_t pos[kRowsPerWarp];  // query position: attends keys 0..pos
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k) {
      const int row = r0 + warp + kAttnWarps * k;
      live[k] = row < M;  // uniform across the warp
      pos[k] = len - q_len + row / group;
    }
    const int last_row = min(M, r0 + kRowsPerTile) - 1;
    const int64_t key_end = min(ke, len - q_len + last_row / group + 1);
    const int n_tiles = key_end > kb ? static_cast<int>((key_end - kb + kKeysPerTile - 1) / kKeysPerTile) : 0;

    float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kLaneChunks][kN];
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k) {
      m[k] = -INFINITY;
      l[k] = 0.0f;
#pragma unroll
      for (int c = 0; c < kLaneChunks; ++c)
#pragma unroll
        for (int e = 0; e < kN; ++e) acc[k][c][e] = 0.0f;
    }

    const int32_t* pages = p.page_table + b * p.page_table_stride;
    const int ps = static_cast<int>(p.page_size);
    auto issue = [&](int t) {
      const int stage = t & 1;
      const int64_t kt0 = kb + static_cast<int64_t>(t) * kKeysPerTile;
      for (int e = tid; e < kKeysPerTile * kChunks; e += kAttnThreads) {
        const int key = e / kChunks, ch = e % kChunks;
        const int64_t s = kt0 + key;
        KV* kd = &sm.k[stage][key][ch * kN];
        KV* vd = &sm.v[stage][key][ch * kN];
        if (s < key_end) {
          const int si = static_cast<int>(s);
          const int64_t loc = static_cast<int64_t>(pages[si / ps]) * ps + si % ps;
          const int64_t off = (loc * p.kv_heads + kvh) * D + ch * kN;
          cp_async16(kd, k_cache + off);
          cp_async16(vd, v_cache + off);
        } else {
          // Past the range: zeros, so that a masked key's p = 0 never multiplies garbage.
          pack16<KV> zero;
#pragma unroll
          for (int j = 0; j < kN; ++j) zero.v[j] = from_float<KV>(0.0f);
          store_pack(kd, zero);
          store_pack(vd, zero);
        }
      }
      cp_async_commit();
    };

    if (n_tiles > 0) issue(0);
    for (int t = 0; t < n_tiles; ++t) {
      if (t + 1 < n_tiles) {
        issue(t + 1);  // stage (t+1)&1 was released by the barrier ending iteration t-1
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
      const int st = t & 1;
      const int64_t s = kb + static_cast<int64_t>(t) * kKeysPerTile + lane;

      float pv[kRowsPerWarp];
#pragma unroll
      for (int k = 0; k < kRowsPerWarp; ++k) {
        pv[k] = 0.0f;
        if (!live[k]) continue;
        const int r = warp + kAttnWarps * k;
        float dot = 0.0f;
#pragma unroll 8
        for (int c = 0; c < kChunks; ++c) {
          const pack16<KV> kp = load_pack(&sm.k[st][lane][c * kN]);
          const float* qr = &sm.q[r][c * kN];
#pragma unroll
          for (int e = 0; e < kN; ++e) dot += qr[e] * to_float(kp.v[e]);
        }
        const float score = (s < key_end && s <= pos[k]) ? dot * p.scale : -INFINITY;
        const float m_new = fmaxf(m[k], warp_max(score));
        // A row with nothing unmasked yet keeps p = 0 (avoids exp(-inf - -inf)).
        const float pk = m_new == -INFINITY ? 0.0f : expf(score - m_new);
        const float corr = m_new == -INFINITY ? 1.0f : expf(m[k] - m_new);
        l[k] = l[k] * corr + warp_sum(pk);
        m[k] = m_new;
#pragma unroll
        for (int c = 0; c < kLaneChunks; ++c)
#pragma unroll
          for (int e = 0; e < kN; ++e) acc[k][c][e] *= corr;
        pv[k] = pk;
      }

#pragma unroll 4
      for (int j = 0; j < kKeysPerTile; ++j) {
        float pj[kRowsPerWarp];
#pragma unroll
        for (int k = 0; k < kRowsPerWarp; ++k) pj[k] = __shfl_sync(0xffffffffu, pv[k], j);
#pragma unroll
        for (int c = 0; c < kLaneChunks; ++c) {
          const int ch = lane + 32 * c;
          if (ch < kChunks) {
            const pack16<KV> vp = load_pack(&sm.v[st][j][ch * kN]);
#pragma unroll
            for (int k = 0; k < kRowsPerWarp; ++k)
#pragma unroll
              for (int e = 0; e < kN; ++e) acc[k][c][e] += pj[k] * to_float(vp.v[e]);
          }
        }
      }
      __syncthreads();  // stage st is refilled by the next iteration's issue
    }

#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k) {
      if (!live[k]) continue;
      const int row = r0 + warp + kAttnWarps * k;
      const int64_t head = kvh * group + row % group;
      if (slice >= 0) {
        const int64_t idx = ((b * p.q_heads + head) * n_slices + slice);
        if (lane == 0) part.ml[idx] = make_float2(m[k], l[k]);
#pragma unroll
        for (int c = 0; c < kLaneChunks; ++c) {
          const int ch = lane + 32 * c;
          if (ch < kChunks)
#pragma unroll
            for (int e = 0; e < kN; ++e) part.acc[idx * D + ch * kN + e] = acc[k][c][e];
        }
      } else {
        float* o = p.out + (q_start + row / group) * p.out_stride + head * D;
        const float inv = 1.0f / l[k];
#pragma unroll
        for (int c = 0; c < kLaneChunks; ++c) {
          const int ch = lane + 32 * c;
          if (ch < kChunks)
#pragma unroll
            for (int e = 0; e < kN; ++e) o[ch * kN + e] = acc[k][c][e] * inv;
        }
      }
    }
  }
};

template <class KV, int D>
__global__ void __launch_bounds__(kAttnThreads) paged_attention_kernel(const paged_attention_params p, int n_slices,
                                                                       const attn_partials part, int skip_upto,
                                                                       int take_upto) {
  // skip_upto: rows of at most that many queries are the decode kernel's (it runs with qmax =
  // skip_upto whenever this kernel runs beside it; 0: none). take_upto: rows of more queries are
  // the tensor-core extend kernel's (INT_MAX: none).
  extern __shared__ uint4 smem_raw[];
  auto& sm = *reinterpret_cast<attn_smem<KV, D>*>(smem_raw);
  const int slice = blockIdx.x;
  const int64_t b = blockIdx.z;
  const int64_t q_start = p.query_start_loc[b];
  const int q_len = p.query_start_loc[b + 1] - static_cast<int>(q_start);
  if (q_len <= 0) return;  // row without queries
  if (q_len <= skip_upto) return;  // served by the decode kernel
  if (q_len > take_upto) return;   // served by attention_extend_mma.cuh
  const int64_t len = p.seq_lens[b];
  if (len < q_len) return;  // invalid row (the CPU op rejects it on the host)
  attn_block<KV, D> blk{p, sm, b, static_cast<int64_t>(blockIdx.y), q_start, len, q_len,
                       static_cast<int>(p.q_heads / p.kv_heads)};
  const int M = q_len * blk.group;
  if (q_len == 1) {
    const int64_t per_slice = ceil_div(ceil_div(len, n_slices), kKeysPerTile) * kKeysPerTile;
    const int64_t kb = slice * per_slice;
    const int64_t ke = min(len, kb + per_slice);
    for (int r0 = 0; r0 < M; r0 += kRowsPerTile) blk.run(r0, kb, ke, n_slices > 1 ? slice : -1, n_slices, part);
  } else {
    for (int r0 = slice * kRowsPerTile; r0 < M; r0 += n_slices * kRowsPerTile) blk.run(r0, 0, len, -1, n_slices, part);
  }
}

// Merges the decode slices of one (row, query head): out = Σ_s e^{m_s−M}·acc_s / Σ_s e^{m_s−M}·l_s
// over the row's non-empty slices, the first ceil(len / K) for K keys per slice (decode kernel:
// attn_decode::keys_per_slice; the extend kernel's decode branch: a multiple of kKeysPerTile).
// The slices' weights e^{m_s−M} are computed once, in parallel, into shared memory; then thread
// d sums its dimension over the slices (independent loads).
constexpr int kMaxCombineSlices = kMaxDecodeSlices > kMaxSlices ? kMaxDecodeSlices : kMaxSlices;

template <int D>
__global__ void __launch_bounds__(kAttnThreads) attention_combine_kernel(const paged_attention_params p, int n_slices,
                                                                         int qmax, const attn_partials part,
                                                                         bool decode_rule,
                                                                         const attn_decode::tree_keys tree) {
  pdl_begin();
  __shared__ float s_w[kMaxCombineSlices];
  __shared__ float s_max[kAttnWarps];
  const int64_t head = blockIdx.x;
  const int64_t bq = blockIdx.y, b = bq / qmax;  // query j of row b (qmax > 1: the decode kernel's verify rows)
  const int j = static_cast<int>(bq % qmax);
  const int64_t q_len = p.query_start_loc[b + 1] - p.query_start_loc[b];
  if (q_len < 1 || q_len > qmax || j >= q_len) return;  // not a decode query
  const int64_t q_start = p.query_start_loc[b] + j;
  const int64_t len = attn_decode::query_keys(p, tree, b, q_len, j);
  if (len < 1) return;
  const int64_t per_slice = decode_rule ? attn_decode::keys_per_slice(len, n_slices)
                                        : ceil_div(ceil_div(len, n_slices), kKeysPerTile) * kKeysPerTile;
  const int64_t used = ceil_div(len, per_slice);
  const int n_act = used < n_slices ? static_cast<int>(used) : n_slices;
  const int64_t base = (bq * p.q_heads + head) * n_slices;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  float mx = -INFINITY;
  for (int s = tid; s < n_act; s += kAttnThreads) mx = fmaxf(mx, part.ml[base + s].x);
  mx = warp_max(mx);
  if (lane == 0) s_max[warp] = mx;
  __syncthreads();
  mx = s_max[0];
#pragma unroll
  for (int w = 1; w < kAttnWarps; ++w) mx = fmaxf(mx, s_max[w]);

  float den = 0.0f;
  for (int s = tid; s < n_act; s += kAttnThreads) {
    const float2 ml = part.ml[base + s];
    const float w = ml.x != -INFINITY ? expf(ml.x - mx) : 0.0f;
    s_w[s] = w;
    den += ml.y * w;
  }
  den = block_sum(den);  // its barriers also publish s_w
  const float inv = 1.0f / den;
  float* o = p.out + q_start * p.out_stride + head * D;
  const float* acc = part.acc + base * D;
  for (int d = tid; d < D; d += kAttnThreads) {
    float num = 0.0f;
#pragma unroll 8
    for (int s = 0; s < n_act; ++s) num += acc[static_cast<int64_t>(s) * D + d] * s_w[s];
    o[d] = num * inv;
  }
}

// Whether decode queries over a KV cache of head_dim run on the tensor-core kernel.
template <class KV>
bool decode_on_mma(int64_t head_dim) {
  return std::is_same_v<KV, __nv_bfloat16> &&
         (head_dim == 64 || head_dim == 128 || (head_dim == 256 && current_paths().attn_decode_mma_hd256)) &&
         attn_decode_uses_mma();
}

// Resident blocks per SM the decode slices are sized for: the CUDA-core kernel's measured ~3
// (register-bound); the tensor-core kernel's from the occupancy calculator (2 at head_dim 128;
// cached).
constexpr int kSimtBlocksPerSm = 3;
int mma_blocks_per_sm(int64_t head_dim, int64_t group) {
  static int cache[3][9] = {};  // [head_dim 64, 128, 256][G <= 8]; 0 = not yet asked
  int& slot = cache[head_dim == 256 ? 2 : head_dim == 128 ? 1 : 0][group];
  if (slot > 0) return slot;
  int n = 0;
  dispatch(int_table<64, 128, 256>{}, head_dim, "paged_attention", "head_dim", [&](auto hd) {
    constexpr int D = decltype(hd)::value;
    dispatch(decode_group_table{}, group, "paged_attention", "q_heads / kv_heads", [&](auto gq) {
      constexpr int G = decltype(gq)::value;
      CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, &attn_decode_mma::decode_kernel_mma<D, G, false>,
                                                               attn_decode::kThreads, 0));
    });
  });
  slot = std::max(n, 1);
  return slot;
}

// Waves of resident blocks the decode slices aim for: kernels.attn_decode_waves (1..8) if set,
// else 1 for the tensor-core kernel and 3 for the CUDA-core one. Measured on the H200 (bf16
// cache, 32 q / 8 kv heads, batch 8): the tensor-core kernel at 32K context 84.6% of copy
// bandwidth with 3 waves, 85.8% with 2, 87.2% with 1 (each wave's blocks start on cold loads and
// end in a merge); the CUDA-core kernel 47.8% / 44.2% / 41.6% (it needs the extra waves to hide
// its compute).
int decode_waves(bool mma) {
  const int asked = current_paths().attn_decode_waves;  // validated with the config: 0 or 1..8
  return asked > 0 ? asked : mma ? 1 : 3;
}

// kernels.attn_decode_cluster: the cluster size (slices a query) of a decode kernel's cluster
// variant: 16 where the device co-schedules clusters of 16 (a non-portable size), else 8. Asked
// once per kernel.
template <auto Kernel>
int decode_cluster_size() {
  static const int size = [] {
    auto* kernel = Kernel;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(16, 1, 1);
      cfg.blockDim = dim3(attn_decode::kThreads);
      cudaLaunchAttribute attr;
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = 16;
      attr.val.clusterDim.y = 1;
      attr.val.clusterDim.z = 1;
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      int active = 0;
      static_assert(attn_decode::kMaxCluster >= 16, "merge_cluster's loads cover the cluster");
      if (cudaOccupancyMaxActiveClusters(&active, kernel, &cfg) == cudaSuccess && active > 0) return 16;
    }
    (void)cudaGetLastError();
    return 8;
  }();
  return size;
}

// A decode kernel's cluster variant over grid's kv heads and queries: the cluster size's slices
// a query (kernels.attn_decode_cluster_size, else decode_cluster_size), each cluster merging them
// (attn_decode::merge_cluster), no partials; extra: the kernel's arguments after the tree's.
template <auto Kernel, class... Extra>
void launch_in_clusters(const paged_attention_params& p, dim3 grid, int qmax, const attn_decode::tree_keys& tree,
                        cudaStream_t stream, Extra... extra) {
  const int asked = current_paths().attn_decode_cluster_size;  // validated with the config: 0 or 2..8
  const int c = asked > 0 ? asked : decode_cluster_size<Kernel>();
  launch_pdl_cluster(Kernel, dim3(static_cast<unsigned>(c), grid.y, grid.z), dim3(attn_decode::kThreads), 0, c, stream,
                     p, c, qmax, attn_decode::partials{}, tree, extra...);
}

// tree: a tree verify call (tree_keys): every row's tree.nodes queries on the decode kernel.
template <class KV>
void launch_paged_attention(const paged_attention_params& p, cudaStream_t stream,
                            const attn_decode::tree_keys& tree = {}) {
  const bool decode_kernel = decode_group_table::supports(p.q_heads / p.kv_heads);
  // determinism: batch_invariant: the slice counts below (a decode row's split of its keys, so
  // the order its partial sums are merged in) are sized as for a batch of one row whatever the
  // batch, so a row's result does not depend on how many rows share the call. fast: sized for
  // the batch (fewer, longer slices when many rows fill the device).
  const int64_t split_rows = current_paths().batch_invariant ? 1 : p.batch;
  // Extend slices: about 8 blocks per SM (2-3 waves of resident blocks), so that a small batch
  // fills the device and a partial last wave costs little. Decode rows of short contexts leave
  // slices empty; those exit after writing an empty partial.
  const auto n_slices =
      static_cast<int>(std::clamp<int64_t>(ceil_div(8 * sm_count(), split_rows * p.kv_heads), 1, kMaxSlices));
  // Decode slices: at least decode_waves() waves of resident four-warp blocks (register-bound,
  // per kernel), and a slice count whose block total fills its last wave best (slices are equal
  // work: a wave one-tenth full costs nearly a whole wave).
  const bool on_mma = decode_kernel && decode_on_mma<KV>(p.head_dim);
  const int64_t pairs = split_rows * p.kv_heads;
  const int64_t resident = static_cast<int64_t>(sm_count()) *
                           (on_mma ? mma_blocks_per_sm(p.head_dim, p.q_heads / p.kv_heads) : kSimtBlocksPerSm);
  const int64_t waves = decode_waves(on_mma);
  int n_dec = 1;
  if (pairs < waves * resident) {
    double best = 0.0;
    const int64_t lo = std::min<int64_t>(ceil_div(waves * resident, pairs), kMaxDecodeSlices);
    for (int64_t n = lo; n <= std::min<int64_t>(2 * lo, kMaxDecodeSlices); ++n) {
      const int64_t blocks = n * pairs;
      const double fill = static_cast<double>(blocks) / static_cast<double>(ceil_div(blocks, resident) * resident);
      if (fill > best + 1e-9) {
        best = fill;
        n_dec = static_cast<int>(n);
      }
    }
  }
  // kernels.attn_decode_max_slices: fewer, longer slices (at batch 1 and short contexts the
  // combine kernel costs about what the decode kernel does).
  if (const int cap = current_paths().attn_decode_max_slices; cap > 0) n_dec = std::min(n_dec, cap);
  // kernels.attn_decode_cluster (fast mode, the decode kernels, causal calls whose contexts are
  // at most its keys, default 2048: the page table's stride times the page size bounds them; a
  // query split into 8 or more slices, i.e. a small batch): a query's slices are one thread-block
  // cluster that merges them itself, no combine kernel.
  const int32_t asked_keys = current_paths().attn_decode_cluster;
  const int64_t cluster_keys = asked_keys == 0 ? 2048 : asked_keys;  // -1: off
  const bool cluster = cluster_keys > 0 && !current_paths().batch_invariant && decode_kernel && tree.nodes == 0 &&
                       n_dec >= 8 && p.page_table_stride * p.page_size <= cluster_keys;
  const int n_part = cluster ? 1 : decode_kernel ? n_dec : n_slices;
  // Rows of up to max_q_len queries all on the decode kernel (a decode or verify step).
  const bool decode_only = decode_kernel && (tree.nodes > 0 || (p.max_q_len >= 1 && p.max_q_len <= kMaxDecodeQueries &&
                                                                  p.batch * p.max_q_len <= kMaxGrid));
  // Under batch_invariant with the host's short_q_max, every row of up to 16 queries goes to the
  // decode kernel in any step (else a verify row's kernel would follow its neighbours' promise).
  const bool short_rows = current_paths().batch_invariant && decode_kernel && !decode_only && p.short_q_max > 1 &&
                          p.short_q_max <= kMaxDecodeQueries && p.batch * p.short_q_max <= kMaxGrid;
  const int qmax = tree.nodes > 0 ? tree.nodes
                   : decode_only  ? static_cast<int>(p.max_q_len)
                   : short_rows   ? static_cast<int>(p.short_q_max)
                                  : 1;
  attn_partials part;
  if (n_part > 1) {
    const int64_t n = p.batch * qmax * p.q_heads * n_part;
    void* ws = nullptr;
    CUDA_CHECK(scratch_alloc(&ws, static_cast<size_t>(n) * (sizeof(float2) + sizeof(float) * p.head_dim), stream));
    part.ml = static_cast<float2*>(ws);
    part.acc = reinterpret_cast<float*>(part.ml + n);
  }
  dispatch(attention_head_dim_table{}, p.head_dim, "paged_attention", "head_dim", [&](auto hd) {
    constexpr int D = decltype(hd)::value;
    if (decode_kernel) {
      dispatch(decode_group_table{}, p.q_heads / p.kv_heads, "paged_attention", "q_heads / kv_heads", [&](auto gq) {
        constexpr int G = decltype(gq)::value;
        const dim3 grid(static_cast<unsigned>(n_dec), static_cast<unsigned>(p.kv_heads),
                        static_cast<unsigned>(p.batch * qmax));
        const attn_decode::partials dpart{part.acc, part.ml};
        // kernels.attn_decode_early_loads: the tensor-core kernel's causal calls load their
        // older keys before the programmatic-launch wait (decode_kernel_mma states when that is safe).
        const bool early = current_paths().attn_decode_early_loads && tree.nodes == 0;
        const auto launch = [&](auto tree_tag) {
          constexpr bool kTree = decltype(tree_tag)::value;
          if constexpr (std::is_same_v<KV, __nv_bfloat16> && (D == 64 || D == 128 || D == 256)) {
            if (on_mma) {
              if constexpr (!kTree) {
                if (cluster) {
                  launch_in_clusters<&attn_decode_mma::decode_kernel_mma<D, G, false, true>>(p, grid, qmax, tree,
                                                                                              stream, early);
                  return;
                }
              }
              launch_pdl(attn_decode_mma::decode_kernel_mma<D, G, kTree>, grid, dim3(attn_decode::kThreads), 0, stream,
                         p, n_dec, qmax, dpart, tree, early);
              return;
            }
          }
          if constexpr (!kTree) {
            if (cluster) {
              launch_in_clusters<&attn_decode::decode_kernel<KV, D, G, false, true>>(p, grid, qmax, tree, stream);
              return;
            }
          }
          launch_pdl(attn_decode::decode_kernel<KV, D, G, kTree>, grid, dim3(attn_decode::kThreads), 0, stream, p, n_dec,
                     qmax, dpart, tree);
        };
        if (tree.nodes > 0)
          launch(std::true_type{});
        else
          launch(std::false_type{});
        HYSERVE_CUDA_CHECK_LAUNCH();
      });
    }
    // A decode or verify step served by the decode kernel has no extend work.
    if (!decode_only) {
      const dim3 grid(static_cast<unsigned>(n_slices), static_cast<unsigned>(p.kv_heads), static_cast<unsigned>(p.batch));
      // Rows of more than one query over a bf16 cache (head_dim 64, 128 or 256) run on the tensor
      // cores (attention_extend_mma.cuh, any group size); the CUDA-core kernel keeps the others:
      // all rows of an f32 cache, and the decode rows of a group size the decode kernel lacks.
      // A step whose rows all have at most max(skip, 1) queries (max_q_len known: decode rows of
      // such a group size) has none for the tensor-core kernel: it is not launched.
      const int skip = decode_kernel ? qmax : 0;
      int take = INT_MAX;
      if constexpr (std::is_same_v<KV, __nv_bfloat16> && (D == 64 || D == 128 || D == 256)) {
        if (!(p.max_q_len >= 1 && p.max_q_len <= std::max(skip, 1))) {
          const auto launch_extend = [&](auto split_tag) {
            constexpr bool kSplit = decltype(split_tag)::value;
            const size_t smem = sizeof(attn_extend_mma::smem_t<D, kSplit>);
            auto* kernel = &attn_extend_mma::extend_kernel<D, kSplit>;
            reserve_dynamic_shared(reinterpret_cast<const void*>(kernel), smem);
            // kernels.attn_extend_fill (default): the tile stride sized for about 8 blocks an SM
            // whatever the kv-head count (at most kMaxExtendSlices); false: the shared slice
            // count, at most kMaxSlices: a prompt of a model with 2 kv heads (Falcon-H1,
            // Qwen3-Next) then has 128 blocks, one an SM where two fit (run 37, H100: 8K prefill
            // 9.6% and 6.3% slower). A row's tiles do not depend on the stride.
            const int n_ext = current_paths().attn_extend_fill
                                  ? static_cast<int>(std::clamp<int64_t>(
                                        ceil_div(8 * sm_count(), split_rows * p.kv_heads), 1, kMaxExtendSlices))
                                  : n_slices;
            const dim3 g(static_cast<unsigned>(n_ext), grid.y, grid.z);
            kernel<<<g, attn_extend_mma::kThreads, smem, stream>>>(p, n_ext, std::max(skip, 1));
          };
          if (p.bf16_products)
            launch_extend(std::false_type{});
          else
            launch_extend(std::true_type{});
          HYSERVE_CUDA_CHECK_LAUNCH();
          take = 1;
        }
      }
      if (take > skip) {
        const size_t smem = sizeof(attn_smem<KV, D>);
        reserve_dynamic_shared(reinterpret_cast<const void*>(&paged_attention_kernel<KV, D>), smem);
        paged_attention_kernel<KV, D><<<grid, kAttnThreads, smem, stream>>>(p, n_slices, part, skip, take);
        HYSERVE_CUDA_CHECK_LAUNCH();
      }
    }
    if (n_part > 1) {
      const dim3 cgrid(static_cast<unsigned>(p.q_heads), static_cast<unsigned>(p.batch * qmax));
      launch_pdl(attention_combine_kernel<D>, cgrid, dim3(kAttnThreads), 0, stream, p, n_part, qmax, part, decode_kernel,
                 tree);
      HYSERVE_CUDA_CHECK_LAUNCH();
    }
  });
  if (n_part > 1) CUDA_CHECK(scratch_free(part.ml, stream));
}

// Thread per (row, node): the node's depth and its path root .. itself into path[node][0..depth].
// Parents come before their children; a parent chain longer than the tree is cut at its size.
__global__ void tree_paths_kernel(const int32_t* __restrict__ parent, int64_t n, int nodes, int32_t* __restrict__ path,
                                  int32_t* __restrict__ depth) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t* par = parent + (i / nodes) * nodes;
  int d = 0;
  for (int a = par[i % nodes]; a >= 0 && a < nodes && d < nodes - 1; a = par[a]) ++d;
  depth[i] = d;
  int a = static_cast<int>(i % nodes);
  for (int k = d; k >= 0; --k, a = par[a]) path[i * nodes + k] = a;
}

}  // namespace

bool tree_on_decode_kernels(const paged_attention_tree_params& p) {
  return decode_group_table::supports(p.q_heads / p.kv_heads) && attention_head_dim_table::supports(p.head_dim) &&
         p.batch * p.tree_nodes <= kMaxGrid && p.kv_heads <= kMaxGrid;
}

void launch_tree_on_decode_kernels(const paged_attention_tree_params& p, cudaStream_t stream) {
  const int64_t n = p.batch * p.tree_nodes;
  if (n == 0) return;
  void* ws = nullptr;
  CUDA_CHECK(scratch_alloc(&ws, sizeof(int32_t) * static_cast<size_t>(n * (p.tree_nodes + 1)), stream));
  auto* depth = static_cast<int32_t*>(ws);
  int32_t* path = depth + n;
  const int nodes = static_cast<int>(p.tree_nodes);
  tree_paths_kernel<<<static_cast<unsigned>(ceil_div(n, int64_t{128})), 128, 0, stream>>>(p.retrieve_parent, n, nodes,
                                                                                          path, depth);
  HYSERVE_CUDA_CHECK_LAUNCH();
  paged_attention_params base = p;
  base.max_q_len = 0;
  base.short_q_max = 0;
  const attn_decode::tree_keys tree{path, depth, nodes};
  cpu_detail::dispatch_storage(p.kv_dtype, "paged_attention_tree", "kv_dtype", [&](auto tag) {
    if constexpr (decltype(tag)::value == dtype::kBF16)
      launch_paged_attention<__nv_bfloat16>(base, stream, tree);
    else
      launch_paged_attention<float>(base, stream, tree);
  });
  CUDA_CHECK(scratch_free(ws, stream));
}

}  // namespace cuda_detail

using namespace cuda_detail;

namespace {
attn_decode_path g_attn_decode_path = attn_decode_path::kDefault;
}  // namespace

void set_attn_decode_path(attn_decode_path path) { g_attn_decode_path = path; }

bool attn_decode_uses_mma() {
  attn_decode_path path = g_attn_decode_path;
  if (path == attn_decode_path::kDefault) {
    switch (current_paths().attn_decode) {
      case kernel_paths::attn_decode_kind::kDefault: path = kAttnDecodeDefaultPath; break;
      case kernel_paths::attn_decode_kind::kSimt: path = attn_decode_path::kSimt; break;
      case kernel_paths::attn_decode_kind::kMma: path = attn_decode_path::kMma; break;
    }
  }
  return path == attn_decode_path::kMma;
}

void run_cuda(const paged_attention_params& p, void* stream) {
  constexpr const char* op = "paged_attention";
  cpu_detail::check_paged_attention(p, op);
  // CUDA-specific: compiled head sizes, grid limits, 16-byte cache reads. query_start_loc,
  // seq_lens and the page table live on the device and are not inspected here.
  if (!attention_head_dim_table::supports(p.head_dim)) {
    fail(op, "head_dim", p.head_dim,
         ("unsupported by the CUDA kernels; built for " + attention_head_dim_table::list()).c_str());
  }
  if (p.batch > kMaxGrid) fail(op, "batch", p.batch, "exceeds the CUDA grid (65535)");
  if (p.kv_heads > kMaxGrid) fail(op, "kv_heads", p.kv_heads, "exceeds the CUDA grid (65535)");
  if (p.q_heads > kMaxGrid) fail(op, "q_heads", p.q_heads, "exceeds the CUDA grid (65535)");
  if (p.page_size > 0x7fffffff) fail(op, "page_size", p.page_size, "exceeds the int range");
  require_aligned16(p.k_cache, op, "k_cache");
  require_aligned16(p.v_cache, op, "v_cache");
  cpu_detail::dispatch_storage(p.kv_dtype, op, "kv_dtype", [&](auto tag) {
    if constexpr (decltype(tag)::value == dtype::kBF16)
      launch_paged_attention<__nv_bfloat16>(p, as_stream(stream));
    else
      launch_paged_attention<float>(p, as_stream(stream));
  });
}

}  // namespace hyserve::kernels
