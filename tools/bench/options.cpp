#include "options.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <string_view>
#include <system_error>

namespace hyserve::bench {

const char* const kUsage =
    "usage: hyserve-bench [--url http://127.0.0.1:8000] [--concurrency 8] [--requests 64]\n"
    "                     [--prompt-len 128] [--output-len 64] [--vocab 1024] [--seed 0]\n"
    "                     [--stream | --no-stream] [--cumulative] [--api-key KEY] [--timeout 120] [--json]\n"
    "                     [--shared-prefix N] [--turns T]\n"
    "\n"
    "Sends --requests POST /generate requests with random prompts (token ids in [3, vocab),\n"
    "deterministic from --seed), greedy sampling and ignore_eos, keeping --concurrency of them\n"
    "in flight, then prints throughput and latency percentiles (TTFT and inter-token latency\n"
    "need --stream, the default).\n"
    "\n"
    "  --url URL          server base URL (http only)\n"
    "  --concurrency N    requests in flight at once (>= 1)\n"
    "  --requests N       total requests (>= 1)\n"
    "  --prompt-len N     prompt tokens per request (>= 1)\n"
    "  --output-len N     generated tokens per request (>= 1)\n"
    "  --vocab N          prompt ids are drawn from [3, N) (N >= 4)\n"
    "  --seed N           prompt seed (unsigned 64-bit)\n"
    "  --shared-prefix N  every prompt starts with the same N tokens (a system prompt; >= 0)\n"
    "  --turns T          multi-turn: --requests conversations of T turns, each turn resending\n"
    "                     the conversation so far plus --prompt-len new tokens (>= 1)\n"
    "  --stream           stream tokens over SSE (default)\n"
    "  --no-stream        one JSON response per request (end-to-end latency only)\n"
    "  --cumulative       streamed chunks carry the whole output so far (SGLang's format) instead\n"
    "                     of only their new tokens (stream_options.incremental, the default)\n"
    "  --api-key KEY      send Authorization: Bearer KEY\n"
    "  --timeout S        seconds allowed for each connect, write and read (> 0)\n"
    "  --json             print the summary as one JSON object\n"
    "  -h, --help         this text\n"
    "\n"
    "Exit status: 0 when at least one request succeeded, 1 when the server cannot be reached\n"
    "or every request failed, 2 for bad flags.\n";

namespace {

int64_t parse_integer(std::string_view flag, std::string_view v, int64_t lo, int64_t hi) {
  int64_t x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || ec == std::errc::invalid_argument || end != v.data() + v.size()) {
    throw usage_error(std::string(flag) + ": expected an integer, got '" + std::string(v) + "'");
  }
  if (ec == std::errc::result_out_of_range || x < lo || x > hi) {
    throw usage_error(std::string(flag) + ": must be in " + std::to_string(lo) + ".." + std::to_string(hi) +
                      ", got " + std::string(v));
  }
  return x;
}

uint64_t parse_unsigned(std::string_view flag, std::string_view v) {
  uint64_t x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size()) {
    throw usage_error(std::string(flag) + ": expected an unsigned 64-bit integer, got '" + std::string(v) + "'");
  }
  return x;
}

double parse_seconds(std::string_view flag, const std::string& v) {
  double x = 0.0;
  size_t used = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (v.empty() || used != v.size()) throw usage_error(std::string(flag) + ": expected a number, got '" + v + "'");
  if (!std::isfinite(x) || x <= 0.0 || x > 86400.0 * 365) {
    throw usage_error(std::string(flag) + ": must be a positive number of seconds, got " + v);
  }
  return x;
}

}  // namespace

std::string server_url::host_header() const {
  const bool v6 = host.find(':') != std::string::npos;
  std::string h = v6 ? "[" + host + "]" : host;
  if (port != "80") h += ":" + port;
  return h;
}

