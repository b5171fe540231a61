// hyserve-write-checkpoint CONFIG OUT_DIR [--dtype bfloat16|float32] [--max-shard-gb N]
// Writes the synthetic model of CONFIG (`model.synthetic`) as a Hugging Face checkpoint
// directory that `model: {path: OUT_DIR}` serves as the same model (checkpoint/writer.h).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "checkpoint/writer.h"
#include "hyserve/common/config.h"
#include "hyserve/common/error.h"

namespace {

constexpr const char* kUsage =
    "usage: hyserve-write-checkpoint CONFIG OUT_DIR [--dtype bfloat16|float32] [--max-shard-gb N]\n"
    "  Writes the synthetic model of CONFIG (model.synthetic) as config.json + safetensors in OUT_DIR.\n"
    "  --dtype         storage of linear weights, embedding and lm_head (default: the config's model.dtype)\n"
    "  --max-shard-gb  largest file before the checkpoint is sharded (default 5)\n";

int run(int argc, char** argv) {
  using namespace hyserve;
  if (argc < 3) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string config_path = argv[1], out_dir = argv[2];
  const service_config cfg = load_config_file(config_path);
  if (!cfg.model.synthetic)
    throw config_error(config_path + ": model.synthetic: missing (hyserve-write-checkpoint writes synthetic models)");
  tools::checkpoint_write_options opts;
  opts.type = cfg.model.weight_dtype == dtype::kBF16 ? dtype::kBF16 : dtype::kF32;
  opts.progress = true;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--dtype" || a == "--max-shard-gb") && i + 1 >= argc)
      throw invalid_argument_error(a + ": missing value");
    if (a == "--dtype") {
      opts.type = parse_dtype(argv[++i]);
    } else if (a == "--max-shard-gb") {
      const std::string v = argv[++i];
      char* end = nullptr;
      const double gb = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !(gb > 0))
        throw invalid_argument_error("--max-shard-gb: expected a positive number, got '" + v + "'");
      opts.max_shard_bytes = static_cast<uint64_t>(gb * 1e9);
    } else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      throw invalid_argument_error("unknown argument '" + a + "'\n" + kUsage);
    }
  }
  const auto start = std::chrono::steady_clock::now();
  const tools::checkpoint_write_result r = tools::write_synthetic_checkpoint(*cfg.model.synthetic, out_dir, opts);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("wrote %s: %lld tensors, %.2f GB in %d file%s, %.1f s\n", out_dir.c_str(),
              static_cast<long long>(r.tensors), r.bytes * 1e-9, r.files, r.files == 1 ? "" : "s", s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hyserve-write-checkpoint: %s\n", e.what());
    return 1;
  }
}
