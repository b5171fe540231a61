#include "hyserve/kernels/gdn.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gdn_validate.h"
#include "recurrent_update.h"
#include "validate.h"

namespace hyserve::kernels {

using namespace cpu_detail;

namespace {

constexpr float kL2Eps = 1e-6f;  // inside the square root, as in the reference l2norm

// Same threshold as torch.nn.functional.softplus: above 20, log1p(e^v) == v in fp32.
float softplus(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }
float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// dst = src · scale / sqrt(Σ src² + eps) (or src · scale without the norm).
void normalise(const float* src, float* dst, int64_t n, bool l2, float scale) {
  float f = scale;
  if (l2) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(src[i]) * src[i];
    f = static_cast<float>(static_cast<double>(scale) / std::sqrt(ss + static_cast<double>(kL2Eps)));
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * f;
}

float query_scale(const gdn_common_params& p) {
  return p.scale != 0.0f ? p.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.k_dim)));
}

// Log decay of value head h for one token.
float log_decay(const gdn_common_params& p, float a, int64_t h) {
  const float bias = p.dt_bias != nullptr ? p.dt_bias[h] : 0.0f;
  return -std::exp(p.A_log[h]) * softplus(a + bias);
}

// The shared field checks (gdn_validate.h), then the slots, which the CPU op can read.
void check_common(const gdn_common_params& p, const char* op) {
  check_gdn_common_fields(p, op);
  require_state_indices(p.state_indices, p.batch, op);
}

// Per-thread scratch of the chunk scan; ld = rows of the longest chunk.
struct chunk_workspace {
  int64_t ld = 0;
  std::vector<float> q, k;  // [ld, K] normalised (q also scaled)
  std::vector<float> beta;  // [ld]
  std::vector<double> cum;  // [ld] inclusive cumsum of the log decay inside the chunk; double so
                            // that differences cum_i − cum_j keep fp32 accuracy
  std::vector<float> L;     // [ld, ld] strictly lower: beta_i (k_i·k_j) exp(cum_i − cum_j)
  std::vector<float> QK;    // [ld, ld] lower incl. diagonal: (q_i·k_j) exp(cum_i − cum_j)
  std::vector<float> U;     // [ld, V] UT-transformed values, then the chunk's new values
  std::vector<float> W;     // [ld, K] UT-transformed decayed keys
};

