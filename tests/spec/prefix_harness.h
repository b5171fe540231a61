#pragma once
// In-process service for prefix-cache tests (coordinator/local_service.h): its scheduler loop
// keeps running between waves of requests, so later waves hit what earlier ones cached.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "spec_harness.h"

namespace hyserve::test {

class prefix_service {
 public:
  explicit prefix_service(const service_config& cfg) : svc_(cfg) {
    coordinator::scheduler_observer obs;
    obs.on_prefix_evict = [this](int64_t nodes, int64_t) { evicted += nodes; };
    svc_.sched().set_observer(std::move(obs));
    svc_.start_loop();
  }
  const model_config& config() const { return svc_.config(); }
  std::atomic<int64_t> evicted{0};  // tree nodes evicted (pages, with their checkpoints)
  coordinator::scheduler& sched() { return svc_.sched(); }

  // Submits every request at once and waits until all have finished (the loop keeps running).
  std::vector<generation> run(const std::vector<gen_request>& reqs) { return svc_.submit_and_wait(reqs); }
  // The loop's capacity after it has gone round at least twice more.
  coordinator::capacity_snapshot settled_capacity() {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return svc_.sched().capacity();
  }

 private:
  coordinator::local_service svc_;
};

// Requests that share prefixes, in waves: each takes a random-length prefix (0..base_len tokens)
// of one of `bases` shared "system prompts", or (one in four, once there are some) an earlier
// request's prompt (a conversation resent), then 1-40 tokens of its own, cut at max_prompt;
// 1..max_new new tokens, greedy or seeded at temperature 0.9, with logprobs when asked.
struct prefix_waves_shape {
  int bases = 4, base_len = 300, per_wave = 20, max_prompt = 400, max_new = 24;
  bool logprobs = false;
};

inline std::vector<std::vector<gen_request>> shared_prefix_waves(int64_t vocab, uint32_t seed, int n_waves,
                                                                 const prefix_waves_shape& shape = {}) {
  std::mt19937 rng(seed);
  auto tok = [&] { return static_cast<int32_t>(3 + rng() % static_cast<uint32_t>(vocab - 3)); };
  std::vector<std::vector<int32_t>> bases(static_cast<size_t>(shape.bases)), earlier;
  for (auto& b : bases)
    for (int i = 0; i < shape.base_len; ++i) b.push_back(tok());
  std::vector<std::vector<gen_request>> waves;
  for (int w = 0; w < n_waves; ++w) {
    std::vector<gen_request> wave;
    for (int i = 0; i < shape.per_wave; ++i) {
      gen_request g;
      if (!earlier.empty() && rng() % 4 == 0) {
        g.prompt = earlier[rng() % earlier.size()];
      } else {
        const auto& b = bases[rng() % bases.size()];
        g.prompt.assign(b.begin(), b.begin() + static_cast<long>(rng() % static_cast<uint32_t>(shape.base_len + 1)));
      }
      const int own = 1 + static_cast<int>(rng() % 40);
      for (int j = 0; j < own; ++j) g.prompt.push_back(tok());
      if (g.prompt.size() > static_cast<size_t>(shape.max_prompt)) g.prompt.resize(static_cast<size_t>(shape.max_prompt));
      g.sampling.max_new_tokens = 1 + static_cast<int32_t>(rng() % static_cast<uint32_t>(shape.max_new));
      g.sampling.ignore_eos = true;
      g.sampling.logprobs = shape.logprobs;
      if (rng() % 2 == 0) {
        g.sampling.temperature = 0.9f;
        g.sampling.seed = rng();
      }
      wave.push_back(g);
    }
    for (const auto& g : wave) earlier.push_back(g.prompt);
    waves.push_back(std::move(wave));
  }
  return waves;
}

}  // namespace hyserve::test
