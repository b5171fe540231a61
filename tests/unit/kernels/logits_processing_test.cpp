// The logits-processing op (logits_processing.h) on the CPU against a naive reference written
// from the definitions (vLLM's): bias, min_tokens masks, repetition / presence / frequency
// penalties from the slot counts, top-N log-softmax values (|Δ| <= 1e-5), and the count
// maintenance (clear, prompt marks, sampled tokens).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "hyserve/common/error.h"
#include "hyserve/kernels/logits_processing.h"

namespace hyserve::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct row_case {
  std::map<int32_t, float> bias;
  std::vector<int32_t> mask;
  float rep = 1.0f, pres = 0.0f, freq = 0.0f;
  int32_t slot = -1;
  int32_t top_n = 0;
};

// Straight from the definitions, in double where it matters.
std::vector<float> reference(std::vector<float> x, const row_case& c, const std::vector<int32_t>& prompt,
                             const std::vector<int32_t>& output) {
  for (const auto& [id, b] : c.bias) x[id] += b;
  for (int32_t id : c.mask) x[id] = -kInf;
  if (c.slot >= 0) {
    for (size_t v = 0; v < x.size(); ++v) {
      const auto n = static_cast<int32_t>(std::count(output.begin(), output.end(), static_cast<int32_t>(v)));
      const bool in_prompt = std::find(prompt.begin(), prompt.end(), static_cast<int32_t>(v)) != prompt.end();
      if ((n > 0 || in_prompt) && c.rep != 1.0f) x[v] = x[v] > 0 ? x[v] / c.rep : x[v] * c.rep;
      x[v] -= c.freq * static_cast<float>(n) + c.pres * (n > 0 ? 1.0f : 0.0f);
    }
  }
  return x;
}

std::vector<double> log_softmax(const std::vector<float>& x) {
  double mx = -kInf;
  for (float v : x) mx = std::max(mx, static_cast<double>(v));
  double z = 0;
  for (float v : x) z += std::exp(v - mx);
  std::vector<double> out;
  for (float v : x) out.push_back(v - mx - std::log(z));
  return out;
}

