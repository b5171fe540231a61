// RMSNorm and gated RMSNorm: one block per (row[, group]). Two passes over the row: the sum of
// squares (block reduction), then the scaled write. out may alias x: every element is read
// and written by the same thread, and all reads of pass 1 precede the reduction's barriers.
#include <algorithm>
#include <cmath>
#include <string>

#include "common.cuh"
#include "hyserve/kernels/norm.h"

namespace hyserve::kernels {
namespace cuda_detail {
namespace {

constexpr int kNormThreads = 256;
constexpr int kMaxGridY = 65535;

template <class T, bool Vec>
__global__ void __launch_bounds__(kNormThreads) rmsnorm_kernel(const rmsnorm_params p) {
  const int64_t r = blockIdx.x;
  const T* x = reinterpret_cast<const T*>(p.x) + r * p.x_stride;
  T* o = reinterpret_cast<T*>(p.out) + r * p.out_stride;
  constexpr int kN = Vec ? pack16<T>::kN : 1;
  const int64_t step = static_cast<int64_t>(blockDim.x) * kN;

  float ss = 0.0f;
  for (int64_t i = threadIdx.x * kN; i < p.cols; i += step) {
    if constexpr (Vec) {
      const pack16<T> v = load_pack(x + i);
#pragma unroll
      for (int j = 0; j < kN; ++j) ss += to_float(v.v[j]) * to_float(v.v[j]);
    } else {
      const float v = to_float(x[i]);
      ss += v * v;
    }
  }
  ss = block_sum(ss);
  const auto inv = static_cast<float>(1.0 / sqrt(static_cast<double>(ss) / static_cast<double>(p.cols) + p.eps));
  for (int64_t i = threadIdx.x * kN; i < p.cols; i += step) {
    if constexpr (Vec) {
      const pack16<T> v = load_pack(x + i);
      float w[kN];
      load_floats<kN>(p.weight + i, w);
      pack16<T> out;
#pragma unroll
      for (int j = 0; j < kN; ++j) out.v[j] = from_float<T>(to_float(v.v[j]) * inv * w[j]);
      store_pack(o + i, out);
    } else {
      o[i] = from_float<T>(to_float(x[i]) * inv * p.weight[i]);
    }
  }
}

// Block (group g, rows r = blockIdx.y, blockIdx.y + gridDim.y, ...).
template <class T, bool Vec>
__global__ void __launch_bounds__(kNormThreads) gated_rmsnorm_kernel(const gated_rmsnorm_params p) {
  const int64_t g = blockIdx.x;
  const int64_t gs = p.group_size;
  const int64_t n_groups = p.cols / gs;
  constexpr int kN = Vec ? pack16<T>::kN : 1;
  const int64_t step = static_cast<int64_t>(blockDim.x) * kN;
  const double divisor = static_cast<double>(p.sumsq_in != nullptr && p.group_count > 0 ? p.group_count : gs);

  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const T* x = reinterpret_cast<const T*>(p.x) + r * p.x_stride + g * gs;
    const T* z = reinterpret_cast<const T*>(p.gate) + r * p.gate_stride + g * gs;
    // h = x · silu(z), recomputed in each pass instead of staged.
    auto h_pack = [&](int64_t i, float (&h)[kN]) {
      if constexpr (Vec) {
        const pack16<T> xv = load_pack(x + i), zv = load_pack(z + i);
#pragma unroll
        for (int j = 0; j < kN; ++j) h[j] = to_float(xv.v[j]) * silu(to_float(zv.v[j]));
      } else {
        h[0] = to_float(x[i]) * silu(to_float(z[i]));
      }
    };

    float inv = 0.0f;
    if (p.sumsq_in == nullptr) {
      float ss = 0.0f;
      for (int64_t i = threadIdx.x * kN; i < gs; i += step) {
        float h[kN];
        h_pack(i, h);
#pragma unroll
        for (int j = 0; j < kN; ++j) ss += h[j] * h[j];
      }
      ss = block_sum(ss);
      if (p.sumsq_out != nullptr) {  // phase 1: publish Σh², do not normalise
        if (threadIdx.x == 0) p.sumsq_out[r * n_groups + g] = ss;
        continue;
      }
      inv = static_cast<float>(1.0 / sqrt(static_cast<double>(ss) / divisor + p.eps));
    } else {
      inv = static_cast<float>(1.0 / sqrt(static_cast<double>(p.sumsq_in[r * n_groups + g]) / divisor + p.eps));
    }

    T* o = reinterpret_cast<T*>(p.out) + r * p.out_stride + g * gs;
    const float* w = p.weight + g * gs;
    for (int64_t i = threadIdx.x * kN; i < gs; i += step) {
      float h[kN];
      h_pack(i, h);
      if constexpr (Vec) {
        float wv[kN];
        load_floats<kN>(w + i, wv);
        pack16<T> out;
#pragma unroll
        for (int j = 0; j < kN; ++j) out.v[j] = from_float<T>(h[j] * inv * wv[j]);
        store_pack(o + i, out);
      } else {
        o[i] = from_float<T>(h[0] * inv * w[i]);
      }
    }
    // A thread's next row begins with block_sum's barrier, so no thread overtakes a reader.
  }
}

template <class T>
void launch_rmsnorm(const rmsnorm_params& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.rows));
  if (vector_ok({p.x, p.out, p.weight}, {p.cols, p.x_stride, p.out_stride}, pack16<T>::kN))
    rmsnorm_kernel<T, true><<<grid, kNormThreads, 0, stream>>>(p);
  else
    rmsnorm_kernel<T, false><<<grid, kNormThreads, 0, stream>>>(p);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_gated_rmsnorm(const gated_rmsnorm_params& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.cols / p.group_size), static_cast<unsigned>(std::min<int64_t>(p.rows, kMaxGridY)));
  const bool vec = vector_ok({p.x, p.gate, p.out, p.weight}, {p.group_size, p.x_stride, p.gate_stride, p.out_stride},
                             pack16<T>::kN);
  if (vec)
    gated_rmsnorm_kernel<T, true><<<grid, kNormThreads, 0, stream>>>(p);
  else
    gated_rmsnorm_kernel<T, false><<<grid, kNormThreads, 0, stream>>>(p);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

