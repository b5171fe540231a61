// SSD chunk scan (varlen prefill).
//
// Implementations, chosen by (head_dim, d_state) and the io type in run_cuda:
//   ssd_chunked_table pairs → chunked SSD on the tensor cores: f32 io in ssd_scan_chunked.cuh
//                             (3xTF32, one (chunk, head) per work item, state passed through the
//                             slot or an f32 carry); bf16 io one of three paths:
//       parallel             ssd_scan_chained.cuh: one kernel over (128-token chunk, head)
//                            items claimed by ticket in chunk order; local chunk state and
//                            intra-chunk outputs in parallel, only the state hand-off from one
//                            chunk to the next is chained (f32, through a small workspace);
//                            persistent blocks stage the next item while finishing one;
//       parallel_single      the same kernel with one block per item (no staging ahead);
//       parallel_fast        parallel with the kOptFloatW and kOptOneFence variants (f32
//                            weights with one ex2 each; one release per warp hand-off);
//       parallel_pair/_quad  parallel_fast claiming 2 / 4 heads of one chunk and group per
//                            ticket, B and C staged once for them (kOptPair, kOptQuad);
//       parallel_y, _quad_y  parallel_fast / parallel_quad storing y through shared memory as
//                            16-byte vectors, whole 128-byte rows (kOptStoreY); parallel_oct_y:
//                            parallel_quad_y claiming 8 heads (kOptOct);
//       sequential           ssd_scan_bf16.cuh: one block per (row, head, state slice) walking
//                            the row's chunks in order, state kept in registers.
//     (A three-kernel path — chunk states, a state pass over each row's chunks, outputs — lost
//     every measurement to the chained kernel, bench/results runs 5 and 7, and was removed.)
//   ssd_seq_* pairs, bf16 io → the sequential kernel above for every path (wider heads and
//                             states: Falcon-H1's head_dim 128, d_state 256);
//   f32 io with bf16_operands (a bf16 model's scan), the ssd_seq_* pairs but 64 × 128 (there too
//                             with kernels.ssd_seq_bf16) → the same kernel, x, B and C rounded
//                             to bf16 as loaded, y stored in f32;
//   anything else          → the kernel below: CUDA cores, one block per (head, sequence).
// The bf16-io path is the op's kernels.ssd_scan (exec_context::paths):
// parallel|parallel_single|parallel_fast|parallel_pair|parallel_quad|parallel_y|
// parallel_quad_y|parallel_oct_y|sequential
// (default: parallel_quad_y, the fastest at every measured shape: 16384 tokens
// 0.95 ms against 1.36 (parallel) and 1.86 (sequential), 256 rows x 256 tokens 4.30 against 5.74
// and 7.90 ms, bench/results run 7);
// ssd_scan_paths.h selects it per call (tests, benchmarks).
// The default (not an explicit choice) takes the sequential path for batches of more than
// kParallelMaxBatch rows: the chunk-parallel paths reserve workspace per row (parallel: two f32
// carries per row, 4 MiB each at the production shape), while
// the sequential kernel already has batch × heads × 2 blocks. Under determinism:
// batch_invariant the default path is kept for every batch (its per-row workspace grows with it).
// The parallel_single path reserves chunks for kernels.ssd_max_tokens tokens (default
// 16384; the token count is device data) plus one per row; a batch needing more chunks is
// computed by the general kernel below instead (decided on the device: no host synchronisation,
// graph-capturable). The parallel path's workspace is per row: it takes any token count.
// All compute the CPU op's formulation with a double cumsum; none depends on chunk_size
// (validated only: the chunk length is each kernel's own).
//
// Fallback kernel. One block per (head, sequence) walks the sequence in chunks
// of Q tokens, carrying the state S [head_dim, d_state] in shared memory. Per chunk, with
// cum_i = Σ_{s<=i} dt_s·A inside the chunk (double, as the CPU op):
//   W[i][j] = (C_i·B_j) · exp(cum_i − cum_j) · dt_j            for j <= i, else 0
//   y_i     = exp(cum_i) · S·C_i + Σ_j W[i][j] · x_j + D · x_i
//   S      ← exp(cum_last) · S + Σ_j (exp(cum_last − cum_j) · dt_j · x_j) ⊗ B_j
// which is the CPU op's formulation; the result does not depend on the chunk length (the
// kernel picks Q from the shared memory it needs, chunk_size is validated only).
//
// Shared-memory tiles are padded by 4 floats per row so that the float4 reads of the three
// inner loops are free of bank conflicts: W lanes vary i (C rows), y lanes vary p (S rows),
// the S update lanes vary the d_state column. Each thread computes 4 outputs per loop to reuse
// its loads.
#include <algorithm>
#include <string>
#include <type_traits>

#include "dispatch.h"
#include "hyserve/kernels/paths.h"

