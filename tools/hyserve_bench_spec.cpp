// hyserve-bench-spec: speculative decoding throughput against plain decoding, in one process
// (the service's scheduler driving a plan runner on the config's device; tools/spec_bench/).
//   hyserve-bench-spec CONFIG [--batches 1,8,32] [--prompt-len 1024] [--new-tokens 128]
//                      [--draft-tokens 4] [--draft-layers 0] [--draft-tree-width 1]
//                      [--repetitive self|echo|block] [--warmup 1] [--dtype float32|bfloat16]
//                      [--cost-check 0|1] [--profile-verify N] [--json FILE]
// Workloads, one prompt per row (rows differ by seed):
//   - repetitive: a prompt that contains its own continuation. `self` (default): a random
//     prefix P (prompt-len/4 tokens), the model's own greedy continuation C of P (prompt-len/2
//     tokens, generated plainly first): prompt = P + C continues the model's own greedy run, so
//     whatever it repeats of itself is in the prompt. `echo`: P (prompt-len/4), its continuation
//     C, then P again (a model that copies repeats C). `block`: a block of 64 random tokens
//     repeated up to prompt-len. A model with random weights may neither copy nor repeat itself:
//     the acceptance columns say how much there was to find.
//   - random: prompt-len uniformly random tokens (nothing to copy; drafting must back off).
// For each workload and batch size: greedy decoding of new-tokens tokens per row without
// speculation, with n-gram drafts (speculative.ngram of the config, num_draft_tokens =
// --draft-tokens) and, with --draft-layers N > 0, with the target's first N layers as the draft
// model (a tree of the draft's best --draft-tree-width first tokens when > 1). Reported: decode tokens/s (tokens emitted after every row's first token, over the time
// from the last row's first token to the last finish), the speedup over plain decoding,
// drafted/accepted tokens and the acceptance rate, the plans by mode (decode, verify, draft:
// back-off shows as decode plans under speculation), and whether every row's output equals the
// plain output token for token. Every cell runs --warmup times untimed before its measured run
// (one-time costs: scratch that grows with the step shapes, kernel choices, CUDA graphs of new
// shapes; the step times the speculative cost check measures are carried across the runs on a
// runner, as a running service keeps them), and each plain cell is measured next to its n-gram
// cell. A synthetic model with
// model.synthetic.residual_scale well below 1 (configs/bamba-9b-synthetic-cuda-spec.yaml) is
// predictable: its greedy runs settle into cycles the repetitive prompts contain, and the
// target's first layers draft it well; with the default random model acceptance is about 0 and
// the rows show the back-off. --dtype overrides the storage of weights, KV cache and SSM state
// (float32: the strict identity check where bf16 GEMMs round differently for decode and verify
// batch shapes). --cost-check overrides speculative.cost_check (0: every round runs, even where
// the measured step times say it does not pay). Every cell prints its host time per step by
// mode (prepare, forward, sampling); --profile-verify N (CUDA) also the GPU time by op of each
// speculative cell's N-th verify step. Exits 2 when any output differs, 1 on errors.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "hyserve/common/config.h"
#include "hyserve/common/error.h"
#include "hyserve/kernels/device.h"
#include "hyserve/worker/forward_mode.h"
#include "hyserve/worker/model.h"
#include "hyserve/worker/runner.h"
#include "spec_bench/in_process.h"

