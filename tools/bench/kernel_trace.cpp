// kernel_trace.h: CUPTI activity records of kind CONCURRENT_KERNEL, and their summary.
#include "bench/kernel_trace.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

#if defined(HYSERVE_HAVE_CUPTI)
#include <cupti.h>
#endif

namespace hyserve::bench {
namespace {

// "void ns::(anonymous namespace)::kernel<A, B>(args)" → "kernel<A, B>" (template arguments cut
// at 48 characters), for a mangled or plain name.
std::string short_name(const char* raw) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(abi::__cxa_demangle(raw, nullptr, nullptr, &status), std::free);
  std::string s = status == 0 && demangled ? demangled.get() : raw;
  // Cut the argument list: the last '(' at template depth 0.
  int depth = 0;
  size_t args = std::string::npos;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    else if (s[i] == '>') --depth;
    else if (s[i] == '(' && depth == 0 && s.compare(i, 20, "(anonymous namespace") != 0) args = i;
  }
  if (args != std::string::npos) s.erase(args);
  // Drop the return type and the namespaces before the kernel's own name (outside <...>).
  depth = 0;
  size_t begin = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    else if (s[i] == '>') --depth;
    else if (depth == 0 && (s[i] == ' ' || (s[i] == ':' && i + 1 < s.size() && s[i + 1] == ':'))) begin = i + 1;
  }
  if (begin < s.size() && s[begin] == ':') ++begin;
  s = s.substr(begin);
  const size_t lt = s.find('<');
  if (lt != std::string::npos && s.size() - lt > 48) s = s.substr(0, lt + 44) + "...>";
  return s;
}

#if defined(HYSERVE_HAVE_CUPTI)
std::mutex g_mutex;
std::vector<kernel_record> g_records;
constexpr size_t kBufferBytes = size_t{8} << 20;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  throw std::runtime_error(std::string("kernel trace: ") + what + ": " + (msg ? msg : "CUPTI error"));
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = kBufferBytes;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    g_records.push_back(kernel_record{short_name(k->name ? k->name : "?"), k->start, k->end});
  }
  std::free(buffer);
}
#endif

}  // namespace

#if defined(HYSERVE_HAVE_CUPTI)
bool kernel_trace_available() { return true; }

void kernel_trace_enable() {
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register callbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernel records");
}

void kernel_trace_start() {
  check(cuptiActivityFlushAll(1), "flush");
  std::lock_guard<std::mutex> lock(g_mutex);
  g_records.clear();
}

std::vector<kernel_record> kernel_trace_stop() {
  check(cuptiActivityFlushAll(1), "flush");
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<kernel_record> out;
  out.swap(g_records);
  std::sort(out.begin(), out.end(), [](const kernel_record& a, const kernel_record& b) { return a.start_ns < b.start_ns; });
  return out;
}
#else
bool kernel_trace_available() { return false; }
void kernel_trace_enable() { throw std::runtime_error("kernel trace: this build has no CUPTI"); }
void kernel_trace_start() { throw std::runtime_error("kernel trace: this build has no CUPTI"); }
std::vector<kernel_record> kernel_trace_stop() { throw std::runtime_error("kernel trace: this build has no CUPTI"); }
#endif

kernel_trace_summary summarize_kernel_trace(const std::vector<kernel_record>& records, int steps) {
  kernel_trace_summary out;
  if (records.empty() || steps <= 0) return out;
  // The steps ran one after the other with host work between them: `steps` equal runs of records
  // (sorted by start), each measured from its first kernel's start.
  const size_t per = records.size() / static_cast<size_t>(steps);
  out.separable = per > 0 && per * static_cast<size_t>(steps) == records.size();
  const int groups = out.separable ? steps : 1;
  const size_t group_size = out.separable ? per : records.size();
  struct agg {
    int64_t n = 0;
    uint64_t total_ns = 0, exclusive_ns = 0;
  };
  std::map<std::string, agg> by_name;
  uint64_t span = 0, busy = 0;
  for (int g = 0; g < groups; ++g) {
    const size_t first = static_cast<size_t>(g) * group_size, last = first + group_size;
    uint64_t covered_to = records[first].start_ns;
    for (size_t i = first; i < last; ++i) {
      const kernel_record& r = records[i];
      const uint64_t from = std::max(r.start_ns, covered_to);
      const uint64_t exclusive = r.end_ns > from ? r.end_ns - from : 0;
      busy += exclusive;
      covered_to = std::max(covered_to, r.end_ns);
      agg& a = by_name[r.name];
      ++a.n;
      a.total_ns += r.end_ns > r.start_ns ? r.end_ns - r.start_ns : 0;
      a.exclusive_ns += exclusive;
    }
    span += covered_to - records[first].start_ns;
  }
  const double per_step_us = 1e-3 / steps;
  out.kernels_per_step = static_cast<double>(records.size()) / steps;
  out.span_us_per_step = static_cast<double>(span) * per_step_us;
  out.busy_us_per_step = static_cast<double>(busy) * per_step_us;
  for (const auto& [name, a] : by_name)
    out.kernels.push_back({name, static_cast<double>(a.n) / steps, static_cast<double>(a.total_ns) * 1e-3 / static_cast<double>(a.n),
                           static_cast<double>(a.total_ns) * per_step_us, static_cast<double>(a.exclusive_ns) * per_step_us});
  std::stable_sort(out.kernels.begin(), out.kernels.end(),
                   [](const auto& x, const auto& y) { return x.exclusive_us_per_step > y.exclusive_us_per_step; });
  return out;
}

boost::json::object print_kernel_trace(const std::vector<kernel_record>& records, int steps, int top) {
  boost::json::object out;
  if (records.empty() || steps <= 0) {
    std::printf("  kernel trace: no kernel records\n");
    return out;
  }
  const kernel_trace_summary s = summarize_kernel_trace(records, steps);
  const double gaps = s.span_us_per_step - s.busy_us_per_step;
  std::printf("  kernel trace (%d steps, %.1f kernels a step%s): span %.1f us a step, kernels busy %.1f us, gaps %.1f us "
              "(%.1f%%)\n",
              steps, s.kernels_per_step, s.separable ? "" : ", steps not separable: span includes host time",
              s.span_us_per_step, s.busy_us_per_step, gaps, s.span_us_per_step > 0 ? 100.0 * gaps / s.span_us_per_step : 0.0);
  // "mean us": a record's length (with PDL, from its early start); "excl us a step": what the
  // kernel adds past its predecessors' ends, and its share of the busy time.
  std::printf("  %-64s %9s %9s %14s %7s\n", "kernel", "per step", "mean us", "excl us a step", "share");
  boost::json::array rows;
  for (size_t i = 0; i < s.kernels.size() && static_cast<int>(i) < top; ++i) {
    const auto& k = s.kernels[i];
    std::printf("  %-64s %9.1f %9.2f %14.1f %6.1f%%\n", k.name.c_str(), k.launches_per_step, k.mean_us, k.exclusive_us_per_step,
                s.busy_us_per_step > 0 ? 100.0 * k.exclusive_us_per_step / s.busy_us_per_step : 0.0);
    rows.push_back({{"kernel", k.name}, {"launches_per_step", k.launches_per_step}, {"mean_us", k.mean_us},
                    {"us_per_step", k.us_per_step}, {"exclusive_us_per_step", k.exclusive_us_per_step}});
  }
  out["span_us_per_step"] = s.span_us_per_step;
  out["busy_us_per_step"] = s.busy_us_per_step;
  out["kernels_per_step"] = s.kernels_per_step;
  out["kernels"] = std::move(rows);
  return out;
}

}  // namespace hyserve::bench
