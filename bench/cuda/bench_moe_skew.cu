// hyserve-bench-cuda moe's skewed-routing case (bench_moe_skew.h).
#include "bench_moe_skew.h"

#include <algorithm>
#include <cmath>

#include "cuda/device_buffer.h"
#include "hyserve/kernels/paths.h"

namespace hyserve::kernels::bench {

moe_skew_result bench_moe_skewed(cudaStream_t stream, const std::vector<float>& logits, const moe_experts_params& p,
                                 const std::function<double(const std::function<void(int)>&)>& time_in_arena) {
  const int64_t T = p.tokens, E = p.experts, K = p.top_k;
  double sum = 0.0, sq = 0.0;
  for (const float v : logits) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(logits.size());
  const auto sigma = static_cast<float>(std::sqrt(std::max(0.0, sq / n - (sum / n) * (sum / n))));
  std::vector<float> skew = logits;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e)
      skew[static_cast<size_t>(t * E + e)] -= sigma * std::log1p(static_cast<float>(e) / 8.0f);
  std::vector<int64_t> load(static_cast<size_t>(E), 0);
  std::vector<int32_t> ids(static_cast<size_t>(K));
  std::vector<float> w(static_cast<size_t>(K));
  for (int64_t t = 0; t < T; ++t) {
    moe_route_token(skew.data() + t * E, E, K, p.scoring, p.norm_topk_prob, ids.data(), w.data());
    for (const int32_t e : ids) ++load[static_cast<size_t>(e)];
  }
  moe_skew_result res;
  res.distinct = std::count_if(load.begin(), load.end(), [](int64_t l) { return l > 0; });
  res.busiest = *std::max_element(load.begin(), load.end());
  const device_array<float> skew_d(skew);
  moe_experts_params ps = p;
  ps.router_logits = skew_d.data();
  kernel_paths rows_128, block_a_tile;
  rows_128.moe_wgmma_rows = 128;
  block_a_tile.moe_wgmma_persistent = false;
  for (const auto& [label, paths] : {std::pair{"default", kernel_paths{}}, std::pair{"tiles_128", rows_128},
                                     std::pair{"block_a_tile", block_a_tile}}) {
    const paths_scope scope(paths);
    res.us.emplace_back(label, time_in_arena([&](int) { run_cuda(ps, stream); }));
  }
  return res;
}

}  // namespace hyserve::kernels::bench
