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

// ---- Batched sampling inside a step (CUDA-graph capturable) ----

// One logits row's sampling settings, in the memory of the logits (the device for CUDA), so a
// captured graph reads each replay's values from a fixed address. The same meaning as
// sample_params; want_logprob is 0 or 1.
struct sample_settings {
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  int32_t want_logprob = 0;
  uint64_t seed = 0;
  uint64_t counter = 0;
};
static_assert(sizeof(sample_settings) == 32, "sample_settings travels packed in i32 step buffers");

// The checks sample_cpu makes on its settings (temperature finite and >= 0, top_p in (0, 1],
// top_k >= 0, want_logprob 0 or 1), on the host: invalid_argument_error naming the field. The
// CUDA op cannot read device settings before it runs, so callers check them here first.
void check_sample_settings(const sample_settings& s);

// out[r] = sample_cpu(row r of logits with settings[r]) for r < rows: the same token (the CUDA
// op differs only when a uniform draw lands within ~1e-16 of a boundary between two candidates,
// see kernels/cuda/sampling.cu) and the logprob within float rounding (0 without want_logprob).
// Rows whose settings[r].temperature is 0 cost one pass over the row (argmax). Settings must
// have passed check_sample_settings; the CUDA op treats a value outside the ranges as the
// nearest valid one instead of failing a captured step.
struct sample_rows_params {
  const float* __restrict__ logits = nullptr;             // [rows, stride], vocab used per row
  const sample_settings* __restrict__ settings = nullptr;  // [rows]
  sample_output* __restrict__ out = nullptr;               // [rows]
  int64_t rows = 0, vocab = 0, stride = 0;
};

void run_cpu(const sample_rows_params& p);
void run_cuda(const sample_rows_params& p, void* stream = nullptr);

// The token feed of an overlapped step loop: the token a request sampled last, kept on the
// device by its state slot, so the next step can be queued before the previous one's tokens
// reach the host.
//   scatter: last[slots[r]] = sampled[r].token for r < rows with slots[r] >= 0;
//   resolve: ids[i] = last[-ids[i] - 1] for i < n with ids[i] < 0 (a placeholder names the
//            slot whose last token it takes); other ids are left as they are.
struct last_token_scatter_params {
  const sample_output* __restrict__ sampled = nullptr;  // [rows]
  const int32_t* __restrict__ slots = nullptr;          // [rows], -1 = none
  int32_t* __restrict__ last = nullptr;                 // [n_slots]
  int64_t rows = 0, n_slots = 0;
};
struct token_resolve_params {
  int32_t* __restrict__ ids = nullptr;         // [n]
  const int32_t* __restrict__ last = nullptr;  // [n_slots]
  int64_t n = 0, n_slots = 0;
};

void run_cpu(const last_token_scatter_params& p);
void run_cuda(const last_token_scatter_params& p, void* stream = nullptr);
void run_cpu(const token_resolve_params& p);
void run_cuda(const token_resolve_params& p, void* stream = nullptr);

}  // namespace hyserve::kernels
