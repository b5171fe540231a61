// hyserve-sparse-quality: how far sparse Top-K decode attention (docs/ARCHITECTURE.md, Sparse Top-K attention) moves the decode
// logits of a model away from dense attention, in a single process (the engine: the model,
// pools and forward modes the workers run).
//   hyserve-sparse-quality CONFIG [--prompt-len 32768] [--steps 64] [--budgets 1024,2048,4096]
//                          [--sink-pages 1] [--recent-pages 2] [--prefill-chunk 8192]
//                          [--seed 1] [--json FILE]
// Method: one synthetic prompt (seeded random token ids) of prompt-len tokens.
//   - Dense: prefill the prompt (in chunks of prefill-chunk tokens), then `steps` greedy Decode
//     steps; keep every decode step's logits and the greedy tokens.
//   - For each budget (in tokens; page_budget = budget / page_size): a fresh request prefills the
//     same prompt again with sparsity quest on (prefill is dense, and it builds the page
//     summaries), then `steps` Decode steps fed with the DENSE greedy tokens (teacher forcing,
//     so every step compares the two models on the same context).
// Per budget it reports, over the `steps` decode steps: the mean (over steps and vocabulary) and
// the largest absolute difference of the logits against dense, and the top-1 agreement (the
// fraction of steps whose argmax equals the dense argmax), and how many decode steps were sparse
// and the KV pages one attention layer read per step. min_seq_len is 0: every decode row whose
// page count exceeds the budget is sparse. The sparsity section of CONFIG is ignored.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "hyserve/common/config.h"
#include "hyserve/common/error.h"
#include "hyserve/kernels/device.h"
#include "hyserve/worker/collective.h"
#include "hyserve/worker/engine.h"
#include "hyserve/worker/model.h"

namespace {

using clock_type = std::chrono::steady_clock;
namespace json = boost::json;
using hyserve::invalid_argument_error;

struct options {
  std::string config;
  int32_t prompt_len = 32768;
  int32_t steps = 64;
  std::vector<int32_t> budgets{1024, 2048, 4096};
  int32_t sink_pages = 1;
  int32_t recent_pages = 2;
  int32_t prefill_chunk = 8192;
  uint32_t seed = 1;
  std::string json_out;
};

std::vector<int32_t> parse_list(const std::string& name, const std::string& s) {
  std::vector<int32_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const int v = std::stoi(item);
    if (v <= 0) throw invalid_argument_error(name + ": values must be positive, got " + item);
    out.push_back(v);
  }
  if (out.empty()) throw invalid_argument_error(name + ": empty list");
  return out;
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw invalid_argument_error(a + " needs a value");
      return argv[++i];
    };
    auto at_least = [&](int lo) {
      const int v = std::stoi(value());
      if (v < lo) throw invalid_argument_error(a + " must be >= " + std::to_string(lo));
      return static_cast<int32_t>(v);
    };
    if (a == "--prompt-len") o.prompt_len = at_least(1);
    else if (a == "--steps") o.steps = at_least(1);
    else if (a == "--budgets") o.budgets = parse_list(a, value());
    else if (a == "--sink-pages") o.sink_pages = at_least(0);
    else if (a == "--recent-pages") o.recent_pages = at_least(0);
    else if (a == "--prefill-chunk") o.prefill_chunk = at_least(1);
    else if (a == "--seed") o.seed = static_cast<uint32_t>(at_least(0));
    else if (a == "--json") o.json_out = value();
    else if (!a.empty() && a[0] != '-' && o.config.empty()) o.config = a;
    else throw invalid_argument_error("unknown argument " + a);
  }
  if (o.config.empty()) throw invalid_argument_error("usage: hyserve-sparse-quality CONFIG [options]");
  return o;
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

std::vector<int32_t> synthetic_prompt(int32_t len, int64_t vocab, uint32_t seed) {
  std::vector<int32_t> p(static_cast<size_t>(len));
  uint32_t x = 2463534242u ^ (seed * 0x9E3779B9u);
  if (x == 0) x = 1;
  for (auto& t : p) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    t = static_cast<int32_t>(x % static_cast<uint32_t>(vocab));
  }
  return p;
}

int32_t argmax(const float* v, int64_t n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);  // first maximum on ties
}