#include "ssd_scan_bf16.cuh"
#include "ssd_scan_chained.cuh"
#include "ssd_scan_chunked.cuh"
#include "ssd_scan_paths.h"
#include "ssm_common.cuh"

namespace hyserve::kernels {
namespace cuda_detail {
namespace {

constexpr int kScanThreads = 256;
constexpr int kTile = 4;  // outputs per thread in the y and S loops

struct scan_layout {
  int q = 0;  // chunk length
  int P = 0, N = 0;
  int ld = 0;    // row stride of S, B and C tiles: N + 4
  int ldw = 0;   // row stride of W: q + 1
  size_t bytes = 0;

  scan_layout(int q_, int P_, int N_) : q(q_), P(P_), N(N_), ld(N_ + 4), ldw(q_ + 1) {
    const size_t floats = static_cast<size_t>(P + 2 * q) * ld + static_cast<size_t>(q) * P +
                          static_cast<size_t>(q) * ldw + 3 * static_cast<size_t>(q);
    bytes = sizeof(double) * q + sizeof(float) * floats;
  }
};

__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

template <class T, class TS>
__global__ void __launch_bounds__(kScanThreads) ssd_scan_kernel(const ssd_chunk_scan_params p, int q,
                                                                const int* gate) {
  if (gate != nullptr && gate[1] == 0) return;  // parallel path's overflow flag: not raised
  const int64_t h = blockIdx.x;
  const int64_t b = blockIdx.y;
  const int64_t slot = p.state_indices[b];
  if (slot < 0) return;  // padding row: output rows and state untouched
  const int P = static_cast<int>(p.head_dim);
  const int N = static_cast<int>(p.d_state);
  const int N4 = N / 4;
  const int ld = N + 4, ld4 = ld / 4, ldw = q + 1;
  const int64_t g = h / (p.heads / p.n_groups);
  const int64_t start = p.query_start_loc[b];
  const int64_t len = p.query_start_loc[b + 1] - start;
  const bool init = p.has_initial_state != nullptr && p.has_initial_state[b] != 0;
  const double A = -exp(static_cast<double>(p.A_log[h]));
  const float d_skip = p.D != nullptr ? p.D[h] : 0.0f;
  const int tid = threadIdx.x;

  extern __shared__ double smem[];
  double* cum = smem;                                  // [q]
  float* S = reinterpret_cast<float*>(cum + q);        // [P][ld]
  float* Bs = S + static_cast<size_t>(P) * ld;         // [q][ld]
  float* Cs = Bs + static_cast<size_t>(q) * ld;        // [q][ld]
  float* Xs = Cs + static_cast<size_t>(q) * ld;        // [q][P]
  float* Wm = Xs + static_cast<size_t>(q) * P;         // [q][ldw]
  float* dtv = Wm + static_cast<size_t>(q) * ldw;      // [q] step sizes
  float* coef = dtv + q;                               // [q] exp(cum_last − cum_j)·dt_j
  float* decay = coef + q;                             // [q] exp(cum_i)
  const float4* S4 = reinterpret_cast<const float4*>(S);
  const float4* B4 = reinterpret_cast<const float4*>(Bs);
  const float4* C4 = reinterpret_cast<const float4*>(Cs);

  TS* state = static_cast<TS*>(p.ssm_states) + (slot * p.heads + h) * static_cast<int64_t>(P) * N;
  for (int e = tid; e < P * N; e += kScanThreads) S[(e / N) * ld + e % N] = init ? to_float(state[e]) : 0.0f;

  const T* xg = reinterpret_cast<const T*>(p.x) + h * P;
  const T* dtg = reinterpret_cast<const T*>(p.dt) + h;
  const T* Bg = reinterpret_cast<const T*>(p.B) + g * N;
  const T* Cg = reinterpret_cast<const T*>(p.C) + g * N;
  T* yg = reinterpret_cast<T*>(p.y) + h * P;

  for (int64_t c0 = 0; c0 < len; c0 += q) {
    const int L = static_cast<int>(min(static_cast<int64_t>(q), len - c0));
    const int64_t t0 = start + c0;
    const bool carry = init || c0 > 0;  // false: S is zero

    // Stage the chunk. The barrier at the end of the previous chunk freed these tiles.
    for (int e = tid; e < L * N; e += kScanThreads) {
      const int j = e / N, n = e % N;
      Bs[j * ld + n] = to_float(Bg[(t0 + j) * p.bc_stride + n]);
      Cs[j * ld + n] = to_float(Cg[(t0 + j) * p.bc_stride + n]);
    }
    for (int e = tid; e < L * P; e += kScanThreads) {
      const int j = e / P, pp = e % P;
      Xs[j * P + pp] = to_float(xg[(t0 + j) * p.x_stride + pp]);
    }
    for (int i = tid; i < L; i += kScanThreads) dtv[i] = step_size(p, to_float(dtg[(t0 + i) * p.dt_stride]), h);
    __syncthreads();
    if (tid == 0) {
      double run = 0.0;
      for (int i = 0; i < L; ++i) {
        run += static_cast<double>(dtv[i]) * A;
        cum[i] = run;
      }
    }
    __syncthreads();
    for (int i = tid; i < L; i += kScanThreads) {
      decay[i] = static_cast<float>(exp(cum[i]));
      coef[i] = static_cast<float>(exp(cum[L - 1] - cum[i])) * dtv[i];
    }
    // W: lanes vary i (padded C rows), B_j is a broadcast.
    for (int e = tid; e < L * L; e += kScanThreads) {
      const int i = e % L, j = e / L;
      float w = 0.0f;
      if (j <= i) {
        float acc = 0.0f;
        for (int n4 = 0; n4 < N4; ++n4) acc += dot4(C4[i * ld4 + n4], B4[j * ld4 + n4]);
        w = acc * expf(static_cast<float>(cum[i] - cum[j])) * dtv[j];
      }
      Wm[i * ldw + j] = w;
    }
    __syncthreads();

    // y: thread item = (kTile consecutive rows i, one column p); lanes vary p.
    const int i_tiles = (L + kTile - 1) / kTile;
    for (int e = tid; e < i_tiles * P; e += kScanThreads) {
      const int pp = e % P;
      const int i0 = (e / P) * kTile;
      float acc[kTile];
#pragma unroll
      for (int k = 0; k < kTile; ++k) acc[k] = 0.0f;
      if (carry) {
        float sc[kTile] = {};
        for (int n4 = 0; n4 < N4; ++n4) {
          const float4 s = S4[pp * ld4 + n4];
#pragma unroll
          for (int k = 0; k < kTile; ++k) sc[k] += dot4(s, C4[min(i0 + k, L - 1) * ld4 + n4]);
        }
#pragma unroll
        for (int k = 0; k < kTile; ++k) acc[k] = decay[min(i0 + k, L - 1)] * sc[k];
      }
      const int j_end = min(L, i0 + kTile);  // W[i][j] = 0 for j > i
      for (int j = 0; j < j_end; ++j) {
        const float xj = Xs[j * P + pp];
#pragma unroll
        for (int k = 0; k < kTile; ++k) acc[k] += Wm[min(i0 + k, L - 1) * ldw + j] * xj;
      }
#pragma unroll
      for (int k = 0; k < kTile; ++k) {
        const int i = i0 + k;
        if (i < L) yg[(t0 + i) * p.y_stride + pp] = from_float<T>(acc[k] + d_skip * Xs[i * P + pp]);
      }
    }
    __syncthreads();  // every read of S precedes its update

    // S update: thread item = (kTile consecutive rows p, one float4 column); lanes vary the column.
    const float total = static_cast<float>(exp(cum[L - 1]));
    const int p_tiles = (P + kTile - 1) / kTile;
    for (int e = tid; e < p_tiles * N4; e += kScanThreads) {
      const int n4 = e % N4;
      const int p0 = (e / N4) * kTile;
      float4 s[kTile];
#pragma unroll
      for (int k = 0; k < kTile; ++k) {
        s[k] = S4[min(p0 + k, P - 1) * ld4 + n4];
        if (carry) {
          s[k].x *= total;
          s[k].y *= total;
          s[k].z *= total;
          s[k].w *= total;
        }
      }
      for (int j = 0; j < L; ++j) {
        const float4 bj = B4[j * ld4 + n4];
        const float cj = coef[j];
#pragma unroll
        for (int k = 0; k < kTile; ++k) {
          const float xk = cj * Xs[j * P + min(p0 + k, P - 1)];
          s[k].x += xk * bj.x;
          s[k].y += xk * bj.y;
          s[k].z += xk * bj.z;
          s[k].w += xk * bj.w;
        }
      }
#pragma unroll
      for (int k = 0; k < kTile; ++k)
        if (p0 + k < P) reinterpret_cast<float4*>(S)[(p0 + k) * ld4 + n4] = s[k];
    }
    __syncthreads();  // S complete and the chunk tiles free before the next chunk
  }

  for (int e = tid; e < P * N; e += kScanThreads) state[e] = from_float<TS>(S[(e / N) * ld + e % N]);
}

// Longest chunk (of 32, 16, 8) whose tiles fit the opt-in shared memory; 0 if none does.
scan_layout pick_layout(int P, int N) {
  const auto limit = static_cast<size_t>(max_shared_per_block_optin());
  for (int q : {32, 16, 8}) {
    scan_layout l(q, P, N);
    if (l.bytes <= limit) return l;
  }
  return scan_layout(0, P, N);
}

template <class T, class TS>
void launch_ssd_scan(const ssd_chunk_scan_params& p, const scan_layout& l, cudaStream_t stream,
                     const int* gate = nullptr) {
  reserve_dynamic_shared(reinterpret_cast<const void*>(&ssd_scan_kernel<T, TS>), l.bytes);
  const dim3 grid(static_cast<unsigned>(p.heads), static_cast<unsigned>(p.batch));
  ssd_scan_kernel<T, TS><<<grid, kScanThreads, l.bytes, stream>>>(p, l.q, gate);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

// (head_dim, d_state) pairs of the tensor-core kernel: head_dim is 16 × its 4 warps, d_state
// any multiple of 8 whose tiles fit two blocks per SM. Adding a d_state is one entry here.
using ssd_chunked_head_dim_table = int_table<64>;
using ssd_chunked_state_dim_table = int_table<128>;

bool chunked_supports(const ssd_chunk_scan_params& p) {
  return ssd_chunked_head_dim_table::supports(p.head_dim) && ssd_chunked_state_dim_table::supports(p.d_state) &&
         p.batch < (int64_t{1} << 30) && p.heads < (int64_t{1} << 20);
}

// (head_dim, d_state) of the bf16-io sequential kernel (ssd_scan_bf16.cuh): the pairs above and,
// for the shapes no other tensor-core path takes (Falcon-H1: head_dim 128, d_state 256), the
// rest of these tables; above 128 state columns it loads B and C a chunk at a time.
using ssd_seq_head_dim_table = int_table<64, 128>;
using ssd_seq_state_dim_table = int_table<128, 256>;

bool seq_supports(const ssd_chunk_scan_params& p) {
  return ssd_seq_head_dim_table::supports(p.head_dim) && ssd_seq_state_dim_table::supports(p.d_state) &&
         p.batch < (int64_t{1} << 30) && p.heads < (int64_t{1} << 20);
}

// f32 io: the 3xTF32 kernel (fp32 accuracy), chunks claimed by ticket, state chained between
// chunks through the slot (f32 states) or an f32 carry in the workspace (bf16 states).
// The sequential kernel (bf16 io, or TI = float rounded to bf16 as loaded): one block per (row,
// head, slice of 32 state rows) walking the row's chunks; with kernels.ssd_seq_slice: 16, a
// bf16 model's scan (TI float) at head_dim 128 in slices of 16 (Falcon-H1-7B: 192 blocks for
// one prompt instead of 96, each with less of the chunk's work, the C·Bᵀ products repeated).
template <class TI, class TS>
void launch_ssd_bf16_seq(const ssd_chunk_scan_params& p, cudaStream_t stream) {
  dispatch(ssd_seq_head_dim_table{}, p.head_dim, "ssd_chunk_scan", "head_dim", [&](auto hd) {
    dispatch(ssd_seq_state_dim_table{}, p.d_state, "ssd_chunk_scan", "d_state", [&](auto ds) {
      constexpr int P = decltype(hd)::value, N = decltype(ds)::value;
      const auto launch = [&](auto slice) {
        constexpr int PS = decltype(slice)::value;
        const auto kernel = &ssd_bf16::ssd_bf16_seq_kernel<TI, TS, P, N, PS>;
        constexpr size_t smem = ssd_bf16::seq_tiles<P, N, PS>::kBytes;
        reserve_dynamic_shared(reinterpret_cast<const void*>(kernel), smem);
        const bool vec = vector_ok({p.x, p.B, p.C, p.y}, {p.x_stride, p.bc_stride, p.y_stride}, 8);
        const dim3 grid(static_cast<unsigned>(p.heads * (P / PS)), static_cast<unsigned>(p.batch));
        kernel<<<grid, ssd_bf16::kThreads, smem, stream>>>(p, vec);
        HYSERVE_CUDA_CHECK_LAUNCH();
      };
      if constexpr (P == 128 && std::is_same_v<TI, float>) {
        if (current_paths().ssd_seq_slice == 16) return launch(std::integral_constant<int, 16>{});
      }
      launch(std::integral_constant<int, 32>{});
    });
  });
}

// Batches above this many rows take the sequential path by default (ssd_scan.cu's header).
constexpr int64_t kParallelMaxBatch = 64;

int64_t parallel_max_tokens() {
  const int32_t n = current_paths().ssd_max_tokens;
  return n > 0 ? int64_t{n} : int64_t{16384};
}

// bf16 io, one chained kernel: zeroed flags and ticket, plan, the kernel; then the general kernel
// gated on the overflow flag (exits at once unless the batch needed more chunks than reserved).
template <class TS, int kFlags = 0>
void launch_ssd_bf16_chained(const ssd_chunk_scan_params& p, bool persist, cudaStream_t stream) {
  namespace sc = ssd_chain;
  // Claims of 2, 4 or 8 items need that many heads of one group per claim; else smaller claims.
  if constexpr ((kFlags & sc::kOptOct) != 0) {
    if ((p.heads / p.n_groups) % 8 != 0 || p.heads % 8 != 0) {
      return launch_ssd_bf16_chained<TS, (kFlags & ~sc::kOptOct) | sc::kOptQuad>(p, persist, stream);
    }
  } else if constexpr ((kFlags & sc::kOptQuad) != 0) {
    if ((p.heads / p.n_groups) % 4 != 0 || p.heads % 4 != 0) {
      return launch_ssd_bf16_chained<TS, (kFlags & ~sc::kOptQuad) | sc::kOptPair>(p, persist, stream);
    }
  } else if constexpr ((kFlags & sc::kOptPair) != 0) {
    if ((p.heads / p.n_groups) % 2 != 0 || p.heads % 2 != 0) {
      return launch_ssd_bf16_chained<TS, kFlags & ~sc::kOptPair>(p, persist, stream);
    }
  }
  dispatch(ssd_chunked_head_dim_table{}, p.head_dim, "ssd_chunk_scan", "head_dim", [&](auto hd) {
    dispatch(ssd_chunked_state_dim_table{}, p.d_state, "ssd_chunk_scan", "d_state", [&](auto ds) {
      constexpr int P = decltype(hd)::value, N = decltype(ds)::value;
      // Chunks the kernel takes: the workspace does not depend on it (carries and flags are per
      // row), so the persistent grid takes any batch whose items fit an int ticket; one block per
      // item reserves kernels.ssd_max_tokens / Q + batch (its grid size).
      const int64_t max_cap = std::min<int64_t>((int64_t{1} << 31) / 2 / p.heads, int64_t{1} << 30);
      const int64_t cap64 = (kFlags != 0 || persist) ? max_cap : (parallel_max_tokens() + sc::kQ - 1) / sc::kQ + p.batch;
      const int cap = static_cast<int>(std::min(cap64, max_cap));
      // Workspace: info [4], chunk_off [batch + 1], flags [batch, 2, heads, warps] (ints, rounded
      // to 16 bytes), carry [batch, 2, heads, P, N] f32. The ints start at zero.
      const int64_t n_ints = (4 + p.batch + 1 + p.batch * 2 * p.heads * sc::kWarps + 3) / 4 * 4;
      const int64_t n_carry = p.batch * 2 * p.heads * P * N;
      void* raw = nullptr;
      const size_t bytes = sizeof(int) * static_cast<size_t>(n_ints) + sizeof(float) * static_cast<size_t>(n_carry);
      CUDA_CHECK(cudaMallocAsync(&raw, bytes, stream));
      CUDA_CHECK(cudaMemsetAsync(raw, 0, sizeof(int) * static_cast<size_t>(n_ints), stream));
      sc::workspace ws;
      ws.info = static_cast<int*>(raw);
      ws.chunk_off = ws.info + 4;
      ws.flags = ws.chunk_off + p.batch + 1;
      ws.carry = reinterpret_cast<float*>(ws.info + n_ints);
      ws.cap = cap;
      const bool vec = vector_ok({p.x, p.B, p.C, p.y}, {p.x_stride, p.bc_stride, p.y_stride}, 8);
      sc::plan_kernel<<<1, sc::kPlanThreads, 0, stream>>>(p, ws);
      HYSERVE_CUDA_CHECK_LAUNCH();
      constexpr size_t smem = sc::chain_tiles<P, N>::kBytes;
      const int64_t items = static_cast<int64_t>(cap) * p.heads;
      if (kFlags != 0 || persist) {  // the variants are persistent only
        // As many blocks as are resident at once (items are claimed by ticket, so correctness
        // does not depend on this number).
        const auto kernel = &sc::chain_kernel<TS, P, N, true, kFlags>;
        reserve_dynamic_shared(reinterpret_cast<const void*>(kernel), smem);
        static const int per_sm = [&] {
          int v = 0;
          CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, kernel, sc::kThreads, smem));
          return std::max(v, 1);
        }();
        const int64_t blocks = std::min<int64_t>(items, static_cast<int64_t>(sm_count()) * per_sm);
        kernel<<<static_cast<unsigned>(blocks), sc::kThreads, smem, stream>>>(p, ws, vec);
      } else if constexpr (kFlags == 0) {
        const auto kernel = &sc::chain_kernel<TS, P, N, false>;
        reserve_dynamic_shared(reinterpret_cast<const void*>(kernel), smem);
        kernel<<<static_cast<unsigned>(items), sc::kThreads, smem, stream>>>(p, ws, vec);
      }
      HYSERVE_CUDA_CHECK_LAUNCH();
      const scan_layout l = pick_layout(P, N);
      launch_ssd_scan<__nv_bfloat16, TS>(p, l, stream, ws.info);  // overflow fallback
      CUDA_CHECK(cudaFreeAsync(raw, stream));
    });
  });
}

template <class T, class TS>
void launch_ssd_chunked(const ssd_chunk_scan_params& p, cudaStream_t stream) {
  namespace sc = ssd_chunked;
  static_assert(std::is_same_v<T, float>, "bf16 io takes launch_ssd_bf16_seq");
  constexpr bool kChain = !std::is_same_v<TS, float>;
  // Workspace: chunk offsets [batch + 1], flags [batch, heads], ticket [1], and
  // for non-f32 states the f32 carry [batch, heads, head_dim, d_state]. Flags and ticket start
  // at zero (the plan kernel writes the offsets).
  const int64_t n_offsets = p.batch + 1, n_flags = p.batch * p.heads;
  const int64_t n_ints = (n_offsets + n_flags + 1 + 3) / 4 * 4;  // the carry starts 16-byte aligned
  const int64_t n_chain = kChain ? p.batch * p.heads * p.head_dim * p.d_state : 0;
  void* raw = nullptr;
  const size_t bytes = sizeof(int) * static_cast<size_t>(n_ints) + sizeof(float) * static_cast<size_t>(n_chain);
  CUDA_CHECK(cudaMallocAsync(&raw, bytes, stream));
  sc::workspace ws;
  ws.chunk_offsets = static_cast<int*>(raw);
  ws.flags = ws.chunk_offsets + n_offsets;
  ws.ticket = ws.flags + n_flags;
  ws.chain = kChain ? reinterpret_cast<float*>(ws.chunk_offsets + n_ints) : nullptr;
  CUDA_CHECK(cudaMemsetAsync(ws.flags, 0, sizeof(int) * static_cast<size_t>(n_flags + 1), stream));
  sc::plan_kernel<<<1, 1024, 0, stream>>>(p, ws);
  HYSERVE_CUDA_CHECK_LAUNCH();
  dispatch(ssd_chunked_head_dim_table{}, p.head_dim, "ssd_chunk_scan", "head_dim", [&](auto hd) {
    dispatch(ssd_chunked_state_dim_table{}, p.d_state, "ssd_chunk_scan", "d_state", [&](auto ds) {
      constexpr int P = decltype(hd)::value, N = decltype(ds)::value;
      // Persistent grid: as many blocks as are resident at once; items are claimed by ticket,
      // so correctness does not depend on this number.
      const auto kernel = &sc::ssd_chunked_kernel<T, TS, P, N>;
      constexpr size_t smem = sc::tiles<P, N>::kBytes;
      reserve_dynamic_shared(reinterpret_cast<const void*>(kernel), smem);
      int per_sm = 0;
      CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, sc::kThreads, smem));
      const int grid = sm_count() * std::max(per_sm, 1);
      kernel<<<grid, sc::kThreads, smem, stream>>>(p, ws);
      HYSERVE_CUDA_CHECK_LAUNCH();
    });
  });
  CUDA_CHECK(cudaFreeAsync(raw, stream));
}

}  // namespace
}  // namespace cuda_detail