namespace {

namespace json = boost::json;
using hyserve::invalid_argument_error;
using hyserve::service_config;
using hyserve::speculative_algorithm;

struct options {
  std::string config;
  std::vector<int32_t> batches{1, 8, 32};
  int32_t prompt_len = 1024;
  int32_t new_tokens = 128;
  int32_t draft_tokens = 4;
  int32_t draft_layers = 0;
  int32_t draft_tree_width = 1;
  std::string repetitive = "self";
  int32_t warmup = 1;
  int32_t cost_check = -1;  // -1: the config's speculative.cost_check; 0 / 1 override it
  std::string dtype;  // "", float32 or bfloat16: overrides model.dtype and the cache's dtypes
  int32_t profile_verify = 0;  // > 0: op-level GPU profile of each speculative cell's N-th verify step
  std::string json_out;
};

std::vector<int32_t> parse_list(const std::string& s) {
  std::vector<int32_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const int v = std::stoi(item);
    if (v <= 0) throw invalid_argument_error("--batches: sizes must be positive, got " + item);
    out.push_back(v);
  }
  if (out.empty()) throw invalid_argument_error("--batches: empty list");
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
    auto number = [&](int lo) {
      const int v = std::stoi(value());
      if (v < lo) throw invalid_argument_error(a + " must be >= " + std::to_string(lo));
      return static_cast<int32_t>(v);
    };
    if (a == "--batches") o.batches = parse_list(value());
    else if (a == "--prompt-len") o.prompt_len = number(8);
    else if (a == "--new-tokens") o.new_tokens = number(2);
    else if (a == "--draft-tokens") o.draft_tokens = number(1);
    else if (a == "--draft-layers") o.draft_layers = number(0);
    else if (a == "--draft-tree-width") o.draft_tree_width = number(1);
    else if (a == "--warmup") o.warmup = number(0);
    else if (a == "--profile-verify") o.profile_verify = number(0);
    else if (a == "--cost-check") {
      o.cost_check = number(0);
      if (o.cost_check > 1) throw invalid_argument_error("--cost-check must be 0 or 1");
    }
    else if (a == "--dtype") {
      o.dtype = value();
      if (o.dtype != "float32" && o.dtype != "bfloat16")
        throw invalid_argument_error("--dtype: '" + o.dtype + "' (known: float32, bfloat16)");
    }
    else if (a == "--repetitive") {
      o.repetitive = value();
      if (o.repetitive != "self" && o.repetitive != "echo" && o.repetitive != "block")
        throw invalid_argument_error("--repetitive: '" + o.repetitive + "' (known: self, echo, block)");
    } else if (a == "--json") o.json_out = value();
    else if (!a.empty() && a[0] != '-' && o.config.empty()) o.config = a;
    else throw invalid_argument_error("unknown argument " + a);
  }
  if (o.config.empty()) throw invalid_argument_error("usage: hyserve-bench-spec CONFIG [options]");
  return o;
}

std::vector<int32_t> random_tokens(int32_t len, int64_t vocab, uint32_t salt) {
  std::vector<int32_t> p(static_cast<size_t>(len));
  uint32_t x = 2463534242u ^ (salt * 0x9e3779b9u);
  for (auto& t : p) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    t = static_cast<int32_t>(3 + x % static_cast<uint32_t>(vocab - 3));
  }
  return p;
}

// Decode throughput of a run: tokens emitted after the last row's first token, over the time
// from then to the last event.
struct throughput {
  double tokens_per_s = 0;
  int64_t tokens = 0;
  double seconds = 0;
};

throughput decode_throughput(const hyserve::tools::run_result& r) {
  double start = 0, end = 0;
  for (const auto& g : r.rows) {
    if (g.events.empty()) continue;
    start = std::max(start, g.events.front().first);
    end = std::max(end, g.events.back().first);
  }
  throughput t;
  for (const auto& g : r.rows)
    for (const auto& [when, n] : g.events)
      if (when > start) t.tokens += n;
  t.seconds = end - start;
  t.tokens_per_s = t.seconds > 0 ? static_cast<double>(t.tokens) / t.seconds : 0.0;
  return t;
}

// The measured run's host time per step by forward mode and phase (the runner's counters):
// where a verify step's time goes besides the forward pass.
void print_phases(const hyserve::worker::runner& r) {
  for (hyserve::worker::forward_mode m : hyserve::worker::kAllForwardModes) {
    const auto& ph = r.phases()[static_cast<size_t>(m)];
    if (ph.steps == 0) continue;
    const double n = static_cast<double>(ph.steps);
    std::fprintf(stderr, "      %-13s %5lld steps: prepare %7.3f  forward %7.3f  sample %7.3f ms/step\n",
                 std::string(hyserve::worker::forward_mode_name(m)).c_str(), static_cast<long long>(ph.steps),
                 ph.prepare_s * 1e3 / n, ph.forward_s * 1e3 / n, ph.sample_s * 1e3 / n);
  }
}

