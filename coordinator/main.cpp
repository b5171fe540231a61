// Coordinator (world rank 0): HTTP API, scheduler, and the control plane to the workers.
//   mpirun -np 1 coordinator CONFIG : -np W worker CONFIG
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "coordinator/api/text_support.h"
#include "coordinator/http/server.h"
#include "coordinator/log.h"
#include "coordinator/metrics/service_metrics.h"
#include "coordinator/rank_monitor.h"
#include "coordinator/scheduler.h"
#include "coordinator/transport.h"
#include "hyserve/common/config.h"
#include "hyserve/common/error.h"
#include "hyserve/common/topology.h"

namespace {

using namespace hyserve;
using namespace hyserve::coordinator;

std::atomic<bool> g_stop{false};

// SIGINT, SIGTERM and SIGUSR1 (what launch/serve.sh sends through mpirun, which forwards it to
// every rank; the workers ignore it): drain, then stop every rank.
extern "C" void on_signal(int) { g_stop.store(true); }

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The watchdog: a thread of its own, so that no call on the scheduler's thread can stall it.
// Every 20 ms (mpirun ends the job about a second after a rank dies: the clients must hear of it
// first) it checks that the local worker ranks still run (a lost one is reported to the
// scheduler, which fails every request with its name and host), that the scheduler loop still
// advances (stalled past worker.step_timeout_s: every open request fails, /health 503, then the
// job ends after worker.fault_grace_s), and that the process ends by its exit deadline once one
// is set.
// Detached: it lives until the process exits, so it also bounds MPI_Finalize.
struct watchdog_state {
  std::mutex mu;
  scheduler* sched = nullptr;  // null once the scheduler is gone (guarded by mu)
  std::optional<rank_monitor> monitor;
  std::atomic<int64_t> deadline_ns{0};  // 0: none
  double stall_s = 60.0, grace_s = 2.0;
  bool lost_reported = false;
};

void set_deadline(watchdog_state& w, double seconds_from_now) {
  const int64_t d = now_ns() + static_cast<int64_t>(seconds_from_now * 1e9);
  int64_t cur = w.deadline_ns.load();
  while ((cur == 0 || d < cur) && !w.deadline_ns.compare_exchange_weak(cur, d)) {
  }
}

void start_watchdog(std::shared_ptr<watchdog_state> w) {
  std::thread([w] {
    bool stalled = false;
    while (true) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      {
        std::lock_guard<std::mutex> lock(w->mu);
        if (w->sched != nullptr) {
          if (w->monitor && !w->lost_reported) {
            if (const auto lost = w->monitor->lost()) {
              w->lost_reported = true;
              HYSERVE_LOG_ERROR("worker rank %d (pid %d) on host %s is gone", lost->world_rank,
                                static_cast<int>(lost->pid), host_name().c_str());
              w->sched->report_lost_rank(lost->world_rank, host_name());
            }
          }
          const int64_t tick = w->sched->last_tick_ns();
          const double idle_s = tick == 0 ? 0.0 : static_cast<double>(now_ns() - tick) / 1e9;
          if (!stalled && idle_s > w->stall_s) {
            stalled = true;
            w->sched->mark_unhealthy();
            HYSERVE_LOG_ERROR("fatal: the scheduler loop has not advanced for %.1f s (over worker.step_timeout_s); "
                              "/health answers 503 for %.1f s, then the job ends",
                              idle_s, w->grace_s);
            char why[160];
            std::snprintf(why, sizeof(why), "fatal worker fault: the scheduler loop stalled for %.1f s", idle_s);
            w->sched->fail_open_requests(why);
            set_deadline(*w, w->grace_s);
          }
        }
      }
      const int64_t deadline = w->deadline_ns.load();
      if (deadline != 0 && now_ns() > deadline) {
        HYSERVE_LOG_ERROR("fatal: the coordinator did not end by its deadline; exiting (mpirun ends every rank)");
        std::fflush(stderr);
        std::_Exit(3);
      }
    }
  }).detach();
}