TEST(LogitsProcessing, MatchesNaiveReference) {
  constexpr int64_t V = 300, n_slots = 4;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<row_case> cases(6);
  cases[0].bias = {{5, 100.0f}, {7, -100.0f}, {299, 2.5f}};
  cases[1].mask = {2, 11};
  cases[1].top_n = 5;
  cases[2].slot = 1;
  cases[2].rep = 1.3f;
  cases[2].top_n = 20;
  cases[3].slot = 2;
  cases[3].pres = 0.5f;
  cases[3].freq = 0.25f;
  cases[3].bias = {{3, 1.0f}};
  cases[3].mask = {9};
  cases[4].slot = 3;
  cases[4].rep = 0.7f;
  cases[4].pres = -1.0f;
  cases[4].freq = 2.0f;
  cases[4].top_n = 1;
  // cases[5]: nothing to do (left untouched).

  // Slot histories: prompts and outputs.
  std::vector<std::vector<int32_t>> prompts(n_slots), outputs(n_slots);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V) - 1);
  for (int s = 0; s < n_slots; ++s) {
    for (int i = 0; i < 20; ++i) prompts[s].push_back(tok(rng));
    for (int i = 0; i < 30; ++i) outputs[s].push_back(i % 3 == 0 ? outputs[s].empty() ? 4 : outputs[s].back() : tok(rng));
  }
  // Build the counts through the count op: junk first, then clear, prompt marks, sampled tokens.
  std::vector<int32_t> counts(static_cast<size_t>(n_slots * V), 12345);
  {
    token_count_params p;
    p.counts = counts.data();
    p.n_slots = n_slots;
    p.vocab = V;
    std::vector<int32_t> clear = {0, 1, 2, 3};
    std::vector<int32_t> seen;
    for (int s = 0; s < n_slots; ++s)
      for (int32_t t : prompts[s]) {
        seen.push_back(s);
        seen.push_back(t);
      }
    seen.push_back(1);
    seen.push_back(-5);  // placeholder-like: skipped
    p.clear_slots = clear.data();
    p.n_clear = 4;
    p.seen = seen.data();
    p.n_seen = static_cast<int64_t>(seen.size() / 2);
    run_cpu(p);
    // Sampled tokens one step at a time, as steps do.
    for (size_t i = 0; i < 30; ++i) {
      token_count_params q;
      q.counts = counts.data();
      q.n_slots = n_slots;
      q.vocab = V;
      std::vector<sample_output> sampled;
      std::vector<int32_t> slots;
      for (int s = 0; s < n_slots; ++s) {
        sampled.push_back(sample_output{outputs[s][i], 0.0f});
        slots.push_back(s);
      }
      sampled.push_back(sample_output{3, 0.0f});
      slots.push_back(-1);  // a row without counts
      q.sampled = sampled.data();
      q.sampled_slots = slots.data();
      q.n_sampled = static_cast<int64_t>(sampled.size());
      run_cpu(q);
    }
  }
  for (int s = 0; s < n_slots; ++s)
    for (int64_t v = 0; v < V; ++v) {
      const int32_t c = counts[static_cast<size_t>(s * V + v)];
      EXPECT_EQ(c & kCountMask, std::count(outputs[s].begin(), outputs[s].end(), v)) << s << " " << v;
      EXPECT_EQ((c & kPromptSeenBit) != 0, std::find(prompts[s].begin(), prompts[s].end(), v) != prompts[s].end());
    }

  const auto rows = static_cast<int64_t>(cases.size());
  std::vector<float> logits(static_cast<size_t>(rows * (V + 3)));
  for (float& v : logits) v = nd(rng);
  const std::vector<float> original = logits;
  std::vector<logits_row_settings> settings;
  std::vector<int32_t> bias_ids, mask_ids;
  std::vector<float> bias_values;
  for (const row_case& c : cases) {
    logits_row_settings s;
    s.repetition_penalty = c.rep;
    s.presence_penalty = c.pres;
    s.frequency_penalty = c.freq;
    s.count_slot = c.slot;
    s.bias_begin = static_cast<int32_t>(bias_ids.size());
    for (const auto& [id, b] : c.bias) {
      bias_ids.push_back(id);
      bias_values.push_back(b);
    }
    s.bias_count = static_cast<int32_t>(bias_ids.size()) - s.bias_begin;
    s.mask_begin = static_cast<int32_t>(mask_ids.size());
    mask_ids.insert(mask_ids.end(), c.mask.begin(), c.mask.end());
    s.mask_count = static_cast<int32_t>(c.mask.size());
    s.top_n = c.top_n;
    settings.push_back(s);
  }
  std::vector<top_logprob> top(static_cast<size_t>(rows * kMaxTopLogprobs));
  logits_process_params p;
  p.logits = logits.data();
  p.settings = settings.data();
  p.counts = counts.data();
  p.bias_ids = bias_ids.data();
  p.bias_values = bias_values.data();
  p.mask_ids = mask_ids.data();
  p.top = top.data();
  p.rows = rows;
  p.vocab = V;
  p.stride = V + 3;
  p.n_slots = n_slots;
  p.n_bias = static_cast<int64_t>(bias_ids.size());
  p.n_mask = static_cast<int64_t>(mask_ids.size());
  p.max_top = kMaxTopLogprobs;
  run_cpu(p);

  for (int64_t r = 0; r < rows; ++r) {
    const row_case& c = cases[static_cast<size_t>(r)];
    const std::vector<float> in(original.begin() + r * (V + 3), original.begin() + r * (V + 3) + V);
    const std::vector<int32_t> no;
    const std::vector<float> want = reference(in, c, c.slot >= 0 ? prompts[c.slot] : no, c.slot >= 0 ? outputs[c.slot] : no);
    for (int64_t v = 0; v < V; ++v) {
      const float got = logits[static_cast<size_t>(r * (V + 3) + v)];
      if (std::isinf(want[v])) EXPECT_EQ(got, want[v]) << "row " << r << " v " << v;
      else EXPECT_NEAR(got, want[v], 1e-5f * std::max(1.0f, std::fabs(want[v]))) << "row " << r << " v " << v;
    }
    for (int64_t v = V; v < V + 3; ++v)  // the stride's padding is not touched
      EXPECT_EQ(logits[static_cast<size_t>(r * (V + 3) + v)], original[static_cast<size_t>(r * (V + 3) + v)]);
    if (c.top_n > 0) {
      const std::vector<double> ls = log_softmax(want);
      std::vector<int32_t> order(static_cast<size_t>(V));
      for (int32_t v = 0; v < V; ++v) order[static_cast<size_t>(v)] = v;
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return want[a] > want[b]; });
      for (int32_t k = 0; k < c.top_n; ++k) {
        const top_logprob& t = top[static_cast<size_t>(r * kMaxTopLogprobs + k)];
        EXPECT_EQ(t.token, order[static_cast<size_t>(k)]) << "row " << r << " rank " << k;
        EXPECT_NEAR(t.logprob, ls[static_cast<size_t>(order[static_cast<size_t>(k)])], 1e-5) << "row " << r;
      }
    }
  }
  // Row 0: a +100 bias makes token 5 the argmax.
  EXPECT_EQ(std::max_element(logits.begin(), logits.begin() + V) - logits.begin(), 5);
}

TEST(LogitsProcessing, RejectsBadSettings) {
  std::vector<float> x(8, 0.0f);
  logits_row_settings s;
  logits_process_params p;
  p.logits = x.data();
  p.settings = &s;
  p.rows = 1;
  p.vocab = 8;
  p.stride = 8;
  s.repetition_penalty = 0.0f;
  EXPECT_THROW(run_cpu(p), invalid_argument_error);
  s = {};
  s.presence_penalty = kInf;
  EXPECT_THROW(run_cpu(p), invalid_argument_error);
  s = {};
  s.count_slot = 0;  // no counts
  EXPECT_THROW(run_cpu(p), invalid_argument_error);
  s = {};
  s.top_n = 3;  // max_top 0
  EXPECT_THROW(run_cpu(p), invalid_argument_error);
  s = {};
  s.bias_count = 1;  // no entries
  EXPECT_THROW(run_cpu(p), invalid_argument_error);
  int32_t bad_id = 8;
  float b = 1.0f;
  s = {};
  s.bias_count = 1;
  p.bias_ids = &bad_id;
  p.bias_values = &b;
  p.n_bias = 1;
  EXPECT_THROW(run_cpu(p), invalid_argument_error);
  p.max_top = 21;
  EXPECT_THROW(run_cpu(p), invalid_argument_error);
}

}  // namespace
}  // namespace hyserve::kernels
