#include "recurrent_mixer.h"

#include "hyserve/common/error.h"
#include "hyserve/kernels/causal_conv1d.h"
#include "hyserve/kernels/run.h"

namespace hyserve::worker::layers {

mixer_path mixer_path_of(const step_inputs& in, const mamba_layer_state* steps, const std::string& mixer) {
  switch (in.mode) {
    case forward_mode::kExtend:
    case forward_mode::kMixed:
    case forward_mode::kDraftExtend:
      return mixer_path::kPrefill;
    case forward_mode::kDecode:
      return mixer_path::kUpdate;
    case forward_mode::kIdle:
      return mixer_path::kIdle;
    case forward_mode::kTargetVerify:
    case forward_mode::kDraft:
      if (!steps)
        throw invalid_argument_error(mixer + ": forward mode " + std::string(forward_mode_name(in.mode)) +
                                     " needs per-step state storage");
      return mixer_path::kSteps;
  }
  throw invalid_argument_error(mixer + ": unknown forward mode");
}

namespace {

template <class P>
void set_conv(P& c, const mixer_conv& conv, mamba_layer_state& state) {
  c.x = conv.x;
  c.weight = conv.weight->as<float>();
  c.bias = conv.bias->empty() ? nullptr : conv.bias->as<float>();
  c.out = conv.out;
  c.conv_states = state.conv.as<float>();
  c.dim = conv.dim;
  c.width = conv.width;
  c.x_stride = conv.x_stride;
  c.out_stride = conv.dim;
  c.silu = true;
}

}  // namespace

void run_recurrent_mixer(mixer_path path, const mixer_conv& conv, const step_inputs& in, mamba_layer_state& state,
                         mamba_layer_state* steps, const mixer_scan& scan, const mixer_labels& labels,
                         const exec_context& ctx) {
  auto prefill = [&](const device_array& slots) {
    kernels::conv1d_varlen_params c;
    set_conv(c, conv, state);
    c.query_start_loc = in.query_start_loc.as<int32_t>();
    c.state_indices = slots.as<int32_t>();
    c.has_initial_state = in.initial_state_flags();
    c.batch = in.batch_size;
    kernels::run(c, ctx);
    // The tokens' channels read and written (f32), the weights.
    const double tokens = static_cast<double>(in.num_tokens);
    if (labels.conv_prefill != nullptr)
      profile(ctx, labels.conv_prefill, tokens * static_cast<double>(conv.dim) * 8.0 + nbytes(*conv.weight));
    scan.prefill(slots);
    if (labels.scan_prefill != nullptr) profile(ctx, labels.scan_prefill, tokens * static_cast<double>(conv.dim) * 8.0);
  };
  const double window_bytes = 4.0 * static_cast<double>(conv.dim * (conv.width - 1));
  // One token per row over the first `rows` rows (tokens 0 .. rows - 1), from and to its slot.
  auto update = [&](int64_t rows) {
    kernels::conv1d_update_params c;
    set_conv(c, conv, state);
    c.state_indices = in.mamba_slots.as<int32_t>();
    c.batch = rows;
    kernels::run(c, ctx);
    // Each token's channels read and written, the weights, each row's window read and written.
    profile(ctx, labels.conv,
            static_cast<double>(rows * conv.dim) * 8.0 + nbytes(*conv.weight) +
                2.0 * static_cast<double>(rows) * window_bytes);
    scan.update(rows);
  };
  switch (path) {
    case mixer_path::kIdle:
      return;
    case mixer_path::kPrefill:
      if (in.mixed_decode_rows > 0) {
        // Mixed: the leading decode rows (tokens 0 .. n - 1) as in a Decode step, then the rest.
        update(in.mixed_decode_rows);
        if (in.mixed_decode_rows < in.batch_size) prefill(in.extend_slots);
        return;
      }
      prefill(in.mamba_slots);
      return;
    case mixer_path::kUpdate:
      update(in.batch_size);
      return;
    case mixer_path::kSteps: {
      kernels::conv1d_update_multi_params c;
      set_conv(c, conv, state);
      c.state_indices = in.mamba_slots.as<int32_t>();
      c.step_windows = steps->conv.as<float>();
      c.retrieve_parent = in.spec_tree ? in.retrieve_parent.as<int32_t>() : nullptr;
      c.first_step = in.spec_first_step ? in.first_step.as<int32_t>() : nullptr;
      c.batch = in.spec_rows;
      c.tokens_per_row = in.spec_tokens_per_row;
      c.steps = in.spec_steps;
      kernels::run(c, ctx);
      // Windows: each token's read (slot or step column) and written.
      const double row_tokens = static_cast<double>(in.spec_rows * in.spec_tokens_per_row);
      profile(ctx, labels.conv_steps,
              row_tokens * (static_cast<double>(conv.dim) * 8.0 + 2.0 * window_bytes) + nbytes(*conv.weight));
      scan.steps(c.retrieve_parent, c.first_step);
      if (in.spec_extend) prefill(in.extend_slots);
      return;
    }
  }
}

}  // namespace hyserve::worker::layers
