// Speculative-decoding ops on CUDA: multi-token SSM / conv / GDN updates with per-step states
// in scratch (chain or tree parents), and the fused commit of accepted steps over every layer.
// Same contract as kernels/cpu/spec_decode.cpp: SSM io and state f32 or bf16, tree attention
// over an f32 or bf16 KV cache, conv windows and GDN states f32.
#include <algorithm>
#include <string>
#include <type_traits>

#include "../cpu/conv_validate.h"
#include "../cpu/dense_validate.h"
#include "../cpu/dtype_dispatch.h"
#include "../cpu/gdn_validate.h"
#include "../cpu/ssm_validate.h"
#include "attention_tree.h"
#include "ssm_common.cuh"
#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/causal_conv1d.h"
#include "hyserve/kernels/gdn.h"
#include "hyserve/kernels/ssm.h"

namespace hyserve::kernels {
namespace cuda_detail {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxCommitLayers = 32;  // layer pointers passed by value per launch

__device__ __forceinline__ float sigmoid_d(float v) { return 1.0f / (1.0f + expf(-v)); }
__device__ __forceinline__ float silu_d(float v) { return v / (1.0f + expf(-v)); }

// Step column token t of row b starts from; -1 = the slot's persistent state.
__device__ __forceinline__ int64_t start_column(const int32_t* parent, const int32_t* first_step, int64_t b,
                                                int64_t t, int64_t T) {
  const int64_t f = first_step != nullptr ? first_step[b] : 0;
  const int64_t q = parent != nullptr ? parent[b * T + t] : t - 1;
  return q >= 0 ? f + q : f - 1;
}

// Warp = one head_dim row pi of head h of row b (block = kMultiWarps consecutive rows of a head),
// its lanes over d_state (element n = lane + 32·i, i < PER <= kMultiMaxPer: coalesced loads and
// stores), y reduced across the warp. Tokens of the row run in order; each starts from its start
// state (the slot's or a step column) and writes its own step column. The warp keeps the state
// it last wrote in registers, so a chain reads the slot once and then only writes (a tree node
// whose parent is not the previous token reads the parent's column, which the same lanes
// wrote). TI: element type of x, dt, B, C, y; TS: of the states (stored rounded to nearest even,
// the next token starting from the stored value; y from the f32 values, as the decode op
// computes it).
constexpr int kMultiWarps = 4;
constexpr int kMultiMaxPer = 8;  // d_state <= 32 · 8

// A token's inputs to one state row (loaded one token ahead: the loads do not wait for the
// previous token's state math and stores).
template <class TI, int PER>
struct multi_token_in {
  TI dt, x;
  TI b[PER], c[PER];
};

template <class TI, int PER>
__device__ __forceinline__ void load_multi_token(const selective_state_update_multi_params& p, int64_t tok, int64_t h,
                                                 int64_t g, int64_t pi, int lane, multi_token_in<TI, PER>& in) {
  const int64_t N = p.d_state;
  const TI* __restrict__ bv = static_cast<const TI*>(p.B) + tok * p.bc_stride + g * N;
  const TI* __restrict__ cv = static_cast<const TI*>(p.C) + tok * p.bc_stride + g * N;
  in.dt = __ldg(static_cast<const TI*>(p.dt) + tok * p.dt_stride + h);
  in.x = __ldg(static_cast<const TI*>(p.x) + tok * p.x_stride + h * p.head_dim + pi);
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int64_t n = lane + 32 * i;
    in.b[i] = n < N ? __ldg(bv + n) : TI{};
    in.c[i] = n < N ? __ldg(cv + n) : TI{};
  }
}

template <class TI, class TS, int PER>
__global__ void __launch_bounds__(32 * kMultiWarps) ssm_update_multi_kernel(const selective_state_update_multi_params p) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t pi = static_cast<int64_t>(blockIdx.x) * kMultiWarps + (threadIdx.x >> 5);
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t P = p.head_dim, N = p.d_state, T = p.tokens_per_row;
  if (pi >= P) return;
  const int64_t slot = p.state_indices[b];
  if (slot < 0) return;
  const int64_t head_elems = P * N, state_elems = p.heads * head_elems;
  const int64_t g = h / (p.heads / p.n_groups);
  const int64_t f = p.first_step != nullptr ? p.first_step[b] : 0;
  TI* ys = static_cast<TI*>(p.y);
  const TS* slot_state = static_cast<const TS*>(p.ssm_states);
  TS* steps = static_cast<TS*>(p.step_states);
  const float d_skip = p.D != nullptr ? p.D[h] : 0.0f;
  const float dt_bias = p.dt_bias != nullptr ? p.dt_bias[h] : 0.0f;
  const float neg_a = -expf(p.A_log[h]);
  float s[PER];
  int64_t held = -2;  // the column whose state row s holds (-1: the slot's; -2: none)
  multi_token_in<TI, PER> cur, next;
  if (T > 0) load_multi_token(p, b * T, h, g, pi, lane, next);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t tok = b * T + t;
    cur = next;
    if (t + 1 < T) load_multi_token(p, tok + 1, h, g, pi, lane, next);
    const int64_t src_col = start_column(p.retrieve_parent, p.first_step, b, t, T);
    if (src_col != held) {
      const TS* src = (src_col < 0 ? slot_state + slot * state_elems : steps + (b * p.steps + src_col) * state_elems) +
                      h * head_elems + pi * N;
#pragma unroll
      for (int i = 0; i < PER; ++i) {
        const int64_t n = lane + 32 * i;
        s[i] = n < N ? to_float(src[n]) : 0.0f;
      }
    }
    TS* S = steps + (b * p.steps + f + t) * state_elems + h * head_elems + pi * N;
    float v = to_float(cur.dt) + dt_bias;
    if (p.dt_softplus) v = softplus(v);
    const float dt = fminf(fmaxf(v, p.dt_min), p.dt_max);
    const float decay = expf(dt * neg_a);
    const float xv = to_float(cur.x);
    const float coef = dt * xv;
    float out = 0.0f;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int64_t n = lane + 32 * i;
      if (n < N) {
        const float sv = s[i] * decay + coef * to_float(cur.b[i]);
        const TS stored = from_float<TS>(sv);
        S[n] = stored;
        out += sv * to_float(cur.c[i]);
        s[i] = to_float(stored);
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) out += __shfl_xor_sync(0xffffffffu, out, o);
    if (lane == 0) ys[tok * p.y_stride + h * P + pi] = from_float<TI>(out + d_skip * xv);
    held = f + t;
  }
}

