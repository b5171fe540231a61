#pragma once
// Element-type dispatch of the ops whose storage may be f32 or bf16 (weights, embedding
// tables, KV caches). The op is written once as a template; dispatch_storage() turns the
// runtime dtype into a tag and throws invalid_argument_error naming the op, the field and the
// supported set for anything else. Host code only: CPU ops and the CUDA host entry points.
#include <cstdint>
#include <string>
#include <type_traits>

#include "hyserve/common/dtype.h"
#include "validate.h"

namespace hyserve::kernels::cpu_detail {

template <dtype T>
using dtype_tag = std::integral_constant<dtype, T>;

// f(dtype_tag<kF32>{}) or f(dtype_tag<kBF16>{}).
template <class F>
decltype(auto) dispatch_storage(dtype t, const char* op, const char* field, F&& f) {
  switch (t) {
    case dtype::kF32:
      return f(dtype_tag<dtype::kF32>{});
    case dtype::kBF16:
      return f(dtype_tag<dtype::kBF16>{});
    default:
      break;
  }
  fail(op, field, dtype_name(t), "unsupported element type; supported: f32, bf16");
}

// Throws unless t is f32 or bf16 (the check of dispatch_storage, for validation up front).
inline void require_storage(dtype t, const char* op, const char* field) {
  dispatch_storage(t, op, field, [](auto) {});
}

// Host storage type of a tag: float, or the raw bf16 bit pattern.
template <dtype T>
struct host_storage;
template <>
struct host_storage<dtype::kF32> {
  using type = float;
};
template <>
struct host_storage<dtype::kBF16> {
  using type = uint16_t;
};

inline float to_f32(float v) { return v; }
inline float to_f32(uint16_t v) { return bf16_to_f32(v); }
template <class T>
inline T from_f32(float v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else
    return f32_to_bf16(v);
}

}  // namespace hyserve::kernels::cpu_detail
