#pragma once
// Seeded synthetic tensor fill. Element i of a tensor (its index in the whole tensor) is a pure
// function of (base, i), so a slice or a set of row ranges generates exactly the elements of the
// whole tensor it selects, on any device: the CUDA kernel's f32 values equal the CPU
// reference's bit for bit, and bf16 outputs are those values rounded to nearest even
// (f32_to_bf16). The worker's synthetic weight source maps a tensor name to `base` and a
// distribution (worker/model/weights.h).
#include <cstdint>

#include "hyserve/common/dtype.h"

#if defined(__CUDACC__)
#define HYSERVE_SYNTHETIC_HD __host__ __device__
#else
#define HYSERVE_SYNTHETIC_HD
#endif

namespace hyserve::kernels {

enum class synthetic_dist : uint8_t {
  kNormal,         // approx_normal(hash, stddev)
  kShiftedNormal,  // mean + approx_normal(hash, stddev)
  kConstant,       // mean
};

// Writes `outer` runs of `width` elements: out[o·out_stride + c] = value of element
// o·stride + offset + c of the whole tensor (a whole tensor is one run of numel elements).
struct synthetic_fill_params {
  void* out = nullptr;             // out_dtype
  dtype out_dtype = dtype::kF32;   // f32 or bf16
  int64_t outer = 1, width = 0;
  int64_t stride = 0, offset = 0;  // in elements of the whole tensor
  int64_t out_stride = 0;          // in elements of out
  uint64_t base = 0;               // seed ^ hash of the tensor's name
  synthetic_dist dist = synthetic_dist::kNormal;
  float mean = 0.0f, stddev = 0.0f;
};

void run_cpu(const synthetic_fill_params& p);
void run_cuda(const synthetic_fill_params& p, void* stream = nullptr);

// The element generator shared by both implementations (and by the worker's host-only roles).
namespace synthetic {

// splitmix64's finaliser.
HYSERVE_SYNTHETIC_HD inline uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The hash of element i of a tensor whose base is `base`.
HYSERVE_SYNTHETIC_HD inline uint64_t element_hash(uint64_t base, int64_t i) {
  return mix64(base + static_cast<uint64_t>(i) * 0xd1b54a32d192ed03ull);
}

// Approximately N(0, stddev²): the Irwin–Hall sum of the hash's four 16-bit quarters (each
// uniform on [0, 1)), centred and scaled to unit variance; tails bounded at ±2√3·stddev. Every
// operation is rounded on its own (no fused multiply-add on the device), so host and device agree.
HYSERVE_SYNTHETIC_HD inline float approx_normal(uint64_t h, float stddev) {
  const float s = static_cast<float>((h & 0xffffu) + ((h >> 16) & 0xffffu) + ((h >> 32) & 0xffffu) + (h >> 48));
#if defined(__CUDA_ARCH__)
  return __fmul_rn(__fmul_rn(__fsub_rn(__fmul_rn(s, 1.0f / 65536.0f), 2.0f), 1.7320508f), stddev);
#else
  return (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f * stddev;
#endif
}

HYSERVE_SYNTHETIC_HD inline float value(synthetic_dist dist, float mean, float stddev, uint64_t h) {
  switch (dist) {
    case synthetic_dist::kNormal:
      return approx_normal(h, stddev);
    case synthetic_dist::kShiftedNormal:
#if defined(__CUDA_ARCH__)
      return __fadd_rn(mean, approx_normal(h, stddev));
#else
      return mean + approx_normal(h, stddev);
#endif
    case synthetic_dist::kConstant:
      return mean;
  }
  return 0.0f;
}

}  // namespace synthetic
}  // namespace hyserve::kernels
