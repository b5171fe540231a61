#pragma once
// Runtime sizes → compile-time constants. Each table lists the values kernels are built for;
// the same table answers supports() and drives dispatch(), and a value outside it throws
// invalid_argument_error naming the op, the field, the value and the supported set. There is
// no silent fall-through.
#include <cstdint>
#include <string>
#include <type_traits>

#include "../cpu/validate.h"

namespace hyserve::kernels::cuda_detail {

template <int... Vs>
struct int_table {
  static constexpr bool supports(int64_t v) { return ((v == Vs) || ...); }
  static std::string list() {
    std::string s;
    ((s += (s.empty() ? "" : ", ") + std::to_string(Vs)), ...);
    return s;
  }
};

// Depthwise causal conv1d kernel width K (Mamba2 and GDN use 4).
using conv_width_table = int_table<2, 3, 4>;
// Mamba2 d_state of the decode state update (the chunk scan takes any d_state that fits).
using ssm_state_dim_table = int_table<16, 32, 64, 128, 256>;
// Attention head_dim.
using attention_head_dim_table = int_table<16, 32, 64, 128, 256>;
// Gated DeltaNet key dim K (Qwen3-Next uses 128).
using gdn_key_dim_table = int_table<16, 32, 64, 128, 256>;

// Calls f(std::integral_constant<int, V>{}) for the V equal to value.
template <int... Vs, class F>
void dispatch(int_table<Vs...> table, int64_t value, const char* op, const char* field, F&& f) {
  const bool hit = ((value == Vs && (f(std::integral_constant<int, Vs>{}), true)) || ...);
  if (!hit) cpu_detail::fail(op, field, value, ("unsupported by the CUDA kernels; built for " + table.list()).c_str());
}

}  // namespace hyserve::kernels::cuda_detail
