// Backend ops: logits processing (bias, min_tokens masks, repetition / presence / frequency
// penalties, top-N logprobs) and the per-slot token counts, CUDA against the CPU op on the same
// inputs. Processed logits agree to 1e-6 relative (same float operations; -inf exactly), the
// top-N tokens are identical and their logprobs agree to 1e-5; the counts are identical.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "hyserve/kernels/device.h"

#if defined(HYSERVE_HAVE_CUDA)

#include "cuda_test_util.h"
#include "hyserve/kernels/logits_processing.h"

namespace hyserve::kernels {
namespace {

using cuda_test::to_device;

TEST(LogitsProcessingCuda, Cuda_f32_MatchesCpu) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (const int64_t V : {97, 4096, 151936}) {
    constexpr int64_t n_slots = 5, rows = 9;
    std::mt19937 rng(static_cast<unsigned>(V));
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V) - 1);
    // Counts: clear every slot, mark prompts, add sampled tokens, on both backends.
    std::vector<int32_t> counts(static_cast<size_t>(n_slots * V), 7);
    std::vector<int32_t> clear = {0, 1, 2, 3, 4}, seen;
    for (int s = 0; s < n_slots; ++s)
      for (int i = 0; i < 40; ++i) {
        seen.push_back(s);
        seen.push_back(i % 5 == 0 ? 1 : tok(rng));
      }
    auto dcounts = to_device(counts);
    auto dclear = to_device(clear);
    auto dseen = to_device(seen);
    token_count_params c;
    c.n_slots = n_slots;
    c.vocab = V;
    c.n_clear = n_slots;
    c.n_seen = static_cast<int64_t>(seen.size() / 2);
    c.counts = counts.data();
    c.clear_slots = clear.data();
    c.seen = seen.data();
    run_cpu(c);
    c.counts = dcounts.data();
    c.clear_slots = dclear.data();
    c.seen = dseen.data();
    run_cuda(c);
    for (int step = 0; step < 25; ++step) {
      std::vector<sample_output> sampled;
      std::vector<int32_t> slots;
      for (int s = 0; s < n_slots; ++s) {
        sampled.push_back(sample_output{step % 4 == 0 ? 3 : tok(rng), 0.0f});
        slots.push_back(s == 2 ? -1 : s);
      }
      device_array<sample_output> dsampled(sampled.size());
      dsampled.upload(sampled);
      auto dslots = to_device(slots);
      token_count_params q;
      q.n_slots = n_slots;
      q.vocab = V;
      q.n_sampled = static_cast<int64_t>(sampled.size());
      q.counts = counts.data();
      q.sampled = sampled.data();
      q.sampled_slots = slots.data();
      run_cpu(q);
      q.counts = dcounts.data();
      q.sampled = dsampled.data();
      q.sampled_slots = dslots.data();
      run_cuda(q);
      device_synchronize();
    }
    EXPECT_EQ(dcounts.download(), counts) << "V " << V;

    std::vector<logits_row_settings> settings(rows);
    std::vector<int32_t> bias_ids, mask_ids;
    std::vector<float> bias_values;
    for (int64_t r = 0; r < rows; ++r) {
      logits_row_settings& s = settings[static_cast<size_t>(r)];
      s.count_slot = r % 3 == 2 ? -1 : static_cast<int32_t>(r % n_slots);
      s.repetition_penalty = r % 2 == 0 ? 1.2f : 0.8f;
      s.presence_penalty = r % 4 == 1 ? 0.5f : -0.3f;
      s.frequency_penalty = r % 3 == 0 ? 0.25f : 0.0f;
      s.bias_begin = static_cast<int32_t>(bias_ids.size());
      for (int i = 0; i < static_cast<int>(r % 4) * 7; ++i) {
        bias_ids.push_back(i == 3 ? bias_ids.back() : tok(rng));  // a repeated id adds twice
        bias_values.push_back(nd(rng) * 10.0f);
      }
      s.bias_count = static_cast<int32_t>(bias_ids.size()) - s.bias_begin;
      s.mask_begin = static_cast<int32_t>(mask_ids.size());
      for (int i = 0; i < static_cast<int>(r % 3); ++i) mask_ids.push_back(tok(rng));
      s.mask_count = static_cast<int32_t>(mask_ids.size()) - s.mask_begin;
      s.top_n = static_cast<int32_t>((r * 7) % 21);
    }
    const int64_t stride = V + 5;
    std::vector<float> logits(static_cast<size_t>(rows * stride));
    for (float& v : logits) v = nd(rng);
    auto dlogits = to_device(logits);
    auto dsettings = device_array<logits_row_settings>(settings.size());
    dsettings.upload(settings);
    auto dbias_ids = to_device(bias_ids);
    auto dbias_values = to_device(bias_values);
    auto dmask = to_device(mask_ids);
    device_array<top_logprob> dtop(static_cast<size_t>(rows * kMaxTopLogprobs));
    std::vector<top_logprob> top(static_cast<size_t>(rows * kMaxTopLogprobs));
    dtop.upload(top);
    logits_process_params p;
    p.rows = rows;
    p.vocab = V;
    p.stride = stride;
    p.n_slots = n_slots;
    p.n_bias = static_cast<int64_t>(bias_ids.size());
    p.n_mask = static_cast<int64_t>(mask_ids.size());
    p.max_top = kMaxTopLogprobs;
    p.logits = logits.data();
    p.settings = settings.data();
    p.counts = counts.data();
    p.bias_ids = bias_ids.data();
    p.bias_values = bias_values.data();
    p.mask_ids = mask_ids.data();
    p.top = top.data();
    run_cpu(p);
    p.logits = dlogits.data();
    p.settings = dsettings.data();
    p.counts = dcounts.data();
    p.bias_ids = dbias_ids.data();
    p.bias_values = dbias_values.data();
    p.mask_ids = dmask.data();
    p.top = dtop.data();
    run_cuda(p);
    device_synchronize();
    cuda_test::expect_match(dlogits.download(), logits, 1e-6, 1e-6, "processed logits, V " + std::to_string(V));
    const std::vector<top_logprob> gtop = dtop.download();
    for (int64_t r = 0; r < rows; ++r)
      for (int32_t k = 0; k < settings[static_cast<size_t>(r)].top_n; ++k) {
        const size_t i = static_cast<size_t>(r * kMaxTopLogprobs + k);
        EXPECT_EQ(gtop[i].token, top[i].token) << "V " << V << " row " << r << " rank " << k;
        EXPECT_NEAR(gtop[i].logprob, top[i].logprob, 1e-5) << "V " << V << " row " << r << " rank " << k;
      }
  }
}

TEST(LogitsProcessingCuda, Cuda_f32_RejectsBadShapes) {
  if (hyserve::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  logits_process_params p;
  p.rows = 1;
  p.vocab = 8;
  p.stride = 8;
  EXPECT_THROW(run_cuda(p), invalid_argument_error);  // no logits
  token_count_params c;
  c.n_slots = 1;
  c.vocab = 8;
  c.n_clear = 1;
  EXPECT_THROW(run_cuda(c), invalid_argument_error);  // no counts
}

}  // namespace
}  // namespace hyserve::kernels

#endif
