// Depthwise causal conv1d. One thread per channel, or four consecutive ones (prefill, where the
// rows allow a vector load) (coalesced over the channel-contiguous token rows), the K-1 previous
// inputs kept in registers as a sliding window.
//
// Varlen prefill: block (channel tile, sequence, token split z). The conv is not recurrent, so
// a sequence is cut into splits of at least kMinSplit tokens, each starting from the K-1
// inputs before it. Only split 0 ever reads the slot's saved window (every other split starts
// at token >= kMinSplit > K-1), and split 0 is also the one that writes the new window back,
// after reading the old one: no other block touches that window, so there is no race.
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "../cpu/conv_validate.h"
#include "common.cuh"
#include "dispatch.h"
#include "hyserve/kernels/causal_conv1d.h"
#include "launch.cuh"

namespace hyserve::kernels {
namespace cuda_detail {
namespace {

constexpr int kConvThreads = 128;
constexpr int64_t kMinSplit = 16;
constexpr int kMaxSplits = 256;
constexpr int64_t kMaxGridY = 65535;

// V consecutive channels of token row p as floats: one 16-byte (float) or 8-byte (bf16) load
// when V is 4 (the launcher checks the alignment), else one element.
template <class T, int V>
__device__ __forceinline__ void load_channels(const T* p, float (&f)[V]) {
  if constexpr (V == 1) {
    f[0] = to_float(p[0]);
  } else if constexpr (std::is_same_v<T, float>) {
    static_assert(V == 4, "4 channels a thread");
    const float4 v = *reinterpret_cast<const float4*>(p);
    f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
  } else {
    static_assert(V == 4, "4 channels a thread");
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    f[0] = __uint_as_float(v.x << 16), f[1] = __uint_as_float(v.x & 0xffff0000u);
    f[2] = __uint_as_float(v.y << 16), f[3] = __uint_as_float(v.y & 0xffff0000u);
  }
}

template <class T, int V>
__device__ __forceinline__ void store_channels(T* p, const float (&f)[V]) {
  if constexpr (V == 1) {
    p[0] = from_float<T>(f[0]);
  } else if constexpr (std::is_same_v<T, float>) {
    *reinterpret_cast<float4*>(p) = make_float4(f[0], f[1], f[2], f[3]);
  } else {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(f[0], f[1]), hi = __floats2bfloat162_rn(f[2], f[3]);
    uint2 v;
    v.x = *reinterpret_cast<const uint32_t*>(&lo);
    v.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(p) = v;
  }
}

// A thread takes V consecutive channels (V = 4: one vector load a token; each channel's
// arithmetic is the same as with V = 1, so are its bits).
template <class T, int K, int V>
__global__ void __launch_bounds__(kConvThreads) conv1d_varlen_kernel(const conv1d_varlen_params p) {
  constexpr int W = K - 1;
  static_assert(kMinSplit > W, "only split 0 may reach into the saved window");
  const int64_t b = blockIdx.y;
  const int32_t slot = p.state_indices[b];
  if (slot < 0) return;  // padding row: output and state untouched
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (c >= p.dim) return;  // V divides dim
  const int64_t start = p.query_start_loc[b];
  const int64_t len = p.query_start_loc[b + 1] - start;
  const int64_t split = max(ceil_div(len, static_cast<int64_t>(gridDim.z)), kMinSplit);
  const int64_t s0 = static_cast<int64_t>(blockIdx.z) * split;
  if (blockIdx.z > 0 && s0 >= len) return;
  const int64_t s1 = min(len, s0 + split);

  const T* x = reinterpret_cast<const T*>(p.x) + start * p.x_stride + c;  // token s at x[s * x_stride]
  T* out = reinterpret_cast<T*>(p.out) + start * p.out_stride + c;
  float* win = p.conv_states + (static_cast<int64_t>(slot) * p.dim + c) * W;  // channel v: [W] at v·W, oldest first
  const bool init = p.has_initial_state != nullptr && p.has_initial_state[b] != 0;

  float old[V][W];  // the saved windows (zeros without initial state); read by split 0 only
#pragma unroll
  for (int v = 0; v < V; ++v)
#pragma unroll
    for (int j = 0; j < W; ++j) old[v][j] = (blockIdx.z == 0 && init) ? win[v * W + j] : 0.0f;

  float prev[W][V];  // inputs at offsets s0-W .. s0-1, oldest first
#pragma unroll
  for (int j = 0; j < W; ++j) {
    const int64_t s = s0 - W + j;
    // s < 0 happens only in split 0, where s0 = 0 and offset s is old[W + s] = old[j].
    if (s >= 0) {
      load_channels<T, V>(x + s * p.x_stride, prev[j]);
    } else {
#pragma unroll
      for (int v = 0; v < V; ++v) prev[j][v] = old[v][j];
    }
  }
  float w[V][K], bias[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
#pragma unroll
    for (int j = 0; j < K; ++j) w[v][j] = p.weight[(c + v) * K + j];
    bias[v] = p.bias != nullptr ? p.bias[c + v] : 0.0f;
  }

#pragma unroll 4
  for (int64_t s = s0; s < s1; ++s) {  // unrolled so that several token loads are in flight
    float xs[V], y[V];
    load_channels<T, V>(x + s * p.x_stride, xs);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      float acc = bias[v];
#pragma unroll
      for (int j = 0; j < W; ++j) acc += w[v][j] * prev[j][v];
      acc += w[v][W] * xs[v];
      y[v] = p.silu ? silu(acc) : acc;
    }
    store_channels<T, V>(out + s * p.out_stride, y);
#pragma unroll
    for (int j = 0; j + 1 < W; ++j)
#pragma unroll
      for (int v = 0; v < V; ++v) prev[j][v] = prev[j + 1][v];
    if constexpr (W > 0) {
#pragma unroll
      for (int v = 0; v < V; ++v) prev[W - 1][v] = xs[v];
    }
  }

