#pragma once
// Small helpers for loading tensor-parallel shards, shared by the layer builders.
#include <cstdint>
#include <string>

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

}  // namespace hyserve::worker
