#pragma once
// Where weights come from: a Hugging Face checkpoint directory or a seeded synthetic generator.
// Both hand out f32 host tensors by Hugging Face tensor name; a tensor-parallel shard reads only
// its slice. On CUDA both can also write a shard straight into a device tensor of the weight's
// storage type (load_to_device: synthetic weights generated on the device, checkpoint tensors
// streamed from the mapped file), which weight_loader.h prefers.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hyserve/common/tensor.h"
#include "hyserve/kernels/device.h"

namespace hyserve::worker {

// The part of a tensor a shard loads: ranges [begin, end) of dimension `dim`, concatenated in
// order (one range: a slice; several: e.g. the pieces of a fused projection; none: the whole
// tensor).
struct weight_selection {
  int dim = 0;
  std::vector<std::pair<int64_t, int64_t>> ranges;
};
// The shape of `sel` of a tensor of shape `full`; invalid_argument_error naming `name` for a
// dimension or range outside it.
shape_t selected_shape(const std::string& name, const shape_t& full, const weight_selection& sel);

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

  // Writes the selection `sel` of tensor `name` (full shape `full`) into `out`, a tensor of
  // selected_shape() on ctx.device whose type (f32 or bf16) is the storage wanted, and returns
  // true; returns false, touching nothing, when this source cannot (then the caller loads on the
  // host). The work is ordered on ctx.stream; the caller synchronises before using `out`.
  virtual bool load_to_device(const std::string& name, const shape_t& full, const weight_selection& sel, tensor& out,
                              const kernels::exec_context& ctx) const;
};

std::unique_ptr<weight_source> make_checkpoint_weights(const std::string& dir);

// Deterministic random weights: each tensor is generated from (seed, name) alone, so shards of
// every rank agree and the order of loading does not matter. Initialisation by role:
// norm weights 1 + N(0, 0.05²), A_log = log(1 + i mod 16), D = 1, dt_bias = softplus⁻¹ of dt in [1e-3, 1e-1],
// everything else N(0, 0.02²) (conv weights N(0, 0.2²)); the residual branches' output
// projections (names ending in o_proj.weight, out_proj.weight, down_proj.weight) N(0, (0.02·
// residual_scale)²).
std::unique_ptr<weight_source> make_synthetic_weights(uint64_t seed, double residual_scale = 1.0);

}  // namespace hyserve::worker