  if (blockIdx.z == 0) {
    // New window = last W entries of (old window ++ sequence): offset len - W + j.
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const int64_t s = len - W + j;
      float f[V];
      if (s >= 0) {
        load_channels<T, V>(x + s * p.x_stride, f);
      } else {
#pragma unroll
        for (int v = 0; v < V; ++v) {
          f[v] = 0.0f;
#pragma unroll
          for (int i = 0; i < W; ++i)
            if (i == W + s) f[v] = old[v][i];
        }
      }
#pragma unroll
      for (int v = 0; v < V; ++v) win[v * W + j] = f[v];
    }
  }
}

template <class T, int K>
__global__ void __launch_bounds__(kConvThreads) conv1d_update_kernel(const conv1d_update_params p) {
  // The window, weights and bias are read before the programmatic-launch wait, overlapping the
  // previous kernel (the in_proj GEMM): the kernel launched just before this one must not write
  // conv_states or state_indices (causal_conv1d.h); everything before it has completed.
  constexpr int W = K - 1;
  const int64_t b = blockIdx.y;
  const int32_t slot = p.state_indices[b];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (slot < 0 || c >= p.dim) {
    pdl_begin();  // every thread waits: the next kernel's wait then covers all earlier work
    return;
  }
  float* win = p.conv_states + (static_cast<int64_t>(slot) * p.dim + c) * W;
  float prev[W], wk[K];
#pragma unroll
  for (int j = 0; j < W; ++j) prev[j] = win[j];
#pragma unroll
  for (int j = 0; j < K; ++j) wk[j] = p.weight[c * K + j];
  float acc = p.bias != nullptr ? p.bias[c] : 0.0f;
  pdl_begin();  // decode path: launched with programmatic dependent launch
  const float xs = to_float(reinterpret_cast<const T*>(p.x)[b * p.x_stride + c]);
#pragma unroll
  for (int j = 0; j < W; ++j) acc += wk[j] * prev[j];
  acc += wk[W] * xs;
  reinterpret_cast<T*>(p.out)[b * p.out_stride + c] = from_float<T>(p.silu ? silu(acc) : acc);
#pragma unroll
  for (int j = 0; j + 1 < W; ++j) win[j] = prev[j + 1];
  win[W - 1] = xs;
}

template <class T>
void launch_conv1d_varlen(const conv1d_varlen_params& p, cudaStream_t stream) {
  // Four channels a thread (one vector load a token) where the rows allow it: dim and both
  // strides multiples of 4, x and out aligned to the vector.
  constexpr size_t kVecBytes = 4 * sizeof(T);
  const bool vec = p.dim % 4 == 0 && p.x_stride % 4 == 0 && p.out_stride % 4 == 0 &&
                   reinterpret_cast<uintptr_t>(p.x) % kVecBytes == 0 && reinterpret_cast<uintptr_t>(p.out) % kVecBytes == 0;
  const int64_t tiles = ceil_div(p.dim, int64_t{kConvThreads} * (vec ? 4 : 1));
  // Token splits: when the batch is small, enough blocks for every SM to hold 16 (2048 threads):
  // the op is a pure stream, and with 4 blocks an SM and one channel a thread (the earlier
  // launch) Qwen3-Next's 8192 channels × 8192 tokens ran at 29% of copy bandwidth (H100, run 37:
  // too few loads in flight; 40% with 16 blocks an SM). The outputs do not depend on the split.
  // The lengths live on the device; a split past a sequence's end exits at once.
  const int64_t splits = std::clamp<int64_t>(ceil_div(16 * sm_count(), tiles * p.batch), 1, kMaxSplits);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.batch), static_cast<unsigned>(splits));
  dispatch(conv_width_table{}, p.width, "causal_conv1d_varlen", "width", [&](auto k) {
    constexpr int K = decltype(k)::value;
    if (vec)
      conv1d_varlen_kernel<T, K, 4><<<grid, kConvThreads, 0, stream>>>(p);
    else
      conv1d_varlen_kernel<T, K, 1><<<grid, kConvThreads, 0, stream>>>(p);
  });
  HYSERVE_CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_conv1d_update(const conv1d_update_params& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(ceil_div(p.dim, kConvThreads)), static_cast<unsigned>(p.batch));
  dispatch(conv_width_table{}, p.width, "causal_conv1d_update", "width", [&](auto k) {
    launch_pdl(conv1d_update_kernel<T, decltype(k)::value>, grid, dim3(kConvThreads), 0, stream, p);
  });
}

