#pragma once
// Where weights come from: a Hugging Face checkpoint directory or a seeded synthetic generator.
// Both hand out f32 host tensors by Hugging Face tensor name; a tensor-parallel shard reads only
// its slice.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hyserve/common/tensor.h"

namespace hyserve::worker {

class weight_source {
 public:
  virtual ~weight_source() = default;
  virtual bool contains(const std::string& name) const = 0;
  // The whole tensor; its shape must equal `expected`.
  virtual host_tensor load(const std::string& name, const shape_t& expected) const = 0;
  // Indices [begin, end) of dimension `dim` of a tensor whose full shape must equal `full`.
  virtual host_tensor load_slice(const std::string& name, const shape_t& full, int dim, int64_t begin,
                                 int64_t end) const = 0;

  // Rows of dimension 0 gathered from several ranges, concatenated in order (fused projections
  // whose shard is made of pieces, e.g. Mamba2 in_proj = [z | x | B | C | dt]).
  host_tensor load_row_ranges(const std::string& name, const shape_t& full,
                              const std::vector<std::pair<int64_t, int64_t>>& ranges) const;
};

std::unique_ptr<weight_source> make_checkpoint_weights(const std::string& dir);

// Deterministic random weights: each tensor is generated from (seed, name) alone, so shards of
// every rank agree and the order of loading does not matter. Initialisation by role:
// norm weights 1, A_log = log(1..heads), D = 1, dt_bias = softplus⁻¹ of dt in [1e-3, 1e-1],
// everything else N(0, 0.02²) (conv weights N(0, 0.2²)); the residual branches' output
// projections (names ending in o_proj.weight, out_proj.weight, down_proj.weight) N(0, (0.02·
// residual_scale)²).
std::unique_ptr<weight_source> make_synthetic_weights(uint64_t seed, double residual_scale = 1.0);

}  // namespace hyserve::worker
