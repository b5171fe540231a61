#pragma once
// Gated DeltaNet decode update, persistent and software-pipelined.
//
// Same per-row math and lane layout as the recurrent kernel in gdn.cu (a state row of K floats
// over L = min(32, K/4) lanes, 16-byte accesses, one reduction round per token), but a block
// walks tiles (row b, value head h, slice z of kRowsPerBlock value rows) strided by the grid,
// and loads tile i+1 (state, q, k, v, a, b) into registers before it computes and stores tile i:
// every thread always has a tile's state reads in flight, so the memory system sees a steady
// stream of reads and writes instead of blocks that load, compute, then store. The grid is as
// many blocks as are resident at once. Tiles are numbered (b, h, z) with z fastest, so
// consecutive tiles of a block's sweep are neighbouring state bytes when slots are.
#include <cstdint>

#include "common.cuh"
#include "hyserve/kernels/gdn.h"
#include "launch.cuh"

namespace hyserve::kernels::cuda_detail {

// The sums of one token's delta-rule step on a lane segment of L lanes (shared by the GDN
// recurrent kernel, gdn.cu, and the decode kernel below): |q|², |k|², q·k, then for each of the
// lane's kR state rows s·k and s·q (sum[3 + 2r], sum[4 + 2r]). A lane holds kCols float4
// columns of q, k and its rows; the segment's lanes add up by xor shuffles, which every lane of
// the warp joins (offsets below L stay inside the segment).
template <int L, int kCols, int kR>
__device__ __forceinline__ void delta_rule_sums(float (&sum)[3 + 2 * kR], const float (&q)[kCols * 4],
                                                const float (&k)[kCols * 4], const float4 (&s)[kR][kCols]) {
  constexpr int kSums = 3 + 2 * kR;
#pragma unroll
  for (int i = 0; i < kSums; ++i) sum[i] = 0.0f;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float qe = q[c * 4 + e], ke = k[c * 4 + e];
      sum[0] += qe * qe;
      sum[1] += ke * ke;
      sum[2] += qe * ke;
    }
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const float4 v = s[r][c];
      sum[3 + 2 * r] += v.x * k[c * 4] + v.y * k[c * 4 + 1] + v.z * k[c * 4 + 2] + v.w * k[c * 4 + 3];
      sum[4 + 2 * r] += v.x * q[c * 4] + v.y * q[c * 4 + 1] + v.z * q[c * 4 + 2] + v.w * q[c * 4 + 3];
    }
  }
#pragma unroll
  for (int o = L / 2; o > 0; o >>= 1) {
#pragma unroll
    for (int i = 0; i < kSums; ++i) sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], o);
  }
}

