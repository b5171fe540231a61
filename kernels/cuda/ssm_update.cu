// Selective state update (decode): the memory-bound hot path. Each state element is read once
// and written once, as 16-byte streaming accesses coalesced across a warp. State f32 or bf16
// (compute f32, stored rounded to nearest even), io f32 or bf16.
//
// Block = (head h, row b, slice z of the head_dim rows), 128 threads. A state row (d_state
// elements) is covered by L = min(32, N/kPack) lanes (kPack = 4 floats or 8 bf16 per 16 bytes),
// each holding N/(kPack·L) packs; a warp thus
// updates 32/L rows at once and reduces y over its L-lane segment with xor shuffles. Each thread
// keeps its B and C columns in registers and issues kUnroll rows' loads before the first use,
// so several 16-byte loads per thread are in flight: kUnroll = 4 (a block moves 8 KiB per step:
// 16 rows of 512 bytes for f32 states, 32 rows of 256 bytes for bf16). For f32 states
// kernels.ssm_update_unroll: 8 takes 8 rows per thread instead (16 KiB per step, more registers,
// fewer resident blocks); the default stays 4 until the device timings compare them.
// The first pass's state rows are loaded before the programmatic-launch wait (ssm.h), so the
// state read overlaps the previous kernel.
#include <algorithm>

#include "dispatch.h"
#include "hyserve/kernels/paths.h"
#include "launch.cuh"
#include "ssm_common.cuh"

namespace hyserve::kernels {
namespace cuda_detail {
namespace {

constexpr int kUpdateThreads = 128;
constexpr int kUpdateWarps = kUpdateThreads / 32;

// TI: element type of x, dt, B, C, y; TS: of the state. A 16-byte state pack holds kPack
// elements (4 floats or 8 bf16); a state row is covered by L = min(32, N / kPack) lanes.
template <class TI, class TS, int N, int kU>
__global__ void __launch_bounds__(kUpdateThreads) ssm_update_kernel(const selective_state_update_params p,
                                                                     int rows_per_slice) {
  using pk = pack_traits<TS>;
  constexpr int kPack = pk::kN;
  constexpr int L = N / kPack < 32 ? N / kPack : 32;  // lanes per state row
  constexpr int kCols = N / (kPack * L);               // packs per lane
  constexpr int kRowsPerWarp = 32 / L;
  constexpr int kRowsPerPass = kUpdateWarps * kRowsPerWarp;
  static_assert(N % kPack == 0 && (N / kPack <= 32 || (N / kPack) % 32 == 0), "d_state must tile the warp");
  const int64_t h = blockIdx.x;
  const int64_t b = blockIdx.y;
  const int64_t slot = p.state_indices[b];
  if (slot < 0) {  // padding row: output row and state untouched
    pdl_wait();    // (every block waits: the next kernel's wait then covers all earlier work)
    return;
  }
  const int P = static_cast<int>(p.head_dim);
  const int p_begin = static_cast<int>(blockIdx.z) * rows_per_slice;
  const int p_end = min(P, p_begin + rows_per_slice);

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int seg_lane = lane % L;
  const int row_in_pass = warp * kRowsPerWarp + lane / L;
  uint4* state = reinterpret_cast<uint4*>(static_cast<TS*>(p.ssm_states) + (slot * p.heads + h) * static_cast<int64_t>(P) * N);

  // The first pass's state rows are loaded before the programmatic-launch wait, overlapping
  // the previous kernel (the conv update): the state and the slots are not written by the
  // kernel launched just before this one (see ssm.h), and everything before that one has
  // completed once this grid runs (it waited for its own predecessor).
  uint4 s[kU][kCols];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int row = p_begin + u * kRowsPerPass + row_in_pass;
    if (row < p_end) {
#pragma unroll
      for (int c = 0; c < kCols; ++c) s[u][c] = __ldcs(state + static_cast<int64_t>(row) * (N / kPack) + c * L + seg_lane);
    }
  }
  pdl_begin();  // decode path: launched with programmatic dependent launch

  const int64_t g = h / (p.heads / p.n_groups);
  const float dt = step_size(p, to_float(static_cast<const TI*>(p.dt)[b * p.dt_stride + h]), h);
  const float decay = expf(dt * -expf(p.A_log[h]));
  const float d_skip = p.D != nullptr ? p.D[h] : 0.0f;
  const TI* x = static_cast<const TI*>(p.x) + b * p.x_stride + h * P;
  TI* y = static_cast<TI*>(p.y) + b * p.y_stride + h * P;
  const TI* bv = static_cast<const TI*>(p.B) + b * p.bc_stride + g * N;
  const TI* cv = static_cast<const TI*>(p.C) + b * p.bc_stride + g * N;