#define HYSERVE_INSTANTIATE(T)                                                \
  template void launch_rmsnorm<T>(const rmsnorm_params&, cudaStream_t); \
  template void launch_gated_rmsnorm<T>(const gated_rmsnorm_params&, cudaStream_t);
HYSERVE_CUDA_FOR_EACH_TYPE(HYSERVE_INSTANTIATE)
#undef HYSERVE_INSTANTIATE

}  // namespace
}  // namespace cuda_detail

using namespace cuda_detail;

void run_cuda(const rmsnorm_params& p, void* stream) {
  constexpr const char* op = "rmsnorm";
  require_ptr(p.x, op, "x");
  require_ptr(p.weight, op, "weight");
  require_ptr(p.out, op, "out");
  require_positive(p.rows, op, "rows");
  require_positive(p.cols, op, "cols");
  require_stride(p.x_stride, p.cols, op, "x_stride");
  require_stride(p.out_stride, p.cols, op, "out_stride");
  if (!(p.eps >= 0.0f)) fail(op, "eps", p.eps, "must be >= 0");
  if (p.rows > 0x7fffffff) fail(op, "rows", p.rows, "exceeds the CUDA grid");
  launch_rmsnorm<float>(p, as_stream(stream));
}

void run_cuda(const gated_rmsnorm_params& p, void* stream) {
  constexpr const char* op = "gated_rmsnorm";
  require_ptr(p.x, op, "x");
  require_ptr(p.gate, op, "gate");
  require_positive(p.rows, op, "rows");
  require_positive(p.cols, op, "cols");
  require_positive(p.group_size, op, "group_size");
  if (p.cols % p.group_size != 0) {
    fail(op, "group_size", p.group_size, ("must divide cols = " + std::to_string(p.cols)).c_str());
  }
  require_stride(p.x_stride, p.cols, op, "x_stride");
  require_stride(p.gate_stride, p.cols, op, "gate_stride");
  if (p.sumsq_out != nullptr && p.sumsq_in != nullptr) {
    fail(op, "sumsq_in", "non-null", "phase 1 (sumsq_out) and phase 2 (sumsq_in) are exclusive");
  }
  if (p.sumsq_out == nullptr) {
    require_ptr(p.weight, op, "weight");
    require_ptr(p.out, op, "out");
    require_stride(p.out_stride, p.cols, op, "out_stride");
    if (!(p.eps >= 0.0f)) fail(op, "eps", p.eps, "must be >= 0");
  }
  require_non_negative(p.group_count, op, "group_count");
  if (p.cols / p.group_size > 0x7fffffff) fail(op, "group_size", p.group_size, "gives more groups than the CUDA grid");
  launch_gated_rmsnorm<float>(p, as_stream(stream));
}

}  // namespace hyserve::kernels
