#include "weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>

#include "hyserve/common/error.h"
#include "hyserve/common/safetensors.h"
#include "hyserve/kernels/run.h"
#include "hyserve/kernels/staged_upload.h"
#include "hyserve/kernels/synthetic.h"

namespace hyserve::worker {

shape_t selected_shape(const std::string& name, const shape_t& full, const weight_selection& sel) {
  if (sel.ranges.empty()) return full;
  if (sel.dim < 0 || sel.dim >= full.ndim)
    throw invalid_argument_error("weight " + name + ": selection dimension " + std::to_string(sel.dim) +
                                 " out of range for shape " + full.str());
  int64_t n = 0;
  for (const auto& [b, e] : sel.ranges) {
    if (b < 0 || e < b || e > full[sel.dim])
      throw invalid_argument_error("weight " + name + ": range [" + std::to_string(b) + ", " + std::to_string(e) +
                                   ") of dimension " + std::to_string(sel.dim) + " out of range for shape " +
                                   full.str());
    n += e - b;
  }
  shape_t out = full;
  out[sel.dim] = n;
  return out;
}

bool weight_source::load_to_device(const std::string&, const shape_t&, const weight_selection&, tensor&,
                                   const kernels::exec_context&) const {
  return false;
}

host_tensor weight_source::load_row_ranges(const std::string& name, const shape_t& full,
                                           const std::vector<std::pair<int64_t, int64_t>>& ranges) const {
  int64_t rows = 0;
  for (const auto& [b, e] : ranges) rows += e - b;
  const int64_t row_elems = full.numel() / std::max<int64_t>(full[0], 1);
  shape_t out_shape = full;
  out_shape[0] = rows;
  host_tensor out(dtype::kF32, out_shape);
  int64_t at = 0;
  for (const auto& [b, e] : ranges) {
    if (e == b) continue;
    host_tensor piece = load_slice(name, full, 0, b, e);
    std::memcpy(out.as<float>() + at * row_elems, piece.data(), piece.nbytes());
    at += e - b;
  }
  return out;
}

namespace {

// One range of a selection as runs over the whole tensor viewed as [outer, full[dim], inner]:
// `outer` runs of `width` elements, run o at o · stride + offset of the whole tensor and at
// o · out_stride + out_offset of the selection.
struct selection_run {
  int64_t outer = 1, width = 0, stride = 0, offset = 0, out_stride = 0, out_offset = 0;
};

std::vector<selection_run> selection_runs(const std::string& name, const shape_t& full, const weight_selection& sel) {
  const shape_t shape = selected_shape(name, full, sel);
  if (sel.ranges.empty()) return {selection_run{1, full.numel(), full.numel(), 0, full.numel(), 0}};
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < sel.dim; ++i) outer *= full[i];
  for (int i = sel.dim + 1; i < full.ndim; ++i) inner *= full[i];
  std::vector<selection_run> runs;
  int64_t at = 0;
  for (const auto& [b, e] : sel.ranges) {
    if (e > b)
      runs.push_back(selection_run{outer, (e - b) * inner, full[sel.dim] * inner, b * inner, shape[sel.dim] * inner,
                                   at * inner});
    at += e - b;
  }
  return runs;
}

class checkpoint_weights final : public weight_source {
 public:
  explicit checkpoint_weights(const std::string& dir) : ckpt_(checkpoint::open_dir(dir)) {}
  bool contains(const std::string& name) const override { return ckpt_.contains(name); }
  host_tensor load(const std::string& name, const shape_t& expected) const override {
    return ckpt_.load_f32(name, expected);
  }
  host_tensor load_slice(const std::string& name, const shape_t& full, int dim, int64_t begin,
                         int64_t end) const override {
    return ckpt_.load_f32_slice(name, full, dim, begin, end);
  }

  // Streams the selection's runs from the mapped file through pinned staging buffers,
  // converting to out's type on the device when the file stores another one.
  bool load_to_device(const std::string& name, const shape_t& full, const weight_selection& sel, tensor& out,
                      const kernels::exec_context& ctx) const override {
    if (ctx.device != device_kind::kCuda) return false;
    const safetensors_file& file = ckpt_.file_of(name);
    const tensor_info& info = file.info(name);
    if (info.type != dtype::kF32 && info.type != dtype::kBF16 && info.type != dtype::kF16)
      throw format_error(file.path() + ": tensor " + name + ": dtype " + std::string(dtype_name(info.type)) +
                         " cannot be loaded as a float weight (expected F32, BF16 or F16)");
    if (!(info.shape == full))
      throw format_error(file.path() + ": tensor " + name + ": expected shape " + full.str() + ", got " +
                         info.shape.str());
    if (!upload_) upload_ = std::make_unique<kernels::staged_upload>(ctx.stream);
    const auto* src = static_cast<const uint8_t*>(file.data(name));
    auto* dst = static_cast<uint8_t*>(out.data());
    for (const selection_run& r : selection_runs(name, full, sel))
      upload_->copy_runs(dst + r.out_offset * dtype_size(out.type()), out.type(), r.out_stride,
                         src + r.offset * dtype_size(info.type), info.type, r.stride, r.outer, r.width);
    return true;
  }

 private:
  checkpoint ckpt_;
  mutable std::unique_ptr<kernels::staged_upload> upload_;  // created by the first device load
};

double unit_uniform(uint64_t h) { return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0); }