// Thread = (row b, channel c); tokens of the row in order.
__global__ void conv_update_multi_kernel(const conv1d_update_multi_params p) {
  const int64_t b = blockIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= p.dim) return;
  const int32_t slot = p.state_indices[b];
  if (slot < 0) return;
  const int64_t K = p.width, W = K - 1, T = p.tokens_per_row, win = p.dim * W;
  const int64_t f = p.first_step != nullptr ? p.first_step[b] : 0;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t tok = b * T + t;
    const int64_t src_col = start_column(p.retrieve_parent, p.first_step, b, t, T);
    const float* src = W == 0 ? nullptr
                       : src_col < 0 ? p.conv_states + static_cast<int64_t>(slot) * win
                                     : p.step_windows + (b * p.steps + src_col) * win;
    const float xv = p.x[tok * p.x_stride + c];
    float acc = p.bias != nullptr ? p.bias[c] : 0.0f;
    for (int64_t j = 0; j < W; ++j) acc += p.weight[c * K + j] * src[c * W + j];
    acc += p.weight[c * K + W] * xv;
    p.out[tok * p.out_stride + c] = p.silu ? silu_d(acc) : acc;
    if (W == 0) continue;
    float* dst = p.step_windows + (b * p.steps + f + t) * win + c * W;
    for (int64_t j = 0; j + 1 < W; ++j) dst[j] = src[c * W + j + 1];
    dst[W - 1] = xv;
  }
}

