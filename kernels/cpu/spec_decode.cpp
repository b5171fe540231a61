// Speculative-decoding ops on the CPU: multi-token SSM / conv / GDN updates that keep the state
// after every step in scratch (chain or tree), and the fused commit of accepted steps. The
// per-token arithmetic is the single-token decode ops' own (same order of operations), so a
// one-token verify followed by a commit leaves exactly the state a decode step leaves.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/causal_conv1d.h"
#include "hyserve/kernels/gdn.h"
#include "hyserve/kernels/ssm.h"
#include "conv_validate.h"
#include "dtype_dispatch.h"
#include "gdn_validate.h"
#include "recurrent_update.h"
#include "ssm_validate.h"
#include "dense_validate.h"
#include "validate.h"

namespace hyserve::kernels {

using namespace cpu_detail;

namespace {

float softplus(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }
float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }
float silu(float v) { return v / (1.0f + std::exp(-v)); }

// Shape checks shared by the three multi-token ops: steps, tree parents, start columns.
void check_steps(const int32_t* parent, const int32_t* first_step, const int32_t* state_indices, int64_t batch,
                 int64_t tokens_per_row, int64_t steps, const char* op) {
  require_step_columns(tokens_per_row, steps, op);
  for (int64_t b = 0; b < batch; ++b) {
    if (state_indices[b] < 0) continue;
    const int64_t f = first_step != nullptr ? first_step[b] : 0;
    if (f < 0 || f + tokens_per_row > steps)
      fail(op, "first_step[" + std::to_string(b) + "]", f,
           ("must be in [0, steps - tokens_per_row] = [0, " + std::to_string(steps - tokens_per_row) + "]").c_str());
    if (parent == nullptr) continue;
    for (int64_t t = 0; t < tokens_per_row; ++t) {
      const int32_t q = parent[b * tokens_per_row + t];
      if (q < -1 || q >= t)
        fail(op, "retrieve_parent[" + std::to_string(b) + ", " + std::to_string(t) + "]", q,
             "must be -1 or an earlier node of the row");
    }
  }
}

// Index of the step column token t of row b starts from: -1 = the slot.
int64_t start_column(const int32_t* parent, const int32_t* first_step, int64_t b, int64_t t, int64_t T) {
  const int64_t f = first_step != nullptr ? first_step[b] : 0;
  const int64_t q = parent != nullptr ? parent[b * T + t] : t - 1;
  if (q >= 0) return f + q;
  return f - 1;
}

void normalise(const float* src, float* dst, int64_t n, bool l2, float scale) {
  float f = scale;
  if (l2) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(src[i]) * src[i];
    f = static_cast<float>(static_cast<double>(scale) / std::sqrt(ss + 1e-6));
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * f;
}

}  // namespace

