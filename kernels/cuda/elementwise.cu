// Row-wise memory-bound ops: embedding gather, SwiGLU, RoPE, KV-cache write. Each has a
// 16-byte vector path (taken when pointers, lengths and strides allow it) and a scalar one.
// All are decode-path kernels launched with programmatic dependent launch (launch.cuh): each
// waits for the kernel before it first thing.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "../cpu/dense_validate.h"
#include "../cpu/dtype_dispatch.h"
#include "common.cuh"
#include "launch.cuh"
#include "hyserve/kernels/activation.h"
#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/embedding.h"
#include "hyserve/kernels/rope.h"

namespace hyserve::kernels {
namespace cuda_detail {
namespace {

constexpr int kRowThreads = 256;
constexpr int kMaxGridY = 65535;
constexpr int kMaxRopeHalf = 256;  // rotary_dim / 2; inv_freq travels as a kernel argument

// dst[0, n) = src[0, n), or zeros when src is null. Vec: n and both pointers are whole packs.
template <class T, bool Vec>
__device__ __forceinline__ void copy_row(T* __restrict__ dst, const T* __restrict__ src, int64_t n) {
  if constexpr (Vec) {
    constexpr int kN = pack16<T>::kN;
    pack16<T> zero;
#pragma unroll
    for (int j = 0; j < kN; ++j) zero.v[j] = from_float<T>(0.0f);
    for (int64_t i = threadIdx.x * kN; i < n; i += blockDim.x * kN)
      store_pack(dst + i, src != nullptr ? load_pack(src + i) : zero);
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src != nullptr ? src[i] : from_float<T>(0.0f);
  }
}

// dst[0, n) = src[0, n) converted (f32 ↔ bf16, round to nearest even), or zeros when src is
// null. Vec: n is a multiple of 8 and both pointers 16-byte aligned (8 elements per step).
template <class Dst, class Src, bool Vec>
__device__ __forceinline__ void convert_row(Dst* __restrict__ dst, const Src* __restrict__ src, int64_t n) {
  if constexpr (std::is_same_v<Dst, Src>) {
    copy_row<Dst, Vec>(dst, src, n);
  } else if constexpr (Vec) {
    constexpr int kN = 8;
    for (int64_t i = threadIdx.x * kN; i < n; i += blockDim.x * kN) {
      float f[kN];
#pragma unroll
      for (int j = 0; j < kN; j += pack16<Src>::kN) {
        const pack16<Src> v = src != nullptr ? load_pack(src + i + j) : pack16<Src>{};
#pragma unroll
        for (int e = 0; e < pack16<Src>::kN; ++e) f[j + e] = src != nullptr ? to_float(v.v[e]) : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kN; j += pack16<Dst>::kN) {
        pack16<Dst> o;
#pragma unroll
        for (int e = 0; e < pack16<Dst>::kN; ++e) o.v[e] = from_float<Dst>(f[j + e]);
        store_pack(dst + i + j, o);
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      dst[i] = from_float<Dst>(src != nullptr ? to_float(src[i]) : 0.0f);
  }
}

// Table element type S (f32 or bf16); activations T.
template <class T, class S, bool Vec>
__global__ void __launch_bounds__(kRowThreads) embedding_kernel(const embedding_params p) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  const int64_t id = p.ids[t];
  const S* table = reinterpret_cast<const S*>(p.table);
  // Ids of another vocab shard (and, unlike the CPU op which rejects them on the host,
  // negative ids) give zero rows.
  const S* src = (id >= p.vocab_start && id < p.vocab_end) ? table + (id - p.vocab_start) * p.hidden : nullptr;
  convert_row<T, S, Vec>(reinterpret_cast<T*>(p.out) + t * p.hidden, src, p.hidden);
}

template <class T, bool Vec>
__global__ void __launch_bounds__(kRowThreads) swiglu_kernel(const swiglu_params p) {
  pdl_begin();
  const T* gate = reinterpret_cast<const T*>(p.gate);
  const T* up = reinterpret_cast<const T*>(p.up);
  T* out = reinterpret_cast<T*>(p.out);
  constexpr int kN = Vec ? pack16<T>::kN : 1;
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kN;
  if (c >= p.cols) return;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const T* g = gate + r * p.gate_stride + c;
    const T* u = up + r * p.up_stride + c;
    T* o = out + r * p.out_stride + c;
    if constexpr (Vec) {
      const pack16<T> gv = load_pack(g), uv = load_pack(u);
      pack16<T> ov;
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        const float gj = to_float(gv.v[j]);
        ov.v[j] = from_float<T>(gj / (1.0f + expf(-gj)) * to_float(uv.v[j]));
      }
      store_pack(o, ov);
    } else {
      const float gj = to_float(*g);
      *o = from_float<T>(gj / (1.0f + expf(-gj)) * to_float(*u));
    }
  }
}

__global__ void __launch_bounds__(kRowThreads) relu2_kernel(const relu2_params p) {
  pdl_begin();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= p.cols) return;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    float* x = p.x + r * p.stride + c;
    const float v = *x > 0.0f ? *x : 0.0f;
    *x = v * v;
  }
}

