// hyserve-bench-model: end-to-end step timings of one model on one device, in a single process
// (the engine: the same model, pools and forward modes the workers run, without the service).
//   hyserve-bench-model CONFIG [--batches 1,16,64] [--prompt-len 1024] [--decode-steps 32]
//                       [--prefill-len 8192] [--json FILE] [--profile-step] [--verify-width W]
//                       [--kernel-trace]
// Reports, from one run:
//   - the device-to-device copy bandwidth (read + write of a 1 GiB buffer);
//   - prefill: wall time and tokens/s of one Extend step over a prefill-len prompt (the second of
//     two; the first, cold, printed beside it; --profile-step: a third op by op);
//   - decode at each batch size: every row first prefilled with prompt-len tokens, then
//     decode-steps Decode steps over all rows; the median step time and tokens/s;
//   - the bytes-moved floor of a batch-1 decode step: the weights every step reads (linear
//     layers and lm_head; one embedding row), the SSM and conv states and the KV of the
//     context, each read once, at the copy bandwidth measured here; and the ratio of the
//     measured batch-1 step to that floor.
// Step times are host wall times around engine::step, which includes building the step's
// metadata, uploading it and copying the logits back to the host; the GPU time of a step is a
// cudaEvent pair around its device work (the graph launch, or the eager model body). Decode is
// measured through CUDA graphs (when the config uses them) and eagerly (forward_options::eager)
// over the same rows, and the graph's node counts explain the launches a graph saves.
// --profile-step: one more eager Decode step per batch size, timed op by op on the device
// (kernels::profile_start: cudaEvents between the ops, the host queueing the whole step while
// the device holds, no zero-fill of activations as in a graph), printed per op kind with the
// bytes the op must move and its bandwidth as a fraction of the copy bandwidth.
// --verify-width W: at each batch size also TargetVerify steps of W tokens per row (the last
// token and W - 1 drafts, as a speculative round's verify), timed like decode (eager: verify
// steps are not captured), with --profile-step one of them op by op; and the ratio of a verify
// step to a decode step of the same rows (what a speculative round must win back).
// --kernel-trace: the sampled decode steps once more with CUPTI's kernel records on (builds
// whose CUDA toolkit has CUPTI): per step the span of its kernels, the time they cover and the
// gaps between them, and the 30 kernels that add the most to it (exclusive time: past every
// earlier kernel's end; tools/bench/kernel_trace.h): where a graph step's time goes, which the
// eager --profile-step cannot show. The records are on
// for the whole run (CUPTI may not see graphs instantiated before), so with --kernel-trace the
// other timings carry CUPTI's cost per kernel: read them from a run without it.
// Tensor parallelism: under `mpirun -np N` with the config's parallel.tp = N (one group; dp 1),
// every rank builds its shard (placed and reduced as the service's workers are:
// hyserve/worker/tp_device.h; with parallel.device_collective: host the N ranks may share one
// GPU) and runs the same steps; rank 0 prints and writes the JSON. N ranks on one GPU share its
// bandwidth and stage every reduction through the host: such figures are a functional check of
// the sharded path, not a speed claim.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <boost/json.hpp>

#include "bench/kernel_trace.h"
#include "hyserve/common/config.h"
#include "hyserve/common/error.h"
#include "hyserve/kernels/device.h"
#include "hyserve/kernels/graph.h"
#include "hyserve/worker/engine.h"
#include "hyserve/worker/model.h"
#include "hyserve/worker/tp_device.h"

