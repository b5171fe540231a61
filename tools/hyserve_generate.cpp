// hyserve-generate: offline greedy generation in a single process: the service's scheduler and
// plan runner (coordinator/local_service.h) on the config's device, without MPI or HTTP; with
// --logits the single-process engine on the CPU (it returns the logits of every position).
//   hyserve-generate --model DIR | --config FILE (--input-ids 1,2,3 | --text "...")
//                    --max-new-tokens N [--tokenizer PATH] [--prefill-chunk N] [--json] [--logits]
// Prints the output ids, or with --text the generated text. With --json prints
// {"output_ids": [...]} (plus "text" with --text, and with --logits a "logits" array with one
// row per position of prompt + output; row t = logits after consuming token t).
// --text needs a tokenizer: --tokenizer PATH (tokenizer.json or its directory), else the
// config's model.tokenizer, else the model directory's tokenizer.json.
#include <boost/json.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hyserve/common/config.h"
#include "hyserve/common/error.h"
#include "coordinator/local_service.h"
#include "hyserve/worker/engine.h"
#include "hyserve/tokenizer/bpe_tokenizer.h"

namespace {

constexpr const char* kUsage =
    "usage: hyserve-generate (--model DIR | --config FILE) (--input-ids 1,2,3 | --text TEXT)\n"
    "                        --max-new-tokens N [--tokenizer PATH] [--prefill-chunk N] [--json] [--logits]\n";

struct options {
  std::string model_dir, config_file;
  std::vector<int32_t> input_ids;
  std::optional<std::string> text;
  std::string tokenizer;
  int32_t max_new_tokens = 16;
  int32_t prefill_chunk = 0;
  bool json = false, logits = false;
};

int32_t parse_int(std::string_view flag, const std::string& v) {
  try {
    size_t used = 0;
    const long long x = std::stoll(v, &used);
    if (used != v.size() || x < INT32_MIN || x > INT32_MAX) throw std::invalid_argument(v);
    return static_cast<int32_t>(x);
  } catch (const std::exception&) {
    throw hyserve::invalid_argument_error(std::string(flag) + ": expected an integer, got '" + v + "'");
  }
}

options parse_args(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw hyserve::invalid_argument_error(std::string(a) + ": missing value");
      return argv[++i];
    };
    if (a == "--model") {
      o.model_dir = value();
    } else if (a == "--config") {
      o.config_file = value();
    } else if (a == "--input-ids") {
      const std::string list = value();
      size_t at = 0;
      while (at <= list.size()) {
        const size_t comma = std::min(list.find(',', at), list.size());
        o.input_ids.push_back(parse_int("--input-ids", list.substr(at, comma - at)));
        at = comma + 1;
      }
    } else if (a == "--text") {
      o.text = value();
    } else if (a == "--tokenizer") {
      o.tokenizer = value();
    } else if (a == "--max-new-tokens") {
      o.max_new_tokens = parse_int(a, value());
      if (o.max_new_tokens < 0) throw hyserve::invalid_argument_error("--max-new-tokens: must be >= 0");
    } else if (a == "--prefill-chunk") {
      o.prefill_chunk = parse_int(a, value());
      if (o.prefill_chunk < 0) throw hyserve::invalid_argument_error("--prefill-chunk: must be >= 0");
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--logits") {
      o.logits = true;
    } else if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else {
      throw hyserve::invalid_argument_error("unknown argument '" + std::string(a) + "'");
    }
  }
  if (o.model_dir.empty() == o.config_file.empty())
    throw hyserve::invalid_argument_error("give exactly one of --model DIR or --config FILE");
  if (o.text && !o.input_ids.empty()) throw hyserve::invalid_argument_error("give one of --input-ids and --text");
  if (!o.text && o.input_ids.empty()) throw hyserve::invalid_argument_error("--input-ids or --text: required, non-empty");
  if (o.text && o.text->empty()) throw hyserve::invalid_argument_error("--text: must not be empty");
  return o;
}

// tokenizer.json for --text: --tokenizer (a file or a directory), the config's model.tokenizer,
// or <model dir>/tokenizer.json.
std::string tokenizer_path(const options& o, const hyserve::service_config& cfg) {
  namespace fs = std::filesystem;
  std::string p = o.tokenizer;
  if (p.empty()) p = cfg.model.tokenizer;
  if (p.empty() && !cfg.model.path.empty()) p = (fs::path(cfg.model.path) / "tokenizer.json").string();
  if (p.empty() || !fs::exists(p))
    throw hyserve::invalid_argument_error("--text needs a tokenizer: give --tokenizer PATH" +
                                          (p.empty() ? std::string() : " (no " + p + ")"));
  if (fs::is_directory(p)) p = (fs::path(p) / "tokenizer.json").string();
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const options o = parse_args(argc, argv);
    hyserve::service_config cfg;
    if (!o.config_file.empty()) {
      cfg = hyserve::load_config_file(o.config_file);
    } else {
      cfg.model.path = o.model_dir;
    }
    std::vector<int32_t> input_ids = o.input_ids;
    std::optional<hyserve::tokenizer::bpe_tokenizer> tok;
    if (o.text) {
      tok = hyserve::tokenizer::bpe_tokenizer::from_file(tokenizer_path(o, cfg));
      input_ids = tok->encode(*o.text);
      if (input_ids.empty()) throw hyserve::invalid_argument_error("--text: encodes to no tokens");
    }
    const int64_t needed = static_cast<int64_t>(input_ids.size()) + o.max_new_tokens + 1;
    if (cfg.cache.max_context < needed) cfg.cache.max_context = static_cast<int32_t>(needed);
    cfg.cache.max_requests = 1;
    cfg.cache.num_pages = 0;
    cfg.parallel.tp = 1;
    cfg.parallel.dp = 1;
    std::vector<std::vector<float>> logits;
    std::vector<int32_t> out;
    if (o.logits) {
      hyserve::worker::engine eng(cfg);
      out = eng.generate_greedy(input_ids, o.max_new_tokens, o.prefill_chunk, &logits);
    } else {
      if (o.prefill_chunk > 0) cfg.scheduler.chunked_prefill = o.prefill_chunk;
      hyserve::coordinator::local_service svc(cfg);
      hyserve::coordinator::local_request req;
      req.prompt = input_ids;
      req.sampling.max_new_tokens = o.max_new_tokens;
      req.sampling.temperature = 0.0f;
      req.sampling.ignore_eos = true;  // exactly max_new_tokens, as the reference continuations
      req.sampling.seed = 0;
      const hyserve::coordinator::local_generation g = svc.run({req}).front();
      if (g.error) throw hyserve::error(*g.error);
      out = g.output;
    }
    std::optional<std::string> text;
    if (tok) text = tok->decode(out);
    if (o.json) {
      boost::json::object obj;
      obj["output_ids"] = boost::json::value_from(out);
      if (text) obj["text"] = *text;
      if (o.logits) obj["logits"] = boost::json::value_from(logits);
      std::cout << boost::json::serialize(obj) << "\n";
    } else if (text) {
      std::cout << *text << "\n";
    } else {
      for (size_t i = 0; i < out.size(); ++i) std::cout << (i ? " " : "") << out[i];
      std::cout << "\n";
    }
    return 0;
  } catch (const hyserve::error& e) {
    std::cerr << "hyserve-generate: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "hyserve-generate: internal error: " << e.what() << "\n";
    return 3;
  }
}
