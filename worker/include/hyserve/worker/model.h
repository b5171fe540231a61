#pragma once
// A hybrid model executing one forward batch. One implementation file per architecture
// (worker/model/<arch>.cpp) built from the shared layer builders in worker/model/layers.h.
#include <functional>
#include <memory>
#include <vector>

#include "hyserve/common/config.h"
#include "hyserve/common/model_config.h"
#include "hyserve/common/tensor.h"
#include "hyserve/kernels/device.h"
#include "hyserve/kernels/graph.h"
#include "hyserve/kernels/logits_processing.h"
#include "hyserve/kernels/sampling.h"
#include "hyserve/worker/collective.h"
#include "hyserve/worker/forward_batch.h"
#include "hyserve/worker/hybrid_metadata.h"
#include "hyserve/worker/memory_pools.h"

namespace hyserve::worker {

// Sampling on the device (forward_options::sample): one settings entry per logits row, and the
// state slot whose last token each logits row feeds (-1: none; the last logits row of a row
// feeds the row's slot, for the next step's placeholders, model_context::last_tokens).
//
// Logits processing (kernels/include/hyserve/kernels/logits_processing.h) runs where sampling
// runs, before it, for steps where a row asks for it: `processing` is empty or holds one entry
// per logits row (indices into bias_* and mask_ids), and the per-slot token counts the
// penalties read are kept by the model where it samples (indexed by request slot): before the
// step, `clear_slots` are zeroed and the (slot, token) pairs of `seen` marked as prompt tokens;
// after the draw, the token of logits row i is counted for slot count_slots[i] (>= 0). Such a
// step runs eagerly (never as a decode graph); one without stays on the fast path.
struct step_sampling {
  std::vector<kernels::sample_settings> settings;
  std::vector<int32_t> feed_slots;
  std::vector<kernels::logits_row_settings> processing;
  std::vector<int32_t> bias_ids;
  std::vector<float> bias_values;
  std::vector<int32_t> mask_ids;
  int32_t max_top = 0;  // the largest top_n of the step (forward_options::top_logprobs rows are max_top wide)
  std::vector<int32_t> clear_slots;
  std::vector<int32_t> seen;         // pairs (slot, token)
  std::vector<int32_t> count_slots;  // empty, or one per logits row (-1: not counted)
  // The step needs the processing path (and so runs eagerly).
  bool needs_processing() const {
    return !processing.empty() || !clear_slots.empty() || !seen.empty() || !count_slots.empty();
  }
};

// Where the model reads and writes per-request state during a step.
struct model_context {
  req_to_token_pool* req_to_token = nullptr;  // token position → flat KV location
  kv_cache* kv = nullptr;                     // one layer cache per attention layer, in layer order
  mamba_state_cache* mamba = nullptr;         // one layer state per SSM layer, in layer order
  // TargetVerify / Draft: per-step states, slot index = row · steps + step (docs/ARCHITECTURE.md, Forward modes and hybrid metadata).
  mamba_state_cache* mamba_steps = nullptr;
  // The token each state slot's request sampled last, on the model's device (i32 [slots]),
  // written by every step that samples on the device (forward_options::sample). A token id
  // -(s + 1) in the batch is a placeholder for last_tokens[s]: the next step of an overlapped
  // loop is queued before the previous step's tokens reach the host. Null: no placeholders.
  int32_t* last_tokens = nullptr;
  int64_t last_token_slots = 0;
};

// What decode attention read in one step (docs/ARCHITECTURE.md, Sparse Top-K attention), summed over the step's rows; the same
// for every attention layer (the layers read equally many pages per row, only which differ).
struct sparse_attention_stats {
  int64_t decode_rows = 0;  // rows of a Decode / TargetVerify step (padding excluded); 0 otherwise
  int64_t sparse_rows = 0;  // of those, rows that attended over a page selection
  int64_t pages_read = 0;   // KV pages one attention layer read for those rows
  int64_t dense_pages = 0;  // pages the same rows hold (what dense attention reads)
};

// How a step ran on the device (filled when forward_options::report is set).
struct step_report {
  bool graph = false;            // replayed (or warmed up and captured) as a CUDA graph
  bool captured = false;         // this step captured its bucket's graph
  int32_t graph_batch = 0;       // the padded batch of the graph (0 when eager)
  double gpu_ms = -1.0;          // GPU time of the step's device work (CUDA; -1 on the CPU)
  kernels::graph_stats nodes;    // nodes of the graph that ran (kernels, memsets, copies, …)
};

// A step whose device work is still running when forward returns (forward_options::defer).
struct deferred_step {
  std::function<bool()> ready;   // finish() would not wait (never waits itself)
  std::function<void()> finish;  // waits for the step; fills forward_options::sampled
  explicit operator bool() const { return static_cast<bool>(finish); }
};

struct forward_options {
  // false: logits for meta.logit_token_indices only; true: logits for every token of the batch.
  bool all_logits = false;
  // When set, receives [num_tokens, hidden] hidden states: the embedding output, the output of
  // every layer, and the final-normed output (num_layers + 2 tensors).
  std::vector<host_tensor>* hidden_states = nullptr;
  // When set, receives the step's decode attention statistics (zero for models without
  // attention layers and for other modes).
  sparse_attention_stats* sparse_stats = nullptr;
  // Decode steps on CUDA run through CUDA graphs unless set (or `cuda_graphs: false`).
  bool eager = false;
  // When set, receives how the step ran and its GPU time.
  step_report* report = nullptr;
  // When set, the step samples on the model's device: settings[i] and feed_slots[i] for logits
  // row i, tokens and logprobs into *sampled (one per logits row). No logits leave
  // the device (forward returns an empty tensor); the sampled tokens are also written to
  // model_context::last_tokens at their feed slots.
  const step_sampling* sample = nullptr;
  std::vector<kernels::sample_output>* sampled = nullptr;
  // With sample->max_top > 0: receives [logits rows, max_top] top-N tokens and logprobs of the
  // processed distribution (entries past a row's top_n are unspecified).
  std::vector<kernels::top_logprob>* top_logprobs = nullptr;
  // When set, a step that can end later (a Decode step replayed as a CUDA graph that samples on
  // the device, without a report) returns once it is queued on the device and sets *defer:
  // *sampled is filled by defer->finish(), and it (and the model) must outlive that call. The
  // next step may be queued before: the device runs the two in order, and eager work waits for
  // it. Any other step ends in forward and leaves *defer empty.
  deferred_step* defer = nullptr;
  // When set, called once with the execution context of the stream the step's forward pass ran
  // on, right after that pass is queued (before its sampled tokens are copied out): work that
  // must follow the step on the device, e.g. prefix-cache state saves. A replayed decode graph
  // runs on its own stream, which work queued on the model's stream does not wait for.
  std::function<void(const kernels::exec_context&)> after_forward;
};

// Tensor-parallel placement of this model instance.
struct tp_placement {
  int rank = 0;
  int size = 1;
};

class model {
 public:
  virtual ~model() = default;
  virtual const model_config& config() const = 0;
  // Per-rank cache shapes (heads split by tp).
  virtual mamba_state_shape mamba_shape() const = 0;
  virtual int32_t kv_heads_local() const = 0;
  // The device the model's weights live on and its ops run on; the caches of ctx must live
  // there too.
  virtual const kernels::exec_context& exec() const = 0;
  // Sparse Top-K decode attention from the next step on (docs/ARCHITECTURE.md, Sparse Top-K attention; make_model passes
  // cfg.sparsity). Page summaries are kept from the first step run with algorithm quest: switch
  // to quest only between requests (KV written before has no summaries).
  virtual void set_sparsity(const sparsity_section& sparsity) = 0;
  virtual const sparsity_section& sparsity() const = 0;
  // Runs one step. Returns logits [rows, vocab] as a HOST tensor (rows =
  // logit_token_indices.size(), or num_tokens with all_logits), or an empty tensor when
  // opts.sample is set (the tokens are sampled on the device); hidden_states are host tensors. Writes KV for the batch's tokens at the locations that
  // ctx.req_to_token holds for their positions, and updates SSM/conv state per the mode.
  virtual tensor forward(const forward_batch& batch, const hybrid_metadata& meta, const model_context& ctx,
                              const forward_options& opts) = 0;
};

// Builds the configured model: weights from the checkpoint directory or synthetic, loaded on the
// host and placed on ctx.device (kernels::open_device gives the context). The model runs its ops
// with ctx's device and stream and the config's kernel paths (`kernels`, replacing ctx.paths).
// comm may be null for tp = 1.
std::unique_ptr<model> make_model(const service_config& cfg, const model_config& mc, tp_placement tp,
                                  collective* comm, const kernels::exec_context& ctx = {});

// The draft model of speculative.algorithm = draft_model (null for other algorithms): the
// checkpoint at speculative.draft_model.path, or the target (mc, same weights) cut to its first
// speculative.draft_model.synthetic.num_layers layers; its weights are stored as model.dtype
// (like the target's: a draft step reads half the bytes in bf16). Throws config_error naming the
// field when it cannot serve as a draft (vocabulary differs, more layers than the target).
std::unique_ptr<model> make_draft_model(const service_config& cfg, const model_config& mc, tp_placement tp,
                                        collective* comm, const kernels::exec_context& ctx = {});

}  // namespace hyserve::worker