namespace {

using clock_type = std::chrono::steady_clock;
namespace json = boost::json;

struct options {
  std::string config;
  std::vector<int32_t> batches{1, 16, 64};
  int32_t prompt_len = 1024;
  int32_t decode_steps = 32;
  int32_t prefill_len = 8192;
  std::string json_out;
  bool profile_step = false;
  bool kernel_trace = false;  // the sampled decode steps' kernels on the device (CUPTI), per batch
  int32_t verify_width = 0;  // 0: no verify steps
};

std::vector<int32_t> parse_list(const std::string& s) {
  std::vector<int32_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const int v = std::stoi(item);
    if (v <= 0) throw hyserve::invalid_argument_error("--batches: sizes must be positive, got " + item);
    out.push_back(v);
  }
  if (out.empty()) throw hyserve::invalid_argument_error("--batches: empty list");
  return out;
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw hyserve::invalid_argument_error(a + " needs a value");
      return argv[++i];
    };
    auto positive = [&](const std::string& name) {
      const int v = std::stoi(value());
      if (v <= 0) throw hyserve::invalid_argument_error(name + " must be positive");
      return static_cast<int32_t>(v);
    };
    if (a == "--batches") o.batches = parse_list(value());
    else if (a == "--prompt-len") o.prompt_len = positive(a);
    else if (a == "--decode-steps") o.decode_steps = positive(a);
    else if (a == "--prefill-len") o.prefill_len = positive(a);
    else if (a == "--json") o.json_out = value();
    else if (a == "--profile-step") o.profile_step = true;
    else if (a == "--kernel-trace") o.kernel_trace = true;
    else if (a == "--verify-width") o.verify_width = positive(a);
    else if (!a.empty() && a[0] != '-' && o.config.empty()) o.config = a;
    else throw hyserve::invalid_argument_error("unknown argument " + a);
  }
  if (o.config.empty()) throw hyserve::invalid_argument_error("usage: hyserve-bench-model CONFIG [options]");
  if (o.kernel_trace && !hyserve::bench::kernel_trace_available())
    throw hyserve::invalid_argument_error("--kernel-trace: this build has no CUPTI");
  return o;
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Read + write bandwidth of a device-to-device copy of 1 GiB (0 on the CPU).
double copy_bandwidth(hyserve::device_kind device) {
  if (device != hyserve::device_kind::kCuda) return 0.0;
  namespace k = hyserve::kernels;
  const size_t bytes = size_t{1} << 30;
  void* a = k::device_alloc(bytes);
  void* b = k::device_alloc(bytes);
  k::device_memset(a, 1, bytes);
  k::device_copy_d2d(b, a, bytes);
  k::stream_synchronize(nullptr);
  const int reps = 10;
  const auto t0 = clock_type::now();
  for (int r = 0; r < reps; ++r) k::device_copy_d2d(b, a, bytes);
  k::stream_synchronize(nullptr);
  const double s = seconds_since(t0);
  k::device_free(a);
  k::device_free(b);
  return 2.0 * static_cast<double>(bytes) * reps / s;
}

size_t dtype_bytes(hyserve::dtype t) { return hyserve::dtype_size(t); }

// Bytes a batch-1 decode step must read at least once: every weight one token touches (the
// routed top-k experts, the shared expert and the router of an MoE layer), the recurrent states
// (Mamba2 or Gated DeltaNet) and the KV cache of the context.
struct floor_bytes {
  double weights = 0, states = 0, kv = 0;
  double total() const { return weights + states + kv; }
};

