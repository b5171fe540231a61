#include "hyserve/kernels/sampling.h"

#include <limits>

#include "validate.h"

namespace hyserve::kernels {

using namespace cpu_detail;

void run_cpu(const argmax_params& p) {
  constexpr const char* op = "argmax";
  require_ptr(p.logits, op, "logits");
  require_ptr(p.out, op, "out");
  require_positive(p.rows, op, "rows");
  require_positive(p.vocab, op, "vocab");
  require_stride(p.stride, p.vocab, op, "stride");
  if (p.vocab > std::numeric_limits<int32_t>::max()) fail(op, "vocab", p.vocab, "exceeds the int32 id range");

    // Strict '>' keeps the first of equal maxima (ties → lowest index). NaN never compares
    // greater, so NaN logits are never chosen; a row of only NaN / -inf gives 0.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* row = p.logits + r * p.stride;
    float best = -std::numeric_limits<float>::infinity();
    int64_t best_i = 0;
    for (int64_t v = 0; v < p.vocab; ++v) {
      if (row[v] > best) {
        best = row[v];
        best_i = v;
      }
    }
    p.out[r] = static_cast<int32_t>(best_i);
  }
}

}  // namespace hyserve::kernels
