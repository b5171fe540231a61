#pragma once
// Loads a model's weights straight into place: each tensor in its storage type on the model's
// device. On CUDA the weight source writes the device tensor itself when it can
// (weight_source::load_to_device: synthetic weights generated on the device, checkpoint tensors
// streamed from the file); otherwise, and always on the CPU, the tensor is read on the host as
// f32, converted and copied (layers::place_weight). Counts the bytes placed, for progress.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "hyserve/common/tensor.h"
#include "hyserve/kernels/device.h"
#include "weights.h"

namespace hyserve::worker {

class weight_loader {
 public:
  weight_loader(const weight_source& ws, const kernels::exec_context& ctx) : ws_(ws), ctx_(ctx) {}

  // The whole tensor (shape `shape`) as `type` (f32 or bf16) on the device.
  tensor load(const std::string& name, const shape_t& shape, dtype type);
  // Indices [begin, end) of dimension `dim` of a tensor of full shape `full`.
  tensor load_slice(const std::string& name, const shape_t& full, int dim, int64_t begin, int64_t end, dtype type);
  // Rows of dimension 0 from several ranges, concatenated in order (weight_source::load_row_ranges).
  tensor load_row_ranges(const std::string& name, const shape_t& full,
                         const std::vector<std::pair<int64_t, int64_t>>& ranges, dtype type);

  // The same, scaled before it is stored (multipliers folded into a weight): `scale` has one
  // entry (the whole tensor) or one per row (dimension 0) of the loaded part; empty or all 1 = as
  // is. A scaled tensor is read on the host.
  tensor load_selection(const std::string& name, const shape_t& full, const weight_selection& sel, dtype type,
                        const std::vector<float>& scale = {});

  // Loaded tensors of one type and width stacked along dimension 0, in order, on the model's
  // device (the parts are freed): one weight for projections of the same input (q | k | v).
  tensor stack_rows(std::vector<tensor> parts) const;
  // The same along dimension 1 (parts of one height): one weight for projections whose inputs sit
  // side by side in one row (Falcon-H1's out_proj | o_proj over mamba y | attention heads).
  tensor stack_cols(std::vector<tensor> parts) const;

  uint64_t bytes() const { return bytes_; }  // placed so far
  device_kind device() const { return ctx_.device; }

 private:
  tensor stack(std::vector<tensor> parts, int dim) const;  // stack_rows (0), stack_cols (1)

  const weight_source& ws_;
  kernels::exec_context ctx_;
  uint64_t bytes_ = 0;
};

}  // namespace hyserve::worker