// Test only (worker.fault: coordinator_stall): the scheduler's thread blocks for good before
// sending control message worker.fail_at_step, as a call that never returns would (a blocking
// send to a rank that stopped reading); only the watchdog can answer the clients then.
class stalling_transport final : public transport {
 public:
  stalling_transport(std::unique_ptr<transport> inner, int64_t at) : inner_(std::move(inner)), at_(at) {}
  int num_groups() const override { return inner_->num_groups(); }
  void send_plan(int group, const std::vector<uint8_t>& bytes) override {
    if (sent_++ == at_) {
      HYSERVE_LOG_ERROR("injected stall of the scheduler loop before control message %lld",
                        static_cast<long long>(at_));
      while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    inner_->send_plan(group, bytes);
  }
  std::optional<std::pair<int, std::vector<uint8_t>>> poll_result() override { return inner_->poll_result(); }
  void send_shutdown() override { inner_->send_shutdown(); }
  bool wait_sent(double timeout_s) override { return inner_->wait_sent(timeout_s); }

 private:
  std::unique_ptr<transport> inner_;
  int64_t at_ = -1;
  int64_t sent_ = 0;
};

// The tokenizer (model.tokenizer) and the chat format (chat). Throws config_error naming the
// setting at fault: a malformed tokenizer.json, ids past the model's vocabulary, a chat.eos that
// is not one token.
api::text_support load_text_support(const service_config& cfg, const model_config& mc) {
  api::text_support text;
  if (cfg.model.tokenizer.empty()) return text;
  try {
    text.tokenizer = std::make_shared<const tokenizer::bpe_tokenizer>(
        tokenizer::bpe_tokenizer::from_file(cfg.model.tokenizer));
  } catch (const error& e) {
    throw config_error(cfg.source + ": model.tokenizer: " + e.what());
  }
  if (text.tokenizer->vocab_size() > mc.vocab_size)
    throw config_error(cfg.source + ": model.tokenizer: " + cfg.model.tokenizer + " has token ids up to " +
                       std::to_string(text.tokenizer->vocab_size() - 1) + ", past the model's vocabulary of " +
                       std::to_string(mc.vocab_size));
  if (cfg.chat) {
    api::chat_format chat;
    chat.message_template = cfg.chat->message_template;
    chat.generation_prompt = cfg.chat->generation_prompt;
    chat.bos = cfg.chat->bos;
    chat.stop = cfg.chat->stop;
    if (!cfg.chat->eos.empty()) {
      const std::optional<int32_t> id = text.tokenizer->token_to_id(cfg.chat->eos);
      if (!id) throw config_error(cfg.source + ": chat.eos: '" + cfg.chat->eos + "' is not a token of " + cfg.model.tokenizer);
      chat.stop_token_ids.push_back(*id);
    }
    text.chat = std::move(chat);
  }
  return text;
}

// After a coordinator-only start-up error: the workers are already loading, so let them finish,
// then tell them to shut down, so that every rank exits on its own.
int stop_workers_after_error(const topology& t, double startup_timeout_s) {
  MPI_Comm unused;
  MPI_Comm_split(MPI_COMM_WORLD, MPI_UNDEFINED, 0, &unused);
  HYSERVE_LOG_INFO("stopping the workers");
  try {
    gather_hellos(t, startup_timeout_s);
  } catch (const error& e) {
    HYSERVE_LOG_ERROR("start-up failed: %s", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  std::unique_ptr<transport> link = make_mpi_transport(t);
  link->send_shutdown();
  if (!link->wait_sent(startup_timeout_s)) MPI_Abort(MPI_COMM_WORLD, 1);
  return 1;
}

int run(int argc, char** argv) {
  topology t;
  MPI_Comm_rank(MPI_COMM_WORLD, &t.world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &t.world_size);
  if (argc < 2) {
    std::fprintf(stderr, "usage: coordinator CONFIG.yaml\n");
    return 2;
  }
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGUSR1, on_signal);
  service_config cfg;
  model_config mc;
  std::string prefix_note;
  try {
    cfg = load_config_file(argv[1]);
    mc = resolve_model_config(cfg);
    prefix_note = settle_prefix_cache(cfg, mc);
  } catch (const error& e) {
    std::fprintf(stderr, "[rank %d] configuration error: %s\n", t.world_rank, e.what());
    return 1;
  }
  if (!prefix_note.empty()) HYSERVE_LOG_WARN("%s", prefix_note.c_str());
  t.dp = cfg.parallel.dp;
  t.tp = cfg.parallel.tp;
  if (const std::string m = t.mismatch(); !m.empty()) {
    std::fprintf(stderr, "[rank %d] %s\n", t.world_rank, m.c_str());
    return 1;
  }
  // Only the coordinator reads the tokenizer (the workers see token ids only).
  api::text_support text;
  try {
    text = load_text_support(cfg, mc);
  } catch (const error& e) {
    std::fprintf(stderr, "[rank %d] configuration error: %s\n", t.world_rank, e.what());
    return stop_workers_after_error(t, cfg.worker.startup_timeout_s);
  }
  if (text.tokenizer)
    HYSERVE_LOG_INFO("tokenizer: %s (%d tokens)%s", cfg.model.tokenizer.c_str(), text.tokenizer->vocab_size(),
                     text.chat ? ", chat enabled" : "");
  MPI_Comm unused;
  MPI_Comm_split(MPI_COMM_WORLD, MPI_UNDEFINED, 0, &unused);  // workers form their tp groups

  HYSERVE_LOG_INFO("waiting for %d data-parallel group(s) of tp=%d to load the model", t.dp, t.tp);
  std::vector<wire::hello> hellos;
  try {
    hellos = gather_hellos(t, cfg.worker.startup_timeout_s);
  } catch (const error& e) {
    HYSERVE_LOG_ERROR("start-up failed: %s", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  std::unique_ptr<transport> link = make_mpi_transport(t);
  if (cfg.worker.fault == worker_fault::kCoordinatorStall && cfg.worker.fail_at_step >= 0)
    link = std::make_unique<stalling_transport>(std::move(link), cfg.worker.fail_at_step);
  metrics::service_metrics metrics;
  scheduler sched(cfg, mc, hellos, *link);
  auto watch = std::make_shared<watchdog_state>();
  watch->stall_s = cfg.worker.step_timeout_s;
  watch->grace_s = cfg.worker.fault_grace_s;
  watch->monitor.emplace(1, t.world_size - 1);
  HYSERVE_LOG_INFO("watching %zu of %d worker rank(s) on this host (%s); the others by worker.step_timeout_s",
                   watch->monitor->ranks().size(), t.world_size - 1, host_name().c_str());
  {
    std::lock_guard<std::mutex> lock(watch->mu);
    watch->sched = &sched;
  }
  // Declared after sched: destroyed first, so the watchdog never sees a destroyed scheduler.
  struct unwatch {
    std::shared_ptr<watchdog_state> w;
    ~unwatch() {
      std::lock_guard<std::mutex> lock(w->mu);
      w->sched = nullptr;
    }
  } unwatch_guard{watch};
  start_watchdog(watch);
  scheduler_observer obs;
  obs.on_step = [&metrics](std::string_view mode, double s) { metrics.step_seconds(mode).observe(s); };
  obs.on_load = [&metrics](int64_t q, int64_t r) {
    metrics.queue_depth().set(static_cast<double>(q));
    metrics.running_requests().set(static_cast<double>(r));
  };
  obs.on_capacity = [&metrics](int64_t pages, int64_t slots) {
    metrics.free_kv_pages().set(static_cast<double>(pages));
    metrics.free_mamba_slots().set(static_cast<double>(slots));
  };
  obs.on_decode_attention = [&metrics](int64_t rows, int64_t sparse, int64_t pages) {
    metrics.record_decode_attention(rows, sparse, pages);
  };
  {
    // Speculative decoding: tokens drafted and accepted over all verify rows (acceptance rate =
    // accepted / drafted), and verify rows that had drafts (mean accepted length = accepted / rounds).
    auto& reg = metrics.metric_registry();
    auto& drafted = reg.counter_series("hyserve_spec_draft_tokens_total", "Speculative draft tokens proposed.");
    auto& accepted = reg.counter_series("hyserve_spec_accepted_tokens_total", "Speculative draft tokens accepted.");
    auto& rounds = reg.counter_series("hyserve_spec_verify_rows_total", "Speculative verify rows that carried drafts.");
    obs.on_spec = [&drafted, &accepted, &rounds](int64_t d, int64_t a) {
      drafted.inc(static_cast<double>(d));
      accepted.inc(static_cast<double>(a));
      rounds.inc(1.0);
    };
  }
  {
    // Overlapped loop: steps sent while the group's previous step was still running, and rows
    // those steps carried for requests that had finished by then (wasted rows).
    auto& reg = metrics.metric_registry();
    auto& overlapped = reg.counter_series("hyserve_overlapped_steps_total",
                                          "Steps sent while the same group's previous step was still in flight.");
    auto& wasted = reg.counter_series("hyserve_overlap_wasted_rows_total",
                                      "Rows of overlapped steps whose request had finished when the step was sent.");
    obs.on_overlap = [&overlapped](int64_t) { overlapped.inc(1.0); };
    obs.on_wasted_rows = [&wasted](int64_t n) { wasted.inc(static_cast<double>(n)); };
  }
  {
    // Prefix caching (docs/ARCHITECTURE.md, Prefix caching): prompt tokens of admitted requests
    // and those served from the cache (hit rate = cached / prompt), tree nodes evicted (one KV
    // page each, with its checkpoint if it had one), checkpoints in use and pages the trees hold.
    auto& reg = metrics.metric_registry();
    auto& prompt = reg.counter_series("hyserve_prefix_cache_prompt_tokens_total",
                                      "Prompt tokens of requests admitted with prefix caching on.");
    auto& cached = reg.counter_series("hyserve_prefix_cache_cached_tokens_total",
                                      "Prompt tokens served from the prefix cache (not prefilled).");
    auto& hit_rate = reg.gauge_series("hyserve_prefix_cache_hit_rate",
                                      "Fraction of prompt tokens served from the prefix cache (since start).");
    auto& hits = reg.counter_series("hyserve_prefix_cache_hits_total", "Requests that started from a cached prefix.");
    auto& evicted = reg.counter_series("hyserve_prefix_cache_evicted_pages_total",
                                       "Prefix-cache nodes evicted (one KV page each).");
    auto& evicted_ckpt = reg.counter_series("hyserve_prefix_cache_evicted_checkpoints_total",
                                            "Recurrent-state checkpoints evicted with their pages.");
    auto& in_use = reg.gauge_series("hyserve_prefix_cache_checkpoints", "Recurrent-state checkpoints in use.");
    auto& pages = reg.gauge_series("hyserve_prefix_cache_pages", "KV pages held by the prefix cache.");
    obs.on_prefix_lookup = [&prompt, &cached, &hit_rate, &hits](int64_t p, int64_t c) {
      prompt.inc(static_cast<double>(p));
      cached.inc(static_cast<double>(c));
      if (c > 0) hits.inc(1.0);
      if (prompt.value() > 0) hit_rate.set(cached.value() / prompt.value());
    };
    obs.on_prefix_evict = [&evicted, &evicted_ckpt](int64_t n, int64_t c) {
      evicted.inc(static_cast<double>(n));
      evicted_ckpt.inc(static_cast<double>(c));
    };
    obs.on_prefix_capacity = [&in_use, &pages](int64_t c, int64_t p) {
      in_use.set(static_cast<double>(c));
      pages.set(static_cast<double>(p));
    };
  }
  sched.set_observer(std::move(obs));

  http::server_options opts;
  opts.host = cfg.server.host;
  opts.port = static_cast<uint16_t>(cfg.server.port);
  opts.threads = cfg.server.threads;
  opts.body_limit = static_cast<size_t>(cfg.server.max_body_bytes);
  opts.strict_fields = cfg.server.strict_fields;
  if (!cfg.server.api_key.empty()) opts.api_key = cfg.server.api_key;
  opts.server_info["dp"] = cfg.parallel.dp;
  opts.server_info["tp"] = cfg.parallel.tp;
  opts.server_info["page_size"] = cfg.cache.page_size;
  opts.server_info["max_running"] = cfg.scheduler.max_running;
  opts.server_info["max_batch_tokens"] = cfg.scheduler.max_batch_tokens;
  opts.server_info["chunked_prefill"] = cfg.scheduler.chunked_prefill;
  opts.server_info["overlap"] = cfg.scheduler.overlap;
  opts.server_info["tokenizer"] = cfg.model.tokenizer;
  opts.server_info["chat"] = text.chat.has_value();
  opts.text = std::move(text);
  http::server server(opts, sched, metrics);
  try {
    server.start();
  } catch (const error& e) {
    HYSERVE_LOG_ERROR("cannot serve on %s:%d: %s", cfg.server.host.c_str(), cfg.server.port, e.what());
    link->send_shutdown();
    if (!link->wait_sent(cfg.worker.step_timeout_s)) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  HYSERVE_LOG_INFO("serving on http://%s:%u (dp=%d, tp=%d, vocab=%lld)", cfg.server.host.c_str(),
                   static_cast<unsigned>(server.port()), t.dp, t.tp, static_cast<long long>(mc.vocab_size));

  const int rc = sched.run(g_stop);
  {
    // The loop is over: no stall or lost-rank checks from here on (the exit deadline remains).
    std::lock_guard<std::mutex> lock(watch->mu);
    watch->sched = nullptr;
  }
  if (rc != 0) {
    // A group is hung or gone: collectives cannot complete, so the whole job is ended. For
    // worker.fault_grace_s the server stays up answering 503 (/health included), so load
    // balancers and clients see the fault rather than a refused connection; then it closes.
    // The watchdog ends the process if any of this blocks.
    set_deadline(*watch, cfg.worker.fault_grace_s + 5.0);
    HYSERVE_LOG_ERROR("fatal worker fault; /health answers 503 for %.1f s, then the job ends",
                      cfg.worker.fault_grace_s);
    std::this_thread::sleep_for(std::chrono::duration<double>(cfg.worker.fault_grace_s));
    server.stop(std::chrono::milliseconds(1000));
    HYSERVE_LOG_ERROR("fatal worker fault; ending the job");
    MPI_Abort(MPI_COMM_WORLD, 3);
    return rc;
  }
  HYSERVE_LOG_INFO("shutting down");
  // Bounded: in-flight answers are written (drain_timeout_s), then the workers are told to stop.
  set_deadline(*watch, cfg.server.drain_timeout_s + cfg.worker.step_timeout_s + 30.0);
  server.stop(std::chrono::milliseconds(static_cast<int64_t>(cfg.server.drain_timeout_s * 1000)));
  link->send_shutdown();
  if (!link->wait_sent(cfg.worker.step_timeout_s)) {
    HYSERVE_LOG_ERROR("a worker group did not take the shutdown message within %.1f s; ending the job",
                      cfg.worker.step_timeout_s);
    MPI_Abort(MPI_COMM_WORLD, 3);
    return 3;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  const int rc = run(argc, argv);
  MPI_Finalize();
  return rc;
}
