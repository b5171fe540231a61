#pragma once
// The architecture-independent frame of one forward step, shared by every architecture:
// token-id checks, the step's KV bookkeeping, then either the eager path (one packed upload,
// the model body on the model's stream, logits back on the host, gathered over tp) or, for a
// Decode step that can, the bucket's CUDA graph (decode_graphs.h). The architecture supplies
// only the body: embedding → layers → final norm → this rank's lm_head logits on the device.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "decode_graphs.h"
#include "hyserve/common/config.h"
#include "hyserve/worker/model.h"
#include "layers.h"

namespace hyserve::worker {

// all_logits: logits for every token (else for in.logit_rows only). hidden: when set, receives
// host copies of the hidden states (eager only; see forward_options::hidden_states).
using model_body = std::function<tensor(const layers::step_inputs& in, const kernels::exec_context& ex,
                                        bool all_logits, std::vector<tensor>* hidden)>;

// `cuda_graphs` and the bucket bound, as make_model resolves them from the service config.
struct decode_graph_options {
  bool enabled = false;
  int32_t max_batch = 0;
  bool step_clock = false;  // time replayed sampling steps on the device (scheduler.step_trace set)
};

struct step_frame {
  std::string label;  // the model in log lines ("Bamba, 32 layers")
  int64_t vocab_size = 0;
  int64_t vocab_local = 0;
  bool attention_layers = false;
  collective* comm = nullptr;
  kernels::exec_context ctx;
  const sparsity_section* sparsity = nullptr;
};

class step_driver {
 public:
  // why_not_graphs: empty when decode may use CUDA graphs (device cuda, options enabled);
  // otherwise the reason decode stays eager, logged once.
  step_driver(const step_frame& frame, const decode_graph_options& graphs, int32_t attention_layers,
              int32_t state_layers, const std::string& why_not_graphs);
  ~step_driver();

  tensor forward(const forward_batch& batch, const hybrid_metadata& meta, const model_context& ctx,
                 const forward_options& opts, const model_body& body);

 private:
  // Logits processing of a sampling step (model.h, step_sampling): counts maintenance, then
  // bias / masks / penalties / top-N on logits [rows, vocab] in the memory of ex (the device of
  // eager sampling, or the host with tp > 1).
  void process_logits(float* logits, int64_t rows, int64_t vocab, const step_sampling& s, const model_context& ctx,
                      const kernels::exec_context& ex, std::vector<kernels::top_logprob>* top);
  // Counts the sampled tokens (in ex's memory) of rows with a count slot.
  void count_sampled(const kernels::sample_output* sampled, const step_sampling& s, const kernels::exec_context& ex);
  int32_t* counts(const model_context& ctx, int64_t vocab, device_kind where);

  step_frame frame_;
  std::unique_ptr<decode_graphs> graphs_;
  // Per request slot token counts of the penalties (logits_processing.h), allocated on first
  // use where this model samples.
  tensor counts_;
  int64_t counts_slots_ = 0, counts_vocab_ = 0;
};

// Why a sampling step cannot replay a decode graph (empty: it can): rows asking for logits
// processing (penalties, logit_bias, min_tokens or top_logprobs) take the eager path.
std::string processing_blocker(const step_sampling* sampling);

// Every token id of a step is in [0, vocab), or a placeholder -(s + 1) for the last token of a
// slot s of ctx.last_tokens (model_context); invalid_argument_error naming the position otherwise.
void check_step_tokens(const std::vector<int32_t>& ids, int64_t vocab, const model_context& ctx);
// Replaces the placeholders among the uploaded token ids (in.token_ids) with the slots' last
// tokens, on ex's stream (nothing when ids has none).
void resolve_placeholders(const layers::step_inputs& in, const std::vector<int32_t>& ids, const model_context& ctx,
                          const kernels::exec_context& ex);

// Why a model cannot use decode graphs at all (empty: it can): device, config, tensor
// parallelism. Architectures add their own reasons (host-routed MoE).
std::string decode_graph_blocker(const kernels::exec_context& ctx, const decode_graph_options& graphs, int tp_size);

}  // namespace hyserve::worker
