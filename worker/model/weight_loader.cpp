#include "weight_loader.h"

#include <algorithm>
#include <cstring>

#include "hyserve/common/error.h"
#include "layers.h"

namespace hyserve::worker {

tensor weight_loader::load(const std::string& name, const shape_t& shape, dtype type) {
  return load_selection(name, shape, {}, type);
}

tensor weight_loader::load_slice(const std::string& name, const shape_t& full, int dim, int64_t begin, int64_t end,
                                 dtype type) {
  return load_selection(name, full, weight_selection{dim, {{begin, end}}}, type);
}

tensor weight_loader::load_row_ranges(const std::string& name, const shape_t& full,
                                      const std::vector<std::pair<int64_t, int64_t>>& ranges, dtype type) {
  return load_selection(name, full, weight_selection{0, ranges}, type);
}

tensor weight_loader::load_selection(const std::string& name, const shape_t& full, const weight_selection& sel,
                                     dtype type, const std::vector<float>& scale) {
  const bool scaled = std::any_of(scale.begin(), scale.end(), [](float s) { return s != 1.0f; });
  if (ctx_.device == device_kind::kCuda && !scaled) {
    // Allocated on the load's stream without the zero-fill: the source writes every element.
    kernels::allocation_stream_scope scope(ctx_.stream, /*zero_fill=*/false);
    tensor t(type, selected_shape(name, full, sel), device_kind::kCuda);
    if (ws_.load_to_device(name, full, sel, t, ctx_)) {
      kernels::stream_synchronize(ctx_.stream);
      bytes_ += t.nbytes();
      return t;
    }
  }
  tensor t;
  if (sel.ranges.empty())
    t = ws_.load(name, full);
  else if (sel.ranges.size() == 1)
    t = ws_.load_slice(name, full, sel.dim, sel.ranges[0].first, sel.ranges[0].second);
  else
    t = ws_.load_row_ranges(name, full, sel.ranges);
  if (scaled) {
    const int64_t rows = t.shape().ndim > 0 ? t.shape()[0] : 1;
    HYSERVE_CHECK(scale.size() == 1 || static_cast<int64_t>(scale.size()) == rows,
                  "weight_loader: " + std::to_string(scale.size()) + " scales for " + std::to_string(rows) + " rows of " +
                      name);
    const int64_t cols = rows > 0 ? t.numel() / rows : 0;
    float* p = t.as<float>();
    for (int64_t r = 0; r < rows; ++r) {
      const float s = scale.size() == 1 ? scale[0] : scale[static_cast<size_t>(r)];
      for (int64_t c = 0; c < cols; ++c) p[r * cols + c] *= s;
    }
  }
  layers::place_weight(t, ctx_.device, type);
  bytes_ += t.nbytes();
  return t;
}

tensor weight_loader::stack_rows(std::vector<tensor> parts) const { return stack(std::move(parts), 0); }

tensor weight_loader::stack_cols(std::vector<tensor> parts) const { return stack(std::move(parts), 1); }

// Parts of one type, device and extent along the other dimension, placed one after the other
// along `dim`: a part is a block of rows × its row bytes at its offset in the output; a block
// whose rows are the output's whole rows (dim 0) is one contiguous copy, else a 2D copy.
tensor weight_loader::stack(std::vector<tensor> parts, int dim) const {
  HYSERVE_CHECK(!parts.empty(), "weight_loader: nothing to stack");
  const tensor& first = parts.front();
  const int other = 1 - dim;
  const int64_t across = first.shape().ndim == 2 ? first.shape()[other] : -1;
  int64_t along = 0;
  for (const tensor& t : parts) {
    HYSERVE_CHECK(t.shape().ndim == 2 && t.shape()[other] == across && t.type() == first.type() &&
                      t.device() == first.device(),
                  "weight_loader: stacking " + t.shape().str() + (dim == 0 ? " under " : " beside ") +
                      first.shape().str());
    along += t.shape()[dim];
  }
  tensor out(first.type(), dim == 0 ? shape_t({along, across}) : shape_t({across, along}), first.device());
  const size_t es = dtype_size(out.type()), pitch = static_cast<size_t>(out.shape()[1]) * es;
  size_t at = 0;  // the part's first byte in the output
  for (tensor& t : parts) {
    const size_t width = static_cast<size_t>(t.shape()[1]) * es, rows = static_cast<size_t>(t.shape()[0]);
    char* dst = static_cast<char*>(out.data()) + at;
    const char* src = static_cast<const char*>(t.data());
    if (width == pitch) {
      if (t.nbytes() > 0) allocator_of(out.device()).copy_within(dst, src, t.nbytes());
    } else if (width > 0 && rows > 0) {
      if (out.device() == device_kind::kCuda) {
        kernels::device_copy_d2d_2d(dst, pitch, src, width, width, rows);
      } else {
        for (size_t r = 0; r < rows; ++r) std::memcpy(dst + r * pitch, src + r * width, width);
      }
    }
    at += dim == 0 ? t.nbytes() : width;
    t = tensor();
  }
  return out;
}

}  // namespace hyserve::worker
