// Gated DeltaNet on CUDA: the varlen prefill and the decode update.
//
// Kernels (paths in gdn_paths.cuh, chosen per call or by the op's kernel paths):
//   prefill, tc (default) / tf32: gdn_chunked.cuh, the chunked WY form on the tensor cores
//                     (3xTF32 or plain TF32) for key dims 32, 64, 128;
//   prefill, recurrent (kernels.gdn_prefill: recurrent, and every other key dim), and the
//                     decode update, grid (kernels.gdn_decode: grid): the kernel below;
//   decode, tiles8 (default: 92-94% of copy at batch 64/256 against 82% for grid, bench/results
//                     run 5) / persistent / persistent8: gdn_decode.cuh, the same math with
//                     tiles of value rows (resident blocks prefetching the next tile for the
//                     persistent variants).
//
// The kernel below. The delta rule updates every value row e of a head's state S [V, K] on its own:
//   s_e ← decay·s_e + beta·(v_e − decay·s_e·k̂)·k̂,   o_e = s_e·q̂,
// so rows need no communication; only q̂, k̂, decay and beta are shared by a head's rows. A
// block takes (value head h, batch row b, slice z of kRowsPerBlock value rows), keeps its rows
// in registers and walks the row's tokens in order (one token for the decode update). The
// prefill is thus the per-token recurrence, not the CPU op's chunked WY form: the two agree to
// rounding for any chunk_size, which the CUDA op accepts and does not need.
//
// Layout in a block: a state row (K floats) is covered by L = min(32, K/4) lanes of a warp,
// each holding K/(4L) float4 columns; a warp has 32/L such segments and each segment owns kRows
// consecutive rows. State reads and writes are 16-byte accesses coalesced across the segment;
// each element is read once and written once per launch.
//
// One reduction round per token. With raw q, k (before the L2 norm), qf = scale/|q|, kf = 1/|k|:
//   pred_e = decay·kf·(s_e·k),   delta_e = beta·(v_e − pred_e),
//   o_e    = decay·qf·(s_e·q) + delta_e·qf·kf·(q·k),   s_e ← decay·s_e + delta_e·kf·k,
// so the segment reduces |q|², |k|², q·k and, per row, s_e·k and s_e·q together with xor
// shuffles (every lane gets every sum) before any state element changes.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "../cpu/gdn_validate.h"
#include "common.cuh"
#include "dispatch.h"
#include "gdn_common.h"
#include "gdn_decode.cuh"
#include "gdn_paths.cuh"
#include "hyserve/kernels/gdn.h"
#include "hyserve/kernels/paths.h"
#include "stream_alloc.h"

