#pragma once
// What the one-token updates of the recurrent ops (ssm.cpp, gdn.cpp) and their multi-token
// forms (spec_decode.cpp) share, so that a verified token leaves exactly the state a decode
// step leaves: the parallel loop over the heads of the live rows, and the gated delta rule on
// one value head.
#include <cstdint>
#include <vector>

#include "hyserve/kernels/gdn.h"
#include "hyserve/kernels/ssm.h"

namespace hyserve::kernels::cpu_detail {

// fn(b, h, xf, bf, cf) for every head h of every row b with a slot (state_indices[b] >= 0; a
// padding row's output and state stay untouched), in parallel, each thread with its own f32
// scratch: xf [head_dim], bf and cf [d_state].
template <class Fn>
void for_each_live_ssm_head(const ssm_common_params& p, Fn&& fn) {
#pragma omp parallel
  {
    std::vector<float> xf(static_cast<size_t>(p.head_dim)), bf(static_cast<size_t>(p.d_state)),
        cf(static_cast<size_t>(p.d_state));
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t h = 0; h < p.heads; ++h) {
        if (p.state_indices[b] < 0) continue;
        fn(b, h, xf.data(), bf.data(), cf.data());
      }
    }
  }
}

// fn(b, h, slot, hk, q, k) for every value head h (reading key head hk) of every row b with a
// slot (padding rows untouched), in parallel, each thread with its own f32 scratch q and k
// [k_dim] for the normalised query and key.
template <class Fn>
void for_each_live_gdn_head(const gdn_common_params& p, Fn&& fn) {
  const int64_t group = p.heads_v / p.heads_k;
#pragma omp parallel
  {
    std::vector<float> q(static_cast<size_t>(p.k_dim)), k(static_cast<size_t>(p.k_dim));
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t h = 0; h < p.heads_v; ++h) {
        const int64_t slot = p.state_indices[b];
        if (slot < 0) continue;
        fn(b, h, slot, h / group, q.data(), k.data());
      }
    }
  }
}

// One value head's state S [V, K] decays by `decay`, then each row e moves toward v[e] along k
// by beta (the delta rule); o[e] = the updated row · q. q and k: K normalised entries.
inline void delta_rule_head(float* S, int64_t V, int64_t K, float decay, float beta, const float* v, const float* q,
                            const float* k, float* o) {
  for (int64_t e = 0; e < V; ++e) {
    float* row = S + e * K;
    float pred = 0.0f;
#pragma omp simd reduction(+ : pred)
    for (int64_t x = 0; x < K; ++x) {
      row[x] *= decay;
      pred += row[x] * k[x];
    }
    const float delta = beta * (v[e] - pred);
    float out = 0.0f;
#pragma omp simd reduction(+ : out)
    for (int64_t x = 0; x < K; ++x) {
      row[x] += delta * k[x];
      out += row[x] * q[x];
    }
    o[e] = out;
  }
}

}  // namespace hyserve::kernels::cpu_detail
