#pragma once
// hyserve-bench-cuda moe at 8192 tokens under skewed routing: expert e's logits lowered by
// σ · ln(1 + e / 8) (σ: the logits' standard deviation), so that a few experts get thousands of
// rows and the tail a few, unlike the balanced routing of trained routers (and of the bench's
// random logits): the default paths against 128-row tiles and a block a tile.
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "hyserve/kernels/moe.h"

namespace hyserve::kernels::bench {

struct moe_skew_result {
  int64_t distinct = 0;  // experts with rows
  int64_t busiest = 0;   // rows of the busiest expert
  std::vector<std::pair<std::string, double>> us;  // label (default, tiles_128, block_a_tile), µs a call
};

// logits: the router's [tokens, experts] logits of p's tokens (host); p: the op as the bench
// runs it (its router_logits replaced); time_in_arena: times a call with the op's scratch in the
// bench's arena.
moe_skew_result bench_moe_skewed(cudaStream_t stream, const std::vector<float>& logits, const moe_experts_params& p,
                                 const std::function<double(const std::function<void(int)>&)>& time_in_arena);

}  // namespace hyserve::kernels::bench