namespace hyserve::kernels {
namespace cuda_detail {
namespace {

constexpr int kGdnThreads = 128;
constexpr int kGdnWarps = kGdnThreads / 32;
constexpr int kRows = 4;                 // value rows per lane segment
constexpr float kL2Eps = 1e-6f;          // inside the square root, as in the CPU op
constexpr int64_t kMaxGridY = 65535;

// Rows of S one block updates, for key dimension K.
template <int K>
__host__ __device__ constexpr int rows_per_block() {
  constexpr int L = K / 4 < 32 ? K / 4 : 32;
  return kGdnWarps * (32 / L) * kRows;
}

// Raw inputs of one token as one lane needs them: its q and k columns, its rows' v, and the
// head's decay input and beta logit.
template <int kCols>
struct gdn_token {
  float q[kCols * 4];
  float k[kCols * 4];
  float v[kRows];
  float a, b;
};

// qsl: token ranges [qsl[b], qsl[b+1]) (null: decode, row b is token b and always starts from
// its slot's state). has_init: null = no initial states (prefill only). gate: null, or a device
// flag; the kernel does nothing unless it is nonzero (the tensor-core prefill's overflow flag).
// io: q, k, v and out of element type In (f32, or bf16 for the chunked prefill's bf16 io).
template <int K, class In>
__global__ void __launch_bounds__(kGdnThreads)
    gdn_kernel(const gdn_common_params p, const gdn_io<In> io, const int32_t* __restrict__ qsl,
               const uint8_t* __restrict__ has_init, float scale, const int* __restrict__ gate) {
  if (gate != nullptr && *gate == 0) return;
  constexpr int L = K / 4 < 32 ? K / 4 : 32;  // lanes per state row
  constexpr int kCols = K / (4 * L);          // float4 columns per lane
  constexpr int kSegs = 32 / L;               // row segments per warp
  constexpr int kSums = 3 + 2 * kRows;        // |q|², |k|², q·k, then s·k and s·q per row
  static_assert(K % 4 == 0 && (K / 4 <= 32 || (K / 4) % 32 == 0), "key dim must tile the warp");
  static_assert(kRows <= L, "a segment writes its rows' outputs from distinct lanes");

  const int64_t h = blockIdx.x;
  const int64_t b = blockIdx.y;
  const int64_t slot = p.state_indices[b];
  if (slot < 0) return;  // padding row: output rows and state untouched
  const bool decode = qsl == nullptr;
  const int64_t t_begin = decode ? b : qsl[b];
  const int64_t t_end = decode ? b + 1 : qsl[b + 1];
  const bool init = decode || (has_init != nullptr && has_init[b] != 0);

  const int V = static_cast<int>(p.v_dim);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int seg_lane = lane % L;
  const int row0 = static_cast<int>(blockIdx.z) * rows_per_block<K>() + (warp * kSegs + lane / L) * kRows;
  const int64_t hk = h / (p.heads_v / p.heads_k);
  const float A = -expf(p.A_log[h]);
  const float bias = p.dt_bias != nullptr ? p.dt_bias[h] : 0.0f;
  float4* S = reinterpret_cast<float4*>(p.states + (slot * p.heads_v + h) * static_cast<int64_t>(V) * K);

  bool live[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) live[r] = row0 + r < V;

  // This lane's state columns: float4 c·L + seg_lane of each of its rows.
  float4 s[kRows][kCols];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int64_t at = static_cast<int64_t>(row0 + r) * (K / 4) + c * L + seg_lane;
      if (live[r] && init) {
        s[r][c] = decode ? __ldcs(S + at) : S[at];
      } else {
        s[r][c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
  }

  // q, k and v rows may be unaligned (column ranges of one buffer, any stride): scalar reads.
  auto load = [&](int64_t t, gdn_token<kCols>& x) {
    const In* qt = io.q + t * p.q_stride + hk * K;
    const In* kt = io.k + t * p.k_stride + hk * K;
    const In* vt = io.v + t * p.v_stride + h * V;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = (c * L + seg_lane) * 4 + e;
        x.q[c * 4 + e] = to_float(qt[col]);
        x.k[c * 4 + e] = to_float(kt[col]);
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) x.v[r] = live[r] ? to_float(vt[row0 + r]) : 0.0f;
    x.a = p.a[t * p.a_stride + h];
    x.b = p.b[t * p.b_stride + h];
  };

  gdn_token<kCols> cur{}, next{};
  if (t_begin < t_end) load(t_begin, cur);
  for (int64_t t = t_begin; t < t_end; ++t) {
    if (t + 1 < t_end) load(t + 1, next);  // in flight while this token is computed

    float sum[kSums];
    delta_rule_sums<L>(sum, cur.q, cur.k, s);

    const float qf = p.qk_l2norm ? scale / sqrtf(sum[0] + kL2Eps) : scale;
    const float kf = p.qk_l2norm ? 1.0f / sqrtf(sum[1] + kL2Eps) : 1.0f;
    const float decay = expf(A * softplus(cur.a + bias));
    const float beta = 1.0f / (1.0f + expf(-cur.b));
    In* out = io.out + t * p.out_stride + h * V;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float delta = beta * (cur.v[r] - decay * kf * sum[3 + 2 * r]);
      const float o = decay * qf * sum[4 + 2 * r] + delta * qf * kf * sum[2];
      const float dk = delta * kf;
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        float4& v = s[r][c];
        v.x = decay * v.x + dk * cur.k[c * 4];
        v.y = decay * v.y + dk * cur.k[c * 4 + 1];
        v.z = decay * v.z + dk * cur.k[c * 4 + 2];
        v.w = decay * v.w + dk * cur.k[c * 4 + 3];
      }
      if (live[r] && seg_lane == r) out[row0 + r] = from_float<In>(o);
    }
    cur = next;
  }

#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (!live[r]) continue;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int64_t at = static_cast<int64_t>(row0 + r) * (K / 4) + c * L + seg_lane;
      if (decode) {
        __stcs(S + at, s[r][c]);
      } else {
        S[at] = s[r][c];
      }
    }
  }
}

}  // namespace

