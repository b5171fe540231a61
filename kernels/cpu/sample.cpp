#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "hyserve/common/error.h"
#include "hyserve/kernels/sampling.h"

namespace hyserve::kernels {
namespace {

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// std::max_element(x, x + V) (the first of equal maxima; a NaN never replaces a value) in two
// passes that vectorise: the maximum over 8 independent lanes, then the first index holding it.
const float* first_max(const float* x, int64_t V) {
  if (std::isnan(x[0])) return std::max_element(x, x + V);  // max_element keeps x[0]: rare
  float lane[8];
  std::fill_n(lane, 8, x[0]);
  int64_t i = 0;
  for (; i + 8 <= V; i += 8)
    for (int l = 0; l < 8; ++l) lane[l] = x[i + l] > lane[l] ? x[i + l] : lane[l];
  float mx = lane[0];
  for (int l = 1; l < 8; ++l) mx = lane[l] > mx ? lane[l] : mx;
  for (; i < V; ++i) mx = x[i] > mx ? x[i] : mx;
  for (int64_t j = 0; j < V; ++j)
    if (x[j] == mx) return x + j;
  return x;  // not reached: mx is one of the values
}

void check_values(float temperature, float top_p) {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature))
    throw invalid_argument_error("sample: temperature must be finite and >= 0, got " + std::to_string(temperature));
  if (!(top_p > 0.0f && top_p <= 1.0f))
    throw invalid_argument_error("sample: top_p must be in (0, 1], got " + std::to_string(top_p));
}

}  // namespace

void check_sample_settings(const sample_settings& s) {
  check_values(s.temperature, s.top_p);
  if (s.top_k < 0) throw invalid_argument_error("sample: top_k must be >= 0, got " + std::to_string(s.top_k));
  if (s.want_logprob != 0 && s.want_logprob != 1)
    throw invalid_argument_error("sample: want_logprob must be 0 or 1, got " + std::to_string(s.want_logprob));
}

sample_output sample_cpu(const sample_params& p) {
  if (!p.logits || p.vocab <= 0) throw invalid_argument_error("sample: logits and vocab > 0 are required");
  check_values(p.temperature, p.top_p);
  const float* x = p.logits;
  const int64_t V = p.vocab;
  const float* const top = first_max(x, V);
  const float mx = *top;
  sample_output out;
  if (p.temperature == 0.0f) {
    out.token = static_cast<int32_t>(top - x);
  } else {
    std::vector<int32_t> idx(static_cast<size_t>(V));
    std::iota(idx.begin(), idx.end(), 0);
    // Descending by logit, ties to the lower id, so the candidate order is deterministic.
    auto by_logit = [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
    int64_t keep = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
    std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), by_logit);
    idx.resize(static_cast<size_t>(keep));
    std::vector<double> prob(idx.size());
    double sum = 0.0;
    for (size_t i = 0; i < idx.size(); ++i) {
      prob[i] = std::exp(static_cast<double>(x[idx[i]] - mx) / p.temperature);
      sum += prob[i];
    }
    size_t n = idx.size();
    if (p.top_p < 1.0f) {
      double acc = 0.0;
      for (size_t i = 0; i < idx.size(); ++i) {
        acc += prob[i] / sum;
        if (acc >= p.top_p) {
          n = i + 1;
          break;
        }
      }
    }
    double mass = 0.0;
    for (size_t i = 0; i < n; ++i) mass += prob[i];
    const uint64_t r = mix(mix(p.seed + 0x9e3779b97f4a7c15ull) ^ (p.counter * 0xd1b54a32d192ed03ull));
    const double u = static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0) * mass;
    double acc = 0.0;
    out.token = idx[n - 1];
    for (size_t i = 0; i < n; ++i) {
      acc += prob[i];
      if (u < acc) {
        out.token = idx[i];
        break;
      }
    }
  }
  if (p.want_logprob) {
    // log-softmax normaliser of the raw logits.
    double z = 0.0;
    for (int64_t i = 0; i < V; ++i) z += std::exp(static_cast<double>(x[i] - mx));
    out.logprob = static_cast<float>(static_cast<double>(x[out.token]) - (static_cast<double>(mx) + std::log(z)));
  }
  return out;
}

}  // namespace hyserve::kernels