struct rope_freqs {
  float inv_freq[kMaxRopeHalf];  // computed on the host with the CPU op's float arithmetic
};

// Token t's q and k heads rotated in place by the block; cos_sin: rotary_dim floats of shared
// memory. The caller synchronises before other threads read the rows.
template <class T>
__device__ void rope_token(const rope_params& p, const rope_freqs& f, int64_t t, float* cos_sin) {
  const int half = static_cast<int>(p.rotary_dim / 2);
  const float pos = static_cast<float>(p.positions[t]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = pos * f.inv_freq[i];
    cos_sin[i] = cosf(angle);
    cos_sin[half + i] = sinf(angle);
  }
  __syncthreads();
  const int64_t n_pairs = (p.n_q_heads + p.n_kv_heads) * half;
  for (int64_t e = threadIdx.x; e < n_pairs; e += blockDim.x) {
    const int64_t head = e / half;
    const int i = static_cast<int>(e % half);
    T* x1 = head < p.n_q_heads ? reinterpret_cast<T*>(p.q) + t * p.q_stride + head * p.head_dim
                               : reinterpret_cast<T*>(p.k) + t * p.k_stride + (head - p.n_q_heads) * p.head_dim;
    const float a = to_float(x1[i]);
    const float b = to_float(x1[half + i]);
    const float c = cos_sin[i], s = cos_sin[half + i];
    x1[i] = from_float<T>(a * c - b * s);
    x1[half + i] = from_float<T>(b * c + a * s);
  }
}

template <class T>
__global__ void __launch_bounds__(kRowThreads) rope_kernel(const rope_params p, const __grid_constant__ rope_freqs f) {
  pdl_begin();
  extern __shared__ float cos_sin[];  // [half] cos, then [half] sin
  rope_token<T>(p, f, blockIdx.x, cos_sin);
}

// The kv_write kernel's frequency argument: the table with rope, nothing without (a write
// without rope does not carry the 1 KB table into every launch).
struct no_rope_freqs {};
template <bool Rope>
using kv_write_freqs = std::conditional_t<Rope, rope_freqs, no_rope_freqs>;

// Activations T, cache element type S (f32 or bf16); Rope: q and k rotated first (p.rope), k then
// read back through p.rope.k (the same rows) after the block's barrier.
template <class T, class S, bool Vec, bool Rope>
__global__ void __launch_bounds__(kRowThreads) kv_write_kernel(const kv_write_params p,
                                                               const __grid_constant__ kv_write_freqs<Rope> f) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  const T* k = reinterpret_cast<const T*>(p.k);
  if constexpr (Rope) {
    extern __shared__ float cos_sin[];
    rope_token<T>(p.rope, f, t, cos_sin);
    __syncthreads();
    k = reinterpret_cast<const T*>(p.rope.k);
  }
  const int64_t loc = p.locs[t];
  if (loc < 0) return;  // padding token
  const int64_t row = p.kv_heads * p.head_dim;
  convert_row<S, T, Vec>(reinterpret_cast<S*>(p.k_cache) + loc * row, k + t * p.k_stride, row);
  convert_row<S, T, Vec>(reinterpret_cast<S*>(p.v_cache) + loc * row, reinterpret_cast<const T*>(p.v) + t * p.v_stride,
                         row);
}

// Storage type of a dtype tag (cpu_detail::dispatch_storage).
template <dtype D>
using storage_t = std::conditional_t<D == dtype::kBF16, __nv_bfloat16, float>;

