#pragma once
// Shared layer builders for hybrid architectures: norms, projections, the Mamba2 mixer,
// attention over the paged KV cache, and the SwiGLU MLP. Activations are contiguous f32
// [num_tokens, features] tensors on the model's device (ctx.device): weights, activations,
// caches and the per-step metadata all live there, and every op goes through kernels::run, so
// the same code runs on the CPU and on CUDA. Tensor-parallel partial sums are reduced through
// the collective (null = tp 1), which must accept pointers of that device.
#include <cstdint>
#include <vector>

#include "hyserve/common/tensor.h"
#include "hyserve/kernels/attention.h"
#include "hyserve/kernels/device.h"
#include "hyserve/kernels/norm.h"
#include "hyserve/worker/collective.h"
#include "hyserve/worker/forward_batch.h"
#include "hyserve/worker/hybrid_metadata.h"
#include "hyserve/worker/memory_pools.h"
#include "sparse_select.h"

namespace hyserve::worker {
struct step_sampling;  // hyserve/worker/model.h
}  // namespace hyserve::worker

namespace hyserve::worker::layers {

using kernels::exec_context;

// Copies t to `device` in place (weights are loaded on the host and placed once).
void place(tensor& t, device_kind device);
// A weight of a linear layer or an embedding table (model.dtype): an f32 host tensor converted
// to `type` (bf16: round to nearest even, stored as bf16 only) and placed on `device`. Norm and
// conv weights, A_log, D and dt_bias stay f32 and use place().
void place_weight(tensor& t, device_kind device, dtype type);

// Op-level GPU timing (kernels::profile_mark, hyserve-bench-model --profile-step): labels the
// ops queued on ctx.stream since the previous mark with what they must move. A no-op unless a
// profile is active on this thread (CUDA only).
void profile(const exec_context& ctx, const char* label, double bytes);
inline double nbytes(const tensor& t) { return static_cast<double>(t.nbytes()); }

// y = x · wᵀ: x [T, in] f32, w [out, in] f32 or bf16 → [T, out] f32.
tensor linear(const tensor& x, const tensor& w, const exec_context& ctx);
// y = rmsnorm(x; norm, eps) · wᵀ (norm null: linear) in one op (kernels rmsnorm_linear: one
// kernel at decode on CUDA).
// relu2: max(y, 0)² instead (the op's squared-ReLU epilogue: the relu² MLP's up projection).
// normed (with a norm): set to rmsnorm(x) as well, written by the same op (no kernel of its own).
tensor norm_linear(const tensor& x, const tensor* norm, float eps, const tensor& w, const exec_context& ctx,
                   bool relu2 = false, tensor* normed = nullptr);
// The output projection of a block (y = x · wᵀ, reduced over tp). residual null: returns y.
// residual set: adds y into it and returns an empty tensor; without a tp reduction in between
// the add happens in the GEMM's epilogue (beta = 1), saving the output tensor and the add kernel.
tensor block_output(const tensor& x, const tensor& w, collective* comm, const exec_context& ctx,
                    tensor* residual = nullptr);
// block_output of a mixer whose output norm has not run yet: norm is the gated_rmsnorm op on y
// (norm.x = norm.out = y's rows, one phase). Into residual on one rank, with
// kernels.norm_linear_gate and at most kNormLinearFusedMaxRows rows, the norm runs inside the
// out_proj op (rmsnorm_linear with a gate: one kernel at decode); else the norm op in place on
// y, then block_output.
tensor gated_block_output(const kernels::gated_rmsnorm_params& norm, const tensor& y, const tensor& w,
                          collective* comm, const exec_context& ctx, tensor* residual);
// a += b (same shape).
void add_inplace(tensor& a, const tensor& b, const exec_context& ctx);
tensor rmsnorm(const tensor& x, const tensor& weight, float eps, const exec_context& ctx);
// Sums a row-parallel partial result over the tp group.
void reduce_partial(tensor& x, collective* comm);
// Rows `rows` (i32 [R] on ctx.device) of x [T, cols] → [R, cols].
tensor gather_rows(const tensor& x, const tensor& rows, const exec_context& ctx);
// Rows rows[0..n) (i32 on ctx.device) of x [T, cols] → [n, cols].
tensor gather_rows(const tensor& x, const int32_t* rows, int64_t n, const exec_context& ctx);
// A host vector as a 1-D i32 tensor on ctx.device.
tensor upload_i32(const std::vector<int32_t>& v, const exec_context& ctx);

// Vocab-parallel embedding (table f32 or bf16, output f32): table holds rows [vocab_start, vocab_start + rows) of the
// vocabulary; ids i32 [T] on ctx.device → [T, hidden].
tensor embed(const tensor& ids, const tensor& table, int64_t vocab_start, collective* comm, const exec_context& ctx);
// The same over n ids (i32 on ctx.device).
tensor embed(const int32_t* ids, int64_t n, const tensor& table, int64_t vocab_start, collective* comm,
             const exec_context& ctx);
// Vocab-parallel lm_head: x [R, hidden] · w_localᵀ, gathered to [R, vocab], returned on the HOST.
tensor lm_head(const tensor& x, const tensor& w_local, collective* comm, const exec_context& ctx);
// The second half of lm_head: this rank's logits [R, vocab_local] on the device → [R, vocab] on
// the HOST, gathered over the tp group.
tensor logits_to_host(const tensor& local, collective* comm, const exec_context& ctx);

// Tokens of the batch gathered into one list, in query_start_loc order.
std::vector<int32_t> batch_token_ids(const forward_batch& batch);

struct mlp_weights {
  tensor gate;  // [inter_local, hidden]
  tensor up;    // [inter_local, hidden]
  tensor down;  // [hidden, inter_local]
};
void place(mlp_weights& w, device_kind device, dtype weight_type = dtype::kF32);
// silu(xn · gateᵀ) ⊙ (xn · upᵀ): [T, inter_local] in one op (kernels rmsnorm_linear), xn = x or,
// with norm set, rmsnorm(x; norm, eps).
tensor swiglu_linear(const mlp_weights& w, const tensor& x, const exec_context& ctx, const tensor* norm = nullptr,
                     float eps = 0.0f);
// residual: see block_output (the block's output added into it; an empty tensor returned).
// w.gate empty: the relu² MLP (Nemotron-H), down · relu(xn · upᵀ)².
tensor mlp_forward(const mlp_weights& w, const tensor& x, collective* comm, const exec_context& ctx,
                   tensor* residual = nullptr, const tensor* norm = nullptr, float eps = 0.0f);

// KV bookkeeping of one step, shared by every attention layer.
struct attention_step {
  std::vector<int32_t> locs;        // [num_tokens] flat KV location of each token; -1 = padding
  std::vector<int32_t> page_table;  // [bs, page_table_stride] page of each block of each row
  int64_t page_table_stride = 0;
  std::vector<int32_t> seq_lens;    // [bs]
  int32_t page_size = 0;
};
attention_step build_attention_step(const forward_batch& batch, const hybrid_metadata& meta,
                                    const req_to_token_pool& req_to_token, int32_t page_size);

// A pointer into the step's packed metadata on the model's device (step_pack.h).
struct device_array {
  void* ptr = nullptr;
  template <typename T>
  T* as() const { return static_cast<T*>(ptr); }
};

// The step's metadata on the model's device, uploaded once per step (one packed buffer,
// step_pack.h) and read by every layer.
struct step_inputs {
  forward_mode mode = forward_mode::kIdle;
  int64_t batch_size = 0, num_tokens = 0;
  device_array query_start_loc;    // i32 [bs + 1]
  device_array mamba_slots;        // i32 [bs]; -1 = padding
  device_array has_initial_state;  // [bs] bytes (uint8)
  device_array positions;          // i32 [num_tokens]
  device_array token_ids;          // i32 [num_tokens]
  device_array logit_rows;         // i32 [n_logit_rows]: tokens whose logits the step returns
  int64_t n_logit_rows = 0;
  // Attention layers only (null otherwise): see attention_step.
  device_array locs;               // i32 [num_tokens]
  device_array page_table;         // i32 [bs, page_table_stride]
  device_array seq_lens;           // i32 [bs]
  int64_t page_table_stride = 0;
  int32_t page_size = 0;
  int64_t short_q_max = 0;  // the most queries of a row with at most kernels::kMaxDecodeQueries (attention.h)
  sparse_step sparse;        // sparse Top-K attention of this step (sparse_select.h)
  // TargetVerify / Draft (per-step states): tokens per row, step columns per row, the tree
  // parents (TargetVerify with tree drafts; empty = chain) and the start column of each row
  // (Draft: the row's draft step; empty = 0).
  int64_t spec_tokens_per_row = 0, spec_steps = 0;
  bool spec_tree = false;        // retrieve_parent is set
  bool spec_first_step = false;  // first_step is set
  device_array retrieve_parent;  // i32 [spec_rows, tokens_per_row]
  device_array first_step;       // i32 [bs]
  // Rows the per-step ops run over: the first spec_rows rows (TargetVerify: the verify rows;
  // Draft: every row). With spec_extend (a TargetVerify step carrying prefill chunks) the
  // remaining rows are extend rows: the prefill ops run over every row with extend_slots, in
  // which the verify rows' slots are -1 (skipped).
  int64_t spec_rows = 0;
  bool spec_extend = false;
  device_array extend_slots;     // i32 [bs]
  // Mixed: the leading decode rows (hybrid_metadata::mixed_decode_rows). The recurrent mixers run
  // their one-token update over them and prefill the rest with extend_slots (decode rows -1).
  int64_t mixed_decode_rows = 0;
  // Sampling on the device (worker::step_sampling): settings and feed slot per logits row.
  bool sampling = false;
  device_array sample_settings;  // kernels::sample_settings [n_logit_rows]
  device_array feed_slots;       // i32 [n_logit_rows]
  tensor storage;  // the packed buffer when this step owns it (eager); empty when bound to another

