// Weight placement ops on CUDA: synthetic_fill against its CPU reference bit for bit (every
// distribution, f32 and bf16 outputs, strided runs as tensor-parallel slices take them), and
// staged_upload against the host (same type and converting copies, strided runs, runs split
// over several staging pieces by a tiny staging buffer).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "hyserve/common/dtype.h"
#include "hyserve/common/error.h"
#include "hyserve/kernels/device.h"

#if defined(HYSERVE_HAVE_CUDA)

#include "cuda/device_buffer.h"
#include "hyserve/kernels/staged_upload.h"
#include "hyserve/kernels/synthetic.h"

namespace hyserve::kernels {
namespace {

#define HYSERVE_REQUIRE_CUDA() \
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

struct run_shape {
  int64_t outer, width, stride, offset, out_stride;
};

TEST(CudaSyntheticFill, EqualsTheCpuReferenceBitForBit) {
  HYSERVE_REQUIRE_CUDA();
  const run_shape shapes[] = {{1, 100003, 100003, 0, 100003},  // a whole tensor
                              {37, 130, 390, 130, 130},        // dim-1 slice of [37, 390]
                              {5, 64, 640, 576, 80}};          // strided output
  struct dist_case {
    synthetic_dist dist;
    float mean, stddev;
  };
  const dist_case dists[] = {{synthetic_dist::kNormal, 0.0f, 0.02f},
                             {synthetic_dist::kNormal, 0.0f, 0.0074f},
                             {synthetic_dist::kShiftedNormal, 1.0f, 0.05f},
                             {synthetic_dist::kConstant, 1.0f, 0.0f}};
  for (const dtype type : {dtype::kF32, dtype::kBF16})
    for (const run_shape& r : shapes)
      for (const dist_case& d : dists) {
        SCOPED_TRACE(std::string(dtype_name(type)) + " outer " + std::to_string(r.outer) + " dist " +
                     std::to_string(static_cast<int>(d.dist)));
        const size_t n = static_cast<size_t>((r.outer - 1) * r.out_stride + r.width);
        const size_t bytes = n * dtype_size(type);
        std::vector<uint8_t> want(bytes, 0xab), got(bytes, 0xab);
        device_buffer dev(bytes);
        dev.upload(got.data(), bytes);
        synthetic_fill_params p;
        p.out_dtype = type;
        p.outer = r.outer;
        p.width = r.width;
        p.stride = r.stride;
        p.offset = r.offset;
        p.out_stride = r.out_stride;
        p.base = 0x1234567890abcdefull;
        p.dist = d.dist;
        p.mean = d.mean;
        p.stddev = d.stddev;
        p.out = want.data();
        run_cpu(p);
        p.out = dev.data();
        run_cuda(p);
        device_synchronize();
        dev.download(got.data(), bytes);
        EXPECT_EQ(std::memcmp(want.data(), got.data(), bytes), 0);
      }
}

// Host expectation of a copy: run o of src (src_stride) → run o of dst (dst_stride), widened to
// f32 and rounded to the destination type like the host converters.
std::vector<uint8_t> expected_copy(const std::vector<float>& values, dtype src_type, dtype dst_type, int64_t outer,
                                   int64_t width, int64_t src_stride, int64_t dst_stride, size_t dst_bytes) {
  std::vector<uint8_t> out(dst_bytes, 0);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < width; ++c) {
      float v = values[static_cast<size_t>(o * src_stride + c)];
      if (src_type == dtype::kBF16) v = bf16_to_f32(f32_to_bf16(v));
      if (src_type == dtype::kF16) v = f16_to_f32(f32_to_f16(v));
      const size_t at = static_cast<size_t>(o * dst_stride + c);
      if (dst_type == dtype::kF32) {
        std::memcpy(out.data() + at * 4, &v, 4);
      } else {
        const uint16_t h = f32_to_bf16(v);
        std::memcpy(out.data() + at * 2, &h, 2);
      }
    }
  return out;
}

std::vector<uint8_t> encode(const std::vector<float>& values, dtype type) {
  std::vector<uint8_t> out(values.size() * dtype_size(type));
  for (size_t i = 0; i < values.size(); ++i) {
    if (type == dtype::kF32) {
      std::memcpy(out.data() + 4 * i, &values[i], 4);
    } else {
      const uint16_t h = type == dtype::kBF16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

TEST(CudaStagedUpload, CopiesAndConvertsStridedRuns) {
  HYSERVE_REQUIRE_CUDA();
  const run_shape shapes[] = {{1, 5000, 5000, 0, 5000}, {40, 37, 100, 0, 50}, {3, 700, 900, 0, 701}};
  for (const size_t staging : {size_t{256}, size_t{1} << 20})
    for (const dtype src_type : {dtype::kF32, dtype::kBF16, dtype::kF16})
      for (const dtype dst_type : {dtype::kF32, dtype::kBF16})
        for (const run_shape& r : shapes) {
          SCOPED_TRACE(std::string(dtype_name(src_type)) + " → " + std::string(dtype_name(dst_type)) + ", staging " +
                       std::to_string(staging) + ", outer " + std::to_string(r.outer));
          std::vector<float> values(static_cast<size_t>(r.outer * r.stride));
          for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 977) * 0.01234567f - 5.0f;
          const std::vector<uint8_t> src = encode(values, src_type);
          const size_t dst_bytes = static_cast<size_t>((r.outer - 1) * r.out_stride + r.width) * dtype_size(dst_type);
          device_buffer dev(dst_bytes);
          dev.fill_bytes(0);
          staged_upload up(nullptr, staging);
          up.copy_runs(dev.data(), dst_type, r.out_stride, src.data(), src_type, r.stride, r.outer, r.width);
          up.wait();
          EXPECT_EQ(up.bytes_read(), static_cast<uint64_t>(r.outer * r.width) * dtype_size(src_type));
          std::vector<uint8_t> got(dst_bytes);
          dev.download(got.data(), dst_bytes);
          const std::vector<uint8_t> want =
              expected_copy(values, src_type, dst_type, r.outer, r.width, r.stride, r.out_stride, dst_bytes);
          EXPECT_EQ(std::memcmp(want.data(), got.data(), dst_bytes), 0);
        }
}

TEST(CudaStagedUpload, UnsupportedTypesNameTheField) {
  HYSERVE_REQUIRE_CUDA();
  staged_upload up(nullptr, 1024);
  device_buffer dev(64);
  const int32_t src[4] = {1, 2, 3, 4};
  try {
    up.copy_runs(dev.data(), dtype::kF32, 4, src, dtype::kI32, 4, 1, 4);
    FAIL() << "expected an error";
  } catch (const invalid_argument_error& e) {
    EXPECT_NE(std::string(e.what()).find("src_type"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hyserve::kernels

#else  // no CUDA backend in this build

TEST(CudaWeightFill, BackendNotBuilt) { GTEST_SKIP() << "CUDA backend not built"; }

#endif
