#include "step_driver.h"

#include <optional>
#include <string>

#include "hyserve/common/error.h"
#include "hyserve/kernels/graph.h"
#include "sparse_select.h"

namespace hyserve::worker {

std::string decode_graph_blocker(const kernels::exec_context& ctx, const decode_graph_options& graphs, int tp_size) {
  if (ctx.device != device_kind::kCuda) return "device cpu";
  if (!graphs.enabled) return "cuda_graphs: false";
  if (graphs.max_batch < 1) return "no batch bucket (max_batch < 1)";
  if (tp_size > 1) return "tp > 1 (the collective waits on the host with a deadline)";
  return {};
}

step_driver::step_driver(const step_frame& frame, const decode_graph_options& graphs, int32_t attention_layers,
                         int32_t state_layers, const std::string& why_not_graphs)
    : frame_(frame) {
  if (why_not_graphs.empty()) {
    decode_graph_config c;
    c.max_batch = graphs.max_batch;
    c.vocab_local = frame.vocab_local;
    c.attention_layers = attention_layers;
    c.state_layers = state_layers;
    graphs_ = std::make_unique<decode_graphs>(c);
    log_decode_path_once("decode (" + frame.label + "): " + graphs_->describe());
  } else if (frame.ctx.device == device_kind::kCuda) {
    log_decode_path_once("decode (" + frame.label + "): eager (" + why_not_graphs + ")");
  }
}

step_driver::~step_driver() = default;

tensor step_driver::forward(const forward_batch& batch, const hybrid_metadata& meta, const model_context& ctx,
                            const forward_options& opts, const model_body& body) {
  const std::vector<int32_t> ids = layers::batch_token_ids(batch);
  for (size_t t = 0; t < ids.size(); ++t)
    if (ids[t] < 0 || ids[t] >= frame_.vocab_size)
      throw invalid_argument_error("token id " + std::to_string(ids[t]) + " at batch position " + std::to_string(t) +
                                   " is outside the vocabulary [0, " + std::to_string(frame_.vocab_size) + ")");
  layers::attention_step step;
  const bool attention = frame_.attention_layers && meta.batch_size > 0;
  if (attention) step = layers::build_attention_step(batch, meta, *ctx.req_to_token, ctx.kv->page_size());
  // Host-side plan (statistics; device scratch only when a row is sparse).
  layers::sparse_step sparse;
  if (attention)
    sparse = layers::plan_sparse_step(*frame_.sparsity, batch, meta, step.page_table_stride, step.page_size, frame_.ctx);
  if (opts.sparse_stats) *opts.sparse_stats = sparse.stats;

  if (graphs_) {
    std::string why = graphs_->ineligible(meta, opts);
    if (why.empty() && frame_.sparsity->algorithm != sparsity_algorithm::kNone)
      why = "sparse attention (per-step host selection plans)";
    if (why.empty()) {
      const step_body graph_body = [&](const layers::step_inputs& in, const kernels::exec_context& ex) {
        return body(in, ex, /*all_logits=*/true, nullptr);  // decode: one logits row per token
      };
      return graphs_->run(meta, attention ? &step : nullptr, ids, ctx, graph_body, opts.report);
    }
    if (meta.mode == forward_mode::kDecode) log_decode_path_once("decode step eager: " + why);
  }

  layers::step_inputs in = layers::upload_step(meta, attention ? &step : nullptr, ids, frame_.ctx);
  in.sparse = std::move(sparse);
  std::vector<tensor> hidden;
  std::optional<kernels::gpu_timer> timer;
  const bool cuda = frame_.ctx.device == device_kind::kCuda;
  if (opts.report && cuda) {
    timer.emplace();
    timer->start(frame_.ctx.stream);
  }
  // Op-level profile (kernels::profile_start): the baseline mark; a Decode step's activations
  // are then not zero-filled, as in a graph capture (its body writes everything it reads).
  std::optional<kernels::allocation_stream_scope> profile_scope;
  if (cuda && kernels::profile_active()) {
    if (meta.mode == forward_mode::kDecode) profile_scope.emplace(frame_.ctx.stream, /*zero_fill=*/false);
    kernels::profile_mark(nullptr, 0, frame_.ctx.stream);
  }
  tensor local = body(in, frame_.ctx, opts.all_logits, opts.hidden_states ? &hidden : nullptr);
  if (timer) timer->stop(frame_.ctx.stream);
  if (opts.hidden_states) *opts.hidden_states = std::move(hidden);
  tensor logits = layers::logits_to_host(local, frame_.comm, frame_.ctx);
  if (opts.report) {
    *opts.report = step_report{};
    opts.report->gpu_ms = timer ? timer->elapsed_ms() : -1.0;
  }
  return logits;
}

}  // namespace hyserve::worker
