#pragma once
// SwiGLU: out[t, i] = silu(gate[t, i]) · up[t, i].
#include <cstdint>

namespace hyserve::kernels {

struct swiglu_params {
  const float* __restrict__ gate = nullptr;  // [rows, cols], row stride gate_stride
  const float* __restrict__ up = nullptr;    // [rows, cols], row stride up_stride
  float* __restrict__ out = nullptr;         // [rows, cols], row stride out_stride
  int64_t rows = 0, cols = 0;
  int64_t gate_stride = 0, up_stride = 0, out_stride = 0;
};

void run_cpu(const swiglu_params& p);
void run_cuda(const swiglu_params& p, void* stream = nullptr);

// Squared ReLU in place (Nemotron-H MLP): x[t, i] = max(x[t, i], 0)².
struct relu2_params {
  float* x = nullptr;  // [rows, cols], row stride stride
  int64_t rows = 0, cols = 0, stride = 0;
};
void run_cpu(const relu2_params& p);
void run_cuda(const relu2_params& p, void* stream = nullptr);

}  // namespace hyserve::kernels