namespace {

// One (row, head) of the multi-token SSM update in element types TI (io) and TS (state). The
// per-token arithmetic is update_row's of the single-token op (kernels/cpu/ssm.cpp): loads
// widen to f32, the new state element is stored rounded to TS, y sums the unrounded values.
template <class TI, class TS>
void ssm_multi_head(const selective_state_update_multi_params& p, int64_t b, int64_t h, float* xf, float* bf,
                    float* cf) {
  const int64_t P = p.head_dim, N = p.d_state, T = p.tokens_per_row;
  const int64_t head_elems = P * N, state_elems = p.heads * head_elems;
  const int64_t slot = p.state_indices[b];
  const int64_t g = h / (p.heads / p.n_groups);
  const int64_t f = p.first_step != nullptr ? p.first_step[b] : 0;
  const auto* slots_state = static_cast<const TS*>(p.ssm_states);
  auto* steps = static_cast<TS*>(p.step_states);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t tok = b * T + t;
    const int64_t src_col = start_column(p.retrieve_parent, p.first_step, b, t, T);
    const TS* src = src_col < 0 ? slots_state + slot * state_elems + h * head_elems
                                : steps + (b * p.steps + src_col) * state_elems + h * head_elems;
    TS* S = steps + (b * p.steps + f + t) * state_elems + h * head_elems;
    float v = to_f32(static_cast<const TI*>(p.dt)[tok * p.dt_stride + h]) + (p.dt_bias != nullptr ? p.dt_bias[h] : 0.0f);
    if (p.dt_softplus) v = softplus(v);
    const float dt = std::min(std::max(v, p.dt_min), p.dt_max);
    const float decay = std::exp(dt * -std::exp(p.A_log[h]));
    const float d_skip = p.D != nullptr ? p.D[h] : 0.0f;
    const TI* x = static_cast<const TI*>(p.x) + tok * p.x_stride + h * P;
    const TI* bv = static_cast<const TI*>(p.B) + tok * p.bc_stride + g * N;
    const TI* cv = static_cast<const TI*>(p.C) + tok * p.bc_stride + g * N;
    for (int64_t i = 0; i < P; ++i) xf[i] = to_f32(x[i]);
    for (int64_t n = 0; n < N; ++n) {
      bf[n] = to_f32(bv[n]);
      cf[n] = to_f32(cv[n]);
    }
    TI* y = static_cast<TI*>(p.y) + tok * p.y_stride + h * P;
    for (int64_t pi = 0; pi < P; ++pi) {
      const float coef = dt * xf[pi];
      const TS* in = src + pi * N;
      TS* row = S + pi * N;
      float out = 0.0f;
#pragma omp simd reduction(+ : out)
      for (int64_t n = 0; n < N; ++n) {
        const float s = to_f32(in[n]) * decay + coef * bf[n];
        row[n] = from_f32<TS>(s);
        out += s * cf[n];  // y from the f32 state, before it is rounded for storage
      }
      y[pi] = from_f32<TI>(out + d_skip * xf[pi]);
    }
  }
}

}  // namespace

void run_cpu(const selective_state_update_multi_params& p) {
  constexpr const char* op = "selective_state_update_multi";
  check_ssm_update_multi_fields(p, op);  // ssm_validate.h, shared with the CUDA op
  require_state_indices(p.state_indices, p.batch, op);
  check_steps(p.retrieve_parent, p.first_step, p.state_indices, p.batch, p.tokens_per_row, p.steps, op);
  dispatch_storage(p.io_dtype, op, "io_dtype", [&](auto io) {
    dispatch_storage(p.state_dtype, op, "state_dtype", [&](auto st) {
      using TI = typename host_storage<decltype(io)::value>::type;
      using TS = typename host_storage<decltype(st)::value>::type;
      for_each_live_ssm_head(p, [&](int64_t b, int64_t h, float* xf, float* bf, float* cf) {
        ssm_multi_head<TI, TS>(p, b, h, xf, bf, cf);
      });
    });
  });
}

void run_cpu(const conv1d_update_multi_params& p) {
  constexpr const char* op = "causal_conv1d_update_multi";
  check_conv1d_update_multi_fields(p, op);  // conv_validate.h, shared with the CUDA op
  require_state_indices(p.state_indices, p.batch, op);
  check_steps(p.retrieve_parent, p.first_step, p.state_indices, p.batch, p.tokens_per_row, p.steps, op);
  const int64_t K = p.width, W = K - 1, T = p.tokens_per_row, win_elems = p.dim * W;

#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < p.batch; ++b) {
    const int32_t slot = p.state_indices[b];
    if (slot < 0) continue;
    const int64_t f = p.first_step != nullptr ? p.first_step[b] : 0;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t tok = b * T + t;
      const int64_t src_col = start_column(p.retrieve_parent, p.first_step, b, t, T);
      const float* src = W == 0 ? nullptr
                         : src_col < 0 ? p.conv_states + static_cast<int64_t>(slot) * win_elems
                                       : p.step_windows + (b * p.steps + src_col) * win_elems;
      float* dst = W == 0 ? nullptr : p.step_windows + (b * p.steps + f + t) * win_elems;
      const float* x = p.x + tok * p.x_stride;
      float* o = p.out + tok * p.out_stride;
      for (int64_t c = 0; c < p.dim; ++c) {
        const float* w = p.weight + c * K;
        float acc = p.bias != nullptr ? p.bias[c] : 0.0f;
        for (int64_t j = 0; j < W; ++j) acc += w[j] * src[c * W + j];
        acc += w[W] * x[c];
        o[c] = p.silu ? silu(acc) : acc;
        if (W == 0) continue;
        for (int64_t j = 0; j + 1 < W; ++j) dst[c * W + j] = src[c * W + j + 1];
        dst[c * W + W - 1] = x[c];
      }
    }
  }
}

