#include "hyserve/kernels/causal_conv1d.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "conv_validate.h"
#include "validate.h"

namespace hyserve::kernels {

using namespace cpu_detail;

namespace {

// Channels per OpenMP task: 64 floats (256 B) per token row keeps the row reads contiguous
// while giving (batch × dim / 64) tasks.
constexpr int64_t kChannelBlock = 64;

float silu(float v) { return v / (1.0f + std::exp(-v)); }

// The shared field checks (conv_validate.h), then the slots, which the CPU op can read.
template <class Params>
void check_common(const Params& p, const char* op) {
  check_conv1d_fields(p, op);
  require_state_indices(p.state_indices, p.batch, op);
}

}  // namespace

void run_cpu(const conv1d_varlen_params& p) {
  constexpr const char* op = "causal_conv1d_varlen";
  check_common(p, op);
  require_ptr(p.query_start_loc, op, "query_start_loc");
  require_query_start_loc(p.query_start_loc, p.batch, op);

  const int64_t K = p.width;
  const int64_t W = K - 1;  // saved window length
  const int64_t n_blocks = (p.dim + kChannelBlock - 1) / kChannelBlock;

  // One task = one sequence × one channel block: it owns those channels of the slot's window,
  // so it reads the old window, convolves, and writes the new window without synchronisation.
#pragma omp parallel
  {
    std::vector<float> old_win(static_cast<size_t>(kChannelBlock * W));  // [block, W], oldest first
    std::vector<float> w_t(static_cast<size_t>(kChannelBlock * K));      // [K, block]: taps transposed
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t blk = 0; blk < n_blocks; ++blk) {
        const int32_t slot = p.state_indices[b];
        if (slot < 0) continue;  // padding row: output and state untouched
        const int64_t start = p.query_start_loc[b];
        const int64_t len = p.query_start_loc[b + 1] - start;
        const int64_t c0 = blk * kChannelBlock;
        const int64_t nc = std::min(kChannelBlock, p.dim - c0);
        const bool init = p.has_initial_state != nullptr && p.has_initial_state[b] != 0;
        float* win = p.conv_states + (static_cast<int64_t>(slot) * p.dim + c0) * W;

        for (int64_t c = 0; c < nc; ++c) {
          for (int64_t j = 0; j < W; ++j) old_win[c * W + j] = init ? win[c * W + j] : 0.0f;
          for (int64_t j = 0; j < K; ++j) w_t[j * kChannelBlock + c] = p.weight[(c0 + c) * K + j];
        }

        // Input of channel c at sequence offset s (s < 0 reaches into the saved window).
        auto input = [&](int64_t s, int64_t c) -> float {
          return s >= 0 ? p.x[(start + s) * p.x_stride + c0 + c] : old_win[c * W + (W + s)];
        };

        for (int64_t t = 0; t < len; ++t) {
          float* o = p.out + (start + t) * p.out_stride + c0;
          if (t >= W) {
            // Whole receptive field inside the sequence: contiguous rows, vectorised over c.
            for (int64_t c = 0; c < nc; ++c) o[c] = p.bias != nullptr ? p.bias[c0 + c] : 0.0f;
            for (int64_t j = 0; j < K; ++j) {
              const float* xr = p.x + (start + t - W + j) * p.x_stride + c0;
              const float* wj = w_t.data() + j * kChannelBlock;
              for (int64_t c = 0; c < nc; ++c) o[c] += wj[c] * xr[c];
            }
          } else {
            for (int64_t c = 0; c < nc; ++c) {
              float acc = p.bias != nullptr ? p.bias[c0 + c] : 0.0f;
              for (int64_t j = 0; j < K; ++j) acc += w_t[j * kChannelBlock + c] * input(t - W + j, c);
              o[c] = acc;
            }
          }
          if (p.silu) {
            for (int64_t c = 0; c < nc; ++c) o[c] = silu(o[c]);
          }
        }

        // New window = last W entries of (old window ++ sequence); sequence offset len - W + j.
        for (int64_t c = 0; c < nc; ++c) {
          for (int64_t j = 0; j < W; ++j) win[c * W + j] = input(len - W + j, c);
        }
      }
    }
  }
}

void run_cpu(const conv1d_update_params& p) {
  constexpr const char* op = "causal_conv1d_update";
  check_common(p, op);

  const int64_t K = p.width;
  const int64_t W = K - 1;

  const int64_t n_blocks = (p.dim + kChannelBlock - 1) / kChannelBlock;

#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t blk = 0; blk < n_blocks; ++blk) {
      const int32_t slot = p.state_indices[b];
      if (slot < 0) continue;  // padding row: output and state untouched
      const float* x = p.x + b * p.x_stride;
      float* o = p.out + b * p.out_stride;
      float* win = p.conv_states + static_cast<int64_t>(slot) * p.dim * W;
      const int64_t c_end = std::min(p.dim, (blk + 1) * kChannelBlock);
      for (int64_t c = blk * kChannelBlock; c < c_end; ++c) {
        const float* w = p.weight + c * K;
        float* wc = win + c * W;
        float acc = p.bias != nullptr ? p.bias[c] : 0.0f;
        for (int64_t j = 0; j < W; ++j) acc += w[j] * wc[j];
        acc += w[W] * x[c];
        o[c] = p.silu ? silu(acc) : acc;
        for (int64_t j = 0; j + 1 < W; ++j) wc[j] = wc[j + 1];
        if (W > 0) wc[W - 1] = x[c];
      }
    }
  }
}

}  // namespace hyserve::kernels