// Prefills the prompt in chunks; returns the logits row of the prompt's last token.
std::vector<float> prefill(hyserve::worker::engine& eng, int32_t req, const std::vector<int32_t>& prompt,
                           int32_t chunk) {
  using hyserve::worker::forward_mode;
  using hyserve::worker::step_row;
  hyserve::host_tensor last;
  for (size_t at = 0; at < prompt.size(); at += static_cast<size_t>(chunk)) {
    const size_t n = std::min(static_cast<size_t>(chunk), prompt.size() - at);
    last = eng.step(forward_mode::kExtend,
                    {step_row{req, std::vector<int32_t>(prompt.begin() + static_cast<std::ptrdiff_t>(at),
                                                        prompt.begin() + static_cast<std::ptrdiff_t>(at + n))}});
  }
  const int64_t vocab = last.shape()[1];
  const float* row = last.as<float>() + (last.shape()[0] - 1) * vocab;
  return std::vector<float>(row, row + vocab);
}

// One Decode step; adds the step's decode attention statistics to `stats`.
std::vector<float> decode(hyserve::worker::engine& eng, int32_t req, int32_t token,
                          hyserve::worker::sparse_attention_stats& stats) {
  hyserve::worker::sparse_attention_stats step;
  hyserve::worker::forward_options opts;
  opts.sparse_stats = &step;
  const hyserve::host_tensor l =
      eng.step(hyserve::worker::forward_mode::kDecode, {hyserve::worker::step_row{req, {token}}}, opts);
  stats.decode_rows += step.decode_rows;
  stats.sparse_rows += step.sparse_rows;
  stats.pages_read += step.pages_read;
  stats.dense_pages += step.dense_pages;
  return std::vector<float>(l.as<float>(), l.as<float>() + l.numel());
}

struct budget_result {
  int32_t budget_tokens = 0, page_budget = 0;
  double mean_abs = 0.0, max_abs = 0.0, prefill_max_abs = 0.0;
  int32_t top1_agree = 0;
  double seconds = 0.0;
  hyserve::worker::sparse_attention_stats attention;  // summed over the decode steps
};