void run_cpu(const gdn_state_update_multi_params& p) {
  constexpr const char* op = "gdn_state_update_multi";
  check_gdn_update_multi_fields(p, op);  // gdn_validate.h, shared with the CUDA op
  require_state_indices(p.state_indices, p.batch, op);
  check_steps(p.retrieve_parent, p.first_step, p.state_indices, p.batch, p.tokens_per_row, p.steps, op);
  const int64_t K = p.k_dim, V = p.v_dim, T = p.tokens_per_row;
  const int64_t head_elems = V * K, state_elems = p.heads_v * head_elems;
  const float scale = p.scale != 0.0f ? p.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(K)));

  for_each_live_gdn_head(p, [&](int64_t b, int64_t h, int64_t slot, int64_t hk, float* q, float* k) {
    const int64_t f = p.first_step != nullptr ? p.first_step[b] : 0;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t tok = b * T + t;
      const int64_t src_col = start_column(p.retrieve_parent, p.first_step, b, t, T);
      const float* src = src_col < 0 ? p.states + slot * state_elems + h * head_elems
                                     : p.step_states + (b * p.steps + src_col) * state_elems + h * head_elems;
      float* S = p.step_states + (b * p.steps + f + t) * state_elems + h * head_elems;
      std::memcpy(S, src, static_cast<size_t>(head_elems) * sizeof(float));
      normalise(p.q + tok * p.q_stride + hk * K, q, K, p.qk_l2norm, scale);
      normalise(p.k + tok * p.k_stride + hk * K, k, K, p.qk_l2norm, 1.0f);
      const float bias = p.dt_bias != nullptr ? p.dt_bias[h] : 0.0f;
      const float decay = std::exp(-std::exp(p.A_log[h]) * softplus(p.a[tok * p.a_stride + h] + bias));
      const float beta = sigmoid(p.b[tok * p.b_stride + h]);
      const float* v = p.v + tok * p.v_stride + h * V;
      float* o = p.out + tok * p.out_stride + h * V;
      delta_rule_head(S, V, K, decay, beta, v, q, k, o);
    }
  });
}

void run_cpu(const state_commit_params& p) {
  constexpr const char* op = "state_commit";
  if (!check_state_commit(p, op)) return;
  const bool conv = p.conv_states != nullptr && p.conv_elems > 0;
  if (conv) require_ptr(p.conv_steps, op, "conv_steps");
  const auto state_bytes = static_cast<int64_t>(dtype_size(p.state_dtype)) * p.state_elems;
  for (int64_t i = 0; i < p.n_commits; ++i) {
    if (p.slots[i] < 0) continue;
    if (p.rows[i] < 0) fail(op, "rows[" + std::to_string(i) + "]", p.rows[i], "must be >= 0");
    if (p.steps_taken[i] < 0 || p.steps_taken[i] >= p.steps)
      fail(op, "steps_taken[" + std::to_string(i) + "]", p.steps_taken[i],
           ("must be in [0, steps = " + std::to_string(p.steps) + ")").c_str());
  }
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t l = 0; l < p.n_layers; ++l) {
    for (int64_t i = 0; i < p.n_commits; ++i) {
      const int64_t slot = p.slots[i];
      if (slot < 0) continue;
      const int64_t col = static_cast<int64_t>(p.rows[i]) * p.steps + p.steps_taken[i];
      std::memcpy(static_cast<char*>(p.ssm_states[l]) + slot * state_bytes,
                  static_cast<const char*>(p.ssm_steps[l]) + col * state_bytes, static_cast<size_t>(state_bytes));
      if (conv)
        std::memcpy(p.conv_states[l] + slot * p.conv_elems, p.conv_steps[l] + col * p.conv_elems,
                    static_cast<size_t>(p.conv_elems) * sizeof(float));
    }
  }
}