// Chunked delta rule for sequence b, value head h. Inside a chunk of n tokens with cumulative
// log decay c_i and entering state S (V × K), the per-token recurrence unrolls to
//   S_i = exp(c_i)·S + Σ_{j≤i} exp(c_i − c_j) · u_j ⊗ k_j,
//   u_i = beta_i·(v_i − exp(c_i)·S·k_i − Σ_{j<i} exp(c_i − c_j)(k_i·k_j)·u_j),
// a unit lower-triangular system (I + L)·u = beta·v − (beta·exp(c)·k)·Sᵀ. Solving it once for
// U = (I + L)⁻¹·(beta·v) and W = (I + L)⁻¹·(beta·exp(c)·k) by forward substitution (the UT
// transform) gives u = U − W·Sᵀ, then
//   o_i = exp(c_i)·S·q_i + Σ_{j≤i} exp(c_i − c_j)(q_i·k_j)·u_j
//   S  ← exp(c_n)·S + Σ_j exp(c_n − c_j)·u_j ⊗ k_j.
// S lives in the slot itself: zeroed first when the sequence has no initial state.
void scan_head(const gdn_chunk_scan_params& p, int64_t bi, int64_t h, chunk_workspace& ws) {
  const int64_t K = p.k_dim, V = p.v_dim, C = p.chunk_size, ld = ws.ld;
  const int64_t hk = h / (p.heads_v / p.heads_k);
  const int64_t start = p.query_start_loc[bi];
  const int64_t len = p.query_start_loc[bi + 1] - start;
  const int64_t slot = p.state_indices[bi];
  const bool init = p.has_initial_state != nullptr && p.has_initial_state[bi] != 0;
  const float scale = query_scale(p);
  float* S = p.states + (slot * p.heads_v + h) * V * K;  // [V, K]
  if (!init) std::fill(S, S + V * K, 0.0f);

  float* q = ws.q.data();
  float* k = ws.k.data();
  float* beta = ws.beta.data();
  double* cum = ws.cum.data();
  float* L = ws.L.data();
  float* QK = ws.QK.data();
  float* U = ws.U.data();
  float* W = ws.W.data();

  for (int64_t c0 = 0; c0 < len; c0 += C) {
    const int64_t n = std::min(C, len - c0);
    const int64_t t0 = start + c0;
    const bool carry = init || c0 > 0;  // false: the entering state is zero

    double run = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = t0 + i;
      normalise(p.q + t * p.q_stride + hk * K, q + i * K, K, p.qk_l2norm, scale);
      normalise(p.k + t * p.k_stride + hk * K, k + i * K, K, p.qk_l2norm, 1.0f);
      beta[i] = sigmoid(p.b[t * p.b_stride + h]);
      run += static_cast<double>(log_decay(p, p.a[t * p.a_stride + h], h));
      cum[i] = run;
    }

    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j <= i; ++j) {
        const float decay = static_cast<float>(std::exp(cum[i] - cum[j]));
        QK[i * ld + j] = dot(q + i * K, k + j * K, K) * decay;
        if (j < i) L[i * ld + j] = beta[i] * dot(k + i * K, k + j * K, K) * decay;
      }
    }

    // UT transform by forward substitution: row i of U and W from the rows before it.
    for (int64_t i = 0; i < n; ++i) {
      float* ui = U + i * V;
      float* wi = W + i * K;
      const float* vi = p.v + (t0 + i) * p.v_stride + h * V;
      const float wscale = beta[i] * static_cast<float>(std::exp(cum[i]));
      for (int64_t e = 0; e < V; ++e) ui[e] = beta[i] * vi[e];
      for (int64_t e = 0; e < K; ++e) wi[e] = wscale * k[i * K + e];
      for (int64_t j = 0; j < i; ++j) {
        const float l = L[i * ld + j];
        const float* uj = U + j * V;
        const float* wj = W + j * K;
#pragma omp simd
        for (int64_t e = 0; e < V; ++e) ui[e] -= l * uj[e];
#pragma omp simd
        for (int64_t e = 0; e < K; ++e) wi[e] -= l * wj[e];
      }
    }

    // New values of the chunk: u = U − W·Sᵀ (the part the entering state already predicts).
    if (carry) {
      for (int64_t i = 0; i < n; ++i)
        for (int64_t e = 0; e < V; ++e) U[i * V + e] -= dot(S + e * K, W + i * K, K);
    }

    for (int64_t i = 0; i < n; ++i) {
      float* o = p.out + (t0 + i) * p.out_stride + h * V;
      if (carry) {
        const float decay = static_cast<float>(std::exp(cum[i]));
        for (int64_t e = 0; e < V; ++e) o[e] = decay * dot(S + e * K, q + i * K, K);
      } else {
        std::fill(o, o + V, 0.0f);
      }
      for (int64_t j = 0; j <= i; ++j) {
        const float w = QK[i * ld + j];
        const float* uj = U + j * V;
#pragma omp simd
        for (int64_t e = 0; e < V; ++e) o[e] += w * uj[e];
      }
    }

    // State passing: decay the entering state over the chunk, add the chunk's own part.
    if (carry) {
      const float total = static_cast<float>(std::exp(cum[n - 1]));
      for (int64_t e = 0; e < V * K; ++e) S[e] *= total;
    }
    for (int64_t j = 0; j < n; ++j) {
      const float w = static_cast<float>(std::exp(cum[n - 1] - cum[j]));
      const float* kj = k + j * K;
      for (int64_t e = 0; e < V; ++e) {
        const float coef = w * U[j * V + e];
        float* row = S + e * K;
#pragma omp simd
        for (int64_t x = 0; x < K; ++x) row[x] += coef * kj[x];
      }
    }
  }
}