// p[o · out_stride + out_offset + c] = f(i, hash of element i) with i = o · stride + offset + c,
// the element's index in the whole tensor, so a shard equals the same part of the whole (the
// roles that need double-precision transcendental functions, generated on the host only).
template <class F>
void fill_hashed(float* p, const selection_run& r, uint64_t base, F f) {
  for (int64_t o = 0; o < r.outer; ++o)
    for (int64_t c = 0; c < r.width; ++c) {
      const int64_t i = o * r.stride + r.offset + c;
      p[o * r.out_stride + r.out_offset + c] = f(i, kernels::synthetic::element_hash(base, i));
    }
}

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// How a tensor's elements are generated (the rules of weights.h): an element-wise hashed
// distribution (the synthetic_fill op, on any device), or one of the two roles that need
// double-precision transcendental functions (generated on the host only).
struct synthetic_role {
  enum class kind : uint8_t { kFill, kALog, kDtBias } what = kind::kFill;
  kernels::synthetic_dist dist = kernels::synthetic_dist::kNormal;
  float mean = 0.0f, stddev = 0.0f;
};

synthetic_role role_of(std::string_view name, double residual_scale) {
  using kernels::synthetic_dist;
  using kind = synthetic_role::kind;
  if (ends_with(name, "norm.weight") || ends_with(name, "layernorm.weight"))
    return {kind::kFill, synthetic_dist::kShiftedNormal, 1.0f, 0.05f};
  if (ends_with(name, "A_log")) return {kind::kALog};
  if (ends_with(name, ".D")) return {kind::kFill, synthetic_dist::kConstant, 1.0f, 0.0f};
  if (ends_with(name, "dt_bias")) return {kind::kDtBias};
  if (ends_with(name, "conv1d.weight")) return {kind::kFill, synthetic_dist::kNormal, 0.0f, 0.2f};
  if (ends_with(name, ".bias")) return {kind::kFill, synthetic_dist::kNormal, 0.0f, 0.01f};
  if (ends_with(name, "o_proj.weight") || ends_with(name, "out_proj.weight") || ends_with(name, "down_proj.weight"))
    return {kind::kFill, synthetic_dist::kNormal, 0.0f, static_cast<float>(0.02 * residual_scale)};
  return {kind::kFill, synthetic_dist::kNormal, 0.0f, 0.02f};
}

kernels::synthetic_fill_params fill_params(const synthetic_role& role, uint64_t base, const selection_run& r,
                                           void* out, dtype out_type) {
  kernels::synthetic_fill_params p;
  p.out = out;
  p.out_dtype = out_type;
  p.outer = r.outer;
  p.width = r.width;
  p.stride = r.stride;
  p.offset = r.offset;
  p.out_stride = r.out_stride;
  p.base = base;
  p.dist = role.dist;
  p.mean = role.mean;
  p.stddev = role.stddev;
  return p;
}

class synthetic_weights final : public weight_source {
 public:
  synthetic_weights(uint64_t seed, double residual_scale) : seed_(seed), residual_scale_(residual_scale) {}
  bool contains(const std::string&) const override { return true; }

  host_tensor load(const std::string& name, const shape_t& expected) const override {
    host_tensor t = host_tensor::f32(expected);
    for (const selection_run& r : selection_runs(name, expected, {})) generate(name, t.as<float>(), r);
    return t;
  }

  // Only the slice's elements are generated (each depends on its index in the whole tensor).
  host_tensor load_slice(const std::string& name, const shape_t& full, int dim, int64_t begin,
                         int64_t end) const override {
    const weight_selection sel{dim, {{begin, end}}};
    host_tensor out(dtype::kF32, selected_shape(name, full, sel));
    for (const selection_run& r : selection_runs(name, full, sel)) generate(name, out.as<float>(), r);
    return out;
  }

  // The hashed roles are generated on the device in out's type; A_log and dt_bias ([heads]
  // vectors) are left to the host.
  bool load_to_device(const std::string& name, const shape_t& full, const weight_selection& sel, tensor& out,
                      const kernels::exec_context& ctx) const override {
    const synthetic_role role = role_of(name, residual_scale_);
    if (ctx.device != device_kind::kCuda || role.what != synthetic_role::kind::kFill) return false;
    auto* dst = static_cast<uint8_t*>(out.data());
    for (const selection_run& r : selection_runs(name, full, sel))
      kernels::run(fill_params(role, base_of(name), r, dst + r.out_offset * dtype_size(out.type()), out.type()), ctx);
    return true;
  }

 private:
  uint64_t base_of(const std::string& name) const { return seed_ ^ fnv1a(name); }

  // Initialisation by role (see weights.h) of the elements `runs` selects.
  void generate(const std::string& name, float* p, const selection_run& runs) const {
    const uint64_t base = base_of(name);
    const synthetic_role role = role_of(name, residual_scale_);
    switch (role.what) {
      case synthetic_role::kind::kFill:
        kernels::run_cpu(fill_params(role, base, runs, p + runs.out_offset, dtype::kF32));
        return;
      case synthetic_role::kind::kALog:
        fill_hashed(p, runs, base, [](int64_t i, uint64_t) {
          return static_cast<float>(std::log(1.0 + static_cast<double>(i % 16)));
        });
        return;
      case synthetic_role::kind::kDtBias:
        fill_hashed(p, runs, base, [](int64_t, uint64_t h) {
          const double dt = std::exp(std::log(1e-3) + unit_uniform(h) * (std::log(1e-1) - std::log(1e-3)));
          return static_cast<float>(dt + std::log(-std::expm1(-dt)));  // softplus⁻¹(dt)
        });
        return;
    }
  }

  uint64_t seed_;
  double residual_scale_;
};

}  // namespace

std::unique_ptr<weight_source> make_checkpoint_weights(const std::string& dir) {
  return std::make_unique<checkpoint_weights>(dir);
}

std::unique_ptr<weight_source> make_synthetic_weights(uint64_t seed, double residual_scale) {
  return std::make_unique<synthetic_weights>(seed, residual_scale);
}

}  // namespace hyserve::worker
