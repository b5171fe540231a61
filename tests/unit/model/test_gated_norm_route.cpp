// kernels.norm_linear_gate on the CPU: a mixer's gated output norm handed to the out_proj op
// (rmsnorm_linear with a gate: the gated norm op into a scratch block, then the gemm with the
// residual add) against the default route (the gated norm op in place, then the gemm). The same
// ops on the same values, so a prefill and four decode steps of every family with a gated
// mixer norm (Mamba2 with one or four groups, Gated DeltaNet) give logits within 1e-6 of each
// other (|Δ| <= 1e-6 + 1e-6·|want|; the gemm reads the normed rows from another buffer).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "fixture.h"
#include "hyserve/common/config.h"
#include "hyserve/worker/engine.h"

namespace hyserve {
namespace {

using worker::engine;
using worker::forward_mode;
using worker::step_row;

service_config route_config(const std::string& fixture, bool gate_in_out_proj) {
  service_config cfg;
  cfg.model.path = test::fixture_dir(fixture);
  cfg.cache.page_size = 16;
  cfg.cache.max_requests = 4;
  cfg.cache.max_context = 256;
  cfg.kernels.norm_linear_gate = gate_in_out_proj;
  return cfg;
}

// Prefill of the first reference prompt, then 4 greedy decode steps: every step's last-row
// logits, concatenated.
std::vector<float> prefill_and_decode(engine& eng, const std::vector<int32_t>& prompt) {
  std::vector<float> all;
  const int32_t req = eng.open_request();
  host_tensor logits = eng.step(forward_mode::kExtend, {step_row{req, prompt}});
  const int64_t vocab = logits.shape()[1];
  for (int s = 0; s < 5; ++s) {
    const float* last = logits.as<float>() + (logits.shape()[0] - 1) * vocab;
    all.insert(all.end(), last, last + vocab);
    int32_t next = 0;
    for (int64_t j = 1; j < vocab; ++j)
      if (last[j] > last[next]) next = static_cast<int32_t>(j);
    if (s < 4) logits = eng.step(forward_mode::kDecode, {step_row{req, {next}}});
  }
  eng.close_request(req);
  return all;
}

TEST(GatedNormRoute, OutProjOpEqualsTheNormOpThenTheGemm) {
  for (const std::string fixture : {"bamba-tiny", "bamba-groups", "nemotronh-tiny", "granite4h-tiny", "qwen3next-tiny"}) {
    SCOPED_TRACE(fixture);
    const std::vector<int32_t> prompt = test::load_reference_prompts(fixture).at(0).input_ids;
    engine apart(route_config(fixture, false));
    engine inside(route_config(fixture, true));
    const std::vector<float> want = prefill_and_decode(apart, prompt);
    const std::vector<float> got = prefill_and_decode(inside, prompt);
    ASSERT_EQ(got.size(), want.size());
    int64_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (!(std::fabs(got[i] - want[i]) <= 1e-6 + 1e-6 * std::fabs(want[i]))) ++bad;
    EXPECT_EQ(bad, 0) << "logits of 5 steps differing by more than 1e-6 + 1e-6·|want|";
  }
}

}  // namespace
}  // namespace hyserve