  const uint8_t* initial_state_flags() const { return has_initial_state.as<uint8_t>(); }
};

struct step_layout;

// Points the arrays of `in` into a packed buffer of `layout` at device address `base` and sets
// the mode's scalars from meta (batch and token counts from the layout, which may be padded).
void bind_step(step_inputs& in, const step_layout& layout, const hybrid_metadata& meta, int32_t* base,
               int32_t page_size);
// The eager path: packs the step (ids: the batch's token ids) and uploads it in one copy. step
// may be null (no attention layers); sampling, when set, travels in the same copy.
step_inputs upload_step(const hybrid_metadata& meta, const attention_step* step, const std::vector<int32_t>& ids,
                        const exec_context& ctx, const worker::step_sampling* sampling = nullptr);

struct attention_weights {
  // q, k and v stacked: [(q_heads_local + 2·kv_heads_local)·head_dim, hidden], one projection
  // (one launch, one weight stream) whose output row is q | k | v.
  tensor qkv;
  tensor o;  // [hidden, q_heads_local·head_dim]
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;  // local head counts
  int64_t rotary_dim = 0;                            // 0: no rotary embedding
  float rope_theta = 10000.0f;
  float scale = 0.0f;  // softmax scale; 0 = 1/sqrt(head_dim)
  // A bfloat16 model: the prefill attention's products in bf16 (paged_attention_params::bf16_products).
  bool bf16_products = false;
};
void place(attention_weights& w, device_kind device, dtype weight_type = dtype::kF32);
// Paged attention over the step's rows: causal, or tree-masked for TargetVerify with tree drafts.
void run_attention(const kernels::paged_attention_params& a, const step_inputs& in, const exec_context& ctx);
// The steps every attention variant takes on its projected q, k, v ([T, heads·head_dim] rows,
// each a whole tensor or a part of the fused projection's output: f32_rows), T > 0:
// RoPE in place on q and k over the step's positions (rotary_dim 0: none), k and v into the paged
// cache at the step's locations (one kv_write op, rotation included), then the pages' summaries
// (sparse);
void rope_write_kv(f32_rows q, f32_rows k, f32_rows v, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                   int64_t rotary_dim, float theta, const step_inputs& in, kv_layer_cache& cache,
                   const exec_context& ctx);
// the paged attention of q over the cache into out [T, q_heads·head_dim], on the step's pages or
// those the sparse selection keeps, with the step's promise of queries per row (max_q_len: one
// in a decode or draft step, D in a chain verify); the caller sets the softmax scale.
kernels::paged_attention_params paged_attention_of(f32_rows q, f32_rows out, int64_t q_heads, int64_t kv_heads,
                                                   int64_t head_dim, const kv_layer_cache& cache,
                                                   const step_inputs& in, collective* comm, const exec_context& ctx);
// norm set: x is the block's input and its RMSNorm (norm, eps) is fused into the q | k | v
// projection (the rmsnorm_linear op); x may then be *residual itself.
tensor attention_forward(const attention_weights& w, const tensor& x, const step_inputs& in, kv_layer_cache& cache,
                         collective* comm, const exec_context& ctx, tensor* residual = nullptr,
                         const tensor* norm = nullptr, float eps = 0.0f);
// The same after the projection: qkv holds the rows' q | k | v (w.qkv's output columns, row
// stride qkv.stride: a part of a wider projection, such as Falcon-H1's in_proj | q | k | v).
tensor attention_mix(const attention_weights& w, f32_rows qkv, const step_inputs& in, kv_layer_cache& cache,
                     collective* comm, const exec_context& ctx, tensor* residual = nullptr);
// attention_mix up to the heads' output, before o_proj: rope, the KV write and the attention of
// the rows' queries into out [T, q_heads·head_dim] (row stride out.stride: a part of a wider row,
// such as Falcon-H1's mamba y | attention heads, projected by one weight).
void attention_heads(const attention_weights& w, f32_rows qkv, const step_inputs& in, kv_layer_cache& cache,
                     collective* comm, const exec_context& ctx, f32_rows out);
// The attention op's profile point (attn.extend for extend and mixed steps, else attn.decode):
// q and out in f32, and each row's context of K and V once, in the cache's type.
void profile_attention(const exec_context& ctx, const step_inputs& in, int64_t T, int64_t qw, int64_t kw,
                       const kv_layer_cache& cache);

struct mamba2_weights {
  tensor in_proj;   // [di_local + conv_local + heads_local, hidden]: z | x | B | C | dt
  tensor conv_w;    // [conv_local, K]
  tensor conv_b;    // [conv_local]; empty = no bias
  tensor dt_bias;   // [heads_local]
  tensor A_log;     // [heads_local]
  tensor D;         // [heads_local]
  tensor norm;      // [di_local]
  tensor out_proj;  // [hidden, di_local]
  int64_t heads = 0, head_dim = 0, d_state = 0, groups = 0;  // local counts
  int64_t conv_width = 0, chunk_size = 256;
  int64_t norm_group_size = 0;    // local channels per gated-norm group
  int64_t norm_group_global = 0;  // channels per group over all ranks (> local: sum-of-squares all-reduce)
  // A group split over ranks (then the rank's one local group): the number of groups over all
  // ranks and this rank's group among them; the all-reduce adds each group's partial sums only.
  int64_t norm_groups_total = 1;
  int64_t norm_group_index = 0;
  float dt_min = 0.0f, dt_max = 3.4e38f, eps = 1e-5f;
  // Output norm (model_config::mamba_rms_norm / mamba_norm_before_gate): gated RMSNorm
  // norm(y · silu(z)) by default; norm(y) · silu(z) with norm_before_gate; y · silu(z) without
  // rms_norm (norm empty). Either norm reduces a group split over ranks through the collective.
  bool rms_norm = true;
  bool norm_before_gate = false;
  // A bf16 model: the prefill scan may take bf16 operands where no f32-accurate tensor-core path
  // takes the head shape (ssd_chunk_scan_params::bf16_operands).
  bool bf16_scan = false;

