// Worker rank: executes the step plans of its data-parallel group (docs/ARCHITECTURE.md, Processes and the wire; One request, end to end).
//   mpirun -np 1 coordinator CONFIG : -np W worker CONFIG
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <optional>
#include <thread>
#include <string>
#include <vector>

#include "hyserve/common/config.h"
#include "hyserve/common/step_trace.h"
#include "hyserve/common/error.h"
#include "hyserve/common/topology.h"
#include "hyserve/common/wire.h"
#include "hyserve/kernels/device.h"
#include "hyserve/worker/mpi_collective.h"
#include "hyserve/worker/runner.h"
#include "hyserve/worker/tp_device.h"

namespace {

using namespace hyserve;

void say(const topology& t, const std::string& msg) {
  std::fprintf(stderr, "[worker %d dp%d/tp%d] %s\n", t.world_rank, t.dp_rank(), t.tp_rank(), msg.c_str());
  std::fflush(stderr);
}

// Completes a non-blocking MPI request without spinning a core: between tests the rank sleeps,
// starting at 20 µs and backing off to 1 ms, so idle workers leave the CPU to busy ones.
void patient_wait(MPI_Request& req) {
  int done = 0;
  auto pause = std::chrono::microseconds(20);
  while (true) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

// Leader: whether a control message from the coordinator is waiting (never blocks).
bool message_waiting() {
  int flag = 0;
  MPI_Iprobe(0, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
  return flag != 0;
}

// Leader: receives one control message from the coordinator; every rank: gets its bytes.
// Until `spin_until` the leader polls without sleeping (a GPU worker right after a step: the
// next plan is typically a fraction of a millisecond away, and a sleep would cost the device
// that much idle time); after it, it backs off from 20 µs to 1 ms between polls.
std::vector<uint8_t> next_message(const topology& t, MPI_Comm tp_comm,
                                  std::chrono::steady_clock::time_point spin_until = {}) {
  std::vector<uint8_t> bytes;
  uint64_t n = 0;
  if (t.is_leader()) {
    MPI_Status st;
    int flag = 0;
    auto pause = std::chrono::microseconds(20);
    while (true) {
      MPI_Iprobe(0, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st);
      if (flag) break;
      if (std::chrono::steady_clock::now() < spin_until) {
        std::this_thread::yield();
        continue;
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    bytes.resize(static_cast<size_t>(count));
    MPI_Recv(bytes.data(), count, MPI_BYTE, 0, st.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    n = bytes.size();
  }
  MPI_Request req;
  MPI_Ibcast(&n, 1, MPI_UINT64_T, 0, tp_comm, &req);
  patient_wait(req);
  bytes.resize(n);
  MPI_Ibcast(bytes.data(), static_cast<int>(n), MPI_BYTE, 0, tp_comm, &req);
  patient_wait(req);
  return bytes;
}

int run(int argc, char** argv) {
  topology t;
  MPI_Comm_rank(MPI_COMM_WORLD, &t.world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &t.world_size);
  if (argc < 2) {
    std::fprintf(stderr, "usage: worker CONFIG.yaml\n");
    return 2;
  }
  service_config cfg;
  model_config mc;
  try {
    // As the coordinator does, before any collective call: a configuration it refuses ends every
    // rank here, and the prefix cache is settled to the checkpoint slots it plans on.
    cfg = load_config_file(argv[1]);
    mc = resolve_model_config(cfg);
    settle_prefix_cache(cfg, mc);
  } catch (const error& e) {
    std::fprintf(stderr, "[rank %d] configuration error: %s\n", t.world_rank, e.what());
    return 1;
  }
  t.dp = cfg.parallel.dp;
  t.tp = cfg.parallel.tp;
  if (const std::string m = t.mismatch(); !m.empty()) {
    std::fprintf(stderr, "[rank %d] %s\n", t.world_rank, m.c_str());
    return 1;
  }
  // The coordinator drives shutdown (it drains first, then sends kShutdown): a signal that
  // mpirun forwards to every rank (SIGUSR1 from launch/serve.sh) must not kill the workers under it.
  std::signal(SIGINT, SIG_IGN);
  std::signal(SIGTERM, SIG_IGN);
  std::signal(SIGUSR1, SIG_IGN);
  MPI_Comm tp_comm;
  MPI_Comm_split(MPI_COMM_WORLD, t.dp_rank(), t.tp_rank(), &tp_comm);
  std::unique_ptr<worker::collective> comm = worker::make_mpi_collective(tp_comm);
  std::unique_ptr<worker::collective> device_comm;  // the model's reductions when tp > 1
  std::unique_ptr<worker::runner> r;
  try {
    worker::fault_injection fault{cfg.worker.fault == worker_fault::kThrow ? cfg.worker.fail_at_step : -1,
                                  cfg.worker.fail_rank};
    // Device, cache share and the model's collective (hyserve/worker/tp_device.h): NCCL on
    // CUDA, or the host-staged collective with which several ranks share one device; the runner
    // keeps the MPI collective for its host-side agreement.
    const worker::device_placement place = worker::place_worker(cfg, t.dp_rank() * t.tp + t.tp_rank(), t.dp * t.tp, t.tp);
    cfg.cache.ranks_per_device = place.ranks_per_device;
    const kernels::exec_context ctx = kernels::open_device(cfg.device, place.ordinal);
    device_comm = worker::make_model_collective(cfg, tp_comm, t.tp, place.ordinal);
    worker::collective* model_comm = device_comm ? device_comm.get() : comm.get();
    // The target, then the draft model (if any; its reductions run where the target's do), then
    // the pools planned for both.
    auto target = worker::make_model(cfg, mc, worker::tp_placement{t.tp_rank(), t.tp}, model_comm, ctx);
    auto draft = worker::make_draft_model(cfg, mc, worker::tp_placement{t.tp_rank(), t.tp}, model_comm, ctx);
    r = std::make_unique<worker::runner>(std::move(target), std::move(draft), cfg.cache, comm.get(), fault);
  } catch (const error& e) {
    say(t, std::string("start-up failed: ") + e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  if (t.is_leader()) {
    const std::vector<uint8_t> hello = wire::encode(r->capacity(t.dp_rank()));
    MPI_Send(hello.data(), static_cast<int>(hello.size()), MPI_BYTE, 0, static_cast<int>(mpi_tag::kHello),
             MPI_COMM_WORLD);
  }
  say(t, "ready");
  // The step loop. A plan runs to its end, except a Decode step the runner can leave in flight
  // on the device (runner::submit): then the next plan is taken as soon as it arrives and, when
  // it may (runner::can_submit_behind), prepared and queued behind the running step, so the
  // host's work for step N+1 overlaps the device's for step N. Results go back in step order,
  // each as soon as its step is done. Only tensor-parallel size 1 leaves steps in flight: with
  // more ranks every step ends in submit and the loop is the strict one.
  // A GPU worker of tensor-parallel size 1 polls for the next plan without sleeping for 2 ms
  // after each result (next_message).
  const bool spin = cfg.device == device_kind::kCuda && t.tp == 1;
  std::chrono::steady_clock::time_point spin_until{};
  // scheduler.step_trace: the leader's plan / submitted / result events.
  step_trace trace(t.is_leader() && !cfg.scheduler.step_trace.empty()
                       ? cfg.scheduler.step_trace + ".worker" + std::to_string(t.dp_rank()) + ".csv"
                       : std::string());
  auto send_result = [&](const wire::step_result& res) {
    if (spin) spin_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
    if (!t.is_leader()) return;
    const std::vector<uint8_t> out = wire::encode(res);
    MPI_Send(out.data(), static_cast<int>(out.size()), MPI_BYTE, 0, static_cast<int>(mpi_tag::kResult), MPI_COMM_WORLD);
    trace.add("result", res.step_id, static_cast<int64_t>(r->in_flight()));
  };
  auto finish_all = [&] {
    while (r->in_flight() > 0) send_result(r->finish());
  };
  // Where the loop's time goes (logged at shutdown): plans, those queued behind a running step,
  // host time in submit, and time with nothing in flight waiting for the next plan.
  using clock = std::chrono::steady_clock;
  int64_t plans = 0, behind = 0;
  double submit_s = 0, idle_s = 0;
  for (int64_t received = 0;; ++received) {
    // With a step in flight: finish it when the device is done, unless the next plan comes
    // first (and there is room for it behind the running step).
    while (r->in_flight() > 0) {
      if (r->oldest_ready()) {
        send_result(r->finish());
        continue;
      }
      if (r->in_flight() < 2 && message_waiting()) break;
      std::this_thread::yield();
    }
    if (cfg.worker.fault == worker_fault::kHang && received == cfg.worker.fail_at_step &&
        t.tp_rank() == cfg.worker.fail_rank) {
      // Test-only (worker.fault: hang): this rank stops reading control messages for good.
      say(t, "injected hang before control message " + std::to_string(received));
      while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    if (cfg.worker.fault == worker_fault::kStop && received == cfg.worker.fail_at_step &&
        t.tp_rank() == cfg.worker.fail_rank) {
      // Test-only (worker.fault: stop): the process stops itself, as `kill -STOP` would, and is
      // only ever killed afterwards.
      say(t, "injected stop before control message " + std::to_string(received));
      std::fflush(nullptr);
      std::raise(SIGSTOP);
    }
    const auto t_wait = clock::now();
    const bool was_idle = r->in_flight() == 0;
    const std::vector<uint8_t> bytes = next_message(t, tp_comm, spin_until);
    if (was_idle) idle_s += std::chrono::duration<double>(clock::now() - t_wait).count();
    std::optional<wire::step_plan> plan;
    wire::step_result bad;
    try {
      if (wire::peek_type(bytes) == wire::message_type::kShutdown) break;
      plan = wire::decode_step_plan(bytes);
    } catch (const error& e) {
      // A corrupt or unexpected message fails this step only (every rank saw the same bytes).
      bad.ok = false;
      bad.error = std::string("bad control message: ") + e.what();
    }
    if (!plan || (r->in_flight() > 0 && !r->can_submit_behind(*plan))) finish_all();
    if (!plan) {
      send_result(bad);
      continue;
    }
    ++plans;
    if (r->in_flight() > 0) ++behind;
    const auto t_submit = clock::now();
    const uint64_t step_id = plan->step_id;
    trace.add("plan", step_id, static_cast<int64_t>(r->in_flight()), static_cast<int64_t>(plan->rows.size()));
    r->submit(std::move(*plan));
    submit_s += std::chrono::duration<double>(clock::now() - t_submit).count();
    trace.add("submitted", step_id, static_cast<int64_t>(r->in_flight()));
  }
  finish_all();
  if (plans > 0) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "step loop: %lld plans, %lld queued behind a running step; %.1f us host time each to submit; "
                  "%.3f s idle waiting for plans",
                  static_cast<long long>(plans), static_cast<long long>(behind),
                  submit_s / static_cast<double>(plans) * 1e6, idle_s);
    say(t, line);
  }
  MPI_Comm_free(&tp_comm);
  say(t, "shut down");
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
