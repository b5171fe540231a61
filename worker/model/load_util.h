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

// Progress of a model's weight loading, on stderr: a line at most every two seconds
// ("Bamba, 32 layers: loaded 12/32 layers, 7.3 GB, 4.1 GB/s") and one when done ("weights
// loaded in 4.6 s (19.5 GB, 4.2 GB/s)"); nothing for a small, fast load (tiny models, tests).
// Bytes are those placed on the model's device (weight_loader::bytes); a model that does not
// count them passes none and gets times only.
class load_progress {
 public:
  load_progress(std::string label, int64_t layers) : label_(std::move(label)), layers_(layers) {}
  ~load_progress() {
    const double s = elapsed();
    if (s < kQuiet && bytes_ < kQuietBytes) return;
    if (bytes_ > 0)
      std::fprintf(stderr, "hyserve: %s: weights loaded in %.1f s (%.1f GB, %.1f GB/s)\n", label_.c_str(), s,
                   bytes_ * 1e-9, rate(s));
    else
      std::fprintf(stderr, "hyserve: %s: weights loaded in %.1f s\n", label_.c_str(), s);
  }
  load_progress(const load_progress&) = delete;
  load_progress& operator=(const load_progress&) = delete;
  // Layer `done` (1-based) is loaded and placed; `bytes` placed so far (0: not counted).
  void layer_done(int64_t done, uint64_t bytes = 0) {
    bytes_ = static_cast<double>(bytes);
    const double s = elapsed();
    if (s - last_ < kEvery) return;
    last_ = s;
    if (bytes_ > 0)
      std::fprintf(stderr, "hyserve: %s: loaded %lld/%lld layers, %.1f GB, %.1f GB/s\n", label_.c_str(),
                   static_cast<long long>(done), static_cast<long long>(layers_), bytes_ * 1e-9, rate(s));
    else
      std::fprintf(stderr, "hyserve: %s: loaded %lld/%lld layers, %.1f s\n", label_.c_str(),
                   static_cast<long long>(done), static_cast<long long>(layers_), s);
  }

 private:
  static constexpr double kQuiet = 2.0, kEvery = 2.0, kQuietBytes = 1e9;
  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  double rate(double s) const { return s > 0 ? bytes_ * 1e-9 / s : 0.0; }
  std::string label_;
  int64_t layers_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double last_ = 0, bytes_ = 0;
};

}  // namespace hyserve::worker