namespace {

// Tree-masked attention over a cache of element type KV (float or bf16 bits), widened to f32.
template <class KV>
void tree_attention(const paged_attention_tree_params& p, int64_t max_len) {
  const auto* k_cache = static_cast<const KV*>(p.k_cache);
  const auto* v_cache = static_cast<const KV*>(p.v_cache);
  const int64_t Dn = p.tree_nodes;
  const int64_t D = p.head_dim, kv_row = p.kv_heads * D, group = p.q_heads / p.kv_heads;
  const int64_t first = p.query_start_loc[0];
#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(max_len)), acc(static_cast<size_t>(D));
    std::vector<uint8_t> visible(static_cast<size_t>(Dn));
#pragma omp for collapse(3) schedule(dynamic, 4)
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t k = 0; k < Dn; ++k) {
        for (int64_t h = 0; h < p.q_heads; ++h) {
          std::fill(visible.begin(), visible.end(), uint8_t{0});
          for (int64_t a = k; a >= 0; a = p.retrieve_parent[b * Dn + a]) visible[static_cast<size_t>(a)] = 1;
          const int64_t prefix = p.seq_lens[b] - Dn;
          const int64_t t = p.query_start_loc[b] + k - first;
          const int32_t* pages = p.page_table + b * p.page_table_stride;
          const int64_t kvh = h / group;
          const float* q = p.q + (first + t) * p.q_stride + h * D;
          auto cache_offset = [&](int64_t s) {
            return (static_cast<int64_t>(pages[s / p.page_size]) * p.page_size + s % p.page_size) * kv_row + kvh * D;
          };
          auto seen = [&](int64_t s) { return s < prefix || visible[static_cast<size_t>(s - prefix)] != 0; };
          const int64_t last = prefix + k;
          float m = -std::numeric_limits<float>::infinity();
          for (int64_t s = 0; s <= last; ++s) {
            if (!seen(s)) continue;
            const KV* kk = k_cache + cache_offset(s);
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < D; ++d) dot += q[d] * to_f32(kk[d]);
            scores[static_cast<size_t>(s)] = dot * p.scale;
            m = std::max(m, scores[static_cast<size_t>(s)]);
          }
          float denom = 0.0f;
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int64_t s = 0; s <= last; ++s) {
            if (!seen(s)) continue;
            const float w = std::exp(scores[static_cast<size_t>(s)] - m);
            denom += w;
            const KV* v = v_cache + cache_offset(s);
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) acc[static_cast<size_t>(d)] += w * to_f32(v[d]);
          }
          float* o = p.out + (first + t) * p.out_stride + h * D;
          const float inv = 1.0f / denom;
          for (int64_t d = 0; d < D; ++d) o[d] = acc[static_cast<size_t>(d)] * inv;
        }
      }
    }
  }
}

}  // namespace

void run_cpu(const paged_attention_tree_params& p) {
  constexpr const char* op = "paged_attention_tree";
  check_paged_attention_tree(p, op);
  const int64_t Dn = p.tree_nodes;
  int64_t max_len = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t q_len = p.query_start_loc[b + 1] - p.query_start_loc[b];
    if (q_len != Dn)
      fail(op, "query_start_loc", q_len, ("row " + std::to_string(b) + " must have tree_nodes queries").c_str());
    if (p.seq_lens[b] < Dn) fail(op, "seq_lens[" + std::to_string(b) + "]", p.seq_lens[b], "must be >= tree_nodes");
    const int64_t n_pages = (p.seq_lens[b] + p.page_size - 1) / p.page_size;
    if (n_pages > p.page_table_stride)
      fail(op, "page_table_stride", p.page_table_stride,
           ("row " + std::to_string(b) + " needs " + std::to_string(n_pages) + " pages").c_str());
    for (int64_t k = 0; k < Dn; ++k) {
      const int32_t q = p.retrieve_parent[b * Dn + k];
      if (q < -1 || q >= k)
        fail(op, "retrieve_parent[" + std::to_string(b) + ", " + std::to_string(k) + "]", q,
             "must be -1 or an earlier node");
    }
    max_len = std::max<int64_t>(max_len, p.seq_lens[b]);
  }
  dispatch_storage(p.kv_dtype, op, "kv_dtype", [&](auto tag) {
    using KV = typename host_storage<decltype(tag)::value>::type;
    tree_attention<KV>(p, max_len);
  });
}

}  // namespace hyserve::kernels
