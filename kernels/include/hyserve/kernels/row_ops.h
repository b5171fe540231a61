#pragma once
// Row-wise glue ops of the model: weighted row accumulation (residual adds, MoE combine) and
// sigmoid output gating.
#include <cstdint>

namespace hyserve::kernels {

// out[dst(i), :] += w(i) · x[i, :] for i < rows, where
//   dst(i) = out_rows ? out_rows[i] : i                (out_rows entries must be distinct)
//   w(i)   = (weights ? weights[i] : 1) · (gate_logits ? sigmoid(gate_logits[i]) : 1)
struct row_add_params {
  const float* __restrict__ x = nullptr;              // [rows, cols], row stride x_stride
  float* out = nullptr;                               // [*, cols], row stride out_stride
  const int32_t* __restrict__ out_rows = nullptr;     // [rows]; null = identity
  const float* __restrict__ weights = nullptr;        // [rows]; null = 1
  const float* __restrict__ gate_logits = nullptr;    // [rows], stride gate_stride; null = no gate
  int64_t rows = 0, cols = 0;
  int64_t x_stride = 0, out_stride = 0, gate_stride = 1;
};

void run_cpu(const row_add_params& p);
void run_cuda(const row_add_params& p, void* stream = nullptr);

// MoE routing on the device (dense weights): for each token t, p = softmax(logits[t, :]) over
// the E experts; the top_k experts by p (ties to the lower index) get weight p_e, divided by the
// sum of the top_k p when norm_topk_prob; every other expert gets 0. Written expert-major,
// weights[e · weights_stride + t], so expert e's column is a row_add weights array.
struct moe_route_params {
  const float* __restrict__ logits = nullptr;  // [tokens, experts], row stride logits_stride
  float* __restrict__ weights = nullptr;       // [experts, weights_stride] (weights_stride >= tokens)
  int64_t tokens = 0, experts = 0, top_k = 1;
  int64_t logits_stride = 0, weights_stride = 0;
  bool norm_topk_prob = true;
};

void run_cpu(const moe_route_params& p);
void run_cuda(const moe_route_params& p, void* stream = nullptr);

// out[r, c] = x[r, c] · sigmoid(gate[r, c]). out may alias x.
struct sigmoid_mul_params {
  const float* x = nullptr;                   // [rows, cols], row stride x_stride
  const float* __restrict__ gate = nullptr;   // [rows, cols], row stride gate_stride
  float* out = nullptr;                       // [rows, cols], row stride out_stride
  int64_t rows = 0, cols = 0;
  int64_t x_stride = 0, gate_stride = 0, out_stride = 0;
};

void run_cpu(const sigmoid_mul_params& p);
void run_cuda(const sigmoid_mul_params& p, void* stream = nullptr);

}  // namespace hyserve::kernels