// Block = (value head h, row b); thread = one value row e of the state (loops over K). The
// normalised q and k of the token are staged in shared memory.
__global__ void gdn_update_multi_kernel(const gdn_state_update_multi_params p, float scale) {
  extern __shared__ float sh[];  // q [K] | k [K] | norms [2]
  const int64_t h = blockIdx.x, b = blockIdx.y;
  const int64_t slot = p.state_indices[b];
  if (slot < 0) return;
  const int64_t K = p.k_dim, V = p.v_dim, T = p.tokens_per_row;
  const int64_t head_elems = V * K, state_elems = p.heads_v * head_elems;
  const int64_t hk = h / (p.heads_v / p.heads_k);
  const int64_t f = p.first_step != nullptr ? p.first_step[b] : 0;
  float* q = sh;
  float* k = sh + K;
  float* norms = sh + 2 * K;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t tok = b * T + t;
    if (threadIdx.x == 0) {
      double sq = 0.0, sk = 0.0;
      for (int64_t x = 0; x < K; ++x) {
        const double qv = p.q[tok * p.q_stride + hk * K + x], kv = p.k[tok * p.k_stride + hk * K + x];
        sq += qv * qv;
        sk += kv * kv;
      }
      norms[0] = p.qk_l2norm ? static_cast<float>(static_cast<double>(scale) / sqrt(sq + 1e-6)) : scale;
      norms[1] = p.qk_l2norm ? static_cast<float>(1.0 / sqrt(sk + 1e-6)) : 1.0f;
    }
    __syncthreads();
    for (int64_t x = threadIdx.x; x < K; x += blockDim.x) {
      q[x] = p.q[tok * p.q_stride + hk * K + x] * norms[0];
      k[x] = p.k[tok * p.k_stride + hk * K + x] * norms[1];
    }
    __syncthreads();
    const int64_t src_col = start_column(p.retrieve_parent, p.first_step, b, t, T);
    const float* src = src_col < 0 ? p.states + slot * state_elems + h * head_elems
                                   : p.step_states + (b * p.steps + src_col) * state_elems + h * head_elems;
    float* S = p.step_states + (b * p.steps + f + t) * state_elems + h * head_elems;
    const float bias = p.dt_bias != nullptr ? p.dt_bias[h] : 0.0f;
    const float decay = expf(-expf(p.A_log[h]) * softplus(p.a[tok * p.a_stride + h] + bias));
    const float beta = sigmoid_d(p.b[tok * p.b_stride + h]);
    for (int64_t e = threadIdx.x; e < V; e += blockDim.x) {
      float pred = 0.0f;
      for (int64_t x = 0; x < K; ++x) {
        const float s = src[e * K + x] * decay;
        S[e * K + x] = s;
        pred += s * k[x];
      }
      const float delta = beta * (p.v[tok * p.v_stride + h * V + e] - pred);
      float out = 0.0f;
      for (int64_t x = 0; x < K; ++x) {
        const float s = S[e * K + x] + delta * k[x];
        S[e * K + x] = s;
        out += s * q[x];
      }
      p.out[tok * p.out_stride + h * V + e] = out;
    }
    __syncthreads();
  }
}

constexpr int kTreeMaxHeadDim = 256;