// The CUDA kernels' own limits: grid dimensions, the key-dim table and the 16-byte state
// accesses.
static void check_gdn_cuda_limits(const gdn_common_params& p, const char* op) {
  if (!gdn_key_dim_table::supports(p.k_dim))
    fail(op, "k_dim", p.k_dim, ("unsupported by the CUDA kernels; built for " + gdn_key_dim_table::list()).c_str());
  if (p.batch > kMaxGridY) fail(op, "batch", p.batch, "exceeds the CUDA grid (65535)");
  if (p.heads_v > 0x7fffffff) fail(op, "heads_v", p.heads_v, "exceeds the CUDA grid");
  if (p.v_dim > 0x7fffffff) fail(op, "v_dim", p.v_dim, "exceeds the int range");
  require_aligned16(p.states, op, "states");
}

// The checks both backends share (cpu/gdn_validate.h), then the CUDA limits; state_indices,
// query_start_loc and has_initial_state live in device memory and are not read here.
void check_gdn_common(const gdn_common_params& p, const char* op, bool f32_io) {
  cpu_detail::check_gdn_common_fields(p, op, f32_io);
  check_gdn_cuda_limits(p, op);
}

void check_gdn_chunk_scan(const gdn_chunk_scan_params& p, const char* op) {
  cpu_detail::check_gdn_chunk_scan_fields(p, op);
  check_gdn_cuda_limits(p, op);
}

void launch_gdn(const gdn_common_params& p, const int32_t* qsl, const uint8_t* has_init, const char* op,
                cudaStream_t stream, const int* gate, const gdn_io<__nv_bfloat16>* bf16) {
  const float scale = p.scale != 0.0f ? p.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.k_dim)));
  dispatch(gdn_key_dim_table{}, p.k_dim, op, "k_dim", [&](auto kd) {
    constexpr int K = decltype(kd)::value;
    const dim3 grid(static_cast<unsigned>(p.heads_v), static_cast<unsigned>(p.batch),
                    static_cast<unsigned>(ceil_div(p.v_dim, rows_per_block<K>())));
    if (bf16 != nullptr) {
      gdn_kernel<K, __nv_bfloat16><<<grid, kGdnThreads, 0, stream>>>(p, *bf16, qsl, has_init, scale, gate);
    } else {
      gdn_kernel<K, float><<<grid, kGdnThreads, 0, stream>>>(p, f32_io(p), qsl, has_init, scale, gate);
    }
  });
  HYSERVE_CUDA_CHECK_LAUNCH();
}

int64_t gdn_tc_max_tokens() {
  const int32_t n = current_paths().gdn_max_tokens;
  return n > 0 ? int64_t{n} : int64_t{16384};
}