server_url parse_url(const std::string& text) {
  constexpr std::string_view kScheme = "http://";
  const std::string_view t = text;
  if (t.starts_with("https://")) throw usage_error("--url: https is not supported, use http://");
  if (!t.starts_with(kScheme)) throw usage_error("--url: expected http://HOST[:PORT][/PATH], got '" + text + "'");
  std::string_view rest = t.substr(kScheme.size());
  server_url u;
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash);
  if (path.find_first_of("?#") != std::string_view::npos) {
    throw usage_error("--url: a query or fragment is not allowed, got '" + text + "'");
  }
  while (path.ends_with('/')) path.remove_suffix(1);
  u.base_path = std::string(path);
  if (authority.find('@') != std::string_view::npos) {
    throw usage_error("--url: credentials in the URL are not supported (use --api-key)");
  }
  std::string_view port;
  if (authority.starts_with('[')) {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) throw usage_error("--url: unterminated IPv6 literal in '" + text + "'");
    u.host = std::string(authority.substr(1, close - 1));
    const std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (!after.starts_with(':')) throw usage_error("--url: unexpected text after the IPv6 literal in '" + text + "'");
      port = after.substr(1);
      if (port.empty()) throw usage_error("--url: empty port in '" + text + "'");
    }
  } else {
    const size_t colon = authority.rfind(':');
    u.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port = authority.substr(colon + 1);
      if (port.empty()) throw usage_error("--url: empty port in '" + text + "'");
    }
  }
  if (u.host.empty()) throw usage_error("--url: missing host in '" + text + "'");
  if (!port.empty()) u.port = std::to_string(parse_integer("--url port", port, 1, 65535));
  u.text = "http://" + u.host_header() + u.base_path;
  return u;
}

bench_options parse_args(int argc, char** argv) {
  bench_options o;
  o.url = parse_url("http://127.0.0.1:8000");
  constexpr int64_t kMaxCount = std::numeric_limits<int32_t>::max();
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::optional<std::string> inline_value;
    if (arg.starts_with("--")) {
      const size_t eq = arg.find('=');
      if (eq != std::string_view::npos) {
        inline_value = std::string(arg.substr(eq + 1));
        arg = arg.substr(0, eq);
      }
    }
    const std::string flag(arg);
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) throw usage_error(flag + ": missing value");
      return argv[++i];
    };
    auto no_value = [&] {
      if (inline_value) throw usage_error(flag + ": takes no value");
    };
    if (arg == "-h" || arg == "--help") {
      no_value();
      o.help = true;
    } else if (arg == "--url") {
      o.url = parse_url(value());
    } else if (arg == "--concurrency") {
      o.concurrency = static_cast<int32_t>(parse_integer(flag, value(), 1, 1 << 16));
    } else if (arg == "--requests") {
      o.requests = static_cast<int32_t>(parse_integer(flag, value(), 1, kMaxCount));
    } else if (arg == "--prompt-len") {
      o.prompt_len = static_cast<int32_t>(parse_integer(flag, value(), 1, kMaxCount));
    } else if (arg == "--output-len") {
      o.output_len = static_cast<int32_t>(parse_integer(flag, value(), 1, kMaxCount));
    } else if (arg == "--vocab") {
      o.vocab = static_cast<int32_t>(parse_integer(flag, value(), 4, kMaxCount));
    } else if (arg == "--shared-prefix") {
      o.shared_prefix = static_cast<int32_t>(parse_integer(flag, value(), 0, kMaxCount));
    } else if (arg == "--turns") {
      o.turns = static_cast<int32_t>(parse_integer(flag, value(), 1, kMaxCount));
    } else if (arg == "--seed") {
      o.seed = parse_unsigned(flag, value());
    } else if (arg == "--stream") {
      no_value();
      o.stream = true;
    } else if (arg == "--no-stream") {
      no_value();
      o.stream = false;
    } else if (arg == "--cumulative") {
      no_value();
      o.cumulative = true;
    } else if (arg == "--api-key") {
      o.api_key = value();
      if (o.api_key->empty()) throw usage_error("--api-key: must not be empty");
    } else if (arg == "--timeout") {
      o.timeout_s = parse_seconds(flag, value());
    } else if (arg == "--json") {
      no_value();
      o.json = true;
    } else {
      throw usage_error("unknown argument '" + std::string(argv[i]) + "'");
    }
  }
  return o;
}

}  // namespace hyserve::bench
