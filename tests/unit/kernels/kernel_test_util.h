#pragma once
// Helpers shared by the kernel tests: seeded random data, element-wise comparison with an
// absolute + relative tolerance, and a check that an op rejects a field by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "hyserve/common/error.h"
#include "test_data.h"

namespace hyserve::kernels::test {

// Shared with every suite (tests/support/test_data.h).
using test_support::expect_invalid;
using test_support::join;
using test_support::random_floats;
using test_support::round_bf16;
using test_support::to_bf16;

// Fails (once, with the worst element) unless |got[i] - want[i]| <= atol + rtol·|want[i]| for all i.
template <class Want>
void expect_close(const float* got, const Want* want, size_t n, double atol, double rtol, const std::string& what) {
  size_t bad = 0, worst = 0;
  double worst_excess = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double w = static_cast<double>(want[i]);
    const double err = std::fabs(static_cast<double>(got[i]) - w);
    const double excess = err - (atol + rtol * std::fabs(w));
    if (!(excess <= 0.0)) {  // also catches NaN
      if (bad == 0 || !(excess <= worst_excess)) {
        worst = i;
        worst_excess = excess;
      }
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << n << " elements out of tolerance (atol " << atol << ", rtol "
                     << rtol << "); worst at " << worst << ": got " << (n ? got[worst] : 0.0f) << ", want "
                     << (n ? static_cast<double>(want[worst]) : 0.0);
}

template <class Want>
void expect_close(const std::vector<float>& got, const std::vector<Want>& want, double atol, double rtol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  expect_close(got.data(), want.data(), got.size(), atol, rtol, what);
}

}  // namespace hyserve::kernels::test
