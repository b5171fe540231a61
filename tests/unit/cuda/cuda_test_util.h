#pragma once
// Helpers of the CUDA backend-ops tests: every CUDA op against its CPU op (run_cpu, the ground
// truth) on the same inputs. Outputs start poisoned with the NaN bit pattern 0xffffffff on
// both sides, so a comparison catches elements the CUDA op forgot to write (NaN where the
// CPU wrote a value) and elements it should not have touched (anything other than that exact
// pattern where the CPU left it). Plain C++: device memory through cuda/device_buffer.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/device_buffer.h"
#include "hyserve/common/error.h"
#include "test_data.h"
#include "hyserve/kernels/device.h"

namespace hyserve::kernels::cuda_test {

// Shared with every suite (tests/support/test_data.h).
using test_support::expect_invalid;
using test_support::join;
using test_support::random_floats;
using test_support::round_bf16;
using test_support::to_bf16;

constexpr uint32_t kPoisonBits = 0xffffffffu;  // what device_buffer::fill_bytes(0xff) writes

inline float poison() {
  float f;
  std::memcpy(&f, &kPoisonBits, sizeof f);
  return f;
}

inline bool is_poison(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u == kPoisonBits;
}

template <class T>
device_array<T> to_device(const std::vector<T>& host) {
  return device_array<T>(host);
}

// got (CUDA) against want (CPU), element by element: where want is the poison pattern got must
// be too (untouched), elsewhere |got − want| <= atol + rtol·|want| (a NaN or Inf in got fails,
// since want is finite). Reports the count and the worst element once.
inline void expect_match(const std::vector<float>& got, const std::vector<float>& want, double atol, double rtol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, worst = 0, checked = 0;
  double worst_excess = -1.0;
  for (size_t i = 0; i < want.size(); ++i) {
    double excess = 0.0;
    if (is_poison(want[i])) {
      excess = is_poison(got[i]) ? 0.0 : 1e30;  // written where the CPU op wrote nothing
    } else {
      ++checked;
      if (!std::isfinite(want[i])) {
        excess = (got[i] == want[i]) ? 0.0 : 1e30;
      } else {
        const double err = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
        excess = std::isfinite(got[i]) ? err - (atol + rtol * std::fabs(static_cast<double>(want[i]))) : 1e30;
      }
    }
    if (excess > 0.0) {
      if (excess > worst_excess) {
        worst = i;
        worst_excess = excess;
      }
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << want.size() << " elements differ (atol " << atol << ", rtol "
                     << rtol << "); worst at " << worst << ": cuda " << got[worst] << ", cpu " << want[worst];
  EXPECT_GT(checked, 0u) << what << ": the CPU op wrote nothing (vacuous comparison)";
}

// Outputs of a bf16 tensor-core pipeline (inputs and intermediate products rounded to bf16 in
// an order the CPU op does not share): like expect_match, except that a few elements — at most
// max(2, n / 100000) — may exceed atol + rtol·|want| (a cancellation amplifies one rounding),
// but none may exceed 0.1 + 0.1·|want|, and the relative L2 error over all elements must stay
// within 1e-2.
inline void expect_match_bf16_pipeline(const std::vector<float>& got, const std::vector<float>& want, double atol,
                                       double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t loose = 0, hard = 0, worst = 0, checked = 0;
  double worst_err = -1.0, diff2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (is_poison(want[i])) {
      if (!is_poison(got[i])) ++hard;  // written where the CPU op wrote nothing
      continue;
    }
    ++checked;
    const double w = want[i], g = got[i];
    if (!std::isfinite(g)) {
      ++hard;
      continue;
    }
    const double err = std::fabs(g - w);
    diff2 += err * err;
    ref2 += w * w;
    if (err > atol + rtol * std::fabs(w)) ++loose;
    if (err > 0.1 + 0.1 * std::fabs(w)) ++hard;
    if (err > worst_err) {
      worst_err = err;
      worst = i;
    }
  }
  const size_t allowed = std::max<size_t>(2, want.size() / 100000);
  EXPECT_EQ(hard, 0u) << what << ": " << hard << " elements beyond 0.1 + 0.1·|want| (or NaN, or written where "
                      << "nothing should be); worst at " << worst << ": cuda " << got[worst] << ", cpu " << want[worst];
  EXPECT_LE(loose, allowed) << what << ": " << loose << " of " << want.size() << " elements beyond atol " << atol
                            << " + rtol " << rtol << "·|want| (at most " << allowed << " allowed)";
  EXPECT_LE(std::sqrt(diff2 / std::max(ref2, 1e-30)), 1e-2) << what << ": relative L2 error";
  EXPECT_GT(checked, 0u) << what << ": the CPU op wrote nothing (vacuous comparison)";
}

// Integer outputs must be identical.
template <class I>
void expect_equal(const std::vector<I>& got, const std::vector<I>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i]) {
      if (bad == 0) first = i;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << want.size() << " differ; first at " << first << ": cuda "
                     << got[first] << ", cpu " << want[first];
}

}  // namespace hyserve::kernels::cuda_test