// bf16 io: the rows widened into f32 buffers, the f32 op, the live rows' outputs rounded back
// (padding rows' outputs untouched, as for f32).
void run_bf16_io(const gdn_chunk_scan_params& p) {
  const int64_t tokens = p.query_start_loc[p.batch];
  const int64_t wq = p.heads_k * p.k_dim, wv = p.heads_v * p.v_dim;
  auto widen = [&](const uint16_t* src, int64_t stride, int64_t width) {
    std::vector<float> dst(static_cast<size_t>(tokens * width));
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t e = 0; e < width; ++e) dst[static_cast<size_t>(t * width + e)] = bf16_to_f32(src[t * stride + e]);
    return dst;
  };
  const std::vector<float> q = widen(p.q_bf16, p.q_stride, wq), k = widen(p.k_bf16, p.k_stride, wq),
                           v = widen(p.v_bf16, p.v_stride, wv);
  std::vector<float> out(static_cast<size_t>(tokens * wv));
  gdn_chunk_scan_params f = p;
  f.io_dtype = dtype::kF32;
  f.q = q.data();
  f.k = k.data();
  f.v = v.data();
  f.out = out.data();
  f.q_stride = f.k_stride = wq;
  f.v_stride = f.out_stride = wv;
  run_cpu(f);
  for (int64_t b = 0; b < p.batch; ++b) {
    if (p.state_indices[b] < 0) continue;
    for (int64_t t = p.query_start_loc[b]; t < p.query_start_loc[b + 1]; ++t)
      for (int64_t e = 0; e < wv; ++e) p.out_bf16[t * p.out_stride + e] = f32_to_bf16(out[static_cast<size_t>(t * wv + e)]);
  }
}

}  // namespace

void run_cpu(const gdn_chunk_scan_params& p) {
  constexpr const char* op = "gdn_chunk_scan";
  check_gdn_chunk_scan_fields(p, op);
  require_state_indices(p.state_indices, p.batch, op);
  require_query_start_loc(p.query_start_loc, p.batch, op);
  const bool bf16_io = p.io_dtype == dtype::kBF16;
  if (bf16_io) {
    run_bf16_io(p);
    return;
  }

  struct task {
    int64_t b, h;
  };
  std::vector<task> tasks;
  int64_t max_len = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    if (p.state_indices[b] < 0) continue;  // padding row: output rows and state untouched
    max_len = std::max<int64_t>(max_len, p.query_start_loc[b + 1] - p.query_start_loc[b]);
    for (int64_t h = 0; h < p.heads_v; ++h) tasks.push_back({b, h});
  }
  if (tasks.empty()) return;

  const int64_t ld = std::max<int64_t>(1, std::min(p.chunk_size, max_len));
  const auto n_tasks = static_cast<int64_t>(tasks.size());
#pragma omp parallel
  {
    chunk_workspace ws;
    ws.ld = ld;
    ws.q.resize(static_cast<size_t>(ld * p.k_dim));
    ws.k.resize(static_cast<size_t>(ld * p.k_dim));
    ws.beta.resize(static_cast<size_t>(ld));
    ws.cum.resize(static_cast<size_t>(ld));
    ws.L.resize(static_cast<size_t>(ld * ld));
    ws.QK.resize(static_cast<size_t>(ld * ld));
    ws.U.resize(static_cast<size_t>(ld * p.v_dim));
    ws.W.resize(static_cast<size_t>(ld * p.k_dim));
#pragma omp for schedule(dynamic)
    for (int64_t i = 0; i < n_tasks; ++i)
      scan_head(p, tasks[static_cast<size_t>(i)].b, tasks[static_cast<size_t>(i)].h, ws);
  }
}

void run_cpu(const gdn_state_update_params& p) {
  constexpr const char* op = "gdn_state_update";
  check_common(p, op);

  const int64_t K = p.k_dim, V = p.v_dim;
  const float scale = query_scale(p);

  for_each_live_gdn_head(p, [&](int64_t b, int64_t h, int64_t slot, int64_t hk, float* q, float* k) {
    normalise(p.q + b * p.q_stride + hk * K, q, K, p.qk_l2norm, scale);
    normalise(p.k + b * p.k_stride + hk * K, k, K, p.qk_l2norm, 1.0f);
    const float decay = std::exp(log_decay(p, p.a[b * p.a_stride + h], h));
    const float beta = sigmoid(p.b[b * p.b_stride + h]);
    const float* v = p.v + b * p.v_stride + h * V;
    float* o = p.out + b * p.out_stride + h * V;
    float* S = p.states + (slot * p.heads_v + h) * V * K;  // [V, K]
    delta_rule_head(S, V, K, decay, beta, v, q, k, o);
  });
}

}  // namespace hyserve::kernels