// One warp per (query node, head): keys in order with an online softmax; lanes split head_dim.
// The calls the decode kernels do not serve (attention_tree.h: other GQA groups or head sizes).
// KV: element type of the cache (float or bf16), widened to f32.
template <class KV>
__global__ void tree_attention_kernel(const paged_attention_tree_params p) {
  const int64_t t = blockIdx.x;  // packed query index relative to query_start_loc[0]
  const int64_t h = blockIdx.y;
  const int lane = threadIdx.x;
  const int64_t Dn = p.tree_nodes, D = p.head_dim;
  const int64_t b = t / Dn, k = t % Dn;
  const int64_t prefix = p.seq_lens[b] - Dn;
  const int64_t kv_row = p.kv_heads * D, kvh = h / (p.q_heads / p.kv_heads);
  const int32_t* pages = p.page_table + b * p.page_table_stride;
  const int64_t qt = p.query_start_loc[b] + k;
  const float* q = p.q + qt * p.q_stride + h * D;
  constexpr int kPer = kTreeMaxHeadDim / 32;
  float qv[kPer], acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t d = lane + 32 * i;
    qv[i] = d < D ? q[d] : 0.0f;
    acc[i] = 0.0f;
  }
  // Ancestor set of node k as a bitmask over at most 128 nodes.
  uint32_t anc[4] = {0, 0, 0, 0};
  for (int64_t a = k; a >= 0; a = p.retrieve_parent[b * Dn + a]) anc[a / 32] |= 1u << (a % 32);
  float m = -INFINITY, denom = 0.0f;
  for (int64_t s = 0; s <= prefix + k; ++s) {
    if (s >= prefix) {
      const int64_t a = s - prefix;
      if (!(anc[a / 32] & (1u << (a % 32)))) continue;
    }
    const int64_t off = (static_cast<int64_t>(pages[s / p.page_size]) * p.page_size + s % p.page_size) * kv_row + kvh * D;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < D) dot += qv[i] * to_float(static_cast<const KV*>(p.k_cache)[off + d]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float score = dot * p.scale;
    const float m_new = fmaxf(m, score);
    const float corr = expf(m - m_new), w = expf(score - m_new);
    denom = denom * corr + w;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < D) acc[i] = acc[i] * corr + w * to_float(static_cast<const KV*>(p.v_cache)[off + d]);
    }
    m = m_new;
  }
  float* out = p.out + qt * p.out_stride + h * D;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t d = lane + 32 * i;
    if (d < D) out[d] = acc[i] / denom;
  }
}

struct commit_layers {
  void* ssm_states[kMaxCommitLayers];
  const void* ssm_steps[kMaxCommitLayers];
  float* conv_states[kMaxCommitLayers];
  const float* conv_steps[kMaxCommitLayers];
};

// Block = (commit i, layer l of this launch's batch); threads copy the state then the window.
// TS: the state's storage type (float, or bf16 copied as its 16-bit pattern).
template <class TS>
__global__ void commit_kernel(const commit_layers L, const int32_t* slots, const int32_t* rows,
                              const int32_t* steps_taken, int64_t steps, int64_t state_elems, int64_t conv_elems) {
  const int64_t i = blockIdx.x, l = blockIdx.y;
  const int64_t slot = slots[i];
  if (slot < 0) return;
  const int64_t col = static_cast<int64_t>(rows[i]) * steps + steps_taken[i];
  const TS* s_src = static_cast<const TS*>(L.ssm_steps[l]) + col * state_elems;
  TS* s_dst = static_cast<TS*>(L.ssm_states[l]) + slot * state_elems;
  for (int64_t e = threadIdx.x; e < state_elems; e += blockDim.x) s_dst[e] = s_src[e];
  if (L.conv_states[l] == nullptr) return;
  const float* c_src = L.conv_steps[l] + col * conv_elems;
  float* c_dst = L.conv_states[l] + slot * conv_elems;
  for (int64_t e = threadIdx.x; e < conv_elems; e += blockDim.x) c_dst[e] = c_src[e];
}

}  // namespace
}  // namespace cuda_detail

using namespace cuda_detail;

void run_cuda(const selective_state_update_multi_params& p, void* stream) {
  constexpr const char* op = "selective_state_update_multi";
  cpu_detail::check_ssm_update_multi_fields(p, op);  // shared with the CPU op (cpu/ssm_validate.h)
  if (p.d_state > 32 * kMultiMaxPer) fail(op, "d_state", p.d_state, "must be in [1, 256]");
  const dim3 grid(static_cast<unsigned>(ceil_div(p.head_dim, int64_t{kMultiWarps})), static_cast<unsigned>(p.heads),
                  static_cast<unsigned>(p.batch));
  // Elements per lane: 4 up to d_state 128 (half the registers, more warps resident), else 8.
  dispatch_ssm_types(p, [&](auto io, auto st) {
    using TI = typename decltype(io)::type;
    using TS = typename decltype(st)::type;
    if (p.d_state <= 32 * 4) ssm_update_multi_kernel<TI, TS, 4><<<grid, 32 * kMultiWarps, 0, as_stream(stream)>>>(p);
    else ssm_update_multi_kernel<TI, TS, kMultiMaxPer><<<grid, 32 * kMultiWarps, 0, as_stream(stream)>>>(p);
  });
  HYSERVE_CUDA_CHECK_LAUNCH();
}

