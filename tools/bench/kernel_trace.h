#pragma once
// Every kernel the device ran between kernel_trace_start() and kernel_trace_stop(), with its
// GPU start and end times, from CUPTI's activity records (graph replays included: each kernel
// node is one record). hyserve-bench-model --kernel-trace uses it to show where a decode step's
// time goes in graph mode: per kernel, and the gaps between kernels. Built with CUPTI where the
// CUDA toolkit has it; elsewhere kernel_trace_available() is false and the others throw.
#include <cstdint>
#include <string>
#include <vector>

#include <boost/json.hpp>

namespace hyserve::bench {

struct kernel_record {
  std::string name;  // demangled, namespaces and template arguments shortened
  uint64_t start_ns = 0, end_ns = 0;
};

bool kernel_trace_available();
// Turns the records on for the rest of the process: before the CUDA work to trace is set up
// (graphs instantiated before it may not be seen); the records cost every later kernel a little.
void kernel_trace_enable();
void kernel_trace_start();                       // drops the records so far
std::vector<kernel_record> kernel_trace_stop();  // the records since kernel_trace_start()

// The records of `steps` steps traced back to back, summed up. Per step: the span (first kernel
// start to last kernel end) and the busy time (the union of the kernels' intervals; the rest of
// the span is gaps). Per kernel name: launches and mean record length, and its exclusive time,
// what it adds to the busy time past every earlier kernel's end. With programmatic dependent
// launch a kernel's record starts while the previous kernel runs (it prefetches, then waits), so
// record lengths overlap and double count; exclusive times add up to the busy time.
struct kernel_trace_summary {
  struct kernel {
    std::string name;
    double launches_per_step = 0, mean_us = 0, us_per_step = 0, exclusive_us_per_step = 0;
  };
  bool separable = true;  // the records split into `steps` equal runs (else one run: span includes host time)
  double kernels_per_step = 0, span_us_per_step = 0, busy_us_per_step = 0;
  std::vector<kernel> kernels;  // longest exclusive time first
};
kernel_trace_summary summarize_kernel_trace(const std::vector<kernel_record>& records, int steps);

// Prints the summary (the `top` kernels of longest exclusive time) and returns it as JSON.
boost::json::object print_kernel_trace(const std::vector<kernel_record>& records, int steps, int top);

}  // namespace hyserve::bench