using namespace cuda_detail;

ssd_scan_path ssd_scan_default_path() {
  using k = kernel_paths::ssd_scan_kind;
  switch (current_paths().ssd_scan) {
    case k::kDefault: break;
    case k::kSequential: return ssd_scan_path::sequential;
    case k::kParallel: return ssd_scan_path::parallel;
    case k::kParallelSingle: return ssd_scan_path::parallel_single;
    case k::kParallelFast: return ssd_scan_path::parallel_fast;
    case k::kParallelPair: return ssd_scan_path::parallel_pair;
    case k::kParallelQuad: return ssd_scan_path::parallel_quad;
    case k::kParallelY: return ssd_scan_path::parallel_y;
    case k::kParallelQuadY: return ssd_scan_path::parallel_quad_y;
    case k::kParallelOctY: return ssd_scan_path::parallel_oct_y;
  }
  return ssd_scan_path::parallel_quad_y;  // fastest at every measured shape (bench/results run 7)
}

void run_cuda(const ssd_chunk_scan_params& p, void* stream) { run_cuda(p, ssd_scan_path::automatic, stream); }

void run_cuda(const ssd_chunk_scan_params& p, ssd_scan_path path, void* stream) {
  constexpr const char* op = "ssd_chunk_scan";
  if (path == ssd_scan_path::automatic) {
    path = ssd_scan_default_path();
    // Not under determinism: batch_invariant: the sequential kernel sums in another order, and
    // a row's bits must not depend on how many rows share the call.
    if (p.batch > kParallelMaxBatch && !current_paths().batch_invariant) path = ssd_scan_path::sequential;
  }
  check_ssm_common(p, op);
  require_ptr(p.query_start_loc, op, "query_start_loc");
  require_positive(p.chunk_size, op, "chunk_size");
  const bool general = path == ssd_scan_path::general;
  // A bf16 model's scan (f32 io, bf16_operands) where the 3xTF32 kernel lacks the shape, or
  // everywhere with kernels.ssd_seq_bf16 (at 16384 tokens the bf16-io sequential kernel took
  // 1.86 ms, the 3xTF32 kernel 5.19, runs 3 and 2), and any other bf16-io call the
  // chunk-parallel kernels do not take: the sequential bf16 kernel for every path where it takes
  // the shape (f32 io rounded to bf16 as loaded).
  const bool seq_bf16_operands =
      p.io_dtype == dtype::kF32 && p.bf16_operands && (!chunked_supports(p) || current_paths().ssd_seq_bf16);
  if (!general && seq_supports(p) && (seq_bf16_operands || (p.io_dtype == dtype::kBF16 && !chunked_supports(p)))) {
    dispatch_ssm_types(p, [&](auto io, auto st) {
      launch_ssd_bf16_seq<typename decltype(io)::type, typename decltype(st)::type>(p, as_stream(stream));
    });
    return;
  }
  if (!general && chunked_supports(p)) {
    dispatch_ssm_types(p, [&](auto io, auto st) {
      using TI = typename decltype(io)::type;
      using TS = typename decltype(st)::type;
      if constexpr (std::is_same_v<TI, __nv_bfloat16>) {
        if (path == ssd_scan_path::parallel) launch_ssd_bf16_chained<TS>(p, true, as_stream(stream));
        else if (path == ssd_scan_path::parallel_single) launch_ssd_bf16_chained<TS>(p, false, as_stream(stream));
        else if (path == ssd_scan_path::parallel_fast)
          launch_ssd_bf16_chained<TS, ssd_chain::kOptFloatW | ssd_chain::kOptOneFence>(p, true, as_stream(stream));
        else if (path == ssd_scan_path::parallel_pair)
          launch_ssd_bf16_chained<TS, ssd_chain::kOptFloatW | ssd_chain::kOptOneFence | ssd_chain::kOptPair>(
              p, true, as_stream(stream));
        else if (path == ssd_scan_path::parallel_quad)
          launch_ssd_bf16_chained<TS, ssd_chain::kOptFloatW | ssd_chain::kOptOneFence | ssd_chain::kOptQuad>(
              p, true, as_stream(stream));
        else if (path == ssd_scan_path::parallel_y)
          launch_ssd_bf16_chained<TS, ssd_chain::kOptFloatW | ssd_chain::kOptOneFence | ssd_chain::kOptStoreY>(
              p, true, as_stream(stream));
        else if (path == ssd_scan_path::parallel_quad_y)
          launch_ssd_bf16_chained<TS, ssd_chain::kOptFloatW | ssd_chain::kOptOneFence | ssd_chain::kOptQuad |
                                          ssd_chain::kOptStoreY>(p, true, as_stream(stream));
        else if (path == ssd_scan_path::parallel_oct_y)
          launch_ssd_bf16_chained<TS, ssd_chain::kOptFloatW | ssd_chain::kOptOneFence | ssd_chain::kOptOct |
                                          ssd_chain::kOptStoreY>(p, true, as_stream(stream));
        else launch_ssd_bf16_seq<__nv_bfloat16, TS>(p, as_stream(stream));
      } else launch_ssd_chunked<TI, TS>(p, as_stream(stream));
    });
    return;
  }
  const scan_layout l = pick_layout(static_cast<int>(p.head_dim), static_cast<int>(p.d_state));
  if (l.q == 0) {
    fail(op, "d_state", p.d_state,
         ("with head_dim " + std::to_string(p.head_dim) + " the state does not fit the CUDA kernel's shared memory")
             .c_str());
  }
  dispatch_ssm_types(p, [&](auto io, auto st) {
    launch_ssd_scan<typename decltype(io)::type, typename decltype(st)::type>(p, l, as_stream(stream));
  });
}