  // This lane's columns: pack c·L + seg_lane of every row. B and C rows may be unaligned (any
  // bc_stride), so they are read as scalars once.
  float bc[kCols][kPack], cc[kCols][kPack];
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
#pragma unroll
    for (int e = 0; e < kPack; ++e) {
      const int n = (c * L + seg_lane) * kPack + e;
      bc[c][e] = to_float(bv[n]);
      cc[c][e] = to_float(cv[n]);
    }
  }

  for (int p0 = p_begin; p0 < p_end; p0 += kU * kRowsPerPass) {
    float xv[kU] = {};
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int row = p0 + u * kRowsPerPass + row_in_pass;
      if (row < p_end) {
        xv[u] = to_float(x[row]);
        if (p0 != p_begin) {  // the first pass's rows were loaded before the wait
#pragma unroll
          for (int c = 0; c < kCols; ++c)
            s[u][c] = __ldcs(state + static_cast<int64_t>(row) * (N / kPack) + c * L + seg_lane);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int row = p0 + u * kRowsPerPass + row_in_pass;
      const bool live = row < p_end;  // uniform across each L-lane segment
      float out = 0.0f;
      if (live) {
        const float coef = dt * xv[u];
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          float v[kPack];
          pk::unpack(s[u][c], v);
#pragma unroll
          for (int e = 0; e < kPack; ++e) {
            v[e] = v[e] * decay + coef * bc[c][e];
            out += v[e] * cc[c][e];  // y from the f32 state, before it is rounded for storage
          }
          __stcs(state + static_cast<int64_t>(row) * (N / kPack) + c * L + seg_lane, pk::pack(v));
        }
      }
      // Every lane joins the shuffles; xor offsets below L stay inside the segment.
#pragma unroll
      for (int o = L / 2; o > 0; o >>= 1) out += __shfl_xor_sync(0xffffffffu, out, o);
      if (live && seg_lane == 0) y[row] = from_float<TI>(out + d_skip * xv[u]);
    }
  }
}

template <class TI, class TS>
void launch_ssm_update(const selective_state_update_params& p, cudaStream_t stream) {
  // Slices of head_dim rows: enough blocks for a few waves when batch × heads is small.
  const int64_t blocks = p.batch * p.heads;
  const int64_t max_slices = std::max<int64_t>(1, p.head_dim / 8);
  const int64_t slices = std::clamp<int64_t>(ceil_div(4 * sm_count(), blocks), 1, max_slices);
  const auto rows_per_slice = static_cast<int>(ceil_div(p.head_dim, slices));
  const dim3 grid(static_cast<unsigned>(p.heads), static_cast<unsigned>(p.batch),
                  static_cast<unsigned>(ceil_div(p.head_dim, rows_per_slice)));
  const bool unroll8 = current_paths().ssm_update_unroll == 8;
  dispatch(ssm_state_dim_table{}, p.d_state, "selective_state_update", "d_state", [&](auto n) {
    constexpr int N = decltype(n)::value;
    if constexpr (sizeof(TS) == 4) {
      if (unroll8) {
        launch_pdl(ssm_update_kernel<TI, TS, N, 8>, grid, dim3(kUpdateThreads), 0, stream, p, rows_per_slice);
        return;
      }
    }
    launch_pdl(ssm_update_kernel<TI, TS, N, 4>, grid, dim3(kUpdateThreads), 0, stream, p, rows_per_slice);
  });
}

}  // namespace
}  // namespace cuda_detail

using namespace cuda_detail;

void run_cuda(const selective_state_update_params& p, void* stream) {
  constexpr const char* op = "selective_state_update";
  check_ssm_common(p, op);
  if (!ssm_state_dim_table::supports(p.d_state)) {
    fail(op, "d_state", p.d_state, ("unsupported by the CUDA kernels; built for " + ssm_state_dim_table::list()).c_str());
  }
  dispatch_ssm_types(p, [&](auto io, auto st) {
    launch_ssm_update<typename decltype(io)::type, typename decltype(st)::type>(p, as_stream(stream));
  });
}

}  // namespace hyserve::kernels
