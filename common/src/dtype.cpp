#include "hyserve/common/dtype.h"

#include <cmath>
#include <string>

#include "hyserve/common/error.h"

namespace hyserve {

dtype parse_dtype(std::string_view name) {
  if (name == "f32" || name == "float32" || name == "F32") return dtype::kF32;
  if (name == "bf16" || name == "bfloat16" || name == "BF16") return dtype::kBF16;
  if (name == "f16" || name == "float16" || name == "F16") return dtype::kF16;
  if (name == "i32" || name == "int32" || name == "I32") return dtype::kI32;
  if (name == "i64" || name == "int64" || name == "I64") return dtype::kI64;
  throw invalid_argument_error("unknown dtype '" + std::string(name) +
                               "' (supported: float32, bfloat16, float16, int32, int64)");
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);  // subnormal (or zero)
  } else if (exp == 31) {
    v = mant ? std::nanf("") : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow → inf
  if (absx < 0x38800000u) {  // subnormal half or zero: value / 2^-24, rounded to nearest even
    float a;
    std::memcpy(&a, &absx, 4);
    const float scaled = a * 16777216.0f;
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  uint32_t mant = absx & 0x7fffffu;
  uint32_t exp = (absx >> 23) - 112;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

}  // namespace hyserve
