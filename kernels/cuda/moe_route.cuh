#pragma once
// The router of the routed-experts op (moe.h) on the GPU, one warp a token: the scores (softmax
// or sigmoid), the top-k by repeated warp arg-max (ties to the lower index), the renormalisation
// and the selection sorted by expert index. Shared by moe.cu's router and prepare kernels and by
// the fused decode kernels (moe_decode.cuh). Internal linkage: moe.cu is the only includer.
#include <climits>
#include <cstdint>

#include "common.cuh"

namespace hyserve::kernels::cuda_detail {
namespace {

constexpr int kMaxTopK = 32;

struct route_args {
  const float* logits = nullptr;
  int64_t logits_stride = 0;
  int64_t tokens = 0;
  int experts = 0, top_k = 0;
  bool softmax = true, norm = true;
  int32_t* ids = nullptr;   // [tokens · top_k]
  float* wts = nullptr;     // [tokens · top_k]
  int32_t* counts = nullptr;  // [experts], zeroed
  int32_t* user_ids = nullptr;
  float* user_wts = nullptr;
};

// Output i (token · top_k + position) of a selection: expert e of score sc (negative: NaN, none),
// its weight max(sc, 0), divided by top_sum when renormalised.
__device__ __forceinline__ void write_selection(const route_args& a, int64_t i, int e, float sc, float top_sum,
                                                int32_t* counts) {
  const float c = fmaxf(sc, 0.0f);
  const float w = a.norm ? c / top_sum : c;
  a.ids[i] = e;
  a.wts[i] = w;
  if (a.user_ids) a.user_ids[i] = e;
  if (a.user_wts) a.user_wts[i] = w;
  if (counts != nullptr) atomicAdd(counts + e, 1);
}

constexpr int kRouteRegs = 16;  // experts a lane holds in registers: up to 32 · 16 = 512

// A score as a 32-bit key in the router's order: a score >= 0 orders as its bits (-0 as +0),
// + 2; NaN 1 (below every number); 0 is left for a taken expert or none.
__device__ __forceinline__ unsigned route_key(float v) { return v >= 0.0f ? __float_as_uint(v + 0.0f) + 2u : 1u; }

// route_token for up to 32 · kRouteRegs experts, the scores in registers: lane l holds experts
// l, l + 32, … (ascending), so every per-lane loop and sum runs in the order route_token_smem's
// does and gives its bits. The logits are loaded all at once (one memory latency, not one per
// expert). Top-k: a round is a warp max of the lanes' best keys and a min of the tied lanes'
// indices; only the winning lane drops its entry and rescans its registers. Lane j keeps the
// j-th selection; the output order (expert index ascending, ties in selection order) is each
// selection's rank, and the renormalisation sum is taken in selection order as the rounds go.
template <int kRouteRegs>
__device__ __forceinline__ void route_token_regs(const route_args& a, int64_t t, int32_t* counts) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int E = a.experts, K = a.top_k;
  const float* l = a.logits + t * a.logits_stride;
  float s[kRouteRegs];
#pragma unroll
  for (int i = 0; i < kRouteRegs; ++i) s[i] = lane + 32 * i < E ? l[lane + 32 * i] : 0.0f;
  if (a.softmax) {
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kRouteRegs; ++i)
      if (lane + 32 * i < E) mx = fmaxf(mx, s[i]);
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kRouteRegs; ++i)
      if (lane + 32 * i < E) {
        s[i] = expf(s[i] - mx);
        sum += s[i];
      }
    sum = warp_sum(sum);
#pragma unroll
    for (int i = 0; i < kRouteRegs; ++i)
      if (lane + 32 * i < E) s[i] = s[i] / sum;
  } else {
#pragma unroll
    for (int i = 0; i < kRouteRegs; ++i)
      if (lane + 32 * i < E) s[i] = 1.0f / (1.0f + expf(-s[i]));
  }
  unsigned key[kRouteRegs];
#pragma unroll
  for (int i = 0; i < kRouteRegs; ++i) key[i] = lane + 32 * i < E ? route_key(s[i]) : 0u;
  unsigned lane_key = 0;
  int lane_i = 0;
  auto rescan = [&] {
    lane_key = 0;
    lane_i = 0;
#pragma unroll
    for (int i = 0; i < kRouteRegs; ++i)
      if (key[i] > lane_key) {
        lane_key = key[i];
        lane_i = i;
      }
  };
  rescan();
  int my_id = INT_MAX;
  float my_s = -1.5f, top_sum = 0.0f;
  for (int j = 0; j < K; ++j) {
    const unsigned best_key = warp_max_u32(lane_key);
    const unsigned lane_e = static_cast<unsigned>(lane + 32 * lane_i);
    const int best_e = static_cast<int>(warp_min_u32(lane_key == best_key ? lane_e : 0xffffffffu));
    const int id = best_key == 0 ? INT_MAX : best_e;  // none left: as the scalar arg-max's start
    const float sc = best_key == 0 ? -1.5f : best_key == 1 ? -1.0f : __uint_as_float(best_key - 2u);
    top_sum += fmaxf(sc, 0.0f);  // selection order (the CPU op's)
    if (lane == j) {
      my_id = id;
      my_s = sc;
    }
    if (best_key != 0 && lane_key == best_key && static_cast<int>(lane_e) == best_e) {
#pragma unroll
      for (int i = 0; i < kRouteRegs; ++i)
        if (i == lane_i) key[i] = 0;
      rescan();
    }
  }
  int rank = 0;  // by expert index, a tie in selection order (a stable sort's)
  for (int i = 0; i < K; ++i) {
    const int o = __shfl_sync(0xffffffffu, my_id, i);
    rank += o < my_id || (o == my_id && i < lane);
  }
  if (lane < K) write_selection(a, t * K + rank, my_id, my_s, top_sum, counts);
}

