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

// Prints, for `steps` steps traced back to back: per step the span (first kernel start to last
// kernel end), the time covered by kernels and the gaps between them; per kernel name the
// launches per step, the mean duration and its share of the busy time (the `top` longest).
// Returns the same as JSON.
boost::json::object print_kernel_trace(const std::vector<kernel_record>& records, int steps, int top);

}  // namespace hyserve::bench
