#pragma once
// What the synthetic CPU-against-CUDA model tests (test_gpu_model.cpp, test_gpu_bf16.cpp) share:
// one config on both devices, an Extend of two prompts and then a Decode step of one token each,
// every position's logits.
#include <cstdint>
#include <utility>
#include <vector>

#include "hyserve/common/config.h"
#include "hyserve/common/tensor.h"
#include "hyserve/worker/engine.h"

namespace hyserve::test {

struct cpu_cuda_logits {
  std::vector<host_tensor> cpu, cuda;  // [Extend, Decode] logits of each device
};

// cfg on the CPU and on CUDA (its device field is ignored): Extend {a, b}, then Decode {next_a,
// next_b}, all logits.
inline cpu_cuda_logits cpu_and_cuda_steps(service_config cfg, const std::vector<int32_t>& a,
                                          const std::vector<int32_t>& b, int32_t next_a, int32_t next_b) {
  cfg.device = device_kind::kCpu;
  worker::engine cpu(cfg);
  cfg.device = device_kind::kCuda;
  worker::engine gpu(cfg);
  worker::forward_options opts;
  opts.all_logits = true;
  cpu_cuda_logits out;
  for (worker::engine* e : {&cpu, &gpu}) {
    const int32_t ra = e->open_request(), rb = e->open_request();
    std::vector<host_tensor>& logits = e == &cpu ? out.cpu : out.cuda;
    logits.push_back(e->step(worker::forward_mode::kExtend, {{ra, a}, {rb, b}}, opts));
    logits.push_back(e->step(worker::forward_mode::kDecode, {{ra, {next_a}}, {rb, {next_b}}}, opts));
  }
  return out;
}

}  // namespace hyserve::test
