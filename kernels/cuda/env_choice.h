#pragma once
// A kernel path chosen by an environment variable (read by the caller once, or per call): the
// variable's value among known names, or `unset` when it is absent or empty. Any other value is
// an error naming the variable and the known names (no silent fallback to a default).
// Host-only; CUDA-free.
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>

#include "hyserve/common/error.h"

namespace hyserve::kernels::cuda_detail {

template <class E>
E env_choice(const char* var, std::initializer_list<std::pair<const char*, E>> known, E unset) {
  const char* e = std::getenv(var);
  if (e == nullptr || *e == '\0') return unset;
  std::string names;
  for (const auto& [name, value] : known) {
    if (std::strcmp(e, name) == 0) return value;
    names += (names.empty() ? "" : ", ") + std::string(name);
  }
  throw invalid_argument_error(std::string(var) + ": '" + e + "' (known: " + names + ")");
}

}  // namespace hyserve::kernels::cuda_detail