  int64_t d_inner() const { return heads * head_dim; }
  int64_t conv_dim() const { return d_inner() + 2 * groups * d_state; }
  int64_t in_width() const { return d_inner() + conv_dim() + heads; }  // in_proj's rows: z | xBC | dt
};
// in_proj and out_proj in weight_type; conv, norm, dt_bias, A_log and D stay f32.
void place(mamba2_weights& w, device_kind device, dtype weight_type = dtype::kF32);
// steps: the layer's per-step states (model_context::mamba_steps), needed by TargetVerify and
// Draft, which never write `state`. norm: x is the block input and in_proj reads rmsnorm(x;
// norm, eps) (the block's input norm fused into it); x may then be *residual.
tensor mamba2_forward(const mamba2_weights& w, const tensor& x, const step_inputs& in, mamba_layer_state& state,
                      collective* comm, const exec_context& ctx, mamba_layer_state* steps = nullptr,
                      tensor* residual = nullptr, const tensor* norm = nullptr, float eps = 0.0f);
// The same after in_proj: proj [T, W] holds z | xBC | dt in its first w.in_width() columns (W
// may be larger: in_proj stacked with another projection of the same input; every read of proj
// takes its row stride W).
tensor mamba2_mix(const mamba2_weights& w, const tensor& proj, const step_inputs& in, mamba_layer_state& state,
                  collective* comm, const exec_context& ctx, mamba_layer_state* steps = nullptr,
                  tensor* residual = nullptr);
// mamba2_mix up to its gated output, before out_proj: conv, scan and the gate (or gated norm) of
// the rows into y_out [T, d_inner] (row stride y_out.stride, as attention_heads' out). False, with
// nothing written, for no rows or the idle mode.
// deferred_norm set: where the output norm is the gated norm op over groups whole on this rank,
// it is not run but its params are written there (x = out = y_out's rows) for
// gated_block_output; deferred_norm->rows is 0 when there is none left to run.
bool mamba2_mix_gated(const mamba2_weights& w, const tensor& proj, const step_inputs& in, mamba_layer_state& state,
                      collective* comm, const exec_context& ctx, mamba_layer_state* steps, f32_rows y_out,
                      kernels::gated_rmsnorm_params* deferred_norm = nullptr);

}  // namespace hyserve::worker::layers
