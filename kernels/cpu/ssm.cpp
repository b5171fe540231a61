#include "hyserve/kernels/ssm.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "recurrent_update.h"
#include "ssm_dtype.h"
#include "ssm_validate.h"
#include "validate.h"

namespace hyserve::kernels {

using namespace cpu_detail;

namespace {

// Host element types: float, or bf16 as its raw 16-bit pattern. Loads widen to f32, stores
// round to nearest even.
using bf16_bits = uint16_t;
inline float load(float v) { return v; }
inline float load(bf16_bits v) { return bf16_to_f32(v); }
inline void store(float* p, float v) { *p = v; }
inline void store(bf16_bits* p, float v) { *p = f32_to_bf16(v); }

template <class T>
void load_row(const T* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = load(src[i]);
}

template <class T>
struct type_tag {
  using type = T;
};

// Calls f(type_tag<IO>{}, type_tag<State>{}) for the params' element types (checked before).
template <class F>
void dispatch_types(const ssm_common_params& p, F&& f) {
  auto with_state = [&](auto io) {
    if (p.state_dtype == dtype::kBF16) f(io, type_tag<bf16_bits>{});
    else f(io, type_tag<float>{});
  };
  if (p.io_dtype == dtype::kBF16) with_state(type_tag<bf16_bits>{});
  else with_state(type_tag<float>{});
}

// Same threshold as torch.nn.functional.softplus: above 20, log1p(e^v) == v in fp32.
float softplus(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }

// Step size of head h from the raw projection output: bias, softplus, clamp to the limits.
float step_size(const ssm_common_params& p, float raw, int64_t h) {
  float v = raw + (p.dt_bias != nullptr ? p.dt_bias[h] : 0.0f);
  if (p.dt_softplus) v = softplus(v);
  return std::min(std::max(v, p.dt_min), p.dt_max);
}

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// The shared field checks (ssm_validate.h), then the slots, which the CPU op can read.
void check_common(const ssm_common_params& p, const char* op) {
  check_ssm_common_fields(p, op);
  require_state_indices(p.state_indices, p.batch, op);
}

// Per-thread scratch of the chunk scan.
struct scan_workspace {
  int64_t ld = 0;           // min(chunk_size, longest sequence): no chunk is longer
  std::vector<float> cb;    // [ld, ld] C_i·B_j for j <= i (row i, column j)
  std::vector<float> dt;    // [ld] step sizes of one head over the chunk
  std::vector<double> cum;  // [ld] inclusive cumsum of dt·A; double so that the segment sums
                            // cum_i - cum_j keep fp32 accuracy deep into a long chunk
  std::vector<float> acc;   // [head_dim] output row accumulator
  std::vector<float> bs, cs;  // [ld, d_state] the chunk's B and C rows of the group, as f32
  std::vector<float> xs;      // [ld, head_dim] the chunk's x rows of one head, as f32
  std::vector<float> S;       // [heads of the task, head_dim, d_state] f32 running states
};

// One unit of work: sequence b, heads [h0, h1) of group g (all share the same B and C).
struct scan_task {
  int64_t b, g, h0, h1;
};

// Chunked SSD for one sequence and a block of heads of one group. For each chunk of Q tokens,
// with a_t = dt_t·A and cum_i = Σ_{s<=i} a_s inside the chunk, and S the state entering it:
//   y_i = Σ_{j<=i} (C_i·B_j) · exp(cum_i − cum_j) · dt_j · x_j      intra-chunk (quadratic)
//       + exp(cum_i) · S·C_i                                         carry from earlier chunks
//       + D · x_i
//   S  ← exp(cum_last) · S + Σ_j exp(cum_last − cum_j) · dt_j · x_j ⊗ B_j   (state passing)
// which equals the per-token recurrence S_t = exp(a_t)·S_{t-1} + dt_t·x_t ⊗ B_t, y_t = S_t·C_t + D·x_t.
// S is carried in f32 scratch: read from the slot once (zeros without an initial state) and
// written back once, rounded to the state type, after the last chunk.
template <class TI, class TS>
void scan_heads(const ssd_chunk_scan_params& p, const scan_task& task, scan_workspace& ws) {
  const int64_t P = p.head_dim;
  const int64_t N = p.d_state;
  const int64_t Q = p.chunk_size;
  const int64_t start = p.query_start_loc[task.b];
  const int64_t len = p.query_start_loc[task.b + 1] - start;
  const int64_t slot = p.state_indices[task.b];
  const bool init = p.has_initial_state != nullptr && p.has_initial_state[task.b] != 0;
  const auto* xg = static_cast<const TI*>(p.x);
  const auto* dtg = static_cast<const TI*>(p.dt);
  const auto* Bg = static_cast<const TI*>(p.B);
  const auto* Cg = static_cast<const TI*>(p.C);
  auto* yg = static_cast<TI*>(p.y);
  auto* states = static_cast<TS*>(p.ssm_states);
  float* cb = ws.cb.data();
  float* dtv = ws.dt.data();
  double* cum = ws.cum.data();
  float* acc = ws.acc.data();
  float* bs = ws.bs.data();
  float* cs = ws.cs.data();
  float* xs = ws.xs.data();

  for (int64_t h = task.h0; h < task.h1; ++h) {
    float* S = ws.S.data() + (h - task.h0) * P * N;
    if (init) load_row(states + (slot * p.heads + h) * P * N, S, P * N);
    else std::fill(S, S + P * N, 0.0f);
  }

  for (int64_t c0 = 0; c0 < len; c0 += Q) {
    const int64_t L = std::min(Q, len - c0);
    const int64_t t0 = start + c0;      // packed index of the chunk's first token
    const bool carry = init || c0 > 0;  // false: the entering state is zero

    for (int64_t i = 0; i < L; ++i) {
      load_row(Bg + (t0 + i) * p.bc_stride + task.g * N, bs + i * N, N);
      load_row(Cg + (t0 + i) * p.bc_stride + task.g * N, cs + i * N, N);
    }
    // Scores C_i·B_j (causal lower triangle), computed once for every head of the group.
    for (int64_t i = 0; i < L; ++i) {
      for (int64_t j = 0; j <= i; ++j) cb[i * ws.ld + j] = dot(cs + i * N, bs + j * N, N);
    }

    for (int64_t h = task.h0; h < task.h1; ++h) {
      const double A = -std::exp(static_cast<double>(p.A_log[h]));
      const float d_skip = p.D != nullptr ? p.D[h] : 0.0f;
      float* S = ws.S.data() + (h - task.h0) * P * N;  // [P, N]

      double run = 0.0;
      for (int64_t i = 0; i < L; ++i) {
        dtv[i] = step_size(p, load(dtg[(t0 + i) * p.dt_stride + h]), h);
        run += static_cast<double>(dtv[i]) * A;
        cum[i] = run;
        load_row(xg + (t0 + i) * p.x_stride + h * P, xs + i * P, P);
      }

      for (int64_t i = 0; i < L; ++i) {
        const float* xi = xs + i * P;
        std::fill(acc, acc + P, 0.0f);
        if (carry) {
          const float* ci = cs + i * N;
          const float decay = static_cast<float>(std::exp(cum[i]));
          for (int64_t pi = 0; pi < P; ++pi) acc[pi] = decay * dot(S + pi * N, ci, N);
        }
        for (int64_t j = 0; j <= i; ++j) {
          const float w = cb[i * ws.ld + j] * static_cast<float>(std::exp(cum[i] - cum[j])) * dtv[j];
          const float* xj = xs + j * P;
#pragma omp simd
          for (int64_t pi = 0; pi < P; ++pi) acc[pi] += w * xj[pi];
        }
        TI* yi = yg + (t0 + i) * p.y_stride + h * P;
        for (int64_t pi = 0; pi < P; ++pi) store(yi + pi, acc[pi] + d_skip * xi[pi]);
      }

      // State passing: decay the entering state over the chunk, add the chunk's own state.
      if (carry) {
        const float total = static_cast<float>(std::exp(cum[L - 1]));
        for (int64_t e = 0; e < P * N; ++e) S[e] *= total;
      }
      for (int64_t j = 0; j < L; ++j) {
        const float w = static_cast<float>(std::exp(cum[L - 1] - cum[j])) * dtv[j];
        const float* xj = xs + j * P;
        const float* bj = bs + j * N;
        for (int64_t pi = 0; pi < P; ++pi) {
          const float coef = w * xj[pi];
          float* row = S + pi * N;
#pragma omp simd
          for (int64_t n = 0; n < N; ++n) row[n] += coef * bj[n];
        }
      }
    }
  }

  for (int64_t h = task.h0; h < task.h1; ++h) {
    const float* S = ws.S.data() + (h - task.h0) * P * N;
    TS* dst = states + (slot * p.heads + h) * P * N;
    for (int64_t e = 0; e < P * N; ++e) store(dst + e, S[e]);
  }
}

template <class TI, class TS>
void update_row(const selective_state_update_params& p, int64_t b, int64_t h, float* xf, float* bf, float* cf) {
  const int64_t P = p.head_dim;
  const int64_t N = p.d_state;
  const int64_t slot = p.state_indices[b];
  const int64_t g = h / (p.heads / p.n_groups);
  const float dt = step_size(p, load(static_cast<const TI*>(p.dt)[b * p.dt_stride + h]), h);
  const float decay = std::exp(dt * -std::exp(p.A_log[h]));
  const float d_skip = p.D != nullptr ? p.D[h] : 0.0f;
  load_row(static_cast<const TI*>(p.x) + b * p.x_stride + h * P, xf, P);
  load_row(static_cast<const TI*>(p.B) + b * p.bc_stride + g * N, bf, N);
  load_row(static_cast<const TI*>(p.C) + b * p.bc_stride + g * N, cf, N);
  TI* y = static_cast<TI*>(p.y) + b * p.y_stride + h * P;
  TS* S = static_cast<TS*>(p.ssm_states) + (slot * p.heads + h) * P * N;  // [P, N]
  for (int64_t pi = 0; pi < P; ++pi) {
    const float coef = dt * xf[pi];
    TS* row = S + pi * N;
    float out = 0.0f;
#pragma omp simd reduction(+ : out)
    for (int64_t n = 0; n < N; ++n) {
      const float v = load(row[n]) * decay + coef * bf[n];
      store(row + n, v);
      out += v * cf[n];  // y from the f32 state, before it is rounded for storage
    }
    store(y + pi, out + d_skip * xf[pi]);
  }
}

}  // namespace

void run_cpu(const ssd_chunk_scan_params& p) {
  constexpr const char* op = "ssd_chunk_scan";
  check_ssd_chunk_scan_fields(p, op);
  require_state_indices(p.state_indices, p.batch, op);
  require_query_start_loc(p.query_start_loc, p.batch, op);

  int64_t n_live = 0;
  int64_t max_len = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    if (p.state_indices[b] < 0) continue;  // padding row: output rows and state untouched
    ++n_live;
    max_len = std::max<int64_t>(max_len, p.query_start_loc[b + 1] - p.query_start_loc[b]);
  }
  if (n_live == 0) return;

