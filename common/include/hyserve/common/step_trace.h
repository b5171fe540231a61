#pragma once
// A bounded in-memory trace of step-loop events (`scheduler.step_trace`), for finding where a
// served step's time goes between the coordinator and the workers. Each event is a steady-clock
// timestamp (the host's monotonic clock, so the traces of processes on one host line up), a
// name, a step id and two numbers; the trace is written as CSV (t_ns,event,step,a,b) when it is
// destroyed. Off (every call a branch) when the path is empty.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace hyserve {

class step_trace {
 public:
  step_trace() = default;
  explicit step_trace(std::string path, size_t capacity = size_t{1} << 18) { open(std::move(path), capacity); }
  // Starts tracing to path (empty: off).
  void open(std::string path, size_t capacity = size_t{1} << 18) {
    path_ = std::move(path);
    events_.clear();
    if (!path_.empty()) events_.reserve(capacity);
  }
  step_trace(const step_trace&) = delete;
  step_trace& operator=(const step_trace&) = delete;
  ~step_trace() { write(); }

  bool on() const { return !path_.empty(); }
  void add(const char* event, uint64_t step, int64_t a = 0, int64_t b = 0) {
    if (path_.empty() || events_.size() == events_.capacity()) return;
    const int64_t t = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
    events_.push_back(entry{t, event, step, a, b});
  }
  // Writes the CSV now (also done at destruction); later events are kept for the next write.
  void write() {
    if (path_.empty() || events_.empty()) return;
    if (FILE* f = std::fopen(path_.c_str(), "w")) {
      std::fprintf(f, "t_ns,event,step,a,b\n");
      for (const entry& e : events_)
        std::fprintf(f, "%lld,%s,%llu,%lld,%lld\n", static_cast<long long>(e.t_ns), e.event,
                     static_cast<unsigned long long>(e.step), static_cast<long long>(e.a), static_cast<long long>(e.b));
      std::fclose(f);
    }
  }

 private:
  struct entry {
    int64_t t_ns;
    const char* event;  // a string literal
    uint64_t step;
    int64_t a, b;
  };
  std::string path_;
  std::vector<entry> events_;
};

}  // namespace hyserve
