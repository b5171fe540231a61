#pragma once
// Token sampling on the device, batched over rows. Row r gives the token sample_cpu(rows[r])
// gives for the same logits (same candidate order, same counter-based generator), and a
// logprob equal to within float rounding; see sampling.cu for the (negligible) exceptions.
// Free of CUDA headers.
#include <cstdint>

#include "hyserve/kernels/sampling.h"

namespace hyserve::kernels {

struct sample_batch_params {
  // HOST array [n_rows]; rows[r].logits is a DEVICE pointer to rows[r].vocab floats. Each row
  // is validated on the host exactly as sample_cpu validates it.
  const sample_params* rows = nullptr;
  int64_t n_rows = 0;
  sample_output* out = nullptr;  // DEVICE [n_rows]
};

// Asynchronous on stream; the settings travel as kernel arguments, so rows may be freed (and
// the call captured in a graph) once this returns.
void run_cuda(const sample_batch_params& p, void* stream = nullptr);

}  // namespace hyserve::kernels
