#include "weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>

#include "hyserve/common/error.h"
#include "hyserve/common/safetensors.h"

namespace hyserve::worker {

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

 private:
  checkpoint ckpt_;
};

// splitmix64's finaliser over a counter: element i of a tensor depends only on (seed, name, i),
// so large tensors fill in parallel and the result does not depend on the thread count.
uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double unit_uniform(uint64_t h) { return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0); }

// Approximately N(0, stddev²): the Irwin–Hall sum of the hash's four 16-bit quarters (each
// uniform on [0, 1)), centred and scaled to unit variance. Cheap enough for 10⁹-element
// synthetic models; tails are bounded at ±2√3·stddev.
float approx_normal(uint64_t h, float stddev) {
  const float s = static_cast<float>((h & 0xffffu) + ((h >> 16) & 0xffffu) + ((h >> 32) & 0xffffu) + (h >> 48));
  return (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f * stddev;
}

// The elements of a tensor to generate: `outer` runs of `width` consecutive elements, run o
// starting at o · stride + offset of the whole tensor (a whole tensor is one run).
struct element_runs {
  int64_t outer = 1, width = 0, stride = 0, offset = 0;
  int64_t count() const { return outer * width; }
};

// p[o · width + c] = f(i, hash of element i) with i = o · stride + offset + c, the element's
// index in the whole tensor, so a shard equals the same part of the whole. Parallel for large
// tensors.
template <class F>
void fill_hashed(float* p, const element_runs& r, uint64_t base, F f) {
#pragma omp parallel for collapse(2) schedule(static) if (r.count() > (int64_t{1} << 16))
  for (int64_t o = 0; o < r.outer; ++o)
    for (int64_t c = 0; c < r.width; ++c) {
      const int64_t i = o * r.stride + r.offset + c;
      p[o * r.width + c] = f(i, mix64(base + static_cast<uint64_t>(i) * 0xd1b54a32d192ed03ull));
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

class synthetic_weights final : public weight_source {
 public:
  synthetic_weights(uint64_t seed, double residual_scale) : seed_(seed), residual_scale_(residual_scale) {}
  bool contains(const std::string&) const override { return true; }

  host_tensor load(const std::string& name, const shape_t& expected) const override {
    host_tensor t = host_tensor::f32(expected);
    generate(name, t.as<float>(), element_runs{1, t.numel(), t.numel(), 0});
    return t;
  }

  // Only the slice's elements are generated (each depends on its index in the whole tensor).
  host_tensor load_slice(const std::string& name, const shape_t& full, int dim, int64_t begin,
                         int64_t end) const override {
    if (dim < 0 || dim >= full.ndim || begin < 0 || end < begin || end > full[dim])
      throw invalid_argument_error("synthetic weight " + name + ": bad slice [" + std::to_string(begin) + ", " +
                                   std::to_string(end) + ") of dim " + std::to_string(dim) + " of " + full.str());
    shape_t out_shape = full;
    out_shape[dim] = end - begin;
    host_tensor out(dtype::kF32, out_shape);
    int64_t inner = 1;
    for (int i = dim + 1; i < full.ndim; ++i) inner *= full[i];
    const int64_t width = (end - begin) * inner;
    generate(name, out.as<float>(), element_runs{out.numel() / std::max<int64_t>(width, 1), width, full[dim] * inner, begin * inner});
    return out;
  }

 private:
  // Initialisation by role (see weights.h) of the elements `runs` selects.
  void generate(const std::string& name, float* p, const element_runs& runs) const {
    const uint64_t base = seed_ ^ fnv1a(name);
    if (ends_with(name, "norm.weight") || ends_with(name, "layernorm.weight")) {
      fill_hashed(p, runs, base, [](int64_t, uint64_t h) { return 1.0f + approx_normal(h, 0.05f); });
    } else if (ends_with(name, "A_log")) {
      fill_hashed(p, runs, base,
                  [](int64_t i, uint64_t) { return static_cast<float>(std::log(1.0 + static_cast<double>(i % 16))); });
    } else if (ends_with(name, ".D")) {
      fill_hashed(p, runs, base, [](int64_t, uint64_t) { return 1.0f; });
    } else if (ends_with(name, "dt_bias")) {
      fill_hashed(p, runs, base, [](int64_t, uint64_t h) {
        const double dt = std::exp(std::log(1e-3) + unit_uniform(h) * (std::log(1e-1) - std::log(1e-3)));
        return static_cast<float>(dt + std::log(-std::expm1(-dt)));  // softplus⁻¹(dt)
      });
    } else if (ends_with(name, "conv1d.weight")) {
      fill_hashed(p, runs, base, [](int64_t, uint64_t h) { return approx_normal(h, 0.2f); });
    } else if (ends_with(name, ".bias")) {
      fill_hashed(p, runs, base, [](int64_t, uint64_t h) { return approx_normal(h, 0.01f); });
    } else if (ends_with(name, "o_proj.weight") || ends_with(name, "out_proj.weight") ||
               ends_with(name, "down_proj.weight")) {
      const auto stddev = static_cast<float>(0.02 * residual_scale_);
      fill_hashed(p, runs, base, [stddev](int64_t, uint64_t h) { return approx_normal(h, stddev); });
    } else {
      fill_hashed(p, runs, base, [](int64_t, uint64_t h) { return approx_normal(h, 0.02f); });
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
