// The kernel trace's summary (tools/bench/kernel_trace.h) on hand-made records: span, busy time,
// gaps, and per kernel its exclusive time, with overlapping (programmatic dependent launch) and
// disjoint records.
#include <gtest/gtest.h>

#include "bench/kernel_trace.h"

namespace hyserve::bench {
namespace {

const kernel_trace_summary::kernel& find(const kernel_trace_summary& s, const std::string& name) {
  for (const auto& k : s.kernels)
    if (k.name == name) return k;
  throw std::runtime_error("no kernel " + name);
}

// Two steps of three kernels (times in ns). Step 1: a [0, 10 µs], b starts early at 4 µs (PDL)
// and ends at 15 µs, a gap of 5 µs, c [20, 22 µs]. Step 2, 1 ms later, the same shifted.
std::vector<kernel_record> two_steps() {
  std::vector<kernel_record> r;
  for (uint64_t base : {uint64_t{0}, uint64_t{1'000'000}}) {
    r.push_back({"a", base + 0, base + 10'000});
    r.push_back({"b", base + 4'000, base + 15'000});
    r.push_back({"c", base + 20'000, base + 22'000});
  }
  return r;
}

TEST(KernelTrace, SpanBusyAndGapsPerStepLeaveOutTheHostTimeBetweenSteps) {
  const kernel_trace_summary s = summarize_kernel_trace(two_steps(), 2);
  EXPECT_TRUE(s.separable);
  EXPECT_DOUBLE_EQ(s.kernels_per_step, 3.0);
  EXPECT_DOUBLE_EQ(s.span_us_per_step, 22.0);  // 0 .. 22 µs, not the 1 ms between the steps
  EXPECT_DOUBLE_EQ(s.busy_us_per_step, 17.0);  // [0, 15] ∪ [20, 22]
}

TEST(KernelTrace, ExclusiveTimesAddUpToTheBusyTimeAndOverlapIsNotCountedTwice) {
  const kernel_trace_summary s = summarize_kernel_trace(two_steps(), 2);
  const auto& a = find(s, "a");
  const auto& b = find(s, "b");
  const auto& c = find(s, "c");
  EXPECT_DOUBLE_EQ(a.exclusive_us_per_step, 10.0);
  EXPECT_DOUBLE_EQ(b.exclusive_us_per_step, 5.0);  // 10 .. 15: its 6 µs beside a are a's time
  EXPECT_DOUBLE_EQ(c.exclusive_us_per_step, 2.0);
  EXPECT_DOUBLE_EQ(b.mean_us, 11.0);  // the record's own length, early start included
  EXPECT_DOUBLE_EQ(b.us_per_step, 11.0);
  EXPECT_DOUBLE_EQ(a.exclusive_us_per_step + b.exclusive_us_per_step + c.exclusive_us_per_step, s.busy_us_per_step);
  // Longest exclusive time first.
  ASSERT_EQ(s.kernels.size(), 3u);
  EXPECT_EQ(s.kernels[0].name, "a");
  EXPECT_EQ(s.kernels[1].name, "b");
  EXPECT_EQ(s.kernels[2].name, "c");
}

TEST(KernelTrace, AKernelInsideItsPredecessorAddsNothingAndLaunchesAreCountedPerStep) {
  // d lies wholly inside a (e.g. a short kernel on another stream): no exclusive time.
  const std::vector<kernel_record> r = {{"a", 0, 10'000}, {"d", 2'000, 3'000}, {"d", 12'000, 13'000}};
  const kernel_trace_summary s = summarize_kernel_trace(r, 1);
  const auto& d = find(s, "d");
  EXPECT_DOUBLE_EQ(d.launches_per_step, 2.0);
  EXPECT_DOUBLE_EQ(d.exclusive_us_per_step, 1.0);  // only the second one, past a's end
  EXPECT_DOUBLE_EQ(s.busy_us_per_step, 11.0);
  EXPECT_DOUBLE_EQ(s.span_us_per_step, 13.0);
}

TEST(KernelTrace, RecordsThatDoNotSplitIntoEqualStepsAreOneRun) {
  std::vector<kernel_record> r = two_steps();
  r.pop_back();  // 5 records, 2 steps
  const kernel_trace_summary s = summarize_kernel_trace(r, 2);
  EXPECT_FALSE(s.separable);
  EXPECT_DOUBLE_EQ(s.span_us_per_step, 1'015'000.0 * 1e-3 / 2);  // host time between the steps included
  EXPECT_TRUE(summarize_kernel_trace({}, 2).kernels.empty());
}

}  // namespace
}  // namespace hyserve::bench
