#pragma once
// What the CUDA-graph decode tests (test_gpu_graph.cpp, test_gpu_graph_arena.cpp) share: the
// fixture and storage type of a case, its test name, and the engine configuration with or
// without decode graphs (page size 4, buckets 1, 2, 4 and 8).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "fixture.h"
#include "hyserve/common/config.h"
#include "hyserve/common/tensor.h"
#include "hyserve/kernels/device.h"
#include "hyserve/kernels/gdn.h"
#include "hyserve/kernels/run.h"

namespace hyserve::graph_test {

struct graph_case {
  std::string fixture;
  bool bf16 = false;
};

inline std::string case_name(const ::testing::TestParamInfo<graph_case>& info) {
  std::string n = info.param.fixture + (info.param.bf16 ? "_bf16" : "_f32");
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

// One engine on the CUDA device over the case's fixture; bf16 cases store weights and the KV
// cache in bf16.
inline service_config graph_config(const graph_case& c, bool graphs, int32_t max_requests) {
  service_config cfg;
  cfg.model.path = test::fixture_dir(c.fixture);
  cfg.device = device_kind::kCuda;
  cfg.cuda_graphs = graphs;
  cfg.cache.page_size = 4;
  cfg.cache.max_requests = max_requests;
  cfg.cache.max_context = 128;
  cfg.scheduler.max_running = 8;  // buckets 1, 2, 4, 8
  if (c.bf16) {
    cfg.model.weight_dtype = dtype::kBF16;
    cfg.cache.kv_dtype = dtype::kBF16;
  }
  return cfg;
}

// Why a case cannot run here (null: it can): no CUDA device, or Qwen3-Next without the Gated
// DeltaNet CUDA op. Use: if (const char* why = skip_reason(c)) GTEST_SKIP() << why;
inline const char* skip_reason(const graph_case& c) {
  if (kernels::cuda_device_count() == 0) return "no CUDA device";
  if (c.fixture == "qwen3next-tiny" && !kernels::has_cuda<kernels::gdn_chunk_scan_params>())
    return "Gated DeltaNet has no CUDA op in this build";
  return nullptr;
}

// A test over graph_case parameters that skips where skip_reason says so.
class device_case_test : public ::testing::TestWithParam<graph_case> {
 protected:
  void SetUp() override {
    if (const char* why = skip_reason(GetParam())) GTEST_SKIP() << why;
  }
};

// How many f32 elements of a and b (the same shape) differ in their bits.
inline int64_t differing_floats(const tensor& a, const tensor& b) {
  int64_t n = 0;
  for (int64_t j = 0; j < a.numel(); ++j)
    if (std::memcmp(a.as<float>() + j, b.as<float>() + j, sizeof(float)) != 0) ++n;
  return n;
}

inline int32_t argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

}  // namespace hyserve::graph_test
