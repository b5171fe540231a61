// CUDA graphs, pinned memory, async copies and event timing (hyserve/kernels/graph.h).
#include "hyserve/kernels/graph.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "check.h"
#include "hyserve/kernels/device.h"
#include "hyserve/kernels/offset_arena.h"
#include "stream_alloc.h"

namespace hyserve::kernels {

namespace {

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// One allocation-stream scope per capturing thread, alive from capture_begin to capture_end.
thread_local std::unique_ptr<allocation_stream_scope> t_capture_scope;

graph_stats count_nodes(cudaGraph_t graph) {
  graph_stats s;
  size_t n = 0;
  CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    switch (type) {
      case cudaGraphNodeTypeKernel: ++s.kernels; break;
      case cudaGraphNodeTypeMemset: ++s.memsets; break;
      case cudaGraphNodeTypeMemcpy: ++s.memcpys; break;
      case cudaGraphNodeTypeMemAlloc: ++s.mem_allocs; break;
      case cudaGraphNodeTypeMemFree: ++s.mem_frees; break;
      default: ++s.other; break;
    }
  }
  return s;
}

}  // namespace

void* pinned_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  CUDA_CHECK(cudaMallocHost(&p, bytes));
  return p;
}

void pinned_free(void* p) noexcept {
  if (p == nullptr) return;
  const cudaError_t status = cudaFreeHost(p);
  if (status != cudaSuccess) std::cerr << "pinned_free: cudaFreeHost failed: " << cudaGetErrorString(status) << "\n";
}

void copy_h2d_async(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, as_stream(stream)));
}

void copy_d2h_async(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, as_stream(stream)));
  cuda_detail::count_device_to_host(bytes);
}

void copy_d2d_async(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, as_stream(stream)));
}

void fill_zero_async(void* dst, size_t bytes, void* stream) {
  if (bytes) CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, as_stream(stream)));
}

void stream_wait_legacy(void* stream) {
  // One event per thread, reused: recording overwrites the previous capture of the event.
  thread_local cudaEvent_t event = [] {
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }();
  CUDA_CHECK(cudaEventRecord(event, cudaStreamLegacy));
  CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream), event, 0));
}

graph_arena::graph_arena(size_t bytes) : bytes_(offset_arena::rounded(bytes)) { data_ = device_alloc(bytes_); }

graph_arena::~graph_arena() { device_free(data_); }

stream_event::stream_event() {
  CUDA_CHECK(cudaGetDevice(&device_));
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  event_ = e;
}

stream_event::~stream_event() {
  if (event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

stream_event::stream_event(stream_event&& o) noexcept
    : event_(std::exchange(o.event_, nullptr)), device_(o.device_) {}

stream_event& stream_event::operator=(stream_event&& o) noexcept {
  if (this != &o) {
    if (event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
    event_ = std::exchange(o.event_, nullptr);
    device_ = o.device_;
  }
  return *this;
}

void stream_event::record(void* stream) {
  HYSERVE_CHECK(event_ != nullptr, "stream_event::record: moved-from event");
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), as_stream(stream)));
}

void stream_event::synchronize() const {
  HYSERVE_CHECK(event_ != nullptr, "stream_event::synchronize: moved-from event");
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device_) CUDA_CHECK(cudaSetDevice(device_));
  CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
}

bool stream_event::ready() const {
  HYSERVE_CHECK(event_ != nullptr, "stream_event::ready: moved-from event");
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device_) CUDA_CHECK(cudaSetDevice(device_));
  const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event_));
  if (status == cudaErrorNotReady) return false;
  CUDA_CHECK(status);
  return true;
}

captured_graph::~captured_graph() {
  if (exec_ == nullptr) return;
  const cudaError_t status = cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (status != cudaSuccess) std::cerr << "cudaGraphExecDestroy failed: " << cudaGetErrorString(status) << "\n";
}

captured_graph::captured_graph(captured_graph&& o) noexcept
    : exec_(std::exchange(o.exec_, nullptr)), stats_(o.stats_) {}

captured_graph& captured_graph::operator=(captured_graph&& o) noexcept {
  if (this != &o) {
    captured_graph old(std::move(*this));
    exec_ = std::exchange(o.exec_, nullptr);
    stats_ = o.stats_;
  }
  return *this;
}

void captured_graph::launch(void* stream) const {
  HYSERVE_CHECK(exec_ != nullptr, "captured_graph::launch: no graph");
  CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), as_stream(stream)));
}

void captured_graph::capture_begin(void* stream, graph_arena* arena) {
  HYSERVE_CHECK(stream != nullptr, "capture_begin: the legacy default stream cannot be captured");
  HYSERVE_CHECK(!t_capture_scope, "capture_begin: this thread is already capturing");
  HYSERVE_CHECK(!cuda_detail::arena_bound(), "capture_begin: this thread already allocates from an arena");
  CUDA_CHECK(cudaStreamBeginCapture(as_stream(stream), cudaStreamCaptureModeThreadLocal));
  t_capture_scope = std::make_unique<allocation_stream_scope>(stream, /*zero_fill=*/false);
  if (arena != nullptr) cuda_detail::arena_bind(arena->data(), arena->bytes());
}

