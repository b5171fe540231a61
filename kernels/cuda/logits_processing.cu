// Logits processing (bias, min_tokens masks, penalties, top-N logprobs) and the per-slot token
// counts, as the CPU reference in kernels/cpu/logits_processing.cpp. One block per logits row.
// Bias and mask entries are applied by one thread in entry order (a row has at most a few
// hundred, and the order must be the CPU's when an id repeats); the penalties are one strided
// pass over the row; the top-N tokens are N block-wide selections of the best (value, id) after
// the previous pick in the order logit descending, id ascending. The log-softmax normaliser is
// summed in double, as on the CPU, in another order (|Δ logprob| ~1e-7).
#include <cfloat>
#include <climits>
#include <cmath>

#include "common.cuh"
#include "hyserve/kernels/logits_processing.h"
#include "../cpu/logits_processing_validate.h"

namespace hyserve::kernels {
namespace cuda_detail {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) process_kernel(const logits_process_params p) {
  const logits_row_settings s = p.settings[blockIdx.x];
  float* x = p.logits + static_cast<int64_t>(blockIdx.x) * p.stride;
  const auto V = static_cast<int32_t>(p.vocab);
  // The host checked the settings (check_logits_row_settings); out-of-range entries are skipped
  // rather than failing a step on the device.
  if (threadIdx.x == 0) {
    for (int32_t i = 0; i < s.bias_count; ++i) {
      const int64_t e = static_cast<int64_t>(s.bias_begin) + i;
      if (e < 0 || e >= p.n_bias) break;
      const int32_t id = p.bias_ids[e];
      if (id >= 0 && id < V) x[id] += p.bias_values[e];
    }
    for (int32_t i = 0; i < s.mask_count; ++i) {
      const int64_t e = static_cast<int64_t>(s.mask_begin) + i;
      if (e < 0 || e >= p.n_mask) break;
      const int32_t id = p.mask_ids[e];
      if (id >= 0 && id < V) x[id] = -INFINITY;
    }
  }
  __syncthreads();
  if (s.count_slot >= 0 && s.count_slot < p.n_slots) {
    const int32_t* c = p.counts + static_cast<int64_t>(s.count_slot) * p.vocab;
    const float rp = s.repetition_penalty;
    for (int32_t v = threadIdx.x; v < V; v += blockDim.x) {
      const int32_t cv = c[v];
      const int32_t n = cv & kCountMask;
      float xv = x[v];
      if (cv != 0 && rp != 1.0f) xv = xv > 0.0f ? xv / rp : xv * rp;
      if (n > 0) xv -= __fadd_rn(__fmul_rn(s.frequency_penalty, static_cast<float>(n)), s.presence_penalty);
      x[v] = xv;
    }
  }
  const int64_t top_cap = p.max_top < p.vocab ? p.max_top : p.vocab;
  const int32_t top_n = s.top_n < top_cap ? s.top_n : static_cast<int32_t>(top_cap);
  if (top_n <= 0) return;
  __syncthreads();
  float mx = -INFINITY;
  int32_t arg = INT_MAX;
  for (int32_t v = threadIdx.x; v < V; v += blockDim.x)
    if (argmax_better(x[v], v, mx, arg)) {
      mx = x[v];
      arg = v;
    }
  block_best(mx, arg);
  double z = 0.0;
  for (int32_t v = threadIdx.x; v < V; v += blockDim.x) z += exp(static_cast<double>(x[v]) - static_cast<double>(mx));
  z = block_sum_double(z);
  const double lse = static_cast<double>(mx) + log(z);
  top_logprob* out = p.top + static_cast<int64_t>(blockIdx.x) * p.max_top;
  float last_v = mx;
  int32_t last_i = arg;
  for (int32_t k = 0; k < top_n; ++k) {
    if (k > 0) {
      // The best element after (last_v, last_i) in the order.
      float bv = -INFINITY;
      int32_t bi = INT_MAX;
      for (int32_t v = threadIdx.x; v < V; v += blockDim.x) {
        const float xv = x[v];
        if (argmax_better(last_v, last_i, xv, v) && argmax_better(xv, v, bv, bi)) {
          bv = xv;
          bi = v;
        }
      }
      block_best(bv, bi);
      last_v = bv;
      last_i = bi;
    }
    if (threadIdx.x == 0) {
      const bool found = last_i != INT_MAX;
      out[k].token = found ? last_i : -1;
      out[k].logprob = found ? static_cast<float>(static_cast<double>(last_v) - lse) : -INFINITY;
    }
  }
}

__global__ void clear_kernel(const token_count_params p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.n_clear * p.vocab) return;
  const int32_t slot = p.clear_slots[i / p.vocab];
  if (slot >= 0 && slot < p.n_slots) p.counts[static_cast<int64_t>(slot) * p.vocab + i % p.vocab] = 0;
}

__global__ void seen_kernel(const token_count_params p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.n_seen) return;
  const int32_t slot = p.seen[2 * i], token = p.seen[2 * i + 1];
  if (slot >= 0 && slot < p.n_slots && token >= 0 && token < p.vocab)
    atomicOr(p.counts + static_cast<int64_t>(slot) * p.vocab + token, kPromptSeenBit);
}

__global__ void sampled_kernel(const token_count_params p) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= p.n_sampled) return;
  const int32_t slot = p.sampled_slots[r], token = p.sampled[r].token;
  if (slot >= 0 && slot < p.n_slots && token >= 0 && token < p.vocab) {
    int32_t* c = p.counts + static_cast<int64_t>(slot) * p.vocab + token;
    if ((*c & kCountMask) < kCountMask) atomicAdd(c, 1);
  }
}

unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace
}  // namespace cuda_detail

using namespace cuda_detail;

void run_cuda(const logits_process_params& p, void* stream) {
  if (!cpu_detail::check_call(p)) return;
  process_kernel<<<static_cast<unsigned>(p.rows), kThreads, 0, as_stream(stream)>>>(p);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

void run_cuda(const token_count_params& p, void* stream) {
  if (!cpu_detail::check_call(p)) return;
  // Three launches in stream order: clear, then prompt marks, then sampled tokens.
  if (p.n_clear > 0) {
    clear_kernel<<<blocks_for(p.n_clear * p.vocab, 256), 256, 0, as_stream(stream)>>>(p);
    HYSERVE_CUDA_CHECK_LAUNCH();
  }
  if (p.n_seen > 0) {
    seen_kernel<<<blocks_for(p.n_seen, 256), 256, 0, as_stream(stream)>>>(p);
    HYSERVE_CUDA_CHECK_LAUNCH();
  }
  if (p.n_sampled > 0) {
    sampled_kernel<<<blocks_for(p.n_sampled, 128), 128, 0, as_stream(stream)>>>(p);
    HYSERVE_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace hyserve::kernels
