#include "hyserve/kernels/sampling.h"

#include <limits>

#include "sampling_validate.h"
#include "dense_validate.h"
#include "validate.h"

namespace hyserve::kernels {

using namespace cpu_detail;

void run_cpu(const argmax_params& p) {
  constexpr const char* op = "argmax";
  check_argmax(p, op);

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

void run_cpu(const sample_rows_params& p) {
  if (!check_call(p)) return;
  for (int64_t r = 0; r < p.rows; ++r) check_sample_settings(p.settings[r]);
  // Rows are independent (each draw's counter is its own), so threads take them in any order.
#pragma omp parallel for schedule(dynamic, 1) if (p.rows > 1 && p.vocab >= 4096)
  for (int64_t r = 0; r < p.rows; ++r) {
    const sample_settings& s = p.settings[r];
    sample_params one;
    one.logits = p.logits + r * p.stride;
    one.vocab = p.vocab;
    one.temperature = s.temperature;
    one.top_k = s.top_k;
    one.top_p = s.top_p;
    one.seed = s.seed;
    one.counter = s.counter;
    one.want_logprob = s.want_logprob != 0;
    p.out[r] = sample_cpu(one);
  }
}

void run_cpu(const last_token_scatter_params& p) {
  if (!check_call(p)) return;
  for (int64_t r = 0; r < p.rows; ++r)
    if (p.slots[r] >= 0 && p.slots[r] < p.n_slots) p.last[p.slots[r]] = p.sampled[r].token;
}

void run_cpu(const token_resolve_params& p) {
  if (!check_call(p)) return;
  for (int64_t i = 0; i < p.n; ++i) {
    const int64_t slot = -static_cast<int64_t>(p.ids[i]) - 1;
    if (p.ids[i] < 0 && slot < p.n_slots) p.ids[i] = p.last[slot];
  }
}

}  // namespace hyserve::kernels