int run(const options& o) {
  namespace w = hyserve::worker;
  hyserve::service_config cfg = hyserve::load_config_file(o.config);
  const int32_t page = cfg.cache.page_size;
  for (int32_t b : o.budgets) {
    if (b % page != 0)
      throw invalid_argument_error("--budgets: " + std::to_string(b) + " tokens is not a multiple of page_size " +
                                   std::to_string(page));
    if (b / page < o.sink_pages + o.recent_pages + 1)
      throw invalid_argument_error("--budgets: " + std::to_string(b) + " tokens (" + std::to_string(b / page) +
                                   " pages) is below sink + recent + 1 = " +
                                   std::to_string(o.sink_pages + o.recent_pages + 1) + " pages");
  }
  const int32_t max_len = o.prompt_len + o.steps + 1;
  cfg.cache.max_requests = 2;
  cfg.cache.max_context = max_len;
  cfg.cache.num_pages = 2 * ((max_len + page - 1) / page);
  cfg.sparsity = {};

  std::fprintf(stderr, "loading %s ...\n", o.config.c_str());
  const auto t_load = clock_type::now();
  std::unique_ptr<w::collective> comm = w::make_local_collective();
  std::unique_ptr<w::model> owned =
      w::make_model(cfg, hyserve::resolve_model_config(cfg), w::tp_placement{}, comm.get(),
                    hyserve::kernels::open_device(cfg.device, 0));
  w::model* model = owned.get();
  w::engine eng(std::move(owned), cfg.cache);
  const int64_t vocab = eng.config().vocab_size;
  std::fprintf(stderr, "loaded in %.1f s\n", seconds_since(t_load));

  const std::vector<int32_t> prompt = synthetic_prompt(o.prompt_len, vocab, o.seed);

  // Dense reference.
  const auto t_dense = clock_type::now();
  std::vector<std::vector<float>> dense_logits;
  std::vector<int32_t> tokens;  // tokens[i]: the dense greedy token fed at decode step i
  std::vector<float> dense_prefill;
  {
    model->set_sparsity(hyserve::sparsity_section{});
    const int32_t r = eng.open_request();
    dense_prefill = prefill(eng, r, prompt, o.prefill_chunk);
    tokens.push_back(argmax(dense_prefill.data(), vocab));
    hyserve::worker::sparse_attention_stats unused;
    for (int32_t s = 0; s < o.steps; ++s) {
      dense_logits.push_back(decode(eng, r, tokens.back(), unused));
      tokens.push_back(argmax(dense_logits.back().data(), vocab));
    }
    eng.close_request(r);
  }
  const double dense_s = seconds_since(t_dense);
  std::fprintf(stderr, "dense: prefill + %d steps in %.1f s\n", o.steps, dense_s);

  std::vector<budget_result> results;
  for (int32_t b : o.budgets) {
    budget_result res;
    res.budget_tokens = b;
    res.page_budget = b / page;
    hyserve::sparsity_section sp;
    sp.algorithm = hyserve::sparsity_algorithm::kQuest;
    sp.page_budget = res.page_budget;
    sp.sink_pages = o.sink_pages;
    sp.recent_pages = o.recent_pages;
    sp.min_seq_len = 0;
    model->set_sparsity(sp);
    const auto t0 = clock_type::now();
    const int32_t r = eng.open_request();
    const std::vector<float> pre = prefill(eng, r, prompt, o.prefill_chunk);
    for (int64_t v = 0; v < vocab; ++v)
      res.prefill_max_abs = std::max(res.prefill_max_abs, std::abs(static_cast<double>(pre[v]) - dense_prefill[v]));
    double sum = 0.0;
    for (int32_t s = 0; s < o.steps; ++s) {
      const std::vector<float> l = decode(eng, r, tokens[static_cast<size_t>(s)], res.attention);
      const std::vector<float>& d = dense_logits[static_cast<size_t>(s)];
      for (int64_t v = 0; v < vocab; ++v) {
        const double diff = std::abs(static_cast<double>(l[v]) - d[v]);
        sum += diff;
        res.max_abs = std::max(res.max_abs, diff);
      }
      res.top1_agree += argmax(l.data(), vocab) == tokens[static_cast<size_t>(s) + 1] ? 1 : 0;
    }
    eng.close_request(r);
    res.mean_abs = sum / (static_cast<double>(o.steps) * static_cast<double>(vocab));
    res.seconds = seconds_since(t0);
    std::fprintf(stderr, "budget %d tokens: done in %.1f s\n", b, res.seconds);
    results.push_back(res);
  }

  const int32_t prompt_pages = (o.prompt_len + page - 1) / page;
  std::printf("sparse vs dense decode logits: prompt %d tokens (%d pages of %d), %d greedy decode steps, sink %d, "
              "recent %d pages\n",
              o.prompt_len, prompt_pages, page, o.steps, o.sink_pages, o.recent_pages);
  std::printf("%14s %12s %16s %16s %14s %18s %13s %16s\n", "budget_tokens", "page_budget", "mean_abs_diff",
              "max_abs_diff", "top1_agree", "prefill_max_diff", "sparse_steps", "pages_per_step");
  for (const budget_result& r : results)
    std::printf("%14d %12d %16.6g %16.6g %8d/%-5d %18.3g %13lld %16.1f\n", r.budget_tokens, r.page_budget, r.mean_abs,
                r.max_abs, r.top1_agree, o.steps, r.prefill_max_abs, static_cast<long long>(r.attention.sparse_rows),
                static_cast<double>(r.attention.pages_read) / o.steps);

  if (!o.json_out.empty()) {
    json::object report;
    report["config"] = o.config;
    report["device"] = cfg.device == hyserve::device_kind::kCuda ? "cuda" : "cpu";
    report["weight_dtype"] = std::string(hyserve::dtype_name(cfg.model.weight_dtype));
    report["kv_dtype"] = std::string(hyserve::dtype_name(cfg.cache.kv_dtype));
    report["prompt_len"] = o.prompt_len;
    report["page_size"] = page;
    report["prompt_pages"] = prompt_pages;
    report["steps"] = o.steps;
    report["sink_pages"] = o.sink_pages;
    report["recent_pages"] = o.recent_pages;
    report["seed"] = o.seed;
    report["dense_seconds"] = dense_s;
    json::array rows;
    for (const budget_result& r : results)
      rows.push_back({{"budget_tokens", r.budget_tokens},
                      {"page_budget", r.page_budget},
                      {"mean_abs_diff", r.mean_abs},
                      {"max_abs_diff", r.max_abs},
                      {"top1_agree", r.top1_agree},
                      {"top1_agreement", static_cast<double>(r.top1_agree) / o.steps},
                      {"prefill_max_abs_diff", r.prefill_max_abs},
                      {"sparse_steps", r.attention.sparse_rows},
                      {"pages_read_per_step", static_cast<double>(r.attention.pages_read) / o.steps},
                      {"dense_pages_per_step", static_cast<double>(r.attention.dense_pages) / o.steps},
                      {"seconds", r.seconds}});
    report["budgets"] = rows;
    std::ofstream out(o.json_out);
    if (!out) throw hyserve::error("cannot write " + o.json_out);
    out << json::serialize(report) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "hyserve-sparse-quality: " << e.what() << "\n";
    return 1;
  }
}