// A profiled verify step's GPU time by op label, largest first.
void print_verify_profile(const std::vector<hyserve::kernels::profile_segment>& segs) {
  if (segs.empty()) return;
  std::map<std::string, std::pair<int64_t, double>> by_label;  // calls, ms
  double total = 0;
  for (const auto& s : segs) {
    auto& [calls, ms] = by_label[s.label];
    ++calls;
    ms += s.ms;
    total += s.ms;
  }
  std::vector<std::pair<std::string, std::pair<int64_t, double>>> rows(by_label.begin(), by_label.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  std::fprintf(stderr, "      verify step profile (GPU, %zu segments, %.3f ms):", segs.size(), total);
  for (const auto& [label, v] : rows)
    std::fprintf(stderr, " %s %lldx %.1f us;", label.c_str(), static_cast<long long>(v.first), v.second * 1e3);
  std::fprintf(stderr, "\n");
}

std::unique_ptr<hyserve::worker::runner> make_runner(const service_config& cfg, const hyserve::model_config& mc,
                                                     const hyserve::kernels::exec_context& ctx) {
  auto target = hyserve::worker::make_model(cfg, mc, hyserve::worker::tp_placement{}, nullptr, ctx);
  return std::make_unique<hyserve::worker::runner>(
      std::move(target), hyserve::worker::make_draft_model(cfg, mc, hyserve::worker::tp_placement{}, nullptr, ctx),
      cfg.cache, nullptr);
}

service_config with_algorithm(service_config cfg, speculative_algorithm a, const options& o) {
  cfg.speculative.algorithm = a;
  cfg.speculative.num_draft_tokens = o.draft_tokens;
  if (a == speculative_algorithm::kDraftModel) {
    cfg.speculative.draft_model.path.clear();
    cfg.speculative.draft_model.synthetic_num_layers = o.draft_layers;
    cfg.speculative.draft_model.max_tree_width = o.draft_tree_width;
  }
  return cfg;
}

const char* algorithm_name(speculative_algorithm a) {
  switch (a) {
    case speculative_algorithm::kNone: return "plain";
    case speculative_algorithm::kNgram: return "ngram";
    case speculative_algorithm::kDraftModel: return "draft_model";
  }
  return "?";
}

struct workload {
  std::string name;
  std::vector<std::vector<int32_t>> prompts;  // one per row of the largest batch
};

int run(const options& o) {
  service_config base = hyserve::load_config_file(o.config);
  const int32_t max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  const int32_t page = base.cache.page_size;
  const int32_t ctx_len = o.prompt_len + o.new_tokens + o.draft_tokens + 16;
  base.cache.max_requests = max_batch;
  base.cache.max_context = ctx_len;
  base.cache.num_pages = max_batch * ((ctx_len + page - 1) / page);
  base.scheduler.max_running = max_batch;
  base.scheduler.max_queue = std::max(base.scheduler.max_queue, max_batch);
  base.speculative.algorithm = speculative_algorithm::kNone;
  // The target runner serves the plain and the n-gram cells: its verify steps' states are
  // allocated up front like a speculative service's (cache.spec_step_cols).
  base.cache.spec_step_cols = o.draft_tokens + 1;
  if (o.cost_check >= 0) base.speculative.cost_check = o.cost_check == 1;
  if (!o.dtype.empty()) {
    const hyserve::dtype t = o.dtype == "float32" ? hyserve::dtype::kF32 : hyserve::dtype::kBF16;
    base.model.weight_dtype = base.cache.kv_dtype = base.cache.ssm_state_dtype = t;
  }
  const hyserve::model_config mc = hyserve::resolve_model_config(base);
  if (o.profile_verify > 0 && base.device != hyserve::device_kind::kCuda)
    throw invalid_argument_error("--profile-verify needs device: cuda (the profile times GPU work)");
  const hyserve::kernels::exec_context ctx = hyserve::kernels::open_device(base.device, 0);

  std::fprintf(stderr, "loading %s ...\n", o.config.c_str());
  auto target = make_runner(base, mc, ctx);

  // Workloads.
  std::vector<workload> loads;
  {
    workload rep{"repetitive", {}};
    if (o.repetitive == "block") {
      for (int32_t j = 0; j < max_batch; ++j) {
        const auto block = random_tokens(64, mc.vocab_size, 1000u + static_cast<uint32_t>(j));
        std::vector<int32_t> p;
        while (static_cast<int32_t>(p.size()) < o.prompt_len) p.insert(p.end(), block.begin(), block.end());
        p.resize(static_cast<size_t>(o.prompt_len));
        rep.prompts.push_back(std::move(p));
      }
    } else {
      const bool echo = o.repetitive == "echo";
      const int32_t pre = std::max(4, o.prompt_len / (echo ? 4 : 8));
      const int32_t cont = std::max(2, o.prompt_len - (echo ? 2 : 1) * pre);
      std::vector<std::vector<int32_t>> prefixes;
      for (int32_t j = 0; j < max_batch; ++j)
        prefixes.push_back(random_tokens(pre, mc.vocab_size, 1000u + static_cast<uint32_t>(j)));
      std::fprintf(stderr, "generating the repetitive prompts (%d continuations of %d tokens) ...\n", max_batch, cont);
      const auto gen = hyserve::tools::run_batch(base, mc, *target, prefixes, cont);
      for (int32_t j = 0; j < max_batch; ++j) {
        const auto& g = gen.rows[static_cast<size_t>(j)];
        if (g.error) throw hyserve::error("generating the repetitive prompt: " + *g.error);
        std::vector<int32_t> p = prefixes[static_cast<size_t>(j)];
        p.insert(p.end(), g.output.begin(), g.output.end());
        if (echo) p.insert(p.end(), prefixes[static_cast<size_t>(j)].begin(), prefixes[static_cast<size_t>(j)].end());
        rep.prompts.push_back(std::move(p));
      }
    }
    loads.push_back(std::move(rep));
    workload rnd{"random", {}};
    for (int32_t j = 0; j < max_batch; ++j)
      rnd.prompts.push_back(random_tokens(o.prompt_len, mc.vocab_size, 5000u + static_cast<uint32_t>(j)));
    loads.push_back(std::move(rnd));
  }

  // Warm-up (allocations, library handles) outside every measurement.
  (void)hyserve::tools::run_batch(base, mc, *target, {random_tokens(16, mc.vocab_size, 7)}, 4);

  struct cell {
    std::string workload;
    int32_t batch;
    speculative_algorithm alg;
    throughput tp;
    int64_t drafted = 0, accepted = 0;
    std::vector<int64_t> modes;
    int32_t mismatched_rows = 0;
    int32_t first_divergence = -1;  // smallest output index where a row differs from plain (-1: none)
    double speedup = 0;
  };
  std::vector<cell> cells;
  std::map<std::string, std::vector<std::vector<int32_t>>> plain_out;  // "workload/batch" → rows
  bool identical = true;

  // One cell: `warmup` untimed runs (allocations that grow with the step shapes, library
  // handles and kernel choices, CUDA graphs of new shapes), then the measured run. The step
  // times the schedulers measure for the speculative cost check are carried from run to run on
  // the same runner (what a service that has been up for a while has measured), so a measured
  // run does not pay for measuring each step shape again.
  std::map<const hyserve::worker::runner*, hyserve::coordinator::spec::step_costs> step_times;
  auto measure = [&](hyserve::worker::runner& r, speculative_algorithm alg, const workload& w, int32_t b) {
    const service_config cfg = with_algorithm(base, alg, o);
    const std::vector<std::vector<int32_t>> prompts(w.prompts.begin(), w.prompts.begin() + b);
    hyserve::coordinator::spec::step_costs& times = step_times[&r];
    for (int32_t i = 0; i < o.warmup; ++i) (void)hyserve::tools::run_batch(cfg, mc, r, prompts, o.new_tokens, &times);
    r.reset_phases();
    const auto res = hyserve::tools::run_batch(cfg, mc, r, prompts, o.new_tokens, &times,
                                               alg == speculative_algorithm::kNone ? 0 : o.profile_verify);
    print_phases(r);
    print_verify_profile(res.verify_profile);
    cell c{w.name, b, alg, decode_throughput(res), 0, 0, res.mode_counts, 0, -1, 0};
    std::vector<std::vector<int32_t>> outs;
    for (const auto& g : res.rows) {
      if (g.error) throw hyserve::error(std::string(algorithm_name(alg)) + " run failed: " + *g.error);
      c.drafted += g.drafted;
      c.accepted += g.accepted;
      outs.push_back(g.output);
    }
    const std::string key = w.name + "/" + std::to_string(b);
    if (alg == speculative_algorithm::kNone) {
      plain_out[key] = outs;
      c.speedup = 1.0;
    } else {
      const auto& want = plain_out.at(key);
      for (size_t i = 0; i < outs.size(); ++i) {
        if (outs[i] == want[i]) continue;
        ++c.mismatched_rows;
        const auto at = static_cast<int32_t>(
            std::mismatch(outs[i].begin(), outs[i].end(), want[i].begin(), want[i].end()).first - outs[i].begin());
        c.first_divergence = c.first_divergence < 0 ? at : std::min(c.first_divergence, at);
      }
      identical = identical && c.mismatched_rows == 0;
      for (const cell& p : cells)
        if (p.alg == speculative_algorithm::kNone && p.workload == c.workload && p.batch == b && p.tp.tokens_per_s > 0)
          c.speedup = c.tp.tokens_per_s / p.tp.tokens_per_s;
    }
    // The cell's identity on its progress line too: a run cut short still tells what it checked.
    const std::string same = alg == speculative_algorithm::kNone ? ""
                             : c.mismatched_rows == 0
                                 ? "  identical"
                                 : "  DIFFERS (" + std::to_string(c.mismatched_rows) + " rows, from output token " +
                                       std::to_string(c.first_divergence) + ")";
    std::fprintf(stderr, "  %-10s batch %3d %-11s %10.1f tokens/s  %5.2fx  drafted %lld accepted %lld  plans %lld/%lld/%lld%s\n",
                 w.name.c_str(), b, algorithm_name(alg), c.tp.tokens_per_s, c.speedup, static_cast<long long>(c.drafted),
                 static_cast<long long>(c.accepted), static_cast<long long>(c.modes[1]), static_cast<long long>(c.modes[4]),
                 static_cast<long long>(c.modes[6]), same.c_str());
    cells.push_back(std::move(c));
  };
  // Plain and n-gram cells side by side (the same device state for both).
  for (const workload& w : loads)
    for (int32_t b : o.batches) {
      measure(*target, speculative_algorithm::kNone, w, b);
      measure(*target, speculative_algorithm::kNgram, w, b);
    }
  std::vector<std::pair<std::string, hyserve::coordinator::spec::step_costs>> measured_steps;
  measured_steps.emplace_back("target", step_times[target.get()]);
  step_times.erase(target.get());  // a later runner may get the same address
  target.reset();
  if (o.draft_layers > 0) {
    const service_config dcfg = with_algorithm(base, speculative_algorithm::kDraftModel, o);
    std::fprintf(stderr, "loading the target with a %d-layer draft model ...\n", o.draft_layers);
    auto with_draft = make_runner(dcfg, mc, ctx);
    for (const workload& w : loads)
      for (int32_t b : o.batches) measure(*with_draft, speculative_algorithm::kDraftModel, w, b);
    measured_steps.emplace_back("target+draft", step_times[with_draft.get()]);
  }

  // Table order: plain, n-gram, draft model; workloads and batches in their order.
  std::stable_sort(cells.begin(), cells.end(), [](const cell& a, const cell& b) { return a.alg < b.alg; });
  std::printf("%-10s %5s %-11s %10s %8s %8s %8s %6s %7s %7s %7s %s\n", "workload", "batch", "mode", "tokens/s", "speedup",
              "drafted", "accepted", "rate", "decode", "verify", "draft", "identical");
  json::array rows;
  for (const cell& c : cells) {
    const double rate = c.drafted > 0 ? static_cast<double>(c.accepted) / static_cast<double>(c.drafted) : 0.0;
    const int64_t decode = c.modes[1], verify = c.modes[4], draft = c.modes[6];
    const bool same = c.mismatched_rows == 0;
    std::printf("%-10s %5d %-11s %10.1f %7.2fx %8lld %8lld %6.2f %7lld %7lld %7lld %s\n", c.workload.c_str(), c.batch,
                algorithm_name(c.alg), c.tp.tokens_per_s, c.speedup, static_cast<long long>(c.drafted),
                static_cast<long long>(c.accepted), rate, static_cast<long long>(decode), static_cast<long long>(verify),
                static_cast<long long>(draft),
                c.alg == speculative_algorithm::kNone ? "-"
                : same                                ? "yes"
                                                      : ("NO (" + std::to_string(c.mismatched_rows) + " rows, from output token " +
                                                         std::to_string(c.first_divergence) + ")")
                                                            .c_str());
    rows.push_back({{"workload", c.workload},
                    {"batch", c.batch},
                    {"mode", algorithm_name(c.alg)},
                    {"tokens_per_s", c.tp.tokens_per_s},
                    {"decode_tokens", c.tp.tokens},
                    {"decode_seconds", c.tp.seconds},
                    {"speedup", c.speedup},
                    {"drafted", c.drafted},
                    {"accepted", c.accepted},
                    {"accept_rate", rate},
                    {"decode_plans", decode},
                    {"verify_plans", verify},
                    {"draft_plans", draft},
                    {"identical", same},
                    {"mismatched_rows", c.mismatched_rows},
                    {"first_divergence", c.first_divergence}});
  }
  // The step times the schedulers measured (what the cost check weighs rounds with).
  std::printf("\nmeasured step times (the speculative cost check's table; the last estimate per shape):\n");
  std::printf("%-13s %-7s %5s %6s %10s %8s\n", "runner", "step", "rows", "width", "ms", "samples");
  json::array steps;
  static constexpr const char* kStepKinds[] = {"decode", "verify", "draft"};
  for (const auto& [name, table] : measured_steps)
    for (const auto& e : table.entries()) {
      const char* kind = e.kind >= 0 && e.kind < 3 ? kStepKinds[e.kind] : "?";
      std::printf("%-13s %-7s %5d %6d %10.3f %8lld\n", name.c_str(), kind, e.rows, e.width, e.seconds * 1e3,
                  static_cast<long long>(e.samples));
      steps.push_back({{"runner", name}, {"step", kind}, {"rows", e.rows}, {"width", e.width},
                       {"ms", e.seconds * 1e3}, {"samples", e.samples}});
    }
  if (!o.json_out.empty()) {
    json::object report{{"config", o.config},
                        {"device", base.device == hyserve::device_kind::kCuda ? "cuda" : "cpu"},
                        {"weight_dtype", std::string(hyserve::dtype_name(base.model.weight_dtype))},
                        {"kv_dtype", std::string(hyserve::dtype_name(base.cache.kv_dtype))},
                        {"ssm_state_dtype", std::string(hyserve::dtype_name(base.cache.ssm_state_dtype))},
                        {"prompt_len", o.prompt_len},
                        {"new_tokens", o.new_tokens},
                        {"draft_tokens", o.draft_tokens},
                        {"draft_layers", o.draft_layers},
                        {"draft_tree_width", o.draft_tree_width},
                        {"repetitive", o.repetitive},
                        {"warmup", o.warmup},
                        {"identical", identical},
                        {"results", rows},
                        {"step_times", steps}};
    std::ofstream(o.json_out) << json::serialize(report) << "\n";
  }
  if (!identical) {
    std::fprintf(stderr, "hyserve-bench-spec: speculative output differs from plain decoding\n");
    return 2;
  }
  std::printf("all speculative outputs identical to plain decoding\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "hyserve-bench-spec: " << e.what() << "\n";
    return 1;
  }
}