#ifdef HYSERVE_SSD_ABLATION
// Benchmark-only entry (see ssd_scan_paths.h): the persistent chained kernel with variant and
// ablation flags; bf16 io, P = 64, N = 128.
void run_cuda_ssd_chain_flags(const ssd_chunk_scan_params& p, int flags, void* stream) {
  namespace sc = ssd_chain;
  dispatch_ssm_types(p, [&](auto io, auto st) {
    using TI = typename decltype(io)::type;
    using TS = typename decltype(st)::type;
    if constexpr (std::is_same_v<TI, __nv_bfloat16>) {
      const cudaStream_t s = as_stream(stream);
      constexpr int F = sc::kOptFloatW | sc::kOptOneFence;
      switch (flags) {
        case 0: launch_ssd_bf16_chained<TS, 0>(p, true, s); break;
        case sc::kOptFloatW: launch_ssd_bf16_chained<TS, sc::kOptFloatW>(p, true, s); break;
        case sc::kOptOneFence: launch_ssd_bf16_chained<TS, sc::kOptOneFence>(p, true, s); break;
        case F: launch_ssd_bf16_chained<TS, F>(p, true, s); break;
        case F | sc::kOptPair: launch_ssd_bf16_chained<TS, F | sc::kOptPair>(p, true, s); break;
        case F | sc::kOptQuad: launch_ssd_bf16_chained<TS, F | sc::kOptQuad>(p, true, s); break;
        case F | sc::kOptStoreY: launch_ssd_bf16_chained<TS, F | sc::kOptStoreY>(p, true, s); break;
        case F | sc::kOptPair | sc::kOptStoreY:
          launch_ssd_bf16_chained<TS, F | sc::kOptPair | sc::kOptStoreY>(p, true, s);
          break;
        case F | sc::kOptQuad | sc::kOptStoreY:
          launch_ssd_bf16_chained<TS, F | sc::kOptQuad | sc::kOptStoreY>(p, true, s);
          break;
        case F | sc::kOptOct | sc::kOptStoreY:
          launch_ssd_bf16_chained<TS, F | sc::kOptOct | sc::kOptStoreY>(p, true, s);
          break;
        case F | sc::kOptQuad | sc::kOptStoreY | sc::kOptPrefetchBC:
          launch_ssd_bf16_chained<TS, F | sc::kOptQuad | sc::kOptStoreY | sc::kOptPrefetchBC>(p, true, s);
          break;
        case F | sc::kOptOct | sc::kOptStoreY | sc::kOptPrefetchBC:
          launch_ssd_bf16_chained<TS, F | sc::kOptOct | sc::kOptStoreY | sc::kOptPrefetchBC>(p, true, s);
          break;
        case F | sc::kOptQuad | sc::kOptStoreY | sc::kOptEarlyInter:
          launch_ssd_bf16_chained<TS, F | sc::kOptQuad | sc::kOptStoreY | sc::kOptEarlyInter>(p, true, s);
          break;
        case F | sc::kOptOct | sc::kOptStoreY | sc::kOptEarlyInter:
          launch_ssd_bf16_chained<TS, F | sc::kOptOct | sc::kOptStoreY | sc::kOptEarlyInter>(p, true, s);
          break;
        case F | sc::kOptQuad | sc::kOptStoreY | sc::kOptOneJb:
          launch_ssd_bf16_chained<TS, F | sc::kOptQuad | sc::kOptStoreY | sc::kOptOneJb>(p, true, s);
          break;
        case F | sc::kOptOct | sc::kOptStoreY | sc::kOptOneJb:
          launch_ssd_bf16_chained<TS, F | sc::kOptOct | sc::kOptStoreY | sc::kOptOneJb>(p, true, s);
          break;
        // Stages left out of the quad claims with y through shared memory (the y stores leave out
        // only the global stores there: the staged tile keeps the products alive).
        case F | sc::kOptQuad | sc::kOptStoreY | sc::kAblNoChain:
          launch_ssd_bf16_chained<TS, F | sc::kOptQuad | sc::kOptStoreY | sc::kAblNoChain>(p, true, s);
          break;
        case F | sc::kOptQuad | sc::kOptStoreY | sc::kAblNoInter:
          launch_ssd_bf16_chained<TS, F | sc::kOptQuad | sc::kOptStoreY | sc::kAblNoInter>(p, true, s);
          break;
        case F | sc::kOptQuad | sc::kOptStoreY | sc::kAblNoLoad:
          launch_ssd_bf16_chained<TS, F | sc::kOptQuad | sc::kOptStoreY | sc::kAblNoLoad>(p, true, s);
          break;
        case F | sc::kOptQuad | sc::kOptStoreY | sc::kAblNoStore:
          launch_ssd_bf16_chained<TS, F | sc::kOptQuad | sc::kOptStoreY | sc::kAblNoStore>(p, true, s);
          break;
        case F | sc::kOptQuad | sc::kAblNoChain:
          launch_ssd_bf16_chained<TS, F | sc::kOptQuad | sc::kAblNoChain>(p, true, s);
          break;
        case F | sc::kAblNoChain: launch_ssd_bf16_chained<TS, F | sc::kAblNoChain>(p, true, s); break;
        case F | sc::kAblNoIntra: launch_ssd_bf16_chained<TS, F | sc::kAblNoIntra>(p, true, s); break;
        case F | sc::kAblNoInter: launch_ssd_bf16_chained<TS, F | sc::kAblNoInter>(p, true, s); break;
        case F | sc::kAblNoSloc: launch_ssd_bf16_chained<TS, F | sc::kAblNoSloc>(p, true, s); break;
        case F | sc::kAblNoLoad: launch_ssd_bf16_chained<TS, F | sc::kAblNoLoad>(p, true, s); break;
        case F | sc::kAblNoStore: launch_ssd_bf16_chained<TS, F | sc::kAblNoStore>(p, true, s); break;
        case F | sc::kAblNoChain | sc::kAblNoLoad | sc::kAblNoStore:
          launch_ssd_bf16_chained<TS, F | sc::kAblNoChain | sc::kAblNoLoad | sc::kAblNoStore>(p, true, s);
          break;
        default: fail("ssd_chunk_scan", "flags", flags, "not an instantiated variant");
      }
    }
  });
}
#endif

}  // namespace hyserve::kernels
