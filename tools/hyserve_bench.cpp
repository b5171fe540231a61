// hyserve-bench: load generator for a running hyserve server (POST /generate).
//   hyserve-bench --url http://127.0.0.1:8000 --concurrency 8 --requests 64 --prompt-len 128 --output-len 64
//                 [--vocab 1024] [--seed 0] [--stream|--no-stream] [--api-key K] [--timeout 120] [--json]
//                 [--shared-prefix N] [--turns T]
// Prompts are random token ids in [3, vocab) derived from --seed; every request is greedy with
// ignore_eos so it generates exactly --output-len tokens. `concurrency` workers (Asio coroutines,
// one keep-alive connection each) keep that many requests in flight until all are done.
// Streaming (the default) measures time to first token and inter-token latency from the SSE
// events; without it only end-to-end latency is measured.
// Prefix caching: --shared-prefix N puts the same N tokens before every prompt; --turns T runs
// --requests conversations of T turns, each turn resending the conversation so far (shared
// prefix, earlier prompts and answers) plus --prompt-len new tokens; the summary reports the
// prompt tokens the server served from its cache (meta_info.cached_tokens).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>

#include "bench/client.h"
#include "bench/options.h"
#include "bench/progress.h"
#include "bench/report.h"

namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using namespace hyserve::bench;

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Request `index`'s prompt depends only on (seed, index), so it is the same whatever the
// concurrency or the order of completion.
std::vector<int32_t> make_prompt(uint64_t seed, uint64_t index, int32_t len, int32_t vocab) {
  uint64_t state = seed;
  state = splitmix64(state) ^ (index * 0xD1B54A32D192ED03ull);
  const uint64_t span = static_cast<uint64_t>(vocab) - 3;
  std::vector<int32_t> ids(static_cast<size_t>(len));
  for (int32_t& id : ids) id = static_cast<int32_t>(3 + splitmix64(state) % span);
  return ids;
}

// The shared prefix (a system prompt): one id sequence for the run, from the seed.
std::vector<int32_t> shared_prefix(const bench_options& o) {
  return make_prompt(o.seed ^ 0x5EED5EED5EED5EEDull, ~uint64_t{0}, o.shared_prefix, o.vocab);
}

std::string make_body(const bench_options& o, uint64_t index, const std::vector<int32_t>& prompt) {
  boost::json::array input;
  input.reserve(prompt.size());
  for (int32_t id : prompt) input.emplace_back(id);
  boost::json::object sampling;
  sampling["max_new_tokens"] = o.output_len;
  sampling["temperature"] = 0.0;
  sampling["top_p"] = 1.0;
  sampling["top_k"] = -1;
  sampling["seed"] = o.seed + index;
  sampling["ignore_eos"] = true;
  boost::json::object body;
  body["input_ids"] = std::move(input);
  body["sampling_params"] = std::move(sampling);
  body["stream"] = o.stream;
  if (o.stream && !o.cumulative) body["stream_options"] = boost::json::object{{"incremental", true}};
  return boost::json::serialize(body);
}

struct shared_run {
  shared_run(const bench_options& o, const tcp::resolver::results_type& eps, const client_config& cfg,
             std::vector<request_result>& r, progress& p)
      : options(o), endpoints(eps), config(cfg), results(r), bar(p) {}

  const bench_options& options;
  const tcp::resolver::results_type& endpoints;
  const client_config& config;
  std::vector<request_result>& results;
  progress& bar;
  std::atomic<size_t> next{0};
  std::mutex mutex;         // guards first_error and fatal
  std::string first_error;  // of the first request to fail, in time order
  std::exception_ptr fatal;
};

