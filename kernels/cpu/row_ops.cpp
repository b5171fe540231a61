#include "hyserve/kernels/row_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "dense_validate.h"
#include "validate.h"

namespace hyserve::kernels {

using namespace cpu_detail;

namespace {

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

}  // namespace

void run_cpu(const row_add_params& p) {
  constexpr const char* op = "row_add";
  check_row_add(p, op);
  if (p.out_rows)
    for (int64_t i = 0; i < p.rows; ++i) require_non_negative(p.out_rows[i], op, "out_rows[i]");

#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < p.rows; ++i) {
    float w = p.weights ? p.weights[i] : 1.0f;
    if (p.gate_logits) w *= sigmoid(p.gate_logits[i * p.gate_stride]);
    const float* x = p.x + i * p.x_stride;
    float* o = p.out + (p.out_rows ? p.out_rows[i] : i) * p.out_stride;
    for (int64_t c = 0; c < p.cols; ++c) o[c] += w * x[c];
  }
}

void run_cpu(const moe_route_params& p) {
  check_moe_route(p, "moe_route");

  std::vector<float> prob(static_cast<size_t>(p.experts));
  std::vector<uint8_t> taken(static_cast<size_t>(p.experts));
  for (int64_t t = 0; t < p.tokens; ++t) {
    const float* l = p.logits + t * p.logits_stride;
    float mx = l[0];
    for (int64_t e = 1; e < p.experts; ++e) mx = std::max(mx, l[e]);
    float sum = 0.0f;
    for (int64_t e = 0; e < p.experts; ++e) sum += (prob[static_cast<size_t>(e)] = std::exp(l[e] - mx));
    for (float& v : prob) v /= sum;
    std::fill(taken.begin(), taken.end(), uint8_t{0});
    float top_sum = 0.0f;
    for (int64_t j = 0; j < p.top_k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < p.experts; ++e)
        if (!taken[static_cast<size_t>(e)] && (best < 0 || prob[static_cast<size_t>(e)] > prob[static_cast<size_t>(best)]))
          best = e;
      taken[static_cast<size_t>(best)] = 1;
      top_sum += prob[static_cast<size_t>(best)];
    }
    for (int64_t e = 0; e < p.experts; ++e) {
      const float v = prob[static_cast<size_t>(e)];
      p.weights[e * p.weights_stride + t] = taken[static_cast<size_t>(e)] ? (p.norm_topk_prob ? v / top_sum : v) : 0.0f;
    }
  }
}

void run_cpu(const sigmoid_mul_params& p) {
  constexpr const char* op = "sigmoid_mul";
  check_sigmoid_mul(p, op);

#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * p.x_stride;
    const float* g = p.gate + r * p.gate_stride;
    float* o = p.out + r * p.out_stride;
    for (int64_t c = 0; c < p.cols; ++c) o[c] = x[c] * sigmoid(g[c]);
  }
}

}  // namespace hyserve::kernels
