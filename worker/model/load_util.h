#pragma once
// Small helpers for loading tensor-parallel shards, shared by the layer builders.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "hyserve/common/error.h"
#include "hyserve/common/tensor.h"
#include "weights.h"

namespace hyserve::worker {

// Splits n into tp equal parts; a dimension that does not divide is a startup error naming it.
inline int64_t tp_split(int64_t n, int tp, const char* what) {
  if (n % tp != 0)
    throw config_error(std::string("tensor parallelism: ") + what + " = " + std::to_string(n) +
                       " is not divisible by tp = " + std::to_string(tp));
  return n / tp;
}

// The KV heads rank `rank` of `tp` keeps: an equal share when tp divides kv_heads, else (tp a
// multiple of kv_heads) the one KV head its query heads read, replicated over ranks.
struct kv_head_range {
  int64_t first = 0, count = 0;
};
inline kv_head_range tp_kv_heads(int64_t q_heads, int64_t kv_heads, int rank, int tp) {
  if (kv_heads % tp == 0) return {rank * (kv_heads / tp), kv_heads / tp};
  if (tp % kv_heads == 0) return {(rank * (q_heads / tp)) / (q_heads / kv_heads), 1};
  throw config_error("tensor parallelism: num_key_value_heads = " + std::to_string(kv_heads) +
                     " neither divides nor is divisible by tp = " + std::to_string(tp));
}

// A zero-centred RMSNorm weight (the norm scales by 1 + w) loaded as the plain weight 1 + w, so
// the ordinary rmsnorm op applies it.
inline host_tensor load_zero_centered_norm(const weight_source& ws, const std::string& name, int64_t dim) {
  host_tensor w = ws.load(name, {dim});
  float* p = w.as<float>();
  for (int64_t i = 0; i < dim; ++i) p[i] += 1.0f;
  return w;
}

// Progress of a model's weight loading, on stderr: nothing for a load that takes under two
// seconds (tiny models, tests); otherwise a line at most every five seconds ("Bamba, 32 layers:
// weights 12/32 layers, 14.2 s") and one when done, with the total time.
class load_progress {
 public:
  load_progress(std::string label, int64_t layers) : label_(std::move(label)), layers_(layers) {}
  ~load_progress() {
    const double s = elapsed();
    if (s >= kQuiet) std::fprintf(stderr, "hyserve: %s: weights loaded and placed in %.1f s\n", label_.c_str(), s);
  }
  load_progress(const load_progress&) = delete;
  load_progress& operator=(const load_progress&) = delete;
  // Layer `done` (1-based) is loaded and placed.
  void layer_done(int64_t done) {
    const double s = elapsed();
    if (s < kQuiet || s - last_ < kEvery) return;
    last_ = s;
    std::fprintf(stderr, "hyserve: %s: weights %lld/%lld layers, %.1f s\n", label_.c_str(), static_cast<long long>(done),
                 static_cast<long long>(layers_), s);
  }

 private:
  static constexpr double kQuiet = 2.0, kEvery = 5.0;
  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  std::string label_;
  int64_t layers_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double last_ = 0;
};

}  // namespace hyserve::worker