template <class T>
void launch_embedding(const embedding_params& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.n_tokens));
  cpu_detail::dispatch_storage(p.table_dtype, "embedding", "table_dtype", [&](auto tag) {
    using S = storage_t<decltype(tag)::value>;
    if (vector_ok({p.table, p.out}, {p.hidden}, std::is_same_v<T, S> ? pack16<T>::kN : 8))
      launch_pdl(embedding_kernel<T, S, true>, grid, dim3(kRowThreads), 0, stream, p);
    else
      launch_pdl(embedding_kernel<T, S, false>, grid, dim3(kRowThreads), 0, stream, p);
  });
  HYSERVE_CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_swiglu(const swiglu_params& p, cudaStream_t stream) {
  const bool vec = vector_ok({p.gate, p.up, p.out}, {p.cols, p.gate_stride, p.up_stride, p.out_stride}, pack16<T>::kN);
  const int64_t per_block = kRowThreads * (vec ? pack16<T>::kN : 1);
  const dim3 grid(static_cast<unsigned>(ceil_div(p.cols, per_block)),
                  static_cast<unsigned>(std::min<int64_t>(p.rows, kMaxGridY)));
  if (vec)
    launch_pdl(swiglu_kernel<T, true>, grid, dim3(kRowThreads), 0, stream, p);
  else
    launch_pdl(swiglu_kernel<T, false>, grid, dim3(kRowThreads), 0, stream, p);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_rope(const rope_params& p, const rope_freqs& f, cudaStream_t stream) {
  const size_t smem = sizeof(float) * static_cast<size_t>(p.rotary_dim);
  launch_pdl(rope_kernel<T>, dim3(static_cast<unsigned>(p.n_tokens)), dim3(kRowThreads), smem, stream, p, f);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_kv_write(const kv_write_params& p, const rope_freqs& f, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.n_tokens));
  const int64_t row = p.kv_heads * p.head_dim;
  const bool rope = p.rope.rotary_dim > 0;
  const size_t smem = rope ? sizeof(float) * static_cast<size_t>(p.rope.rotary_dim) : 0;
  cpu_detail::dispatch_storage(p.kv_dtype, "kv_write", "kv_dtype", [&](auto tag) {
    using S = storage_t<decltype(tag)::value>;
    const bool vec =
        vector_ok({p.k, p.v, p.k_cache, p.v_cache}, {row, p.k_stride, p.v_stride}, std::is_same_v<T, S> ? pack16<T>::kN : 8);
    auto go = [&](auto kernel, const auto& freqs) { launch_pdl(kernel, grid, dim3(kRowThreads), smem, stream, p, freqs); };
    if (rope)
      vec ? go(kv_write_kernel<T, S, true, true>, f) : go(kv_write_kernel<T, S, false, true>, f);
    else
      vec ? go(kv_write_kernel<T, S, true, false>, no_rope_freqs{}) : go(kv_write_kernel<T, S, false, false>, no_rope_freqs{});
  });
  HYSERVE_CUDA_CHECK_LAUNCH();
}

#define HYSERVE_INSTANTIATE(T)                                                   \
  template void launch_embedding<T>(const embedding_params&, cudaStream_t);      \
  template void launch_swiglu<T>(const swiglu_params&, cudaStream_t);            \
  template void launch_rope<T>(const rope_params&, const rope_freqs&, cudaStream_t); \
  template void launch_kv_write<T>(const kv_write_params&, const rope_freqs&, cudaStream_t);
HYSERVE_CUDA_FOR_EACH_TYPE(HYSERVE_INSTANTIATE)
#undef HYSERVE_INSTANTIATE

// One-dimensional grids index tokens with blockIdx.x.
void require_grid_x(int64_t n, const char* op, const char* field) {
  if (n > std::numeric_limits<int32_t>::max()) fail(op, field, n, "exceeds the CUDA grid");
}

}  // namespace
}  // namespace cuda_detail

using namespace cuda_detail;

// Host checks: the CPU op's, except for values held in device memory (ids, locs, positions),
// which the host cannot read without a synchronisation; the kernels treat an out-of-range id
// or a negative location as padding.

void run_cuda(const embedding_params& p, void* stream) {
  constexpr const char* op = "embedding";
  cpu_detail::check_embedding(p, op);
  require_grid_x(p.n_tokens, op, "n_tokens");
  launch_embedding<float>(p, as_stream(stream));
}

void run_cuda(const swiglu_params& p, void* stream) {
  constexpr const char* op = "swiglu";
  cpu_detail::check_swiglu(p, op);
  launch_swiglu<float>(p, as_stream(stream));
}

void run_cuda(const relu2_params& p, void* stream) {
  constexpr const char* op = "relu2";
  cpu_detail::check_relu2(p, op);
  const dim3 grid(static_cast<unsigned>(ceil_div(p.cols, int64_t{kRowThreads})),
                  static_cast<unsigned>(std::min<int64_t>(p.rows, kMaxGridY)));
  launch_pdl(relu2_kernel, grid, dim3(kRowThreads), 0, as_stream(stream), p);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

namespace {

// The frequencies exactly as the CPU op computes them: a device powf may differ by an ulp,
// which a position of 10⁵ turns into a visibly different angle.
rope_freqs rope_frequencies(const rope_params& p, const char* op) {
  if (p.rotary_dim / 2 > kMaxRopeHalf) {
    fail(op, "rotary_dim", p.rotary_dim, ("unsupported by the CUDA kernel; at most " + std::to_string(2 * kMaxRopeHalf)).c_str());
  }
  rope_freqs f{};
  const int64_t half = p.rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(p.rotary_dim);
    f.inv_freq[i] = 1.0f / std::pow(p.theta, expo);
  }
  return f;
}

}  // namespace

void run_cuda(const rope_params& p, void* stream) {
  constexpr const char* op = "rope";
  cpu_detail::check_rope(p, op);
  const rope_freqs f = rope_frequencies(p, op);
  require_grid_x(p.n_tokens, op, "n_tokens");
  launch_rope<float>(p, f, as_stream(stream));
}

void run_cuda(const kv_write_params& p, void* stream) {
  constexpr const char* op = "kv_write";
  cpu_detail::check_kv_write(p, op);
  require_grid_x(p.n_tokens, op, "n_tokens");
  launch_kv_write<float>(p, p.rope.rotary_dim > 0 ? rope_frequencies(p.rope, op) : rope_freqs{}, as_stream(stream));
}

}  // namespace hyserve::kernels