namespace gdn_dec {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr float kL2Eps = 1e-6f;

template <int K, int kR>
struct geom {
  static constexpr int L = K / 4 < 32 ? K / 4 : 32;  // lanes per state row
  static constexpr int kCols = K / (4 * L);          // float4 columns per lane
  static constexpr int kSegs = 32 / L;               // row segments per warp
  static constexpr int kRowsPerBlock = kWarps * kSegs * kR;
  static_assert(K % 4 == 0 && (K / 4 <= 32 || (K / 4) % 32 == 0), "key dim must tile the warp");
  static_assert(kR <= L, "a segment writes its rows' outputs from distinct lanes");
};

template <int K, int kR>
struct tile_regs {
  float4 s[kR][geom<K, kR>::kCols];
  float q[geom<K, kR>::kCols * 4];
  float k[geom<K, kR>::kCols * 4];
  float v[kR];
  float a, b;
  int64_t slot;  // -1: padding row or no tile
  int64_t b_row, h;
  int row0;
};

// kPrefetch false: one tile per block (grid = tiles), no second tile's registers.
template <int K, int kR, bool kPrefetch = true>
__global__ void __launch_bounds__(kThreads) decode_kernel(const gdn_state_update_params p, float scale, int z_blocks,
                                                          int64_t n_tiles) {
  pdl_begin();  // launched with programmatic dependent launch (launch.cuh)
  using ge = geom<K, kR>;
  constexpr int L = ge::L, kCols = ge::kCols, kSegs = ge::kSegs;
  constexpr int kSums = 3 + 2 * kR;
  const int V = static_cast<int>(p.v_dim);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, seg_lane = lane % L;
  const int64_t HV = p.heads_v;
  const int64_t group = HV / p.heads_k;

  auto load = [&](int64_t tile, tile_regs<K, kR>& x) {
    x.slot = -1;
    if (tile >= n_tiles) return;
    const int64_t z = tile % z_blocks;
    const int64_t bh = tile / z_blocks;
    x.h = bh % HV;
    x.b_row = bh / HV;
    x.slot = p.state_indices[x.b_row];
    if (x.slot < 0) return;
    x.row0 = static_cast<int>(z) * ge::kRowsPerBlock + (warp * kSegs + lane / L) * kR;
    const float4* S = reinterpret_cast<const float4*>(p.states + (x.slot * HV + x.h) * static_cast<int64_t>(V) * K);
#pragma unroll
    for (int r = 0; r < kR; ++r) {
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int64_t at = static_cast<int64_t>(x.row0 + r) * (K / 4) + c * L + seg_lane;
        x.s[r][c] = x.row0 + r < V ? __ldcs(S + at) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
    const int64_t t = x.b_row;
    const int64_t hk = x.h / group;
    const float* qt = p.q + t * p.q_stride + hk * K;
    const float* kt = p.k + t * p.k_stride + hk * K;
    const float* vt = p.v + t * p.v_stride + x.h * V;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = (c * L + seg_lane) * 4 + e;
        x.q[c * 4 + e] = qt[col];
        x.k[c * 4 + e] = kt[col];
      }
    }
#pragma unroll
    for (int r = 0; r < kR; ++r) x.v[r] = x.row0 + r < V ? vt[x.row0 + r] : 0.0f;
    x.a = p.a[t * p.a_stride + x.h];
    x.b = p.b[t * p.b_stride + x.h];
  };

  tile_regs<K, kR> cur, nxt;
  int64_t tile = blockIdx.x;
  load(tile, cur);
  for (; tile < n_tiles; tile += gridDim.x) {
    if constexpr (kPrefetch) load(tile + gridDim.x, nxt);  // in flight while this tile is computed and stored
    if (cur.slot >= 0) {
      float sum[kSums];
      delta_rule_sums<L>(sum, cur.q, cur.k, cur.s);
      const float qf = p.qk_l2norm ? scale / sqrtf(sum[0] + kL2Eps) : scale;
      const float kf = p.qk_l2norm ? 1.0f / sqrtf(sum[1] + kL2Eps) : 1.0f;
      const float bias = p.dt_bias != nullptr ? p.dt_bias[cur.h] : 0.0f;
      const float decay = expf(-expf(p.A_log[cur.h]) * softplus(cur.a + bias));
      const float beta = 1.0f / (1.0f + expf(-cur.b));
      float* out = p.out + cur.b_row * p.out_stride + cur.h * V;
      float4* S = reinterpret_cast<float4*>(p.states + (cur.slot * HV + cur.h) * static_cast<int64_t>(V) * K);
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const float delta = beta * (cur.v[r] - decay * kf * sum[3 + 2 * r]);
        const float o = decay * qf * sum[4 + 2 * r] + delta * qf * kf * sum[2];
        const float dk = delta * kf;
        const bool live = cur.row0 + r < V;
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          float4 v = cur.s[r][c];
          v.x = decay * v.x + dk * cur.k[c * 4];
          v.y = decay * v.y + dk * cur.k[c * 4 + 1];
          v.z = decay * v.z + dk * cur.k[c * 4 + 2];
          v.w = decay * v.w + dk * cur.k[c * 4 + 3];
          const int64_t at = static_cast<int64_t>(cur.row0 + r) * (K / 4) + c * L + seg_lane;
          if (live) __stcs(S + at, v);
        }
        if (live && seg_lane == r) out[cur.row0 + r] = o;
      }
    }
    if constexpr (!kPrefetch) break;
    cur = nxt;
  }
}

}  // namespace gdn_dec
}  // namespace hyserve::kernels::cuda_detail
