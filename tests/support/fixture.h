#pragma once
// Access to the Hugging Face reference fixtures under tests/fixtures/.
#include <boost/json.hpp>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "hyserve/common/safetensors.h"

namespace hyserve::test {

inline std::string fixture_dir(const std::string& name) {
  return std::string(HYSERVE_SOURCE_DIR) + "/tests/fixtures/" + name;
}

struct reference_prompt {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> greedy_ids;
  std::vector<double> greedy_top2_margin;
};

inline std::vector<reference_prompt> load_reference_prompts(const std::string& name) {
  std::ifstream in(fixture_dir(name) + "/reference.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const boost::json::value v = boost::json::parse(ss.str());
  std::vector<reference_prompt> out;
  for (const auto& p : v.at("prompts").as_array()) {
    reference_prompt r;
    r.input_ids = boost::json::value_to<std::vector<int32_t>>(p.at("input_ids"));
    r.greedy_ids = boost::json::value_to<std::vector<int32_t>>(p.at("greedy_ids"));
    r.greedy_top2_margin = boost::json::value_to<std::vector<double>>(p.at("greedy_top2_margin"));
    out.push_back(std::move(r));
  }
  return out;
}

// Maximum absolute difference between a [rows, cols] block and a reference tensor slice.
inline float max_abs_diff(const float* a, const float* b, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

}  // namespace hyserve::test
