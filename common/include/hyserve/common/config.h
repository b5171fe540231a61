#pragma once
// The service configuration (docs/ARCHITECTURE.md, Configuration): YAML parsed once into typed structs and validated
// at load. Unknown keys and bad values are config_error naming the path, e.g.
//   "cache.page_size: must be a power of two, got 12".
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hyserve/common/dtype.h"
#include "hyserve/common/kernel_paths.h"
#include "hyserve/common/model_config.h"
#include "hyserve/common/tensor.h"

namespace hyserve {

// `model.synthetic`: seeded random weights for an architecture built from these sizes.
struct synthetic_model_config {
  model_config arch;  // sizes; layer kinds from `attn_layer_indices`
  uint64_t seed = 0;
  // `residual_scale`: multiplies the initial scale of the residual branches' output projections
  // (attention o_proj, Mamba out_proj, MLP down_proj). 1 = the usual initialisation; a small
  // value (e.g. 1e-4) lets the token embedding dominate the residual stream, so the next token
  // depends mostly on the current one: greedy decoding settles into cycles and the target's
  // first layers predict it well (a predictable model for speculative-decoding tests and
  // benchmarks).
  double residual_scale = 1.0;
};

// `model.gdn_prefill`: the Gated DeltaNet chunked-prefill kernel on CUDA. auto: by model.dtype
// (bfloat16: the bf16 tensor-core path, about 1e-2 relative like flash-linear-attention's;
// float32: tc, 3xTF32 at fp32-level accuracy); or one named path (recurrent | tc | tf32 | bf16).
enum class gdn_prefill_choice : uint8_t { kAuto, kRecurrent, kTc, kTf32, kBf16 };

struct model_section {
  std::string path;                               // HF checkpoint directory (exclusive with synthetic)
  std::optional<synthetic_model_config> synthetic;
  dtype weight_dtype = dtype::kF32;               // `dtype`: float32 | bfloat16 | float16
  // `tokenizer`: a tokenizer.json file or a directory holding one. Resolved by load_config_file
  // to the file's path; by default <path>/tokenizer.json when it exists. Empty: no tokenizer
  // (the API then takes token ids only).
  std::string tokenizer;
  gdn_prefill_choice gdn_prefill = gdn_prefill_choice::kAuto;  // `gdn_prefill`: auto | recurrent | tc | tf32 | bf16
};

// How tensor-parallel partial results are combined on a GPU: NCCL on device memory, or copied
// to the host and reduced with MPI (several ranks may then share one device).
enum class device_collective_kind : uint8_t { kNccl, kHost };

struct parallel_section {
  int32_t tp = 1;
  int32_t dp = 1;
  device_collective_kind device_collective = device_collective_kind::kNccl;
};

// Prefix caching (`cache.prefix`): a radix tree over token ids at page granularity in the
// coordinator; full KV pages are shared by reference count and the recurrent state (SSM / GDN
// state and conv window) is checkpointed into a bounded pool of extra state slots at chosen page
// boundaries. docs/ARCHITECTURE.md, Prefix caching. On by default; `enabled: false` turns it off.
struct prefix_cache_section {
  bool enabled = true;
  // The YAML names cache.prefix.enabled. Left unset, the cache turns itself off where
  // determinism: batch_invariant cannot keep every output's bits with it (settle_prefix_cache);
  // set to true, that is a start-up error.
  bool enabled_given = false;
  // Checkpoint every state_interval tokens (a multiple of cache.page_size; 0 = the SSM kernels'
  // chunk, 256 tokens, rounded up to a page; with determinism: batch_invariant the prefill chunk
  // for a bfloat16 SSM state, else gcd(256, the prefill chunk)), plus at the last page boundaries
  // of each prompt.
  int32_t state_interval = 0;
  int32_t state_slots = 64;  // checkpoint slots per worker (each one slot of recurrent state)
};

struct cache_section {
  int32_t page_size = 16;          // power of two
  int32_t max_requests = 64;
  int32_t max_context = 4096;
  int32_t num_pages = 0;           // 0 = derived: max_requests · ceil(max_context / page_size)
  double gpu_memory_fraction = 0.85;  // (0, 1]
  // Worker ranks that share this rank's device (set by the worker at start-up, not read from the
  // YAML): each takes gpu_memory_fraction / ranks_per_device of the free memory for its caches.
  int32_t ranks_per_device = 1;
  dtype kv_dtype = dtype::kF32;         // `kv_dtype`: float32 | bfloat16 (KV cache pages)
  dtype ssm_state_dtype = dtype::kF32;  // `ssm_state_dtype`: float32 | bfloat16 (Mamba2 SSM state)
  prefix_cache_section prefix;
  // Speculative verify and draft steps keep every token's recurrent state (SSM / GDN state and
  // conv window) until the next plan commits the accepted one: up to max_requests rows of
  // spec_step_cols states per layer, planned beside the slots. Derived from speculative at load
  // (speculative_step_cols; 0 without speculation), not read from the YAML.
  int32_t spec_step_cols = 0;
  int32_t spec_step_rows = 0;  // rows of them: speculative.max_batch (0 = max_requests)
  // Per-token states planned for the speculative steps (0 without speculation).
  int64_t spec_step_slots() const {
    const int32_t rows = spec_step_rows > 0 ? std::min(spec_step_rows, max_requests) : max_requests;
    return spec_step_cols > 0 ? int64_t{rows} * spec_step_cols : 0;
  }
  // Checkpoint slots the workers keep beside the request slots (0 when prefix caching is off).
  int32_t checkpoint_slots() const { return prefix.enabled ? prefix.state_slots : 0; }
  // The effective checkpoint interval in tokens (a multiple of page_size).
  int32_t state_interval() const {
    const int32_t v = prefix.state_interval > 0 ? prefix.state_interval : 256;
    return (v + page_size - 1) / page_size * page_size;
  }
};

struct scheduler_section {
  int32_t max_batch_tokens = 4096;
  int32_t max_running = 64;
  int32_t chunked_prefill = 512;
  int32_t max_queue = 1024;
  // Overlapped step loop: a group's next plain step (Decode / Extend / Mixed) is built and sent
  // while its previous one runs, its decode rows' tokens as placeholders the worker fills on
  // the device from the previous step's samples. false: each step waits for the previous
  // result. Speculative rounds always run strictly.
  bool overlap = true;
  // With overlap: plain steps a data-parallel group may have in flight at once (2-4). Default 3
  // with `device: cuda`, 2 on the CPU.
  int32_t overlap_steps = 2;
  // Diagnosis: when set, the coordinator and each worker leader write a CSV trace of their step
  // loops' events to `<step_trace>.<process>.csv` at shutdown (common/step_trace.h).
  std::string step_trace;
};

enum class sparsity_algorithm : uint8_t { kNone, kQuest };
struct sparsity_section {
  sparsity_algorithm algorithm = sparsity_algorithm::kNone;
  int32_t page_budget = 64;
  int32_t sink_pages = 1;
  int32_t recent_pages = 2;
  int32_t min_seq_len = 2048;
};

enum class speculative_algorithm : uint8_t { kNone, kNgram, kDraftModel };
// `speculative.ngram`: prompt lookup over the request's own tokens.
struct ngram_spec_section {
  int32_t min_match = 1;       // shortest suffix n-gram that may match
  int32_t max_match = 4;       // longest suffix n-gram tried first
  int32_t max_tree_width = 1;  // > 1: several distinct continuations become a draft tree
};
// `speculative.draft_model`: exactly one of `path` (a checkpoint with the target's vocabulary)
// or `synthetic: {num_layers: N}` (the target's first N layers, same embedding and head).
struct draft_model_spec_section {
  std::string path;
  int32_t synthetic_num_layers = 0;  // > 0 when `synthetic` is given
  // > 1: the draft model's top max_tree_width tokens at the first position become siblings of
  // a draft tree (the greedy chain continues from the best one); num_draft_tokens bounds the
  // node count.
  int32_t max_tree_width = 1;
};
struct speculative_section {
  speculative_algorithm algorithm = speculative_algorithm::kNone;
  int32_t num_draft_tokens = 4;
  ngram_spec_section ngram;
  draft_model_spec_section draft_model;
  // Back-off: below this acceptance rate (over the recent rounds) a request drafts less.
  double min_accept_rate = 0.3;
  // Skip a decode-only round whose expected tokens per second (from measured step times and the
  // requests' acceptance) fall below a plain step's. Off: rounds depend on the drafts alone (the
  // plans do not depend on timing).
  bool cost_check = true;
  // Speculate only while a step has at most this many rows (decode rows and the prefill rows
  // that would ride in the verify step); above it the group decodes plainly. Bounds the
  // per-token states a verify step keeps (cache.spec_step_rows). 0 = cache.max_requests.
  int32_t max_batch = 0;
};

// Per-step states a speculative step keeps per row: a verify row's drafts (at most
// num_draft_tokens nodes, chain or tree) and its last accepted token; 0 without speculation.
inline int32_t speculative_step_cols(const speculative_section& s) {
  return s.algorithm == speculative_algorithm::kNone ? 0 : s.num_draft_tokens + 1;
}

struct server_section {
  std::string host = "127.0.0.1";
  int32_t port = 8000;
  std::string api_key;             // empty = no authentication
  int64_t max_body_bytes = 8 << 20;
  int32_t threads = 2;             // HTTP I/O threads
  double drain_timeout_s = 30.0;   // SIGINT / SIGTERM / SIGUSR1: how long in-flight requests may finish
  // OpenAI routes: request fields the server does not know are ignored with a warning (an
  // X-Hyserve-Ignored-Fields header and a log line); true turns them into a 400.
  bool strict_fields = false;
};

// Test-only fault injection (worker.fault): what the failing rank does at worker.fail_at_step.
enum class worker_fault : uint8_t {
  kThrow,  // the step throws: its requests fail with 500, the worker stays up
  kHang,   // the rank stops reading control messages and never answers (a hung rank)
  kStop,   // the rank stops its own process with SIGSTOP (what `kill -STOP` does to it)
  kCoordinatorStall,  // the coordinator's scheduler loop blocks for good before sending control
                      // message fail_at_step (a call that never returns): only its watchdog answers
};

struct worker_section {
  double step_timeout_s = 60.0;      // a group that does not answer a step in time is fatal
  double startup_timeout_s = 600.0;  // time for every group to load and say hello
  double fault_grace_s = 2.0;        // after a fatal fault: /health answers 503 this long, then the job ends
  int64_t fail_at_step = -1;         // test only: the worker throws in this step (-1 = never)
  int32_t fail_rank = 0;             // test only: tp rank that throws (or hangs, or stops)
  worker_fault fault = worker_fault::kThrow;  // test only: throw | hang | stop | coordinator_stall at fail_at_step
};

// `chat`: how /v1/chat/completions turns messages into a prompt (ChatML style):
//   bos + template(message 1) + ... + template(message n) + generation_prompt
// where template has {role} and {content} placeholders. Needs a tokenizer.
struct chat_section {
  std::string message_template = "<|im_start|>{role}\n{content}<|im_end|>\n";  // `template`
  std::string generation_prompt = "<|im_start|>assistant\n";
  std::string bos;                // text before the first message (e.g. "<s>"); may be empty
  std::string eos;                // a token's text that ends the reply (e.g. "<|im_end|>"); may be empty
  std::vector<std::string> stop;  // stop strings added to every chat request
};

struct service_config {
  model_section model;
  device_kind device = device_kind::kCpu;
  // `cuda_graphs`: decode steps captured and replayed as CUDA graphs per batch-size bucket
  // (device cuda only; unset = on for device cuda). See cuda_graphs_enabled().
  std::optional<bool> cuda_graphs;
  parallel_section parallel;
  cache_section cache;
  scheduler_section scheduler;
  sparsity_section sparsity;
  speculative_section speculative;
  server_section server;
  worker_section worker;
  std::optional<chat_section> chat;  // absent: /v1/chat/completions is refused
  // `kernels`: the CUDA kernel variants (kernel_paths.h); the models' execution context carries
  // them (worker::make_model).
  kernel_paths kernels;
  std::string source;  // file it was loaded from ("<string>" for load_config_string)
};

// Loads and validates a YAML file. Relative `model.path` and `model.tokenizer` resolve against
// the config file's directory first, then against the current directory.
service_config load_config_file(const std::string& path);
service_config load_config_string(const std::string& yaml_text);

// Whether decode runs through CUDA graphs: `cuda_graphs`, by default true exactly for device cuda.
inline bool cuda_graphs_enabled(const service_config& cfg) {
  return cfg.cuda_graphs.value_or(cfg.device == device_kind::kCuda) && cfg.device == device_kind::kCuda;
}

// The model_config of the configured model: read_hf_config(path/config.json) or the synthetic
// section's sizes.
model_config resolve_model_config(const service_config& cfg);

// determinism: batch_invariant with cache.prefix.enabled: the prefix cache cuts and resumes
// prompts only at multiples of cache.prefix.state_interval, which keeps every output's bits only
// if those positions are chunk boundaries of the recurrent scans in an uncut prompt too. Throws
// config_error (naming the key and the value it needs) unless state_interval is a multiple of
// the model's scan chunk (mamba_chunk_size; model_config::kGdnChunkSize for Gated DeltaNet) and
// min(scheduler.chunked_prefill, scheduler.max_batch_tokens) is a multiple of state_interval; with
// cache.ssm_state_dtype: bfloat16 and Mamba2 layers, unless state_interval equals that chunk (a
// bf16 state is rounded where a prefill call ends, and an uncached prompt ends calls only there).
void check_invariant_prefix(const service_config& cfg, const model_config& mc);

// The prefix cache as this model runs it, the same on every rank: check_invariant_prefix when the
// YAML sets cache.prefix.enabled; when it leaves it unset (on by default) and the check fails, the
// cache is turned off and the reason returned for the start-up log (empty otherwise).
std::string settle_prefix_cache(service_config& cfg, const model_config& mc);

}  // namespace hyserve
