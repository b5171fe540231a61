// Single-threaded tokenizer throughput on a deterministic mixed text (ASCII words with
// punctuation and numbers, code-like indentation, some accented, CJK and emoji text).
//   hyserve-bench-tokenizer [--verbose] [tokenizer.json] [megabytes]
// Defaults: the test fixture tokenizer and 10 MB. --verbose prints every timed run.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "hyserve/tokenizer/bpe_tokenizer.h"
#include "hyserve/tokenizer/incremental_detokenizer.h"

namespace {

using hyserve::tokenizer::bpe_tokenizer;

std::string make_text(size_t bytes, uint64_t seed) {
  static constexpr std::array<std::string_view, 40> kWords = {
      "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be",
      "by", "this", "are", "from", "at", "or", "model", "token", "layer", "state", "return", "self",
      "value", "forward", "hybrid", "attention", "sequence", "memory", "request", "server",
      "cache", "kernel", "batch", "decode", "prefill", "scheduler"};
  static constexpr std::array<std::string_view, 12> kPunct = {",", ".", ";", ":", "!", "?", "(", ")", "\"", "'s", "-", "..."};
  static constexpr std::array<std::string_view, 10> kMulti = {
      "héllo", "wörld", "café", "naïve", "中文", "日本語", "привет", "—", "🙂", "🚀"};
  std::mt19937_64 rng(seed);
  std::string text;
  text.reserve(bytes + 64);
  while (text.size() < bytes) {
    const unsigned r = unsigned(rng() % 100);
    if (r < 62) {
      std::string_view w = kWords[rng() % kWords.size()];
      if (rng() % 10 == 0) {
        text += ' ';
        text += char(w[0] - 'a' + 'A');
        text.append(w.substr(1));
      } else {
        text += ' ';
        text.append(w);
      }
    } else if (r < 72) {
      // A random lowercase word: rarer words exercise the merge loop, not only the cache.
      text += ' ';
      const int len = 2 + int(rng() % 9);
      for (int i = 0; i < len; ++i) text += char('a' + rng() % 26);
    } else if (r < 82) {
      text.append(kPunct[rng() % kPunct.size()]);
    } else if (r < 88) {
      text += ' ';
      text += std::to_string(rng() % 1000000);
      if (rng() % 3 == 0) text += "." + std::to_string(rng() % 1000);
    } else if (r < 93) {
      text += ' ';
      text.append(kMulti[rng() % kMulti.size()]);
    } else if (r < 97) {
      text += '\n';
      text.append(size_t(rng() % 3) * 4, ' ');
    } else {
      text += "  ";
    }
  }
  return text;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU time of this thread: on a shared machine it counts only the time the encoder ran.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  bool verbose = false;
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--verbose") verbose = true;
    else args.emplace_back(argv[i]);
  }
  const std::string path =
      !args.empty() ? args[0] : std::string(HYSERVE_SOURCE_DIR) + "/tests/fixtures/tokenizer-bpe512/tokenizer.json";
  const double megabytes = args.size() > 1 ? std::atof(args[1].c_str()) : 10.0;
  try {
    auto t0 = std::chrono::steady_clock::now();
    const bpe_tokenizer tok = bpe_tokenizer::from_file(path);
    std::printf("load: %.1f ms (%s, vocab %d)\n", seconds_since(t0) * 1e3, path.c_str(), tok.vocab_size());

    const std::string text = make_text(size_t(megabytes * 1e6), 20240601);
    const double mb = double(text.size()) / 1e6;

    // Fault the output buffer in first: the first run should measure the empty word cache,
    // not the kernel handing out 25 MB of pages.
    std::vector<int32_t> ids(text.size());
    constexpr int kRuns = 4;
    double first = 0, best = 1e30, first_cpu = 0, best_cpu = 1e30;
    for (int run = 0; run < kRuns; ++run) {
      ids.clear();
      t0 = std::chrono::steady_clock::now();
      const double c0 = thread_cpu_seconds();
      tok.encode_into(text, ids);
      const double s = seconds_since(t0), c = thread_cpu_seconds() - c0;
      if (run == 0) first = s, first_cpu = c;
      if (verbose) std::printf("  run %d: %.3f s wall, %.3f s cpu\n", run, s, c);
      best = std::min(best, s);
      best_cpu = std::min(best_cpu, c);
    }
    std::printf("encode: %.2f MB, %zu tokens (%.2f bytes/token)\n", mb, ids.size(), double(text.size()) / ids.size());
    std::printf("encode: first run (cold word cache) %.1f MB/s wall, %.1f MB/s cpu\n", mb / first, mb / first_cpu);
    std::printf("encode: best of %d %.1f MB/s wall, %.1f MB/s cpu (%.2f Mtokens/s cpu)\n", kRuns, mb / best,
                mb / best_cpu, double(ids.size()) / best_cpu / 1e6);

    t0 = std::chrono::steady_clock::now();
    const std::string back = tok.decode(ids);
    const double dec = seconds_since(t0);
    std::printf("decode: %.1f MB/s, round trip %s\n", mb / dec, back == text ? "exact" : "MISMATCH");

    t0 = std::chrono::steady_clock::now();
    hyserve::tokenizer::incremental_detokenizer detok(tok);
    std::string streamed;
    for (const int32_t id : ids) detok.push(id, streamed);
    streamed += detok.finish();
    const double inc = seconds_since(t0);
    std::printf("incremental decode: %.1f Mtokens/s, %s\n", double(ids.size()) / inc / 1e6,
                streamed == text ? "exact" : "MISMATCH");
    return back == text && streamed == text ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
