#pragma once
// Element types and their conversions. bf16/f16 are stored as raw 16-bit patterns on the
// host; compute happens in f32.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace hyserve {

enum class dtype : uint8_t { kF32, kBF16, kF16, kI32, kI64 };

constexpr size_t dtype_size(dtype t) {
  switch (t) {
    case dtype::kF32: return 4;
    case dtype::kBF16: return 2;
    case dtype::kF16: return 2;
    case dtype::kI32: return 4;
    case dtype::kI64: return 8;
  }
  return 0;
}

constexpr std::string_view dtype_name(dtype t) {
  switch (t) {
    case dtype::kF32: return "f32";
    case dtype::kBF16: return "bf16";
    case dtype::kF16: return "f16";
    case dtype::kI32: return "i32";
    case dtype::kI64: return "i64";
  }
  return "?";
}

// Parses "f32"/"float32", "bf16"/"bfloat16", "f16"/"float16", "i32", "i64"; throws
// invalid_argument_error naming the value and the supported set otherwise.
dtype parse_dtype(std::string_view name);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round-to-nearest-even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace hyserve