namespace {

// ---- tensor-core prefill (gdn_chunked.cuh, gdn_tc_launch.cuh) ----------------------------------

// Key dims of the tensor-core prefill: K / 4 key columns per warp in whole n-tiles, and the
// staged tiles of K = 128 fit one block per SM.
using gdn_tc_key_dim_table = int_table<32, 64, 128>;

bool tc_supports(const gdn_chunk_scan_params& p) {
  return gdn_tc_key_dim_table::supports(p.k_dim) && p.heads_v <= 65535 && p.batch <= 65535 &&
         p.v_dim <= (int64_t{1} << 24);
}

// plan, intra, state for the call's key dim (gdn_tc_launch.cuh, instantiated per (kSplit, K,
// kHalf, In)).
template <bool kSplit, bool kHalf = false, class In = float>
void launch_gdn_tc(const gdn_chunk_scan_params& p, cudaStream_t stream, int stages = 3) {
  dispatch(gdn_tc_key_dim_table{}, p.k_dim, "gdn_chunk_scan", "k_dim",
           [&](auto kd) { launch_gdn_tc_k<kSplit, decltype(kd)::value, kHalf, In>(p, stream, stages); });
}

void launch_gdn_path(const gdn_chunk_scan_params& p, gdn_prefill_path path, cudaStream_t stream, int stages = 3) {
  if (p.io_dtype == dtype::kBF16) {
    launch_gdn_tc<false, true, __nv_bfloat16>(p, stream, stages);  // (resolve_path: bf16 io is the bf16 path's)
    return;
  }
  switch (path) {
    case gdn_prefill_path::tc: launch_gdn_tc<true>(p, stream, stages); return;
    case gdn_prefill_path::bf16: launch_gdn_tc<false, true>(p, stream, stages); return;
    default: launch_gdn_tc<false>(p, stream, stages); return;
  }
}

// The path a call takes: automatic is the default path (kernels.gdn_prefill), which with bf16 io
// is the bf16 path unless it is the recurrent kernel; bf16 io asked of the f32-accurate paths is
// an error.
gdn_prefill_path resolve_path(const gdn_chunk_scan_params& p, gdn_prefill_path path, const char* op) {
  const bool asked = path != gdn_prefill_path::automatic;
  if (!asked) path = gdn_prefill_default_path();
  if (p.io_dtype == dtype::kBF16 && (path == gdn_prefill_path::tc || path == gdn_prefill_path::tf32)) {
    if (asked)
      fail(op, "io_dtype", "bf16",
           (std::string("the ") + gdn_prefill_path_name(path) + " path takes f32 io; bf16 io runs on the bf16 or recurrent path")
               .c_str());
    path = gdn_prefill_path::bf16;
  }
  return path;
}

}  // namespace
}  // namespace cuda_detail

using namespace cuda_detail;

gdn_prefill_path gdn_prefill_default_path() {
  switch (current_paths().gdn_prefill) {
    case kernel_paths::gdn_prefill_kind::kDefault: return gdn_prefill_path::tc;
    case kernel_paths::gdn_prefill_kind::kRecurrent: return gdn_prefill_path::recurrent;
    case kernel_paths::gdn_prefill_kind::kTc: return gdn_prefill_path::tc;
    case kernel_paths::gdn_prefill_kind::kTf32: return gdn_prefill_path::tf32;
    case kernel_paths::gdn_prefill_kind::kBf16: return gdn_prefill_path::bf16;
  }
  return gdn_prefill_path::tc;
}

bool gdn_prefill_tc_supports(const gdn_chunk_scan_params& p) { return tc_supports(p); }

const char* gdn_prefill_path_name(gdn_prefill_path path) {
  switch (path) {
    case gdn_prefill_path::automatic: return "automatic";
    case gdn_prefill_path::recurrent: return "recurrent";
    case gdn_prefill_path::tc: return "tc";
    case gdn_prefill_path::tf32: return "tf32";
    case gdn_prefill_path::bf16: return "bf16";
  }
  return "?";
}

void run_cuda(const gdn_chunk_scan_params& p, gdn_prefill_path path, void* stream) {
  constexpr const char* op = "gdn_chunk_scan";
  check_gdn_chunk_scan(p, op);
  path = resolve_path(p, path, op);
  if (path != gdn_prefill_path::recurrent && tc_supports(p)) {
    launch_gdn_path(p, path, as_stream(stream));
    return;
  }
  if (p.io_dtype == dtype::kBF16) {
    const gdn_io<__nv_bfloat16> io = bf16_io(p);
    launch_gdn(p, p.query_start_loc, p.has_initial_state, op, as_stream(stream), nullptr, &io);
  } else {
    launch_gdn(p, p.query_start_loc, p.has_initial_state, op, as_stream(stream));
  }
}

namespace {

// The params' kernel choice (gdn.h) as a path; kDefault is automatic.
gdn_prefill_path path_of(gdn_prefill_kernel k) {
  switch (k) {
    case gdn_prefill_kernel::kDefault: return gdn_prefill_path::automatic;
    case gdn_prefill_kernel::kRecurrent: return gdn_prefill_path::recurrent;
    case gdn_prefill_kernel::kTc: return gdn_prefill_path::tc;
    case gdn_prefill_kernel::kTf32: return gdn_prefill_path::tf32;
    case gdn_prefill_kernel::kBf16: return gdn_prefill_path::bf16;
  }
  fail("gdn_chunk_scan", "kernel", static_cast<int>(k), "unknown prefill kernel");
}

}  // namespace

void run_cuda(const gdn_chunk_scan_params& p, void* stream) { run_cuda(p, path_of(p.kernel), stream); }