captured_graph captured_graph::capture_end(void* stream) {
  const cuda_detail::arena_result used = cuda_detail::arena_unbind();
  t_capture_scope.reset();
  cudaGraph_t graph = nullptr;
  const cudaError_t status = cudaStreamEndCapture(as_stream(stream), &graph);
  if (status != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    cuda_detail::throw_cuda_error(status, "cudaStreamEndCapture", __FILE__, __LINE__);
  }
  if (used.live_blocks > 0) {
    // A replay would hand those bytes to the captured code again while someone still holds them.
    cudaGraphDestroy(graph);
    throw error("capture_end: " + std::to_string(used.live_blocks) +
                " allocations carved from the graph arena outlive the capture");
  }
  captured_graph out;
  try {
    out.stats_ = count_nodes(graph);
    out.stats_.arena_bytes = static_cast<int64_t>(used.peak);
    cudaGraphExec_t exec = nullptr;
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    out.exec_ = exec;
  } catch (...) {
    cudaGraphDestroy(graph);
    throw;
  }
  CUDA_CHECK(cudaGraphDestroy(graph));
  return out;
}

void captured_graph::capture_abort(void* stream) noexcept {
  cuda_detail::arena_unbind();
  t_capture_scope.reset();
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(as_stream(stream), &st) == cudaSuccess && st != cudaStreamCaptureStatusNone) {
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(as_stream(stream), &graph);
    if (graph) cudaGraphDestroy(graph);
  }
  cudaGetLastError();
}

gpu_timer::gpu_timer() {
  cudaEvent_t b = nullptr, e = nullptr;
  CUDA_CHECK(cudaEventCreate(&b));
  const cudaError_t status = cudaEventCreate(&e);
  if (status != cudaSuccess) {
    cudaEventDestroy(b);
    CUDA_CHECK(status);
  }
  begin_ = b;
  end_ = e;
}

gpu_timer::~gpu_timer() {
  cudaEventDestroy(static_cast<cudaEvent_t>(begin_));
  cudaEventDestroy(static_cast<cudaEvent_t>(end_));
}

void gpu_timer::start(void* stream) { CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(begin_), as_stream(stream))); }
void gpu_timer::stop(void* stream) { CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(end_), as_stream(stream))); }

double gpu_timer::elapsed_ms() const {
  CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(end_)));
  float ms = 0.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(begin_), static_cast<cudaEvent_t>(end_)));
  return ms;
}

double gpu_timer::since_ms(const gpu_timer& earlier) const {
  CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(begin_)));
  float ms = 0.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(earlier.end_), static_cast<cudaEvent_t>(begin_)));
  return ms;
}

namespace {

// The profile of this thread: its events (one per mark) and their labels and bytes.
struct step_profile {
  bool active = false;
  double hold_ms = 0;
  cudaStream_t stream = nullptr;
  std::vector<cudaEvent_t> events;
  std::vector<std::string> labels;
  std::vector<double> bytes;
  ~step_profile() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }
};
thread_local step_profile t_profile;

void CUDART_CB hold_host(void* ms) {
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(*static_cast<double*>(ms)));
}

}  // namespace

bool profile_active() { return t_profile.active; }

void profile_start(double hold_ms) {
  HYSERVE_CHECK(!t_profile.active, "profile_start: a profile is already active on this thread");
  for (cudaEvent_t e : t_profile.events) cudaEventDestroy(e);
  t_profile.events.clear();
  t_profile.labels.clear();
  t_profile.bytes.clear();
  t_profile.hold_ms = hold_ms;
  t_profile.active = true;
}

void profile_mark(const char* label, double bytes, void* stream) {
  step_profile& p = t_profile;
  if (!p.active) return;
  if (p.events.empty()) {
    if (label != nullptr) return;  // marks before the baseline are not part of the step
    p.stream = as_stream(stream);
    if (p.hold_ms > 0) CUDA_CHECK(cudaLaunchHostFunc(p.stream, hold_host, &p.hold_ms));
  } else if (label == nullptr) {
    return;  // one baseline per profile
  }
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreate(&e));
  p.events.push_back(e);
  p.labels.emplace_back(label ? label : "");
  p.bytes.push_back(bytes);
  CUDA_CHECK(cudaEventRecord(e, as_stream(stream)));
}

std::vector<profile_segment> profile_stop() {
  step_profile& p = t_profile;
  p.active = false;
  std::vector<profile_segment> out;
  if (p.events.empty()) return out;
  CUDA_CHECK(cudaEventSynchronize(p.events.back()));
  for (size_t i = 1; i < p.events.size(); ++i) {
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, p.events[i - 1], p.events[i]));
    out.push_back(profile_segment{p.labels[i], ms, p.bytes[i]});
  }
  for (cudaEvent_t e : p.events) cudaEventDestroy(e);
  p.events.clear();
  p.labels.clear();
  p.bytes.clear();
  return out;
}

}  // namespace hyserve::kernels
