// CUDA graph API of a build without the CUDA backend: every call that needs a device is an
// error naming the missing backend; releasing nothing is a no-op.
#include <string>

#include "hyserve/common/error.h"
#include "hyserve/kernels/graph.h"

namespace hyserve::kernels {

namespace {

[[noreturn]] void no_cuda(const char* what) {
  throw error(std::string(what) + ": this build has no CUDA backend (configure with HYSERVE_ENABLE_CUDA=ON)");
}

}  // namespace

void* pinned_alloc(size_t /*bytes*/) { no_cuda("pinned_alloc"); }
void pinned_free(void* /*p*/) noexcept {}
void copy_h2d_async(void*, const void*, size_t, void*) { no_cuda("copy_h2d_async"); }
void copy_d2h_async(void*, const void*, size_t, void*) { no_cuda("copy_d2h_async"); }
void copy_d2d_async(void*, const void*, size_t, void*) { no_cuda("copy_d2d_async"); }
void fill_zero_async(void*, size_t, void*) { no_cuda("fill_zero_async"); }
void stream_wait_legacy(void* /*stream*/) { no_cuda("stream_wait_legacy"); }

graph_arena::graph_arena(size_t /*bytes*/) { no_cuda("graph_arena"); }
graph_arena::~graph_arena() = default;
// Nothing allocates device memory here: the footprint stays 0.
arena_footprint::arena_footprint() = default;
arena_footprint::~arena_footprint() = default;
size_t arena_footprint::bytes() const { return 0; }
stream_event::stream_event() { no_cuda("stream_event"); }
stream_event::~stream_event() = default;
stream_event::stream_event(stream_event&& o) noexcept : event_(o.event_), device_(o.device_) { o.event_ = nullptr; }
stream_event& stream_event::operator=(stream_event&& o) noexcept {
  event_ = o.event_;
  device_ = o.device_;
  o.event_ = nullptr;
  return *this;
}
void stream_event::record(void* /*stream*/) { no_cuda("stream_event::record"); }
void stream_event::synchronize() const { no_cuda("stream_event::synchronize"); }
bool stream_event::ready() const { no_cuda("stream_event::ready"); }

captured_graph::~captured_graph() = default;
captured_graph::captured_graph(captured_graph&& o) noexcept : exec_(o.exec_), stats_(o.stats_) { o.exec_ = nullptr; }
captured_graph& captured_graph::operator=(captured_graph&& o) noexcept {
  exec_ = o.exec_;
  stats_ = o.stats_;
  o.exec_ = nullptr;
  return *this;
}
void captured_graph::launch(void* /*stream*/) const { no_cuda("captured_graph::launch"); }
void captured_graph::capture_begin(void* /*stream*/, graph_arena* /*arena*/) { no_cuda("captured_graph::capture_begin"); }
captured_graph captured_graph::capture_end(void* /*stream*/) { no_cuda("captured_graph::capture_end"); }
void captured_graph::capture_abort(void* /*stream*/) noexcept {}

gpu_timer::gpu_timer() { no_cuda("gpu_timer"); }
gpu_timer::~gpu_timer() = default;
void gpu_timer::start(void* /*stream*/) { no_cuda("gpu_timer::start"); }
void gpu_timer::stop(void* /*stream*/) { no_cuda("gpu_timer::stop"); }
double gpu_timer::elapsed_ms() const { no_cuda("gpu_timer::elapsed_ms"); }
double gpu_timer::since_ms(const gpu_timer& /*earlier*/) const { no_cuda("gpu_timer::since_ms"); }

bool profile_active() { return false; }
void profile_start(double /*hold_ms*/) { no_cuda("profile_start"); }
void profile_mark(const char* /*label*/, double /*bytes*/, void* /*stream*/) {}
std::vector<profile_segment> profile_stop() { return {}; }

}  // namespace hyserve::kernels