void run_cuda_tc_stages(const gdn_chunk_scan_params& p, gdn_prefill_path path, int stages, void* stream) {
  constexpr const char* op = "gdn_chunk_scan";
  check_gdn_chunk_scan(p, op);
  if (!tc_supports(p)) fail(op, "k_dim", p.k_dim, "not a key dim of the tensor-core prefill");
  path = resolve_path(p, path, op);
  if (path == gdn_prefill_path::recurrent) fail(op, "path", 0, "the recurrent kernel has no stages");
  launch_gdn_path(p, path, as_stream(stream), stages);
}

gdn_decode_path gdn_decode_default_path() {
  switch (current_paths().gdn_decode) {
    case kernel_paths::gdn_decode_kind::kDefault: return gdn_decode_path::tiles8;
    case kernel_paths::gdn_decode_kind::kGrid: return gdn_decode_path::grid;
    case kernel_paths::gdn_decode_kind::kPersistent: return gdn_decode_path::persistent;
    case kernel_paths::gdn_decode_kind::kPersistent8: return gdn_decode_path::persistent8;
    case kernel_paths::gdn_decode_kind::kTiles8: return gdn_decode_path::tiles8;
  }
  return gdn_decode_path::tiles8;
}

const char* gdn_decode_path_name(gdn_decode_path path) {
  switch (path) {
    case gdn_decode_path::automatic: return "automatic";
    case gdn_decode_path::grid: return "grid";
    case gdn_decode_path::persistent: return "persistent";
    case gdn_decode_path::persistent8: return "persistent8";
    case gdn_decode_path::tiles8: return "tiles8";
  }
  return "?";
}

namespace {

// kPrefetch: resident blocks stride over the tiles; else one block per tile.
template <int kR, bool kPrefetch = true>
void launch_gdn_decode_tiles(const gdn_state_update_params& p, cudaStream_t stream) {
  const float scale = p.scale != 0.0f ? p.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.k_dim)));
  dispatch(gdn_key_dim_table{}, p.k_dim, "gdn_state_update", "k_dim", [&](auto kd) {
    constexpr int K = decltype(kd)::value;
    if constexpr (kR <= gdn_dec::geom<K, 1>::L) {
      const auto kernel = &gdn_dec::decode_kernel<K, kR, kPrefetch>;
      const int z_blocks = static_cast<int>(ceil_div(p.v_dim, gdn_dec::geom<K, kR>::kRowsPerBlock));
      const int64_t n_tiles = p.batch * p.heads_v * z_blocks;
      int64_t grid = n_tiles;
      if constexpr (kPrefetch) {
        int per_sm = 0;
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, gdn_dec::kThreads, 0));
        grid = std::min<int64_t>(n_tiles, static_cast<int64_t>(sm_count()) * std::max(per_sm, 1));
      }
      if (grid > 0x7fffffff) fail("gdn_state_update", "batch", p.batch, "too many tiles for the CUDA grid");
      launch_pdl(kernel, dim3(static_cast<unsigned>(grid)), dim3(gdn_dec::kThreads), 0, stream, p, scale, z_blocks, n_tiles);
      HYSERVE_CUDA_CHECK_LAUNCH();
    } else {
      launch_gdn_decode_tiles<4, kPrefetch>(p, stream);  // K too small for kR rows per lane segment
    }
  });
}

}  // namespace

void run_cuda(const gdn_state_update_params& p, gdn_decode_path path, void* stream) {
  constexpr const char* op = "gdn_state_update";
  check_gdn_common(p, op);
  if (path == gdn_decode_path::automatic) path = gdn_decode_default_path();
  if (path == gdn_decode_path::persistent) {
    launch_gdn_decode_tiles<4>(p, as_stream(stream));
  } else if (path == gdn_decode_path::persistent8) {
    launch_gdn_decode_tiles<8>(p, as_stream(stream));
  } else if (path == gdn_decode_path::tiles8) {
    launch_gdn_decode_tiles<8, false>(p, as_stream(stream));
  } else {
    launch_gdn(p, nullptr, nullptr, op, as_stream(stream));
  }
}

void run_cuda(const gdn_state_update_params& p, void* stream) { run_cuda(p, gdn_decode_path::automatic, stream); }

}  // namespace hyserve::kernels
