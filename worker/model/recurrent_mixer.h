#pragma once
// The step skeleton shared by the recurrent mixers (Mamba2, Gated DeltaNet): the forward mode
// picks one of three paths, the causal conv over the mixer's conv channels runs that path, and
// the mixer's scan follows it.
//   prefill  (Extend, Mixed, DraftExtend): varlen conv from each row's slot, then the chunked
//            scan from the slot's state; final conv window and state back to the slot. A Mixed
//            step's leading decode rows take the update path instead (then the other rows
//            prefill), so a decode row's result does not depend on what shares its step;
//   update   (Decode): one token per row, window and state updated in place;
//   steps    (TargetVerify, Draft): every token's window and state written to the per-step
//            storage, the slot's untouched (the commit copies the accepted step later); a
//            TargetVerify step carrying prefill chunks then prefills its extend rows.
// A mixer is its scan: three callbacks that read the conv output.
#include <functional>
#include <string>

#include "layers.h"

namespace hyserve::worker::layers {

enum class mixer_path { kIdle, kPrefill, kUpdate, kSteps };

// The path of in.mode; invalid_argument_error naming `mixer` when a per-step mode has no steps.
mixer_path mixer_path_of(const step_inputs& in, const mamba_layer_state* steps, const std::string& mixer);

// The conv's input and output: channels [0, dim) of x (row stride x_stride) into out (dim
// channels per row), SiLU applied; weight [dim, width], bias [dim] or empty.
struct mixer_conv {
  const float* x = nullptr;
  int64_t x_stride = 0;
  float* out = nullptr;  // contiguous rows of dim channels
  int64_t dim = 0, width = 0;
  const tensor* weight = nullptr;
  const tensor* bias = nullptr;
};

struct mixer_scan {
  // The chunked scan over the rows whose slot in `slots` is >= 0 (after their varlen conv).
  std::function<void(const device_array& slots)> prefill;
  // One token per row from and to its slot, over the first `rows` rows.
  std::function<void(int64_t rows)> update;
  // Every token to its step column (tree parents and start columns as the conv used them).
  std::function<void(const int32_t* retrieve_parent, const int32_t* first_step)> steps;
};

// The row fields of a mixer's scan params that come from the step alike for both mixers:
// the chunked scan's rows by slot (negative: skipped), their token spans and initial-state flags;
template <class ScanParams>
void set_prefill_rows(ScanParams& s, const device_array& slots, const step_inputs& in, int64_t chunk_size) {
  s.state_indices = slots.as<int32_t>();
  s.query_start_loc = in.query_start_loc.as<int32_t>();
  s.has_initial_state = in.initial_state_flags();
  s.chunk_size = chunk_size;
}
// the per-step update's verify or draft rows, tokens per row and step columns.
template <class StepParams>
void set_step_rows(StepParams& s, const step_inputs& in, const int32_t* retrieve_parent, const int32_t* first_step) {
  s.batch = in.spec_rows;
  s.retrieve_parent = retrieve_parent;
  s.first_step = first_step;
  s.tokens_per_row = in.spec_tokens_per_row;
  s.steps = in.spec_steps;
}

// The profile entries (kernels::profile_mark) of the conv: one-token update, per-step update,
// prefill; and of the prefill scan (the one-token and per-step scans profile themselves).
struct mixer_labels {
  const char* conv = nullptr;
  const char* conv_steps = nullptr;
  const char* conv_prefill = nullptr;
  const char* scan_prefill = nullptr;
};

// Runs the conv and the scan along `path` (nothing for kIdle).
void run_recurrent_mixer(mixer_path path, const mixer_conv& conv, const step_inputs& in, mamba_layer_state& state,
                         mamba_layer_state* steps, const mixer_scan& scan, const mixer_labels& labels,
                         const exec_context& ctx);

}  // namespace hyserve::worker::layers