  // Split each group's heads into enough blocks to occupy the threads; every block recomputes
  // the group's C·Bᵀ, so blocks are no smaller than needed.
  const int64_t heads_per_group = p.heads / p.n_groups;
  const int64_t want = 2 * static_cast<int64_t>(omp_get_max_threads());
  const int64_t blocks =
      std::clamp<int64_t>((want + n_live * p.n_groups - 1) / (n_live * p.n_groups), 1, heads_per_group);
  const int64_t block_heads = (heads_per_group + blocks - 1) / blocks;
  std::vector<scan_task> tasks;
  for (int64_t b = 0; b < p.batch; ++b) {
    if (p.state_indices[b] < 0) continue;
    for (int64_t g = 0; g < p.n_groups; ++g) {
      for (int64_t h0 = g * heads_per_group; h0 < (g + 1) * heads_per_group; h0 += block_heads) {
        tasks.push_back({b, g, h0, std::min(h0 + block_heads, (g + 1) * heads_per_group)});
      }
    }
  }

  // Chunks never exceed the longest sequence, so the scratch does not either.
  const int64_t q = std::max<int64_t>(1, std::min(p.chunk_size, max_len));
  const auto n_tasks = static_cast<int64_t>(tasks.size());
#pragma omp parallel
  {
    scan_workspace ws;
    ws.ld = q;
    ws.cb.resize(static_cast<size_t>(q * q));
    ws.dt.resize(static_cast<size_t>(q));
    ws.cum.resize(static_cast<size_t>(q));
    ws.acc.resize(static_cast<size_t>(p.head_dim));
    ws.bs.resize(static_cast<size_t>(q * p.d_state));
    ws.cs.resize(static_cast<size_t>(q * p.d_state));
    ws.xs.resize(static_cast<size_t>(q * p.head_dim));
    ws.S.resize(static_cast<size_t>(block_heads * p.head_dim * p.d_state));
    dispatch_types(p, [&](auto io, auto st) {
      using TI = typename decltype(io)::type;
      using TS = typename decltype(st)::type;
#pragma omp for schedule(dynamic)
      for (int64_t i = 0; i < n_tasks; ++i) scan_heads<TI, TS>(p, tasks[static_cast<size_t>(i)], ws);
    });
  }
}

void run_cpu(const selective_state_update_params& p) {
  constexpr const char* op = "selective_state_update";
  check_common(p, op);

  dispatch_types(p, [&](auto io, auto st) {
    using TI = typename decltype(io)::type;
    using TS = typename decltype(st)::type;
    for_each_live_ssm_head(p, [&](int64_t b, int64_t h, float* xf, float* bf, float* cf) {
      update_row<TI, TS>(p, b, h, xf, bf, cf);
    });
  });
}

}  // namespace hyserve::kernels
