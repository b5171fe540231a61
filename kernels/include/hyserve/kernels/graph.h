#pragma once
// CUDA graphs and the stream-ordered plumbing around them (docs/ARCHITECTURE.md, Model and kernels: decode replayed as
// CUDA graphs). Free of CUDA headers; without the CUDA backend every call that needs a device
// throws hyserve::error and the no-op destructors stay harmless.
//
// Capture contract: between capture_begin(s) and capture_end(s) the calling thread's tensor
// allocations are ordered on s (graph memory nodes, see allocation_stream_scope in device.h),
// or, when the capture has a graph_arena, carved from the arena (no memory node at all: the
// graph holds only the kernels, copies and memsets); every tensor allocated inside the capture
// must be released inside it; nothing may synchronise with the host (no synchronous copies, no
// reads of device data on the host).
// Tensors allocated inside a capture are NOT zero-filled (no memset node per activation): the
// captured code writes every element it reads; rows a kernel skips (padding rows) may hold
// stale values and must only flow into row-local ops whose rows are discarded.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hyserve::kernels {

// Page-locked host memory (async copies from/to it overlap nothing else but never stage).
void* pinned_alloc(size_t bytes);
void pinned_free(void* p) noexcept;

// Stream-ordered copies on `stream` (a cudaStream_t; null = legacy default stream).
void copy_h2d_async(void* dst, const void* src, size_t bytes, void* stream);
void copy_d2h_async(void* dst, const void* src, size_t bytes, void* stream);
void copy_d2d_async(void* dst, const void* src, size_t bytes, void* stream);
// Sets `bytes` bytes at dst to zero, ordered on `stream` (a memset node inside a capture).
void fill_zero_async(void* dst, size_t bytes, void* stream);
// Makes `stream` wait for everything queued so far on the legacy default stream (where the
// eager ops, the tensor allocator outside captures and the synchronous copies run).
void stream_wait_legacy(void* stream);

// Node counts of a captured graph, by kind.
struct graph_stats {
  int64_t kernels = 0, memsets = 0, memcpys = 0, mem_allocs = 0, mem_frees = 0, other = 0;
  int64_t arena_bytes = 0;  // bytes of the capture's arena its allocations used (not a node)
  int64_t total() const { return kernels + memsets + memcpys + mem_allocs + mem_frees + other; }
};

// Device memory (cudaMalloc, not pool memory) that captured graphs carve their allocations
// from: every allocation of a capture with an arena (tensors and op scratch) is placed in it by
// an offset_arena (offset_arena.h), first fit, reusing what the capture released before, so
// the graph bakes in addresses inside the arena. The arena must outlive every graph captured
// with it, and graphs that share one arena must never run concurrently (one stream, or
// otherwise ordered). Not copyable or movable: share it through a smart pointer.
class graph_arena {
 public:
  explicit graph_arena(size_t bytes);  // rounded up to offset_arena::kAlignment
  ~graph_arena();                      // cudaFree (which waits for the device)
  graph_arena(const graph_arena&) = delete;
  graph_arena& operator=(const graph_arena&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// While alive, measures the arena capacity the calling thread's device allocations (tensors
// and op scratch, made and released while it lives) need when placed by an offset_arena in the
// order they are made and released: run a step eagerly inside one, then capture the same step
// with a graph_arena of bytes() and every allocation of the capture fits (the placement
// depends only on the sequence). One per thread at a time.
class arena_footprint {
 public:
  arena_footprint();
  ~arena_footprint();
  arena_footprint(const arena_footprint&) = delete;
  arena_footprint& operator=(const arena_footprint&) = delete;
  size_t bytes() const;

 private:
  void* state_ = nullptr;
};

// A reusable event (no timing): recorded on a stream, waited for on the host, from any thread
// (synchronize makes the event's device the calling thread's current device first, so a helper
// thread never initialises a context on another device).
class stream_event {
 public:
  stream_event();
  ~stream_event();
  stream_event(stream_event&& o) noexcept;
  stream_event& operator=(stream_event&& o) noexcept;
  stream_event(const stream_event&) = delete;
  stream_event& operator=(const stream_event&) = delete;
  void record(void* stream);
  void synchronize() const;  // returns once the work before the last record has finished
  bool ready() const;        // that work has finished (never waits); true before any record

 private:
  void* event_ = nullptr;
  int device_ = 0;  // current at construction
};

// An instantiated graph (cudaGraphExec_t) captured from one stream; move-only.
class captured_graph {
 public:
  captured_graph() = default;
  ~captured_graph();
  captured_graph(captured_graph&& o) noexcept;
  captured_graph& operator=(captured_graph&& o) noexcept;
  captured_graph(const captured_graph&) = delete;
  captured_graph& operator=(const captured_graph&) = delete;

  bool valid() const { return exec_ != nullptr; }
  void launch(void* stream) const;
  const graph_stats& stats() const { return stats_; }

  // Starts capturing `stream` (thread-local capture mode) and orders this thread's tensor
  // allocations on it, without zero-fill, until capture_end / capture_abort. With an arena,
  // this thread's allocations (tensors and op scratch) are carved from it instead; those that
  // do not fit fall back to graph memory nodes (counted in the stats).
  static void capture_begin(void* stream, graph_arena* arena = nullptr);
  // Ends the capture and instantiates the graph; throws (after cleaning up) when the capture
  // was invalidated by an operation that cannot be captured, or when an allocation carved from
  // the arena was not released inside the capture.
  static captured_graph capture_end(void* stream);
  // Ends a capture that failed part-way (after an exception) and clears the sticky error.
  static void capture_abort(void* stream) noexcept;

 private:
  void* exec_ = nullptr;
  graph_stats stats_;
};

// GPU time between two points of one stream (cudaEvent pair).
class gpu_timer {
 public:
  gpu_timer();
  ~gpu_timer();
  gpu_timer(const gpu_timer&) = delete;
  gpu_timer& operator=(const gpu_timer&) = delete;
  void start(void* stream);
  void stop(void* stream);
  // Milliseconds from start to stop; waits for the stop event.
  double elapsed_ms() const;
  // Milliseconds from earlier's stop to this timer's start (both recorded on one stream, earlier
  // first); waits for this timer's start event.
  double since_ms(const gpu_timer& earlier) const;

 private:
  void* begin_ = nullptr;
  void* end_ = nullptr;
};

// Op-level GPU timing of one eager step (hyserve-bench-model --profile-step). Between
// profile_start and profile_stop, profile_mark records a cudaEvent on `stream` after the work
// queued so far; segment i is the GPU time from mark i-1 to mark i and carries mark i's label
// and byte count (what the ops queued in between must move). The first mark (label null) is
// the baseline: it first queues a host-side hold of hold_ms on the stream, so that the host
// queues the whole step while the device waits and the segments time the device work alone,
// not the host's launch rate. No host synchronisation until profile_stop, which waits for the
// last event. Off (profile_active() false) the marks cost one thread-local test.
struct profile_segment {
  std::string label;
  double ms = 0;
  double bytes = 0;
};
bool profile_active();
void profile_start(double hold_ms = 30.0);
void profile_mark(const char* label, double bytes, void* stream);
std::vector<profile_segment> profile_stop();

}  // namespace hyserve::kernels
