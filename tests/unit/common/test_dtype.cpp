#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "hyserve/common/dtype.h"
#include "hyserve/common/error.h"
#include "hyserve/common/tensor.h"

namespace hyserve {
namespace {

TEST(Dtype, Bf16RoundTripIsExactForRepresentableValues) {
  for (float v : {0.0f, 1.0f, -2.5f, 0.15625f, 65536.0f, -1.0e-3f}) {
    const float back = bf16_to_f32(f32_to_bf16(v));
    EXPECT_NEAR(back, v, std::fabs(v) * 1.0f / 128.0f) << v;  // 8 bits of mantissa
  }
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Dtype, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 lies exactly half-way between bf16 1.0 and 1 + 2^-7: ties to even → 1.0.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256.0f)), 1.0f);
  // 1 + 3·2^-8 lies half-way between 1 + 2^-7 and 1 + 2^-6: ties to even → 1 + 2^-6.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256.0f)), 1.0f + 1.0f / 64.0f);
}

TEST(Dtype, F16RoundTrip) {
  for (float v : {0.0f, 1.0f, -2.5f, 0.333251953125f, 65504.0f, 6.103515625e-05f, 5.9604644775390625e-08f}) {
    EXPECT_EQ(f16_to_f32(f32_to_f16(v)), v) << v;
  }
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1.0e6f))));
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
}

TEST(Dtype, ParseNamesAndRejectUnknown) {
  EXPECT_EQ(parse_dtype("bfloat16"), dtype::kBF16);
  EXPECT_EQ(parse_dtype("float32"), dtype::kF32);
  try {
    parse_dtype("float8");
    FAIL() << "expected an error";
  } catch (const invalid_argument_error& e) {
    EXPECT_NE(std::string(e.what()).find("float8"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("bfloat16"), std::string::npos);
  }
}

TEST(Tensor, HostTensorIsZeroedContiguousAndAligned) {
  host_tensor t = host_tensor::f32({3, 5, 7});
  EXPECT_EQ(t.numel(), 105);
  EXPECT_EQ(t.nbytes(), 420u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.as<float>()[i], 0.0f);
  const tensor_view v = t.view();
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.strides[0], 35);
  EXPECT_EQ(v.strides[1], 7);
  EXPECT_EQ(v.strides[2], 1);
  EXPECT_EQ(v.shape.str(), "[3, 5, 7]");
}

TEST(Tensor, RejectsNegativeDimensions) { EXPECT_THROW(shape_t({2, -1}), invalid_argument_error); }

}  // namespace
}  // namespace hyserve