#define HYSERVE_INSTANTIATE(T)                                                         \
  template void launch_conv1d_varlen<T>(const conv1d_varlen_params&, cudaStream_t); \
  template void launch_conv1d_update<T>(const conv1d_update_params&, cudaStream_t);
HYSERVE_CUDA_FOR_EACH_TYPE(HYSERVE_INSTANTIATE)
#undef HYSERVE_INSTANTIATE

// The checks both backends share (cpu/conv_validate.h), then the CUDA kernels' own limits.
// state_indices, query_start_loc and has_initial_state live on the device: a slot < 0 is
// padding; the rest is trusted.
template <class Params>
void check_common(const Params& p, const char* op) {
  cpu_detail::check_conv1d_fields(p, op);
  if (p.batch > kMaxGridY) fail(op, "batch", p.batch, "exceeds the CUDA grid (65535)");
  if (!conv_width_table::supports(p.width)) {
    fail(op, "width", p.width, ("unsupported by the CUDA kernels; built for " + conv_width_table::list()).c_str());
  }
}

}  // namespace
}  // namespace cuda_detail

using namespace cuda_detail;

void run_cuda(const conv1d_varlen_params& p, void* stream) {
  constexpr const char* op = "causal_conv1d_varlen";
  check_common(p, op);
  require_ptr(p.query_start_loc, op, "query_start_loc");
  launch_conv1d_varlen<float>(p, as_stream(stream));
}

void run_cuda(const conv1d_update_params& p, void* stream) {
  check_common(p, "causal_conv1d_update");
  launch_conv1d_update<float>(p, as_stream(stream));
}

}  // namespace hyserve::kernels
