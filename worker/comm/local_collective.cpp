#include <algorithm>

#include "hyserve/worker/collective.h"

namespace hyserve::worker {
namespace {

class local_collective final : public collective {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(float*, int64_t) override {}
  void all_gather(const float* in, float* out, int64_t n_per_rank) override {
    if (in != out) std::copy(in, in + n_per_rank, out);
  }
  void broadcast(void*, size_t, int) override {}
};

}  // namespace

std::unique_ptr<collective> make_local_collective() { return std::make_unique<local_collective>(); }

}  // namespace hyserve::worker
