// all_reduce_sum as all_gather and then each element's sum in rank order (collective.h).
#include <string>

#include "hyserve/common/error.h"
#include "hyserve/common/tensor.h"
#include "hyserve/kernels/device.h"
#include "hyserve/kernels/row_ops.h"
#include "hyserve/kernels/run.h"
#include "hyserve/worker/collective.h"

namespace hyserve::worker {
namespace {

class rank_ordered_collective final : public collective {
 public:
  rank_ordered_collective(std::unique_ptr<collective> inner, device_kind device)
      : inner_(std::move(inner)), ctx_{device, nullptr, {}} {
    if (!inner_) throw invalid_argument_error("rank-ordered collective: no inner collective");
  }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

  void all_reduce_sum(float* data, int64_t n) override {
    if (n < 0) throw invalid_argument_error("all_reduce_sum: n must be >= 0");
    const int ranks = inner_->size();
    if (n == 0 || ranks == 1) return;
    tensor all = tensor::f32({int64_t{ranks} * n}, ctx_.device);
    inner_->all_gather(data, all.as<float>(), n);
    // data = x0, then data += x1, += x2, ...: one order for every element, whatever n is.
    if (ctx_.device == device_kind::kCpu) {
      const float* x0 = all.as<float>();
      for (int64_t i = 0; i < n; ++i) data[i] = x0[i];
    } else {
      kernels::device_copy_d2d(data, all.as<float>(), static_cast<size_t>(n) * sizeof(float));
    }
    for (int r = 1; r < ranks; ++r) {
      kernels::row_add_params p;
      p.x = all.as<float>() + int64_t{r} * n;
      p.out = data;
      p.rows = 1;
      p.cols = n;
      p.x_stride = p.out_stride = n;
      kernels::run(p, ctx_);
    }
  }
  void all_gather(const float* in, float* out, int64_t n_per_rank) override { inner_->all_gather(in, out, n_per_rank); }
  void broadcast(void* data, size_t bytes, int root) override { inner_->broadcast(data, bytes, root); }

 private:
  std::unique_ptr<collective> inner_;
  kernels::exec_context ctx_;
};

}  // namespace

std::unique_ptr<collective> make_rank_ordered_collective(std::unique_ptr<collective> inner, device_kind device) {
  return std::make_unique<rank_ordered_collective>(std::move(inner), device);
}

}  // namespace hyserve::worker
