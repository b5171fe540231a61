#include "hyserve/kernels/row_ops.h"

#include <cmath>

#include "validate.h"

namespace hyserve::kernels {

using namespace cpu_detail;

namespace {

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

}  // namespace

void run_cpu(const row_add_params& p) {
  constexpr const char* op = "row_add";
  require_ptr(p.x, op, "x");
  require_ptr(p.out, op, "out");
  require_non_negative(p.rows, op, "rows");
  require_non_negative(p.cols, op, "cols");
  require_stride(p.x_stride, p.cols, op, "x_stride");
  require_stride(p.out_stride, p.cols, op, "out_stride");
  if (p.gate_logits) require_positive(p.gate_stride, op, "gate_stride");
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

void run_cpu(const sigmoid_mul_params& p) {
  constexpr const char* op = "sigmoid_mul";
  require_ptr(p.x, op, "x");
  require_ptr(p.gate, op, "gate");
  require_ptr(p.out, op, "out");
  require_non_negative(p.rows, op, "rows");
  require_non_negative(p.cols, op, "cols");
  require_stride(p.x_stride, p.cols, op, "x_stride");
  require_stride(p.gate_stride, p.cols, op, "gate_stride");
  require_stride(p.out_stride, p.cols, op, "out_stride");

#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * p.x_stride;
    const float* g = p.gate + r * p.gate_stride;
    float* o = p.out + r * p.out_stride;
    for (int64_t c = 0; c < p.cols; ++c) o[c] = x[c] * sigmoid(g[c]);
  }
}

}  // namespace hyserve::kernels