// Token t by one warp: s, its scores (experts floats of shared memory), sel_id / sel_s its
// selection (kMaxTopK of shared memory); counts gets one atomic increment per selected expert
// (global or shared memory; null: none). Up to 32 · kRouteRegs experts: route_token_regs
// (s, sel_id and sel_s unused).
__device__ __forceinline__ void route_token_smem(const route_args& a, int64_t t, float* s, int* sel_id, float* sel_s,
                                                 int32_t* counts);

__device__ __forceinline__ void route_token(const route_args& a, int64_t t, float* s, int* sel_id, float* sel_s, int32_t* counts) {
  if (a.experts <= 32 * kRouteRegs) {  // Qwen3-Next's 512 and fewer
    route_token_regs<kRouteRegs>(a, t, counts);
  } else {
    route_token_smem(a, t, s, sel_id, sel_s, counts);
  }
}

__device__ __forceinline__ void route_token_smem(const route_args& a, int64_t t, float* s, int* sel_id, float* sel_s,
                                                 int32_t* counts) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int E = a.experts;
  const float* l = a.logits + t * a.logits_stride;
  if (a.softmax) {
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) {
      const float v = l[e];
      s[e] = v;
      mx = fmaxf(mx, v);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) {
      const float v = expf(s[e] - mx);
      s[e] = v;
      sum += v;
    }
    sum = warp_sum(sum);
    for (int e = lane; e < E; e += 32) s[e] = s[e] / sum;
  } else {
    for (int e = lane; e < E; e += 32) s[e] = 1.0f / (1.0f + expf(-l[e]));
  }
  // Scores are >= 0; NaN ranks below every number, a taken expert below NaN. As keys of 32 bits
  // that order the same way (a non-negative float orders as its bits): score + 2, NaN 1, taken
  // 0. Each lane keeps the best key of its own entries (e ≡ lane mod 32, ascending: a tie keeps
  // the lower index); a round is a warp max of the keys and a min of the tied lanes' indices
  // (the lower index wins a tie), then only the winning lane marks its entry and rescans. Each
  // lane reads and writes only its own entries, so no barrier is needed between rounds.
  for (int e = lane; e < E; e += 32)
    if (!(s[e] >= 0.0f)) s[e] = -1.0f;
  auto key_of = [](float v) -> unsigned {
    return v >= 0.0f ? __float_as_uint(v + 0.0f) + 2u : (v == -1.0f ? 1u : 0u);  // + 0: -0 as +0
  };
  unsigned lane_key = 0;
  int lane_e = INT_MAX;
  auto rescan = [&] {
    lane_key = 0;
    lane_e = INT_MAX;
    for (int e = lane; e < E; e += 32) {
      const unsigned k = key_of(s[e]);
      if (k > lane_key) {
        lane_key = k;
        lane_e = e;
      }
    }
  };
  rescan();
  for (int j = 0; j < a.top_k; ++j) {
    const unsigned best_key = warp_max_u32(lane_key);
    const int best_e = static_cast<int>(warp_min_u32(lane_key == best_key ? static_cast<unsigned>(lane_e) : 0xffffffffu));
    if (lane == 0) {
      sel_id[j] = best_key == 0 ? INT_MAX : best_e;  // none left: as the scalar arg-max's start
      sel_s[j] = best_key == 0 ? -1.5f : best_key == 1 ? -1.0f : __uint_as_float(best_key - 2u);
    }
    if (best_key != 0 && lane_e == best_e && lane_key == best_key) {
      s[best_e] = -2.0f;
      rescan();
    }
  }
  __syncwarp();
  if (lane != 0) return;
  const int k = a.top_k;
  float top_sum = 0.0f;
  for (int j = 0; j < k; ++j) top_sum += fmaxf(sel_s[j], 0.0f);  // selection order (the CPU op's)
  for (int j = 1; j < k; ++j) {  // by expert index
    const int id = sel_id[j];
    const float sc = sel_s[j];
    int i = j - 1;
    while (i >= 0 && sel_id[i] > id) {
      sel_id[i + 1] = sel_id[i];
      sel_s[i + 1] = sel_s[i];
      --i;
    }
    sel_id[i + 1] = id;
    sel_s[i + 1] = sc;
  }
  for (int j = 0; j < k; ++j) write_selection(a, t * k + j, sel_id[j], sel_s[j], top_sum, counts);
}

}  // namespace
}  // namespace hyserve::kernels::cuda_detail