void run_cuda(const conv1d_update_multi_params& p, void* stream) {
  constexpr const char* op = "causal_conv1d_update_multi";
  cpu_detail::check_conv1d_update_multi_fields(p, op);  // shared with the CPU op (cpu/conv_validate.h)
  const dim3 grid(static_cast<unsigned>(ceil_div(p.dim, kThreads)), static_cast<unsigned>(p.batch));
  conv_update_multi_kernel<<<grid, kThreads, 0, as_stream(stream)>>>(p);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

void run_cuda(const gdn_state_update_multi_params& p, void* stream) {
  constexpr const char* op = "gdn_state_update_multi";
  cpu_detail::check_gdn_update_multi_fields(p, op);  // shared with the CPU op (cpu/gdn_validate.h)
  const float scale = p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(static_cast<float>(p.k_dim));
  const dim3 grid(static_cast<unsigned>(p.heads_v), static_cast<unsigned>(p.batch));
  const size_t shared = static_cast<size_t>(2 * p.k_dim + 2) * sizeof(float);
  gdn_update_multi_kernel<<<grid, kThreads, shared, as_stream(stream)>>>(p, scale);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

void run_cuda(const state_commit_params& p, void* stream) {
  constexpr const char* op = "state_commit";
  if (!cpu_detail::check_state_commit(p, op)) return;  // shared with the CPU op (cpu/ssm_validate.h)
  const bool conv = p.conv_states != nullptr && p.conv_elems > 0;
  // One launch covers every layer unless there are more than kMaxCommitLayers of them.
  for (int64_t l0 = 0; l0 < p.n_layers; l0 += kMaxCommitLayers) {
    const int64_t n = std::min<int64_t>(kMaxCommitLayers, p.n_layers - l0);
    commit_layers L{};
    for (int64_t l = 0; l < n; ++l) {
      L.ssm_states[l] = p.ssm_states[l0 + l];
      L.ssm_steps[l] = p.ssm_steps[l0 + l];
      L.conv_states[l] = conv ? p.conv_states[l0 + l] : nullptr;
      L.conv_steps[l] = conv ? p.conv_steps[l0 + l] : nullptr;
    }
    const dim3 grid(static_cast<unsigned>(p.n_commits), static_cast<unsigned>(n));
    cpu_detail::dispatch_storage(p.state_dtype, op, "state_dtype", [&](auto tag) {
      using TS = typename cpu_detail::host_storage<decltype(tag)::value>::type;  // bits are copied
      commit_kernel<TS><<<grid, 256, 0, as_stream(stream)>>>(L, p.slots, p.rows, p.steps_taken, p.steps,
                                                             p.state_elems, p.conv_elems);
    });
    HYSERVE_CUDA_CHECK_LAUNCH();
  }
}

void run_cuda(const paged_attention_tree_params& p, void* stream) {
  constexpr const char* op = "paged_attention_tree";
  cpu_detail::check_paged_attention_tree(p, op);
  if (p.tree_nodes > 128) fail(op, "tree_nodes", p.tree_nodes, "must be <= 128");
  if (p.head_dim < 1 || p.head_dim > kTreeMaxHeadDim) fail(op, "head_dim", p.head_dim, "must be in [1, 256]");
  // The split-KV decode kernels where they apply: each node computed as the decode step at its
  // position computes it (attention_tree.h).
  if (tree_on_decode_kernels(p)) {
    require_aligned16(p.k_cache, op, "k_cache");
    require_aligned16(p.v_cache, op, "v_cache");
    launch_tree_on_decode_kernels(p, as_stream(stream));
    return;
  }
  const dim3 grid(static_cast<unsigned>(p.batch * p.tree_nodes), static_cast<unsigned>(p.q_heads));
  cpu_detail::dispatch_storage(p.kv_dtype, op, "kv_dtype", [&](auto tag) {
    using KV = std::conditional_t<decltype(tag)::value == dtype::kBF16, __nv_bfloat16, float>;
    tree_attention_kernel<KV><<<grid, 32, 0, as_stream(stream)>>>(p);
  });
  HYSERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::kernels
