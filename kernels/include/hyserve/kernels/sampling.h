#pragma once
// Token selection from logits.
#include <cstdint>

namespace hyserve::kernels {

// Greedy: out[r] = argmax_v logits[r, v] (ties to the lowest index).
struct argmax_params {
  const float* __restrict__ logits = nullptr;  // [rows, vocab], row stride stride
  int32_t* __restrict__ out = nullptr;         // [rows]
  int64_t rows = 0, vocab = 0, stride = 0;
};

void run_cpu(const argmax_params& p);
void run_cuda(const argmax_params& p, void* stream = nullptr);

}  // namespace hyserve::kernels

namespace hyserve::kernels {

// One token from one row of logits: temperature 0 = greedy (argmax); otherwise softmax of
// logits / temperature restricted to the top_k largest (0 = all) and then to the smallest
// prefix of probability mass ≥ top_p, sampled with a counter-based generator seeded by
// (seed, counter), so a request's output is reproducible for a given seed.
struct sample_params {
  const float* __restrict__ logits = nullptr;  // [vocab]
  int64_t vocab = 0;
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  uint64_t counter = 0;  // position of the token in the request's output
  // Whether to compute sample_output::logprob: the log-softmax normaliser is a pass of exp over
  // the whole vocabulary (most of a greedy step's host time at a 128K vocabulary), so callers
  // that do not report logprobs turn it off. The token does not depend on it.
  bool want_logprob = true;
};

struct sample_output {
  int32_t token = 0;
  float logprob = 0.0f;  // log-softmax of the unscaled logits at token (0 without want_logprob)
};

sample_output sample_cpu(const sample_params& p);

}  // namespace hyserve::kernels
