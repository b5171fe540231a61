#pragma once
// Wire protocol between the coordinator and the workers (docs/ARCHITECTURE.md, Processes and the wire; One request, end to end). Messages are
// versioned, length-prefixed and checksummed:
//   [magic u32 "HYSV"][version u16][type u16][payload_len u32][crc32 of payload u32][payload]
// All integers little-endian. Decoding validates everything: a truncated, corrupt, unknown or
// inconsistent message raises wire_error, never undefined behaviour.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "hyserve/common/error.h"

namespace hyserve::wire {

class wire_error : public error {
 public:
  using error::error;
};

inline constexpr uint32_t kMagic = 0x56535948;  // "HYSV"
// 2: plan_row.dense_attention; step_result's decode attention statistics.
inline constexpr uint16_t kVersion = 2;
inline constexpr size_t kHeaderBytes = 16;

// Sanity limits, checked by encode and decode alike. A decoder also checks every count against
// the bytes left before reserving, so it never allocates more than its input can describe.
inline constexpr uint32_t kMaxRows = 1u << 20;          // rows, free_req_slots, commits
inline constexpr uint32_t kMaxTokensPerRow = 1u << 24;  // tokens, new_pages, retrieve_*, logprobs
inline constexpr uint32_t kMaxStringBytes = 1u << 20;   // error, host
inline constexpr int32_t kMaxTopLogprobs = 20;          // logits_processing.top_logprobs

enum class message_type : uint16_t {
  kHello = 1,     // worker → coordinator at start-up: capacities
  kStepPlan = 2,  // coordinator → group leader → every rank of the group
  kStepResult = 3,  // group leader → coordinator
  kShutdown = 4,  // coordinator → workers
};

// "hello", "step_plan", "step_result", "shutdown"; "unknown" for any other value.
const char* message_type_name(message_type t);

// Per-request sampling on the worker. temperature 0 = greedy.
struct sampling {
  float temperature = 0.0f;
  int32_t top_k = 0;     // 0 = off
  float top_p = 1.0f;    // (0, 1]
  uint64_t seed = 0;     // with the row's output index, makes sampling deterministic
};

// Per-request logits processing and logprobs (the OpenAI / vLLM parameters; the worker applies
// them where it samples, kernels/include/hyserve/kernels/logits_processing.h). Default values
// mean "off"; a plan row carries them in the optional processing extension only when one is on.
struct logits_processing {
  float repetition_penalty = 1.0f;  // > 0; 1 = off. Prompt and output tokens.
  float presence_penalty = 0.0f;    // output tokens
  float frequency_penalty = 0.0f;   // output tokens
  int32_t min_tokens = 0;           // mask min_tokens_mask while output_index < min_tokens
  int32_t prompt_len = 0;           // positions below are prompt tokens (repetition_penalty)
  bool logprobs = false;            // return the sampled token's logprob
  int32_t top_logprobs = 0;         // 0..20: return the top-N of the processed distribution
  std::vector<int32_t> min_tokens_mask;  // EOS and stop token ids
  std::vector<int32_t> bias_ids;         // logit_bias
  std::vector<float> bias_values;        // same length as bias_ids
  bool penalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
  // Anything that changes the logits before sampling (the step leaves the fast path).
  bool changes_logits() const { return penalties() || !bias_ids.empty() || (min_tokens > 0 && !min_tokens_mask.empty()); }
  bool any() const { return changes_logits() || logprobs || top_logprobs > 0 || min_tokens > 0; }
};

// One row of a step plan. The mode byte of the plan says how the rows are interpreted.
struct plan_row {
  int64_t request_id = -1;
  int32_t req_slot = -1;
  int32_t mamba_slot = -1;   // -1 = padding row
  int32_t prefix_len = 0;
  std::vector<int32_t> tokens;
  // Pages newly assigned to this request, covering positions [first_page_pos, …) page by page.
  int32_t first_page_pos = 0;
  std::vector<int32_t> new_pages;
  sampling sample;
  int32_t output_index = 0;  // how many tokens the request has generated so far (sampling seed)
  bool is_decode = false;    // Mixed mode: this row is a decode row
  bool reset_state = false;  // zero the mamba slot before running (first chunk of a request)
  bool dense_attention = false;  // the request set sampling_params.sparse: false
  int32_t draft_step = 0;    // Draft mode
  std::vector<int32_t> retrieve_next_token;    // tree TargetVerify only, [D]
  std::vector<int32_t> retrieve_next_sibling;  // tree TargetVerify only, [D]
  // Travels in an optional trailing extension (tag kPlanExtensionProcessing) listing the rows
  // whose processing is not all default; plans without such rows are unchanged.
  logits_processing processing;
};

// Control operations applied before the step's forward pass.
struct commit_op {
  int32_t mamba_slot = -1;
  int32_t row = -1;          // row of the previous verify/draft step whose scratch holds the state
  int32_t accepted_step = -1;
};

// Prefix caching: copy one recurrent-state slot (SSM / GDN state and conv window, every layer)
// to another. Checkpoint slots follow the request slots: [mamba_slots, mamba_slots + state_slots).
struct state_copy_op {
  int32_t src_slot = -1;
  int32_t dst_slot = -1;
};

struct kv_move_op {
  int32_t req_slot = -1;
  int32_t from_pos = 0;
  int32_t to_pos = 0;
};

struct step_plan {
  uint64_t step_id = 0;
  uint8_t mode = 0;  // hyserve::worker::forward_mode as a byte; validated by the worker
  int32_t draft_len = 0;
  bool is_tree = false;
  bool want_logprobs = false;
  std::vector<plan_row> rows;
  std::vector<int32_t> free_req_slots;  // request slots released (their req→token rows reset)
  std::vector<commit_op> commits;        // target model: keep the accepted step of a verify row
  // Draft model (speculative draft_model): keep the accepted draft step. Travels in an optional
  // trailing extension (tag kPlanExtensionSpec) present only when non-empty; plans without it
  // are unchanged.
  std::vector<commit_op> draft_commits;
  // Tree drafts: KV entries of the accepted path moved from node order to depth order (target
  // model, every attention layer), applied after the commits. Same extension.
  std::vector<kv_move_op> kv_moves;
  // TargetVerify mixed with prefill: the last extend_rows rows are prefill chunks (extend rows:
  // any token count, their prefix from the slot, one logit row each) that ride in the verify
  // step after its verify rows. Travels in an optional trailing extension (tag
  // kPlanExtensionMixed) present only when non-zero.
  int32_t extend_rows = 0;
  // Draft steps of a draft-model tree: rows at draft_step 0 return the draft model's best
  // draft_width tokens (the greedy one first) instead of one. Optional trailing extension (tag
  // kPlanExtensionDraftWidth), present only when > 1.
  int32_t draft_width = 1;
  // Prefix caching (docs/ARCHITECTURE.md, Prefix caching): checkpoints copied into request slots
  // before the step (after the rows' resets; a restored row has reset_state false), and request
  // slots copied into checkpoint slots after the step's forward pass (the state after the row's
  // last token). Both lists go to the target model and, when there is one, the draft model.
  // Optional trailing extension (tag kPlanExtensionPrefix), present only when either is non-empty.
  std::vector<state_copy_op> state_restores;
  std::vector<state_copy_op> state_saves;
};

inline constexpr uint8_t kPlanExtensionSpec = 1;
inline constexpr uint8_t kPlanExtensionMixed = 2;
inline constexpr uint8_t kPlanExtensionDraftWidth = 3;
inline constexpr uint8_t kPlanExtensionProcessing = 4;
inline constexpr uint8_t kResultExtensionTopLogprobs = 1;
inline constexpr uint8_t kPlanExtensionPrefix = 5;

struct row_result {
  int64_t request_id = -1;
  std::vector<int32_t> tokens;     // 1 sampled token (D for TargetVerify)
  std::vector<float> logprobs;     // same length as tokens when the row asked (or want_logprobs), else empty
  // Rows that asked for top_logprobs = N: N (token, logprob) pairs per token, token-major
  // (top_ids[t * N + k]). Travels in an optional trailing extension of the result.
  int32_t top_n = 0;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};

struct step_result {
  uint64_t step_id = 0;
  bool ok = true;
  std::string error;  // when !ok: what failed (the step's requests fail, the worker stays up)
  std::vector<row_result> rows;
  double step_ms = 0.0;
  // Decode attention of the step (docs/ARCHITECTURE.md, Sparse Top-K attention): rows of a Decode / TargetVerify step (padding
  // excluded), those that attended over a sparse page selection, and the KV pages one attention
  // layer read for them (all pages of a dense row). Zero for other modes.
  int32_t decode_rows = 0;
  int32_t sparse_rows = 0;
  int64_t pages_read = 0;
};

struct hello {
  int32_t dp_rank = 0;
  int32_t tp_size = 1;
  int32_t num_pages = 0;
  int32_t mamba_slots = 0;
  int32_t max_requests = 0;
  int32_t max_context = 0;
  int32_t page_size = 0;
  int64_t vocab_size = 0;
  std::string host;
};

std::vector<uint8_t> encode(const step_plan& m);
std::vector<uint8_t> encode(const step_result& m);
std::vector<uint8_t> encode(const hello& m);
std::vector<uint8_t> encode_shutdown();

// Decode validation beyond structure (encode checks the same and throws wire_error too):
//   step_plan: draft_len >= 0; per row req_slot, mamba_slot >= -1, prefix_len, first_page_pos,
//     output_index, draft_step, top_k >= 0, retrieve_next_token/_sibling both empty or of
//     equal length with values >= -1; free_req_slots >= 0; commits: mamba_slot >= -1,
//     row >= 0, accepted_step >= 0. The mode byte and the float sampling values pass through.
//   plan_row.processing: min_tokens, prompt_len >= 0, top_logprobs in [0, 20], bias ids and
//     values of equal length (the penalty values pass through: the worker checks them per row).
//   step_result: per row logprobs empty or as long as tokens; top_n in [0, 20] with
//     top_ids / top_logprobs of tokens * top_n entries; 0 <= sparse_rows <= decode_rows;
//     pages_read >= 0.
//   hello: every count >= 0, tp_size >= 1.
// Bools are one byte that must be 0 or 1; floats and doubles travel as their IEEE-754 bits.

// Reads the header only (validates magic, version, length against the buffer, checksum).
message_type peek_type(std::span<const uint8_t> bytes);

step_plan decode_step_plan(std::span<const uint8_t> bytes);
step_result decode_step_result(std::span<const uint8_t> bytes);
hello decode_hello(std::span<const uint8_t> bytes);
// Validates a shutdown message (header, checksum, empty payload).
void decode_shutdown(std::span<const uint8_t> bytes);

}  // namespace hyserve::wire
