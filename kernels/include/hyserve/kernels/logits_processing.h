#pragma once
// Per-request logits processing before sampling (the OpenAI / vLLM request parameters
// logit_bias, min_tokens, repetition_penalty, presence_penalty, frequency_penalty and
// top_logprobs), and the per-slot token counts the penalties read.
//
// Counts live with the request slot, in the memory where sampling runs (the device on CUDA):
// counts[slot, v] holds, in bits 0..29, how many times the request generated token v, and in
// bit 30 (kPromptSeenBit) whether v occurs in its prompt. Steps never ship a history: the
// first chunk of a request clears its slot's row and marks the prompt tokens it carries (later
// chunks mark theirs), and every sampled token of a row that has counts is added after the
// draw (token_count_params).
#include <cstdint>

#include "hyserve/kernels/sampling.h"

namespace hyserve::kernels {

inline constexpr int32_t kPromptSeenBit = 1 << 30;
inline constexpr int32_t kCountMask = kPromptSeenBit - 1;
// The most top_logprobs a row may ask for (the OpenAI limit).
inline constexpr int32_t kMaxTopLogprobs = 20;

// One logits row's processing, in the memory of the logits. The order is vLLM's:
//   1. logit_bias: logits[v] += bias for every (v, bias) of the row's bias entries;
//   2. min_tokens: logits[v] = -inf for every v of the row's mask entries (the caller lists
//      the EOS and stop token ids only while fewer than min_tokens tokens exist);
//   3. penalties (rows with count_slot >= 0), with c = counts[count_slot, v]:
//      repetition_penalty r: where v is in the prompt or the output so far,
//        logits[v] = logits[v] > 0 ? logits[v] / r : logits[v] * r;
//      logits[v] -= frequency_penalty * output_count + presence_penalty * (output_count > 0);
//   4. top_n > 0: the top_n tokens of the processed row (logit descending, ties to the lower
//      id) and their log-softmax values go to top[row, 0 .. top_n).
// Rows with nothing to do (no bias, no mask, count_slot -1, top_n 0) are left untouched.
struct logits_row_settings {
  float repetition_penalty = 1.0f;  // > 0; 1 = off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t count_slot = -1;   // row of counts the penalties read; -1 = no penalties
  int32_t bias_begin = 0;    // entries [bias_begin, bias_begin + bias_count) of bias_ids/_values
  int32_t bias_count = 0;
  int32_t mask_begin = 0;    // entries [mask_begin, mask_begin + mask_count) of mask_ids
  int32_t mask_count = 0;
  int32_t top_n = 0;         // 0 .. kMaxTopLogprobs
  int32_t reserved = 0;
};
static_assert(sizeof(logits_row_settings) == 40, "logits_row_settings travels packed in device buffers");

struct top_logprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

struct logits_process_params {
  float* __restrict__ logits = nullptr;                          // [rows, stride], in place
  const logits_row_settings* __restrict__ settings = nullptr;    // [rows]
  const int32_t* __restrict__ counts = nullptr;   // [n_slots, vocab]; needed when a row has count_slot >= 0
  const int32_t* __restrict__ bias_ids = nullptr;     // [n_bias]
  const float* __restrict__ bias_values = nullptr;    // [n_bias]
  const int32_t* __restrict__ mask_ids = nullptr;     // [n_mask]
  top_logprob* __restrict__ top = nullptr;            // [rows, max_top]; needed when max_top > 0
  int64_t rows = 0, vocab = 0, stride = 0;
  int64_t n_slots = 0, n_bias = 0, n_mask = 0;
  int64_t max_top = 0;  // every row's top_n <= max_top <= kMaxTopLogprobs
};

// Host checks of one row's settings against the call (what the CUDA op cannot read before it
// runs): penalties finite, repetition_penalty > 0, count_slot in [-1, n_slots), entry ranges
// inside the entry arrays, top_n in [0, max_top]. invalid_argument_error naming the field.
void check_logits_row_settings(const logits_row_settings& s, int64_t n_slots, int64_t n_bias, int64_t n_mask,
                               int64_t max_top);

void run_cpu(const logits_process_params& p);
void run_cuda(const logits_process_params& p, void* stream = nullptr);

// Maintains the counts, in this order:
//   1. clear: counts[clear_slots[i], :] = 0;
//   2. prompt: counts[seen[2i], seen[2i+1]] |= kPromptSeenBit (pairs (slot, token); a token < 0
//      is skipped);
//   3. sampled: counts[sampled_slots[r], sampled[r].token] += 1 for sampled_slots[r] >= 0.
// Slots outside [0, n_slots) and tokens outside [0, vocab) are skipped.
struct token_count_params {
  int32_t* __restrict__ counts = nullptr;  // [n_slots, vocab]
  int64_t n_slots = 0, vocab = 0;
  const int32_t* __restrict__ clear_slots = nullptr;  // [n_clear]
  int64_t n_clear = 0;
  const int32_t* __restrict__ seen = nullptr;  // [2 * n_seen]
  int64_t n_seen = 0;
  const sample_output* __restrict__ sampled = nullptr;  // [n_sampled]
  const int32_t* __restrict__ sampled_slots = nullptr;  // [n_sampled]
  int64_t n_sampled = 0;
};

void run_cpu(const token_count_params& p);
void run_cuda(const token_count_params& p, void* stream = nullptr);

}  // namespace hyserve::kernels