net::awaitable<void> worker(shared_run& run) {
  connection conn(co_await net::this_coro::executor, run.endpoints, run.config);
  const std::function<void(int64_t)> on_tokens = [&run](int64_t n) { run.bar.add_tokens(n); };
  for (;;) {
    const bench_options& o = run.options;
    const size_t c = run.next.fetch_add(1);  // a conversation: `turns` requests, one after another
    if (c >= static_cast<size_t>(o.requests)) break;
    std::vector<int32_t> history = shared_prefix(o);
    for (int32_t t = 0; t < o.turns; ++t) {
      const size_t i = c * static_cast<size_t>(o.turns) + static_cast<size_t>(t);
      const std::vector<int32_t> mine = make_prompt(o.seed, i, o.prompt_len, o.vocab);
      history.insert(history.end(), mine.begin(), mine.end());
      request_result r = co_await conn.generate(make_body(o, i, history), o.stream,
                                                static_cast<int64_t>(history.size()), on_tokens);
      const bool ok = r.ok;
      if (!ok) {
        std::lock_guard lock(run.mutex);
        if (run.first_error.empty()) run.first_error = "request " + std::to_string(i) + ": " + r.error;
      }
      run.bar.request_done(ok);
      history.insert(history.end(), r.output_ids.begin(), r.output_ids.end());
      run.results[i] = std::move(r);
      if (!ok) {  // the conversation cannot go on: its later turns count as failed
        for (int32_t u = t + 1; u < o.turns; ++u) {
          run.results[c * static_cast<size_t>(o.turns) + static_cast<size_t>(u)].error = "an earlier turn failed";
          run.bar.request_done(false);
        }
        break;
      }
    }
  }
  conn.close();
}

int run_bench(const bench_options& o) {
  std::signal(SIGPIPE, SIG_IGN);

  net::io_context setup;
  tcp::resolver resolver(setup);
  boost::system::error_code ec;
  const tcp::resolver::results_type endpoints = resolver.resolve(o.url.host, o.url.port, ec);
  if (ec) {
    std::fprintf(stderr, "hyserve-bench: error: cannot resolve '%s': %s\n", o.url.host.c_str(), ec.message().c_str());
    return 1;
  }
  client_config config;
  config.host_header = o.url.host_header();
  config.base_path = o.url.base_path;
  config.api_key = o.api_key;
  config.timeout_s = o.timeout_s;

  // Reachability check: connect, then GET /health on the same connection.
  std::string unreachable;
  plain_response health;
  net::co_spawn(
      setup,
      [&]() -> net::awaitable<void> {
        connection conn(co_await net::this_coro::executor, endpoints, config);
        unreachable = co_await conn.connect();
        if (!unreachable.empty()) co_return;
        health = co_await conn.get("/health");
        if (!health.error.empty()) unreachable = "connected, but GET /health failed: " + health.error;
        conn.close();
      },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  setup.run();
  if (!unreachable.empty()) {
    std::fprintf(stderr, "hyserve-bench: error: server at %s is unreachable: %s\n", o.url.text.c_str(),
                 unreachable.c_str());
    return 1;
  }
  if (health.status != 200) {
    std::string text = health.body.substr(0, 200);
    std::replace(text.begin(), text.end(), '\n', ' ');
    std::fprintf(stderr, "hyserve-bench: warning: GET /health returned HTTP %u (%s); running anyway\n", health.status,
                 text.c_str());
  }

  std::vector<request_result> results(static_cast<size_t>(o.requests) * static_cast<size_t>(o.turns));

  const int workers = std::min(o.concurrency, o.requests);
  const int threads =
      std::min(workers, static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u)));
  net::io_context pool(threads);
  progress bar(static_cast<int64_t>(results.size()), ::isatty(STDERR_FILENO) == 1);
  shared_run run(o, endpoints, config, results, bar);

  bar.start();
  const bench_clock::time_point start = bench_clock::now();
  for (int w = 0; w < workers; ++w) {
    net::co_spawn(net::make_strand(pool), worker(run), [&run](std::exception_ptr e) {
      if (!e) return;
      std::lock_guard lock(run.mutex);
      if (!run.fatal) run.fatal = e;
    });
  }
  std::vector<std::thread> extra;
  for (int t = 1; t < threads; ++t) extra.emplace_back([&pool] { pool.run(); });
  pool.run();
  for (std::thread& t : extra) t.join();
  const double wall_s = std::chrono::duration<double>(bench_clock::now() - start).count();
  bar.finish();
  if (run.fatal) std::rethrow_exception(run.fatal);

  const summary s = make_summary(o, results, run.first_error, wall_s);
  if (o.json) {
    std::printf("%s\n", boost::json::serialize(to_json(s)).c_str());
  } else {
    print_text(stdout, s);
  }
  std::fflush(stdout);
  if (s.ok == 0) {
    std::fprintf(stderr, "hyserve-bench: error: every request failed (first error: %s)\n", s.first_error.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bench_options options;
  try {
    options = parse_args(argc, argv);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "hyserve-bench: error: %s\nrun 'hyserve-bench --help' for the list of flags\n", e.what());
    return 2;
  }
  if (options.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  try {
    return run_bench(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hyserve-bench: error: %s\n", e.what());
    return 1;
  }
}
