#pragma once
// Test data and checks shared by every test suite (the hyserve_test_support library): seeded
// random values, bf16 rounding as the storage type does it, a check that a call rejects a field
// by name, and names for parameterised cases.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "hyserve/common/dtype.h"
#include "hyserve/common/error.h"

namespace hyserve::test_support {

// n values uniform in [lo, hi) from a fixed seed.
inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& e : v) e = dist(gen);
  return v;
}

// v rounded to bf16 (round to nearest even) and widened back: the value a bf16 tensor stores.
inline float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

inline std::vector<float> round_bf16(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = round_bf16(v[i]);
  return out;
}

// The bf16 bit patterns of v (round to nearest even): what a bf16 buffer holds.
inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}

// Runs fn and expects an invalid_argument_error whose message contains field.
template <class Fn>
void expect_invalid(Fn&& fn, const std::string& field) {
  try {
    fn();
    ADD_FAILURE() << "expected invalid_argument_error naming '" << field << "'";
  } catch (const invalid_argument_error& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos)
        << "message '" << e.what() << "' does not name '" << field << "'";
  }
}

// Joins integers for test names: {37, 16, 1} → "37x16x1".
inline std::string join(const std::vector<int>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? "x" : "") << v[i];
  return os.str();
}

}  // namespace hyserve::test_support