floor_bytes decode_floor(const hyserve::service_config& cfg, const hyserve::model_config& mc, int64_t context) {
  const double w = static_cast<double>(dtype_bytes(cfg.model.weight_dtype));
  const double H = static_cast<double>(mc.hidden_size), V = static_cast<double>(mc.vocab_size);
  floor_bytes f;
  f.weights += H * w;                                   // one embedding row
  f.weights += V * H * w;                               // lm_head (the embedding table when tied)
  f.weights += H * 4;                                   // final norm
  const double I = static_cast<double>(mc.intermediate_size);
  const double state_b = static_cast<double>(dtype_bytes(cfg.cache.ssm_state_dtype));
  const double kv_b = static_cast<double>(dtype_bytes(cfg.cache.kv_dtype));
  // The MLP weights one token reads per layer: SwiGLU gate/up/down; relu² (Nemotron-H, its MLP
  // layers only) up/down; Granite's top-k experts plus the shared MLP.
  const auto mlp_bytes = [&](int64_t layer, hyserve::layer_kind kind) {
    if (mc.num_experts > 0 && mc.is_moe_layer(layer)) {
      const double shared = static_cast<double>(mc.shared_expert_intermediate_size);
      return 3 * H * w * (static_cast<double>(mc.num_experts_per_tok * mc.moe_intermediate_size) + shared) +
             static_cast<double>(mc.num_experts) * H * w +                                // router
             (mc.arch == hyserve::model_arch::kQwen3Next && shared > 0 ? H * w : 0.0);  // shared expert's gate
    }
    if (mc.arch == hyserve::model_arch::kNemotronH) return kind == hyserve::layer_kind::kMlp ? 2 * H * I * w : 0.0;
    return 3 * H * I * w;
  };
  const auto mamba = [&] {
    const double d_in = static_cast<double>(mc.mamba_intermediate());
    const double conv = static_cast<double>(mc.mamba_conv_dim());
    f.weights += H * static_cast<double>(mc.mamba_in_proj_dim()) * w + d_in * H * w;
    f.weights += conv * static_cast<double>(mc.mamba_d_conv) * 4 + d_in * 4 + 3 * mc.mamba_n_heads * 4.0;
    f.states += static_cast<double>(mc.mamba_n_heads * mc.mamba_d_head * mc.mamba_d_state) * state_b;
    f.states += conv * static_cast<double>(mc.mamba_d_conv - 1) * 4;
  };
  const auto attention = [&] {
    const double q = static_cast<double>(mc.num_attention_heads * mc.head_dim);
    const double kv = static_cast<double>(mc.num_kv_heads * mc.head_dim);
    const double q_out = mc.arch == hyserve::model_arch::kQwen3Next ? 2 * q : q;  // Qwen3-Next: query | output gate
    f.weights += (H * q_out + 2 * H * kv + q * H) * w;
    f.kv += 2 * kv * static_cast<double>(context) * kv_b;
  };
  // Gated DeltaNet (Qwen3-Next): in_proj q | k | v | z and b | a, the conv, out_proj; the state
  // is heads × K × V.
  const auto gdn = [&] {
    const double kd = static_cast<double>(mc.gdn_key_dim()), vd = static_cast<double>(mc.gdn_value_dim());
    const double nv = static_cast<double>(mc.linear_num_value_heads);
    const double conv = static_cast<double>(mc.gdn_conv_dim());
    f.weights += H * (2 * kd + 2 * vd + 2 * nv) * w + vd * H * w;
    f.weights += conv * static_cast<double>(mc.linear_conv_kernel_dim) * w + 2 * nv * 4 +
                 static_cast<double>(mc.linear_value_head_dim) * 4;
    f.states += nv * static_cast<double>(mc.linear_key_head_dim * mc.linear_value_head_dim) * state_b;
    f.states += conv * static_cast<double>(mc.linear_conv_kernel_dim - 1) * 4;
  };
  for (int64_t l = 0; l < mc.num_layers; ++l) {
    const hyserve::layer_kind kind = mc.layer_kinds[static_cast<size_t>(l)];
    f.weights += 2 * H * 4;  // norms
    f.weights += mlp_bytes(l, kind);
    switch (kind) {
      case hyserve::layer_kind::kMamba2:
        mamba();
        break;
      case hyserve::layer_kind::kAttention:
        attention();
        break;
      case hyserve::layer_kind::kParallelHybrid:
        mamba();
        attention();
        break;
      case hyserve::layer_kind::kMlp:
        break;
      case hyserve::layer_kind::kGatedDeltaNet:
        gdn();
        break;
    }
  }
  return f;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The op-level profile of one eager step, aggregated per label in order of first appearance.
json::object print_profile(const std::vector<hyserve::kernels::profile_segment>& segs, int32_t batch, double copy_bw,
                           const char* step = "step") {
  struct agg {
    std::string label;
    int64_t calls = 0;
    double ms = 0, bytes = 0;
  };
  std::vector<agg> rows;
  double total_ms = 0, total_bytes = 0;
  for (const auto& s : segs) {
    auto it = std::find_if(rows.begin(), rows.end(), [&](const agg& a) { return a.label == s.label; });
    if (it == rows.end()) {
      rows.push_back(agg{s.label});
      it = rows.end() - 1;
    }
    it->calls += 1;
    it->ms += s.ms;
    it->bytes += s.bytes;
    total_ms += s.ms;
    total_bytes += s.bytes;
  }
  std::printf("profile  batch %4d, one eager %s op by op (%zu segments, device time between cudaEvents):\n", batch,
              step, segs.size());
  std::printf("  %-18s %5s %10s %9s %10s %9s %7s %7s\n", "op", "calls", "total us", "us/call", "MB moved", "GB/s",
              "%copy", "%step");
  json::array out;
  auto line = [&](const std::string& label, int64_t calls, double ms, double bytes) {
    const double gbs = ms > 0 ? bytes / (ms * 1e-3) / 1e9 : 0.0;
    const double pct_copy = copy_bw > 0 && ms > 0 ? 100.0 * bytes / (ms * 1e-3) / copy_bw : 0.0;
    std::printf("  %-18s %5lld %10.1f %9.2f %10.2f %9.1f %6.1f%% %6.1f%%\n", label.c_str(),
                static_cast<long long>(calls), ms * 1e3, calls ? ms * 1e3 / static_cast<double>(calls) : 0.0,
                bytes / 1e6, gbs, pct_copy, total_ms > 0 ? 100.0 * ms / total_ms : 0.0);
    out.push_back(json::object{{"op", label},        {"calls", calls},     {"us", ms * 1e3},
                               {"bytes", bytes},     {"GBps", gbs},        {"pct_copy", pct_copy}});
  };
  for (const agg& a : rows) line(a.label, a.calls, a.ms, a.bytes);
  line("total", static_cast<int64_t>(segs.size()), total_ms, total_bytes);
  // What the step would take if every op ran at the copy bandwidth, and where the rest goes.
  if (copy_bw > 0) {
    const double ideal_ms = total_bytes / copy_bw * 1e3;
    std::printf("  at copy bandwidth: %.3f ms; excess %.3f ms, of which per op kind (us above its bytes / copy bw):\n",
                ideal_ms, total_ms - ideal_ms);
    std::vector<std::pair<double, std::string>> excess;
    for (const agg& a : rows) excess.emplace_back(a.ms * 1e3 - a.bytes / copy_bw * 1e6, a.label);
    std::sort(excess.begin(), excess.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
    for (const auto& [us, label] : excess) std::printf("    %-18s %9.1f us\n", label.c_str(), us);
  }
  return json::object{{"batch", batch}, {"ops", out}, {"total_ms", total_ms}, {"total_bytes", total_bytes}};
}

std::vector<int32_t> synthetic_prompt(int32_t len, int64_t vocab, uint32_t salt) {
  std::vector<int32_t> p(static_cast<size_t>(len));
  uint32_t x = 2463534242u ^ salt;
  for (auto& t : p) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    t = static_cast<int32_t>(x % static_cast<uint32_t>(vocab));
  }
  return p;
}

// TargetVerify steps of verify_width tokens per row over the decoded rows: the median wall and
// GPU time, its ratio to the rows' decode step, and (--profile-step) one step op by op.
void verify_steps(hyserve::worker::engine& eng, const options& o, const std::vector<int32_t>& reqs, double copy_bw,
                  json::object& entry) {
  using hyserve::worker::forward_mode;
  using hyserve::worker::step_row;
  const int64_t vocab = eng.config().vocab_size;
  const auto b = static_cast<int32_t>(reqs.size());
  auto rows_at = [&](int32_t s) {
    std::vector<step_row> rows;
    for (int32_t j = 0; j < b; ++j) {
      std::vector<int32_t> tokens;
      for (int32_t t = 0; t < o.verify_width; ++t) tokens.push_back(static_cast<int32_t>((11 * (s + 5) + 3 * j + t) % vocab));
      rows.push_back(step_row{reqs[static_cast<size_t>(j)], std::move(tokens)});
    }
    return rows;
  };
  std::vector<double> wall, gpu;
  for (int32_t s = -2; s < o.decode_steps; ++s) {  // two untimed steps first (step scratch growth)
    hyserve::worker::step_report rep;
    hyserve::worker::forward_options opts;
    opts.report = &rep;
    const auto t0 = clock_type::now();
    eng.step(forward_mode::kTargetVerify, rows_at(s), opts);
    const double t = seconds_since(t0);
    if (s >= 0) {
      wall.push_back(t);
      gpu.push_back(rep.gpu_ms * 1e-3);
    }
  }
  const double med = median(wall), gmed = median(gpu);
  const double decode_ms = entry.contains("graph_step_ms") ? entry["graph_step_ms"].as_double()
                                                           : entry["eager_step_ms"].as_double();
  char gpu_text[32] = "";
  if (gmed >= 0) std::snprintf(gpu_text, sizeof gpu_text, ", %8.3f ms GPU", gmed * 1e3);
  std::printf("verify   batch %4d width %d: step %8.3f ms wall%s (median of %d) = %.2f x the decode step\n", b,
              o.verify_width, med * 1e3, gpu_text, o.decode_steps, med * 1e3 / decode_ms);
  entry["verify_width"] = o.verify_width;
  entry["verify_step_ms"] = med * 1e3;
  entry["verify_gpu_ms"] = gmed * 1e3;
  entry["verify_over_decode"] = med * 1e3 / decode_ms;
  if (o.profile_step && copy_bw > 0) {
    hyserve::worker::forward_options opts;
    opts.eager = true;
    hyserve::kernels::profile_start();
    try {
      eng.step(forward_mode::kTargetVerify, rows_at(o.decode_steps), opts);
    } catch (...) {
      hyserve::kernels::profile_stop();
      throw;
    }
    entry["verify_profile"] = print_profile(hyserve::kernels::profile_stop(), b, copy_bw, "verify step");
  }
}

int run(const options& o) {
  using hyserve::worker::forward_mode;
  using hyserve::worker::step_row;
  hyserve::service_config cfg = hyserve::load_config_file(o.config);
  const int32_t max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  // A row's context: the prompt, the graph and eager decode passes (two untimed steps each), the
  // sampled pass (two untimed steps) and the traced one, the profiled step, and a verify step's
  // tokens (verify commits nothing).
  const int32_t row_ctx = o.prompt_len + 3 * (o.decode_steps + 2) + (o.kernel_trace ? o.decode_steps : 0) + 1 +
                          o.verify_width + 8;
  const int32_t max_ctx = std::max(row_ctx, o.prefill_len + 8);
  cfg.cache.max_requests = std::max(max_batch, 1);
  cfg.cache.max_context = max_ctx;
  const int32_t page = cfg.cache.page_size;
  cfg.cache.num_pages = max_batch * ((row_ctx + page - 1) / page) + (o.prefill_len + 8 + page - 1) / page;

  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (cfg.parallel.tp != world || cfg.parallel.dp != 1)
    throw hyserve::config_error("parallel: {tp: " + std::to_string(cfg.parallel.tp) + ", dp: " +
                                std::to_string(cfg.parallel.dp) +
                                "}: this bench runs one tensor-parallel group (dp 1) of tp ranks: run it under "
                                "mpirun -np " + std::to_string(cfg.parallel.tp) + " (it has " +
                                std::to_string(world) + ")");
  if (rank != 0 && !std::freopen("/dev/null", "w", stdout)) throw hyserve::error("cannot silence rank " + std::to_string(rank));
  // Kernel records on before any CUDA work (graphs instantiated before may not be traced).
  if (o.kernel_trace && cfg.device == hyserve::device_kind::kCuda) hyserve::bench::kernel_trace_enable();
  if (rank == 0) std::fprintf(stderr, "loading %s (tp %d) ...\n", o.config.c_str(), world);
  const auto t_load = clock_type::now();
  std::unique_ptr<hyserve::worker::collective> comm;
  std::unique_ptr<hyserve::worker::engine> eng_owner;
  if (world == 1) {
    eng_owner = std::make_unique<hyserve::worker::engine>(cfg);
  } else {
    const hyserve::worker::device_placement place = hyserve::worker::place_worker(cfg, rank, world, world);
    cfg.cache.ranks_per_device = place.ranks_per_device;
    const hyserve::kernels::exec_context ctx = hyserve::kernels::open_device(cfg.device, place.ordinal);
    comm = hyserve::worker::make_model_collective(cfg, MPI_COMM_WORLD, world, place.ordinal);
    eng_owner = std::make_unique<hyserve::worker::engine>(
        hyserve::worker::make_model(cfg, hyserve::resolve_model_config(cfg), hyserve::worker::tp_placement{rank, world},
                                    comm.get(), ctx),
        cfg.cache);
  }
  hyserve::worker::engine& eng = *eng_owner;
  const hyserve::model_config& mc = eng.config();
  if (rank == 0) std::fprintf(stderr, "loaded in %.1f s\n", seconds_since(t_load));
  const double copy_bw = copy_bandwidth(cfg.device);

  json::object report;
  report["config"] = o.config;
  report["tp"] = world;
  if (world > 1)
    report["collective"] = cfg.device != hyserve::device_kind::kCuda                                ? "mpi"
                           : cfg.parallel.device_collective == hyserve::device_collective_kind::kHost ? "host"
                                                                                                     : "nccl";
  report["device"] = cfg.device == hyserve::device_kind::kCuda ? "cuda" : "cpu";
  report["weight_dtype"] = std::string(hyserve::dtype_name(cfg.model.weight_dtype));
  report["kv_dtype"] = std::string(hyserve::dtype_name(cfg.cache.kv_dtype));
  report["ssm_state_dtype"] = std::string(hyserve::dtype_name(cfg.cache.ssm_state_dtype));
  report["copy_GBps"] = copy_bw / 1e9;
  std::printf("device-to-device copy (1 GiB, read + write): %.1f GB/s\n", copy_bw / 1e9);

  // Warm-up: one short prefill and a few decodes (cuBLAS handles, the memory pool).
  {
    const int32_t r = eng.open_request();
    eng.step(forward_mode::kExtend, {step_row{r, synthetic_prompt(64, mc.vocab_size, 7)}});
    for (int i = 0; i < 3; ++i) eng.step(forward_mode::kDecode, {step_row{r, {1}}});
    eng.close_request(r);
  }

  // Prefill: one prompt of prefill_len tokens in one Extend step, twice: the first (cold: the
  // kernels of these shapes loaded, GEMM algorithms chosen, the pool grown) printed, the second
  // the figure; --profile-step: a third op by op.
  {
    auto prefill = [&](uint32_t salt) {
      const int32_t r = eng.open_request();
      const auto t0 = clock_type::now();
      eng.step(forward_mode::kExtend, {step_row{r, synthetic_prompt(o.prefill_len, mc.vocab_size, salt)}});
      const double s = seconds_since(t0);
      eng.close_request(r);
      return s;
    };
    const double cold = prefill(11), s = prefill(13);
    std::printf("prefill  %6d tokens: %9.2f ms  %10.0f tokens/s (cold: %.2f ms)\n", o.prefill_len, s * 1e3,
                o.prefill_len / s, cold * 1e3);
    report["prefill"] = {
        {"tokens", o.prefill_len}, {"ms", s * 1e3}, {"tokens_per_s", o.prefill_len / s}, {"cold_ms", cold * 1e3}};
    if (o.profile_step && cfg.device == hyserve::device_kind::kCuda) {
      const int32_t r = eng.open_request();
      hyserve::kernels::profile_start();
      try {
        eng.step(forward_mode::kExtend, {step_row{r, synthetic_prompt(o.prefill_len, mc.vocab_size, 17)}});
      } catch (...) {
        hyserve::kernels::profile_stop();
        throw;
      }
      eng.close_request(r);
      report["prefill"].as_object()["profile"] =
          print_profile(hyserve::kernels::profile_stop(), 1, copy_bw, "prefill step");
    }
  }

  json::array decode;
  struct timing {
    double wall = 0, gpu = 0;
  };
  timing b1_graph, b1_eager;
  for (int32_t b : o.batches) {
    std::vector<int32_t> reqs;
    for (int32_t i = 0; i < b; ++i) reqs.push_back(eng.open_request());
    // Prefill the rows a few at a time (bounded activation memory).
    const int32_t group = std::max(1, 16384 / o.prompt_len);
    for (int32_t i = 0; i < b; i += group) {
      std::vector<step_row> rows;
      for (int32_t j = i; j < std::min(b, i + group); ++j)
        rows.push_back(step_row{reqs[static_cast<size_t>(j)],
                                synthetic_prompt(o.prompt_len, mc.vocab_size, 100u + static_cast<uint32_t>(j))});
      eng.step(forward_mode::kExtend, rows);
    }
    // The same rows decoded through CUDA graphs (when the model uses them) and eagerly.
    json::object entry{{"batch", b}, {"context", o.prompt_len}};
    for (const bool eager : {false, true}) {
      if (eager && entry.contains("eager_step_ms")) continue;  // graphs off: the first pass was eager
      std::vector<double> wall, gpu;
      hyserve::worker::step_report last;
      for (int32_t s = -2; s < o.decode_steps; ++s) {  // two untimed steps first (graph capture)
        std::vector<step_row> rows;
        for (int32_t j = 0; j < b; ++j)
          rows.push_back(step_row{reqs[static_cast<size_t>(j)],
                                  {static_cast<int32_t>((7 * (s + 3) + j) % mc.vocab_size)}});
        hyserve::worker::step_report rep;
        hyserve::worker::forward_options opts;
        opts.eager = eager;
        opts.report = &rep;
        const auto t0 = clock_type::now();
        eng.step(forward_mode::kDecode, rows, opts);
        const double t = seconds_since(t0);
        if (s >= 0) {
          wall.push_back(t);
          gpu.push_back(rep.gpu_ms * 1e-3);
          last = rep;
        }
      }
      const double med = median(wall), gmed = median(gpu);
      const char* path = last.graph ? "graph" : "eager";
      if (b == 1) {
        if (last.graph) b1_graph = {med, gmed};
        else b1_eager = {med, gmed};
      }
      char gpu_text[32] = "";
      if (gmed >= 0) std::snprintf(gpu_text, sizeof gpu_text, ", %8.3f ms GPU", gmed * 1e3);
      std::printf("decode   batch %4d (context %d) %s: step %8.3f ms wall%s (median of %d)  %10.1f tokens/s\n", b,
                  o.prompt_len, path, med * 1e3, gpu_text, o.decode_steps, b / med);
      const std::string key = last.graph ? "graph" : "eager";
      entry[key + "_step_ms"] = med * 1e3;
      entry[key + "_gpu_ms"] = gmed * 1e3;
      entry[key + "_tokens_per_s"] = b / med;
      if (last.graph) {
        const hyserve::kernels::graph_stats& n = last.nodes;
        // Eager issues the same kernels and copies, plus one memset per activation (zero-fill,
        // one per allocation node of the graph) and the host-side allocator calls.
        std::printf("         graph of batch %d: %lld nodes = %lld kernels, %lld memsets, %lld copies, %lld allocs, "
                    "%lld frees, %lld other (eager: ~%lld launches)\n",
                    last.graph_batch, static_cast<long long>(n.total()), static_cast<long long>(n.kernels),
                    static_cast<long long>(n.memsets), static_cast<long long>(n.memcpys),
                    static_cast<long long>(n.mem_allocs), static_cast<long long>(n.mem_frees),
                    static_cast<long long>(n.other), static_cast<long long>(n.kernels + n.memcpys + n.mem_allocs));
        entry["graph_batch"] = last.graph_batch;
        entry["graph_kernels"] = n.kernels;
        entry["graph_memsets"] = n.memsets;
        entry["graph_copies"] = n.memcpys;
        entry["graph_allocs"] = n.mem_allocs;
      }
    }
    {
      // The step as the service runs it: the same path (graphs when the model uses them) with
      // greedy sampling on the device, so only the tokens come back (8 bytes a row).
      hyserve::worker::step_sampling sampling;
      sampling.settings.assign(static_cast<size_t>(b), hyserve::kernels::sample_settings{});
      sampling.feed_slots.assign(static_cast<size_t>(b), -1);
      std::vector<hyserve::kernels::sample_output> sampled;
      std::vector<double> wall;
      uint64_t d2h = 0;
      // --kernel-trace: a second pass of the same steps with CUPTI's kernel records on.
      std::vector<hyserve::bench::kernel_record> traced;
      const int passes = o.kernel_trace && cfg.device == hyserve::device_kind::kCuda ? 2 : 1;
      for (int pass = 0; pass < passes; ++pass) {
        if (pass == 1) hyserve::bench::kernel_trace_start();
        for (int32_t s = pass == 0 ? -2 : 0; s < o.decode_steps; ++s) {
          std::vector<step_row> rows;
          for (int32_t j = 0; j < b; ++j)
            rows.push_back(step_row{reqs[static_cast<size_t>(j)],
                                    {static_cast<int32_t>((11 * (s + 3) + j) % mc.vocab_size)}});
          hyserve::worker::forward_options opts;
          opts.sample = &sampling;
          opts.sampled = &sampled;
          const uint64_t before = hyserve::kernels::device_to_host_bytes();
          const auto t0 = clock_type::now();
          eng.step(forward_mode::kDecode, rows, opts);
          const double t = seconds_since(t0);
          if (s >= 0 && pass == 0) {
            wall.push_back(t);
            d2h = hyserve::kernels::device_to_host_bytes() - before;
          }
        }
        if (pass == 1) traced = hyserve::bench::kernel_trace_stop();
      }
      const double med = median(wall);
      std::printf("decode   batch %4d (context %d) sampled on the device: step %8.3f ms wall (median of %d)  "
                  "%10.1f tokens/s, %llu bytes device->host per step\n",
                  b, o.prompt_len, med * 1e3, o.decode_steps, b / med, static_cast<unsigned long long>(d2h));
      entry["sampled_step_ms"] = med * 1e3;
      entry["sampled_tokens_per_s"] = b / med;
      entry["sampled_d2h_bytes_per_step"] = static_cast<double>(d2h);
      if (passes == 2) entry["kernel_trace"] = hyserve::bench::print_kernel_trace(traced, o.decode_steps, 30);
    }
    if (o.profile_step && cfg.device == hyserve::device_kind::kCuda) {
      std::vector<step_row> rows;
      for (int32_t j = 0; j < b; ++j)
        rows.push_back(step_row{reqs[static_cast<size_t>(j)], {static_cast<int32_t>((5 + j) % mc.vocab_size)}});
      hyserve::worker::forward_options opts;
      opts.eager = true;
      hyserve::kernels::profile_start();
      try {
        eng.step(forward_mode::kDecode, rows, opts);
      } catch (...) {
        hyserve::kernels::profile_stop();
        throw;
      }
      entry["profile"] = print_profile(hyserve::kernels::profile_stop(), b, copy_bw);
    }
    if (o.verify_width > 0) verify_steps(eng, o, reqs, copy_bw, entry);
    for (int32_t r : reqs) eng.close_request(r);
    entry["step_ms"] = entry.contains("graph_step_ms") ? entry["graph_step_ms"] : entry["eager_step_ms"];
    decode.push_back(entry);
  }
  report["decode"] = decode;

  if (copy_bw > 0) {
    const floor_bytes f = decode_floor(cfg, mc, o.prompt_len + o.decode_steps / 2);
    const double floor_s = f.total() / copy_bw;
    std::printf("batch-1 decode floor: weights %.2f GB + states %.3f GB + KV %.3f GB = %.2f GB -> %.3f ms at %.0f GB/s\n",
                f.weights / 1e9, f.states / 1e9, f.kv / 1e9, f.total() / 1e9, floor_s * 1e3, copy_bw / 1e9);
    json::object fl{{"weights_GB", f.weights / 1e9}, {"states_GB", f.states / 1e9}, {"kv_GB", f.kv / 1e9},
                    {"floor_ms", floor_s * 1e3}};
    for (const auto& [name, t] : {std::pair<const char*, timing>{"graph", b1_graph}, {"eager", b1_eager}}) {
      if (t.wall <= 0) continue;
      std::printf("batch-1 decode %s: wall step / floor = %.3f, GPU time / floor = %.3f (host overhead %.3f ms)\n", name,
                  t.wall / floor_s, t.gpu / floor_s, (t.wall - t.gpu) * 1e3);
      fl[std::string(name) + "_step_over_floor"] = t.wall / floor_s;
      fl[std::string(name) + "_gpu_over_floor"] = t.gpu / floor_s;
    }
    const timing best = b1_graph.wall > 0 ? b1_graph : b1_eager;
    if (best.wall > 0) fl["b1_step_over_floor"] = best.wall / floor_s;
    report["b1_floor"] = fl;
  }
  if (!o.json_out.empty() && rank == 0) {
    std::ofstream out(o.json_out);
    out << json::serialize(report) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 1;
  try {
    rc = run(parse(argc, argv));
  } catch (const std::exception& e) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::cerr << "hyserve-bench-model (rank " << rank << "): " << e.what() << "\n";
    // The other ranks may wait in a collective for this one.
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world > 1) MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
