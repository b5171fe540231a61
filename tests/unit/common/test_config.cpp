#include <gtest/gtest.h>
#include <unistd.h>

#include <cfloat>
#include <climits>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common_test_support.h"
#include "hyserve/common/config.h"
#include "hyserve/common/error.h"

namespace hyserve {
namespace {

constexpr const char* kFullConfig = R"(
model:
  path: /some/checkpoint
  dtype: bfloat16
device: cuda
parallel: {tp: 2, dp: 3}
cache:
  page_size: 32
  max_requests: 8
  max_context: 2048
  num_pages: 100
  gpu_memory_fraction: 0.5
scheduler: {max_batch_tokens: 1024, max_running: 16, chunked_prefill: 256, max_queue: 10, overlap: false}
sparsity: {algorithm: quest, page_budget: 16, sink_pages: 2, recent_pages: 4, min_seq_len: 512}
speculative: {algorithm: ngram, num_draft_tokens: 3}
server: {host: 0.0.0.0, port: 9000, api_key: secret, max_body_bytes: 65536, threads: 4, drain_timeout_s: 2.5,
         strict_fields: true}
worker: {step_timeout_s: 5, startup_timeout_s: 30.5, fault_grace_s: 0.5, fail_at_step: 7, fail_rank: 1, fault: hang}
)";

TEST(Config, FullConfigParses) {
  const service_config c = load_config_string(kFullConfig);
  EXPECT_EQ(c.source, "<string>");
  EXPECT_EQ(c.model.path, "/some/checkpoint");  // not resolved for strings
  EXPECT_FALSE(c.model.synthetic.has_value());
  EXPECT_EQ(c.model.weight_dtype, dtype::kBF16);
  EXPECT_EQ(c.device, device_kind::kCuda);
  EXPECT_EQ(c.parallel.tp, 2);
  EXPECT_EQ(c.parallel.dp, 3);
  EXPECT_EQ(c.cache.page_size, 32);
  EXPECT_EQ(c.cache.max_requests, 8);
  EXPECT_EQ(c.cache.max_context, 2048);
  EXPECT_EQ(c.cache.num_pages, 100);
  EXPECT_DOUBLE_EQ(c.cache.gpu_memory_fraction, 0.5);
  EXPECT_EQ(c.scheduler.max_batch_tokens, 1024);
  EXPECT_EQ(c.scheduler.max_running, 16);
  EXPECT_EQ(c.scheduler.chunked_prefill, 256);
  EXPECT_EQ(c.scheduler.max_queue, 10);
  EXPECT_FALSE(c.scheduler.overlap);
  EXPECT_EQ(c.sparsity.algorithm, sparsity_algorithm::kQuest);
  EXPECT_EQ(c.sparsity.page_budget, 16);
  EXPECT_EQ(c.sparsity.sink_pages, 2);
  EXPECT_EQ(c.sparsity.recent_pages, 4);
  EXPECT_EQ(c.sparsity.min_seq_len, 512);
  EXPECT_EQ(c.speculative.algorithm, speculative_algorithm::kNgram);
  EXPECT_EQ(c.speculative.num_draft_tokens, 3);
  EXPECT_EQ(c.server.host, "0.0.0.0");
  EXPECT_EQ(c.server.port, 9000);
  EXPECT_EQ(c.server.api_key, "secret");
  EXPECT_EQ(c.server.max_body_bytes, 65536);
  EXPECT_EQ(c.server.threads, 4);
  EXPECT_DOUBLE_EQ(c.server.drain_timeout_s, 2.5);
  EXPECT_DOUBLE_EQ(c.worker.step_timeout_s, 5.0);
  EXPECT_DOUBLE_EQ(c.worker.startup_timeout_s, 30.5);
  EXPECT_DOUBLE_EQ(c.worker.fault_grace_s, 0.5);
  EXPECT_EQ(c.worker.fail_at_step, 7);
  EXPECT_EQ(c.worker.fail_rank, 1);
  EXPECT_EQ(c.worker.fault, worker_fault::kHang);
  EXPECT_TRUE(c.server.strict_fields);
}

TEST(Config, MissingKeysTakeDefaults) {
  const service_config c = load_config_string("model: {path: /ckpt}\nsparsity:\n");
  const service_config d;  // config.h defaults
  EXPECT_EQ(c.model.weight_dtype, dtype::kF32);
  EXPECT_EQ(c.device, device_kind::kCpu);
  EXPECT_EQ(c.parallel.tp, d.parallel.tp);
  EXPECT_EQ(c.parallel.dp, d.parallel.dp);
  EXPECT_EQ(c.cache.page_size, d.cache.page_size);
  EXPECT_EQ(c.cache.max_requests, d.cache.max_requests);
  EXPECT_EQ(c.cache.max_context, d.cache.max_context);
  EXPECT_EQ(c.cache.num_pages, d.cache.num_pages);
  EXPECT_EQ(c.cache.gpu_memory_fraction, d.cache.gpu_memory_fraction);
  EXPECT_EQ(c.cache.kv_dtype, dtype::kF32);
  EXPECT_EQ(c.cache.ssm_state_dtype, dtype::kF32);
  EXPECT_EQ(c.scheduler.max_batch_tokens, d.scheduler.max_batch_tokens);
  EXPECT_EQ(c.scheduler.max_running, d.scheduler.max_running);
  EXPECT_EQ(c.scheduler.chunked_prefill, d.scheduler.chunked_prefill);
  EXPECT_EQ(c.scheduler.max_queue, d.scheduler.max_queue);
  EXPECT_TRUE(d.scheduler.overlap);
  EXPECT_EQ(c.sparsity.algorithm, sparsity_algorithm::kNone);
  EXPECT_EQ(c.sparsity.page_budget, d.sparsity.page_budget);
  EXPECT_EQ(c.speculative.algorithm, speculative_algorithm::kNone);
  EXPECT_EQ(c.speculative.num_draft_tokens, d.speculative.num_draft_tokens);
  EXPECT_EQ(c.server.host, "127.0.0.1");
  EXPECT_EQ(c.server.port, 8000);
  EXPECT_EQ(c.server.api_key, "");
  EXPECT_EQ(c.server.max_body_bytes, d.server.max_body_bytes);
  EXPECT_EQ(c.server.threads, d.server.threads);
  EXPECT_EQ(c.server.drain_timeout_s, d.server.drain_timeout_s);
  EXPECT_EQ(c.worker.step_timeout_s, d.worker.step_timeout_s);
  EXPECT_EQ(c.worker.startup_timeout_s, d.worker.startup_timeout_s);
  EXPECT_EQ(c.worker.fail_at_step, -1);
  EXPECT_EQ(c.worker.fail_rank, 0);
  EXPECT_EQ(c.worker.fault, worker_fault::kThrow);
  EXPECT_FALSE(c.server.strict_fields);
}

TEST(Config, PrefixCacheSection) {
  const std::string model = "model: {path: /ckpt}\n";
  // On by default: 64 checkpoint slots, an interval of the SSM kernels' chunk.
  const service_config dflt = load_config_string(model);
  EXPECT_TRUE(dflt.cache.prefix.enabled);
  EXPECT_EQ(dflt.cache.checkpoint_slots(), 64);
  EXPECT_EQ(dflt.cache.state_interval(), 256);
  const service_config off = load_config_string(model + "cache: {prefix: {enabled: false}}");
  EXPECT_FALSE(off.cache.prefix.enabled);
  EXPECT_EQ(off.cache.checkpoint_slots(), 0);
  const service_config on = load_config_string(
      model + "cache: {page_size: 32, prefix: {enabled: true, state_interval: 96, state_slots: 8}}");
  EXPECT_TRUE(on.cache.prefix.enabled);
  EXPECT_EQ(on.cache.checkpoint_slots(), 8);
  EXPECT_EQ(on.cache.state_interval(), 96);
  EXPECT_ERROR_WITH(load_config_string(model + "cache: {page_size: 32, prefix: {state_interval: 48}}"), config_error,
                    "cache.prefix.state_interval: must be a multiple of cache.page_size (32), got 48");
  EXPECT_ERROR_WITH(load_config_string(model + "cache: {prefix: {state_slots: 0}}"), config_error,
                    "cache.prefix.state_slots");
  EXPECT_ERROR_WITH(load_config_string(model + "cache: {prefix: {enabled: maybe}}"), config_error,
                    "cache.prefix.enabled");
}

TEST(Config, UnknownKeyInEverySectionNamesItsPath) {
  const std::string model = "model: {path: /ckpt}\n";
  EXPECT_ERROR_WITH(load_config_string(model + "cache: {pag_size: 16}"), config_error,
                    "cache.pag_size: unknown key (known: page_size, max_requests, max_context, num_pages, "
                    "gpu_memory_fraction, kv_dtype, ssm_state_dtype, prefix)");
  EXPECT_ERROR_WITH(load_config_string(model + "cache: {prefix: {slots: 4}}"), config_error,
                    "cache.prefix.slots: unknown key (known: enabled, state_interval, state_slots)");
  EXPECT_ERROR_WITH(load_config_string(model + "caches: {}"), config_error, "caches: unknown key (known: model,");
  EXPECT_ERROR_WITH(load_config_string("model: {path: /ckpt, dtyp: float32}"), config_error,
                    "model.dtyp: unknown key (known: path, synthetic, dtype, tokenizer, gdn_prefill)");
  EXPECT_ERROR_WITH(load_config_string("model: {synthetic: {hidden: 64}}"), config_error,
                    "model.synthetic.hidden: unknown key (known: arch, vocab_size,");
  EXPECT_ERROR_WITH(load_config_string(model + "parallel: {pp: 2}"), config_error,
                    "parallel.pp: unknown key (known: tp, dp, device_collective)");
  EXPECT_ERROR_WITH(load_config_string(model + "parallel: {device_collective: gloo}"), config_error,
                    "parallel.device_collective: unknown collective 'gloo' (known: nccl, host)");
  EXPECT_EQ(load_config_string(model + "parallel: {device_collective: host}").parallel.device_collective,
            device_collective_kind::kHost);
  EXPECT_EQ(load_config_string(model).parallel.device_collective, device_collective_kind::kNccl);
  EXPECT_ERROR_WITH(load_config_string(model + "scheduler: {max_batch: 1}"), config_error,
                    "scheduler.max_batch: unknown key (known: max_batch_tokens, max_running, chunked_prefill, "
                    "max_queue, overlap, overlap_steps, step_trace)");
  EXPECT_ERROR_WITH(load_config_string(model + "sparsity: {budget: 1}"), config_error,
                    "sparsity.budget: unknown key (known: algorithm, page_budget, sink_pages, recent_pages, "
                    "min_seq_len)");
  EXPECT_ERROR_WITH(load_config_string(model + "speculative: {draft_tokens: 1}"), config_error,
                    "speculative.draft_tokens: unknown key (known: algorithm, num_draft_tokens, ngram, draft_model, "
                    "min_accept_rate, cost_check, max_batch)");
  EXPECT_ERROR_WITH(load_config_string(model + "server: {address: x}"), config_error,
                    "server.address: unknown key (known: host, port, api_key, max_body_bytes, threads, "
                    "drain_timeout_s, strict_fields)");
  EXPECT_ERROR_WITH(load_config_string(model + "worker: {timeout: 1}"), config_error,
                    "worker.timeout: unknown key (known: step_timeout_s, startup_timeout_s, fault_grace_s, fail_at_step, fail_rank, "
                    "fault)");
  EXPECT_ERROR_WITH(load_config_string(model + "worker: {fault: stall}"), config_error, "worker.fault");
  EXPECT_EQ(load_config_string(model + "worker: {fault: stop}").worker.fault, worker_fault::kStop);
  EXPECT_EQ(load_config_string(model + "worker: {fault: coordinator_stall}").worker.fault,
            worker_fault::kCoordinatorStall);
  EXPECT_EQ(load_config_string(model + "worker: {fault: throw}").worker.fault, worker_fault::kThrow);
}

TEST(Config, BadValuesNameThePathAndValue) {
  const std::string model = "model: {path: /ckpt}\n";
  EXPECT_ERROR_WITH(load_config_string(model + "cache: {page_size: 12}"), config_error,
                    "cache.page_size: must be a power of two, got 12");
  EXPECT_ERROR_WITH(load_config_string(model + "cache: {page_size: 0}"), config_error,
                    "cache.page_size: must be a power of two, got 0");
  EXPECT_ERROR_WITH(load_config_string(model + "parallel: {tp: 0}"), config_error, "parallel.tp: must be >= 1, got 0");
  EXPECT_ERROR_WITH(load_config_string(model + "parallel: {dp: -2}"), config_error,
                    "parallel.dp: must be >= 1, got -2");
  EXPECT_ERROR_WITH(load_config_string(model + "scheduler: {max_running: abc}"), config_error,
                    "scheduler.max_running: expected an integer, got 'abc'");
  EXPECT_ERROR_WITH(load_config_string(model + "scheduler: {max_queue: 1.5}"), config_error,
                    "scheduler.max_queue: expected an integer, got '1.5'");
  EXPECT_ERROR_WITH(load_config_string(model + "scheduler: {overlap: sometimes}"), config_error, "scheduler.overlap");
  EXPECT_EQ(load_config_string(model + "scheduler: {overlap_steps: 3}").scheduler.overlap_steps, 3);
  EXPECT_ERROR_WITH(load_config_string(model + "scheduler: {overlap_steps: 1}"), config_error,
                    "scheduler.overlap_steps: must be >= 2, got 1");
  EXPECT_ERROR_WITH(load_config_string(model + "scheduler: {overlap_steps: 5}"), config_error,
                    "scheduler.overlap_steps: must be in [2, 4], got 5");
  EXPECT_ERROR_WITH(load_config_string(model + "scheduler: {max_batch_tokens: [1, 2]}"), config_error,
                    "scheduler.max_batch_tokens: expected an integer, got a sequence");
  EXPECT_ERROR_WITH(load_config_string(model + "cache: {max_context: 99999999999}"), config_error,
                    "cache.max_context: integer out of range, got 99999999999");
  EXPECT_ERROR_WITH(load_config_string(model + "cache: {gpu_memory_fraction: 1.5}"), config_error,
                    "cache.gpu_memory_fraction: must be in (0, 1], got 1.5");
  EXPECT_ERROR_WITH(load_config_string(model + "cache: {gpu_memory_fraction: lots}"), config_error,
                    "cache.gpu_memory_fraction: expected a finite number, got 'lots'");
  EXPECT_ERROR_WITH(load_config_string(model + "sparsity: {algorithm: foo}"), config_error,
                    "sparsity.algorithm: unknown algorithm 'foo' (known: none, quest)");
  EXPECT_ERROR_WITH(load_config_string(model + "speculative: {algorithm: eagle}"), config_error,
                    "speculative.algorithm: unknown algorithm 'eagle' (known: none, ngram, draft_model)");
  EXPECT_ERROR_WITH(load_config_string(model + "speculative: {num_draft_tokens: 0}"), config_error,
                    "speculative.num_draft_tokens: must be >= 1, got 0");
  EXPECT_ERROR_WITH(load_config_string(model + "speculative: {max_batch: 0}"), config_error,
                    "speculative.max_batch: must be >= 1, got 0");
  EXPECT_EQ(load_config_string(model + "speculative: {algorithm: ngram, max_batch: 8}").cache.spec_step_rows, 8);
  EXPECT_ERROR_WITH(load_config_string(model + "device: tpu"), config_error,
                    "device: unknown device 'tpu' (known: cpu, cuda)");
  EXPECT_ERROR_WITH(load_config_string("model: {path: /ckpt, dtype: int8}"), config_error,
                    "model.dtype: unknown dtype 'int8' (known: float32, bfloat16, float16)");
  EXPECT_EQ(load_config_string(model + "server: {port: 0}").server.port, 0);  // ephemeral port
  EXPECT_ERROR_WITH(load_config_string(model + "server: {port: -1}"), config_error,
                    "server.port: must be in 0..65535, got -1");
  EXPECT_ERROR_WITH(load_config_string(model + "server: {port: 65536}"), config_error,
                    "server.port: must be in 0..65535, got 65536");
  EXPECT_ERROR_WITH(load_config_string(model + "server: {threads: 0}"), config_error,
                    "server.threads: must be >= 1, got 0");
  EXPECT_ERROR_WITH(load_config_string(model + "server: {max_body_bytes: 0}"), config_error,
                    "server.max_body_bytes: must be >= 1, got 0");
  EXPECT_ERROR_WITH(load_config_string(model + "server: {drain_timeout_s: -1}"), config_error,
                    "server.drain_timeout_s: must be >= 0, got -1");
  EXPECT_ERROR_WITH(load_config_string(model + "worker: {step_timeout_s: 0}"), config_error,
                    "worker.step_timeout_s: must be > 0, got 0");
  EXPECT_ERROR_WITH(load_config_string(model + "worker: {startup_timeout_s: .inf}"), config_error,
                    "worker.startup_timeout_s: expected a finite number, got '.inf'");
  EXPECT_ERROR_WITH(load_config_string(model + "worker: {fail_at_step: -2}"), config_error,
                    "worker.fail_at_step: must be >= -1, got -2");
  EXPECT_ERROR_WITH(load_config_string(model + "parallel: {tp: 2}\nworker: {fail_rank: 2}"), config_error,
                    "worker.fail_rank: must be < parallel.tp = 2, got 2");
  EXPECT_ERROR_WITH(load_config_string(model + "cache: 5"), config_error, "cache: expected a mapping, got '5'");
  EXPECT_ERROR_WITH(load_config_string("- 1\n- 2"), config_error, "expected a mapping of sections");
}

TEST(Config, SparsityBudgetMustCoverSinkAndRecentPages) {
  EXPECT_ERROR_WITH(load_config_string("model: {path: /ckpt}\n"
                                       "sparsity: {algorithm: quest, page_budget: 3, sink_pages: 1, recent_pages: 2}"),
                    config_error, "sparsity.page_budget: must be >= sink_pages + recent_pages + 1 = 4, got 3");
  const service_config c = load_config_string(
      "model: {path: /ckpt}\nsparsity: {algorithm: quest, page_budget: 4, sink_pages: 1, recent_pages: 2}");
  EXPECT_EQ(c.sparsity.page_budget, 4);
}

TEST(Config, ModelNeedsExactlyOneSource) {
  EXPECT_ERROR_WITH(load_config_string("model: {dtype: float32}"), config_error,
                    "model: exactly one of path or synthetic");
  EXPECT_ERROR_WITH(load_config_string("model: {path: /ckpt, synthetic: {}}"), config_error,
                    "model: exactly one of path or synthetic");
  EXPECT_ERROR_WITH(load_config_string("device: cpu"), config_error, "model: exactly one of path or synthetic");
  EXPECT_ERROR_WITH(load_config_string(""), config_error, "model: exactly one of path or synthetic");
  EXPECT_ERROR_WITH(load_config_string("model: {path: ''}"), config_error, "model.path: must not be empty");
}

TEST(Config, YamlSyntaxErrorNamesFileAndLine) {
  EXPECT_ERROR_WITH(load_config_string("model: {path: /ckpt}\ncache: {page_size: 16\n"), config_error,
                    "<string>:", "YAML syntax error");
  test::scratch_dir dir;
  const std::string p = dir.file("bad.yaml");
  test::write_file(p, "model:\n  path: /ckpt\n  dtype: [float32\nserver: {}\n");
  EXPECT_ERROR_WITH(load_config_file(p), config_error, p + ":", "YAML syntax error");
  try {
    load_config_file(p);
  } catch (const config_error& e) {
    const std::string what = e.what();
    const std::string line_part = what.substr(p.size() + 1);
    EXPECT_TRUE(line_part[0] >= '1' && line_part[0] <= '9') << what;  // "<file>:<line>:<column>: ..."
  }
}

TEST(Config, FileErrorsCarryFileAndLine) {
  test::scratch_dir dir;
  const std::string p = dir.file("service.yaml");
  test::write_file(p, "model:\n  synthetic: {}\ncache:\n  page_size: 12\n");
  EXPECT_ERROR_WITH(load_config_file(p), config_error, p + ":4: cache.page_size: must be a power of two, got 12");
  EXPECT_ERROR_WITH(load_config_file(dir.file("absent.yaml")), config_error, dir.file("absent.yaml"),
                    "cannot read config file");
}

TEST(Config, SyntheticModelDefaultsMatchBambaTiny) {
  const service_config c = load_config_string("model:\n  synthetic: {seed: 7}\n");
  ASSERT_TRUE(c.model.synthetic.has_value());
  EXPECT_TRUE(c.model.path.empty());
  EXPECT_EQ(c.model.synthetic->seed, 7u);
  const model_config& m = c.model.synthetic->arch;
  EXPECT_EQ(m.arch, model_arch::kBamba);
  EXPECT_EQ(m.vocab_size, 512);
  EXPECT_EQ(m.hidden_size, 64);
  EXPECT_EQ(m.num_layers, 4);
  EXPECT_EQ(m.layer_kinds[1], layer_kind::kAttention);
  EXPECT_EQ(m.num_layers_of(layer_kind::kAttention), 1);
  EXPECT_EQ(m.head_dim, 16);
  EXPECT_EQ(m.num_kv_heads, 2);
  EXPECT_EQ(m.mamba_d_head, 32);
  EXPECT_EQ(m.mamba_expand, 2);
  EXPECT_EQ(m.mamba_in_proj_dim(), 292);
  EXPECT_EQ(m.rotary_dim(), 8);
  EXPECT_EQ(m.eos_token_id, 2);
  EXPECT_EQ(m.bos_token_id, 1);
  EXPECT_EQ(m.pad_token_id, 0);
  EXPECT_EQ(m.time_step_max, FLT_MAX);
  EXPECT_NO_THROW(m.validate());
  const model_config r = resolve_model_config(c);
  EXPECT_EQ(r.hidden_size, 64);
}

TEST(Config, SyntheticModelWithSizes) {
  const service_config c = load_config_string(R"(
model:
  synthetic:
    arch: bamba
    vocab_size: 1000
    hidden_size: 128
    num_layers: 6
    attn_layer_indices: [2, 5]
    num_attention_heads: 8
    num_kv_heads: 4
    head_dim: 32
    intermediate_size: 256
    mamba_n_heads: 8
    mamba_d_head: 48
    mamba_d_state: 32
    mamba_n_groups: 2
    mamba_d_conv: 4
    mamba_chunk_size: 64
    partial_rotary_factor: 0.25
    rope_theta: 500000
    rms_norm_eps: 1.0e-6
    tie_word_embeddings: true
    seed: 18446744073709551615
  dtype: float16
)");
  const model_config& m = c.model.synthetic->arch;
  EXPECT_EQ(c.model.weight_dtype, dtype::kF16);
  EXPECT_EQ(c.model.synthetic->seed, UINT64_MAX);
  EXPECT_EQ(m.vocab_size, 1000);
  EXPECT_EQ(m.num_layers, 6);
  EXPECT_EQ(m.layer_kinds[2], layer_kind::kAttention);
  EXPECT_EQ(m.layer_kinds[5], layer_kind::kAttention);
  EXPECT_EQ(m.num_layers_of(layer_kind::kMamba2), 4);
  EXPECT_EQ(m.head_dim, 32);
  EXPECT_EQ(m.rotary_dim(), 8);
  EXPECT_EQ(m.mamba_expand, 3);  // 8 × 48 / 128
  EXPECT_EQ(m.mamba_n_groups, 2);
  EXPECT_EQ(m.mamba_chunk_size, 64);
  EXPECT_FLOAT_EQ(m.rope_theta, 500000.0f);
  EXPECT_FLOAT_EQ(m.rms_norm_eps, 1.0e-6f);
  EXPECT_TRUE(m.tie_word_embeddings);
}

TEST(Config, SyntheticModelErrors) {
  EXPECT_ERROR_WITH(load_config_string("model: {synthetic: {arch: llama}}"), config_error,
                    "model.synthetic.arch: unknown arch 'llama' (known: bamba)");
  EXPECT_ERROR_WITH(load_config_string("model: {synthetic: {mamba_d_head: 20}}"), config_error,
                    "model.synthetic: inconsistent dimensions", "80", "hidden_size = 64");
  EXPECT_ERROR_WITH(load_config_string("model: {synthetic: {num_kv_heads: 3}}"), config_error,
                    "model.synthetic: num_attention_heads", "num_kv_heads (3)");
  EXPECT_ERROR_WITH(load_config_string("model: {synthetic: {attn_layer_indices: [4]}}"), config_error,
                    "model.synthetic.attn_layer_indices: index out of range [0, 4), got 4");
  EXPECT_ERROR_WITH(load_config_string("model: {synthetic: {hidden_size: 0}}"), config_error,
                    "model.synthetic.hidden_size: must be >= 1, got 0");
  EXPECT_ERROR_WITH(load_config_string("model: {synthetic: {tie_word_embeddings: maybe}}"), config_error,
                    "model.synthetic.tie_word_embeddings: expected a boolean", "'maybe'");
  EXPECT_ERROR_WITH(load_config_string("model: {synthetic: {seed: -1}}"), config_error,
                    "model.synthetic.seed: expected a non-negative integer, got '-1'");
}

// Runs `fn` with the working directory set to `dir`, restoring it afterwards.
template <typename Fn>
void in_directory(const std::string& dir, Fn&& fn) {
  const auto saved = std::filesystem::current_path();
  std::filesystem::current_path(dir);
  try {
    fn();
  } catch (...) {
    std::filesystem::current_path(saved);
    throw;
  }
  std::filesystem::current_path(saved);
}

TEST(Config, RelativeModelPathResolvesAgainstConfigDirThenCwd) {
  test::scratch_dir dir;
  std::filesystem::create_directories(dir.file("ckpt_next_to_config"));
  const std::string p = dir.file("service.yaml");

  // Not under the current directory (the source root), so found next to the config file.
  test::write_file(p, "model: {path: ckpt_next_to_config}\n");
  in_directory(HYSERVE_SOURCE_DIR, [&] {
    const service_config c = load_config_file(p);
    EXPECT_EQ(c.source, p);
    EXPECT_EQ(c.model.path, dir.file("ckpt_next_to_config"));
  });

  // Found under the current directory first.
  test::write_file(p, "model: {path: tests/fixtures/bamba-tiny}\n");
  in_directory(HYSERVE_SOURCE_DIR, [&] {
    const service_config c = load_config_file(p);
    EXPECT_EQ(std::filesystem::path(c.model.path),
              (std::filesystem::path(HYSERVE_SOURCE_DIR) / "tests/fixtures/bamba-tiny").lexically_normal());
    const model_config m = resolve_model_config(c);
    EXPECT_EQ(m.hidden_size, 64);
    EXPECT_EQ(m.num_layers, 4);
  });

  // In both places: the one beside the config file wins.
  std::filesystem::create_directories(dir.file("tests/fixtures/bamba-tiny"));
  test::write_file(p, "model: {path: tests/fixtures/bamba-tiny}\n");
  in_directory(HYSERVE_SOURCE_DIR, [&] {
    EXPECT_EQ(load_config_file(p).model.path, dir.file("tests/fixtures/bamba-tiny"));
  });

  // Neither.
  test::write_file(p, "model: {path: no_such_checkpoint}\n");
  EXPECT_ERROR_WITH(load_config_file(p), config_error, p, "model.path", "'no_such_checkpoint' not found");
}

TEST(Config, RepositoryConfigsLoad) {
  // From any directory (launch/serve.sh with the default config): paths are relative to the file.
  in_directory("/", [&] {
    const service_config def = load_config_file(std::string(HYSERVE_SOURCE_DIR) + "/configs/default.yaml");
    EXPECT_EQ(std::filesystem::path(def.model.tokenizer),
              (std::filesystem::path(HYSERVE_SOURCE_DIR) / "tests/fixtures/tokenizer-bpe512/tokenizer.json")
                  .lexically_normal());
    const service_config tiny = load_config_file(std::string(HYSERVE_SOURCE_DIR) + "/configs/bamba-tiny.yaml");
    EXPECT_EQ(resolve_model_config(tiny).hidden_size, 64);
  });
  in_directory(HYSERVE_SOURCE_DIR, [&] {
    const service_config tiny = load_config_file("configs/bamba-tiny.yaml");
    EXPECT_EQ(resolve_model_config(tiny).hidden_size, 64);
    const service_config def = load_config_file("configs/default.yaml");
    ASSERT_TRUE(def.model.synthetic.has_value());
    const model_config m = resolve_model_config(def);
    EXPECT_EQ(m.hidden_size, 256);
    EXPECT_EQ(m.mamba_expand, 2);
    EXPECT_EQ(m.num_layers_of(layer_kind::kAttention), 2);
    // Both serve text with the 512-token test tokenizer and ChatML.
    for (const service_config* c : {&tiny, &def}) {
      EXPECT_EQ(std::filesystem::path(c->model.tokenizer),
                (std::filesystem::path(HYSERVE_SOURCE_DIR) / "tests/fixtures/tokenizer-bpe512/tokenizer.json")
                    .lexically_normal());
      ASSERT_TRUE(c->chat.has_value());
      EXPECT_EQ(c->chat->eos, "<|im_end|>");
    }
  });
}

TEST(Config, TokenizerPathAndChatSection) {
  test::scratch_dir dir;
  std::filesystem::create_directories(dir.file("ckpt"));
  std::filesystem::create_directories(dir.file("tok"));
  test::write_file(dir.file("tok/tokenizer.json"), "{}");
  const std::string p = dir.file("service.yaml");

  // A directory holding tokenizer.json, relative to the config file; chat defaults to ChatML.
  test::write_file(p, "model: {path: ckpt, tokenizer: tok}\nchat: {}\n");
  service_config c = load_config_file(p);
  EXPECT_EQ(c.model.tokenizer, dir.file("tok/tokenizer.json"));
  ASSERT_TRUE(c.chat.has_value());
  EXPECT_EQ(c.chat->message_template, "<|im_start|>{role}\n{content}<|im_end|>\n");
  EXPECT_EQ(c.chat->generation_prompt, "<|im_start|>assistant\n");

  // Default: the checkpoint's own tokenizer.json, when there is one.
  test::write_file(p, "model: {path: ckpt}\n");
  EXPECT_EQ(load_config_file(p).model.tokenizer, "");
  test::write_file(dir.file("ckpt/tokenizer.json"), "{}");
  EXPECT_EQ(load_config_file(p).model.tokenizer, dir.file("ckpt/tokenizer.json"));

  // Every chat field.
  test::write_file(p, "model: {path: ckpt, tokenizer: tok/tokenizer.json}\n"
                      "chat: {template: \"[{role}] {content}\\n\", generation_prompt: '[assistant] ', bos: '<s>',\n"
                      "       eos: '</s>', stop: ['Assistant:', 'User:']}\n");
  c = load_config_file(p);
  EXPECT_EQ(c.chat->message_template, "[{role}] {content}\n");
  EXPECT_EQ(c.chat->bos, "<s>");
  EXPECT_EQ(c.chat->eos, "</s>");
  EXPECT_EQ(c.chat->stop, (std::vector<std::string>{"Assistant:", "User:"}));

  // Errors name the path.
  test::write_file(p, "model: {path: ckpt, tokenizer: nowhere}\n");
  EXPECT_ERROR_WITH(load_config_file(p), config_error, "model.tokenizer: 'nowhere' not found");
  test::write_file(p, "model: {path: ckpt, tokenizer: .}\n");
  EXPECT_ERROR_WITH(load_config_file(p), config_error, "model.tokenizer: directory '.' has no tokenizer.json");
  test::write_file(p, "model: {synthetic: {}}\nchat: {}\n");
  EXPECT_ERROR_WITH(load_config_file(p), config_error, "chat: needs a tokenizer");
  const std::string model = "model: {path: /x}\n";
  EXPECT_ERROR_WITH(load_config_string(model + "chat: {template: 'no placeholder'}"), config_error,
                    "chat.template: must contain the {content} placeholder");
  EXPECT_ERROR_WITH(load_config_string(model + "chat: {stop: ['']}"), config_error, "chat.stop: stop strings must not be empty");
  EXPECT_ERROR_WITH(load_config_string(model + "chat: {stop: {a: 1}}"), config_error, "chat.stop: expected a string");
  EXPECT_ERROR_WITH(load_config_string(model + "chat: {roles: 1}"), config_error, "chat.roles: unknown key");
}

TEST(Config, ResolveModelConfigReadsCheckpointConfig) {
  service_config c = load_config_string("model: {path: " + test::fixture_dir() + "}");
  const model_config m = resolve_model_config(c);
  EXPECT_EQ(m.vocab_size, 512);
  EXPECT_EQ(m.layer_kinds[1], layer_kind::kAttention);
  c.model.path = "/nonexistent/ckpt";
  EXPECT_ERROR_WITH(resolve_model_config(c), config_error, "/nonexistent/ckpt/config.json");
}

TEST(Config, GdnPrefillKernel) {
  EXPECT_EQ(load_config_string("model: {path: /ckpt}\n").model.gdn_prefill, gdn_prefill_choice::kAuto);
  EXPECT_EQ(load_config_string("model: {path: /ckpt, gdn_prefill: bf16}\n").model.gdn_prefill, gdn_prefill_choice::kBf16);
  EXPECT_EQ(load_config_string("model: {path: /ckpt, gdn_prefill: tc}\n").model.gdn_prefill, gdn_prefill_choice::kTc);
  EXPECT_EQ(load_config_string("model: {path: /ckpt, gdn_prefill: recurrent}\n").model.gdn_prefill,
            gdn_prefill_choice::kRecurrent);
  EXPECT_ERROR_WITH(load_config_string("model: {path: /ckpt, gdn_prefill: fast}\n"), config_error,
                    "model.gdn_prefill: unknown GDN prefill kernel 'fast' (known: auto, recurrent, tc, tf32, bf16)");
}

TEST(Config, CacheElementTypes) {
  const std::string model = "model: {path: /ckpt}\n";
  const service_config c = load_config_string(model + "cache: {kv_dtype: bfloat16, ssm_state_dtype: bfloat16}");
  EXPECT_EQ(c.cache.kv_dtype, dtype::kBF16);
  EXPECT_EQ(c.cache.ssm_state_dtype, dtype::kBF16);
  const service_config f = load_config_string(model + "cache: {kv_dtype: float32, ssm_state_dtype: float32}");
  EXPECT_EQ(f.cache.kv_dtype, dtype::kF32);
  EXPECT_EQ(f.cache.ssm_state_dtype, dtype::kF32);
  const service_config mixed = load_config_string(model + "cache: {kv_dtype: bfloat16}");
  EXPECT_EQ(mixed.cache.kv_dtype, dtype::kBF16);
  EXPECT_EQ(mixed.cache.ssm_state_dtype, dtype::kF32);

  EXPECT_ERROR_WITH(load_config_string(model + "cache: {kv_dtype: float16}"), config_error,
                    "cache.kv_dtype: unknown dtype 'float16' (known: float32, bfloat16)");
  EXPECT_ERROR_WITH(load_config_string(model + "cache: {ssm_state_dtype: bf16}"), config_error,
                    "cache.ssm_state_dtype: unknown dtype 'bf16' (known: float32, bfloat16)");
  EXPECT_ERROR_WITH(load_config_string(model + "cache: {kv_dtype: [float32]}"), config_error, "cache.kv_dtype:");
}

}  // namespace
}  // namespace hyserve

namespace hyserve {
namespace {

TEST(Config, CudaGraphsDefaultOnForCudaAndRefusedOnCpu) {
  const std::string model = "model: {path: /ckpt}\n";
  EXPECT_FALSE(cuda_graphs_enabled(load_config_string(model)));
  EXPECT_TRUE(cuda_graphs_enabled(load_config_string(model + "device: cuda\n")));
  EXPECT_FALSE(cuda_graphs_enabled(load_config_string(model + "device: cuda\ncuda_graphs: false\n")));
  EXPECT_TRUE(cuda_graphs_enabled(load_config_string(model + "device: cuda\ncuda_graphs: true\n")));
  EXPECT_FALSE(cuda_graphs_enabled(load_config_string(model + "cuda_graphs: false\n")));
  EXPECT_ERROR_WITH(load_config_string(model + "cuda_graphs: true\n"), config_error,
                    "cuda_graphs: true needs device: cuda");
  EXPECT_ERROR_WITH(load_config_string(model + "device: cuda\ncuda_graphs: maybe\n"), config_error, "cuda_graphs");
}

}  // namespace
}  // namespace hyserve

namespace hyserve {
namespace {

// The keys a section of the config knows, as its unknown-key error lists them.
std::vector<std::string> known_keys(const std::string& yaml) {
  try {
    (void)load_config_string(yaml);
  } catch (const config_error& e) {
    const std::string what = e.what();
    const size_t at = what.find("(known: ");
    if (at == std::string::npos) return {};
    const size_t end = what.find(')', at);
    std::vector<std::string> keys;
    std::string list = what.substr(at + 8, end - at - 8);
    for (size_t pos = 0; pos <= list.size();) {
      const size_t comma = std::min(list.find(", ", pos), list.size());
      keys.push_back(list.substr(pos, comma - pos));
      pos = comma + 2;
    }
    return keys;
  }
  return {};
}

// README's configuration section names every key the loader knows: the sections with a table
// row per key as `section.key`, the ones documented below the table (sparsity, speculative, chat)
// by the key itself.
TEST(Config, ReadmeConfigurationListsEveryKey) {
  std::ifstream in(std::string(HYSERVE_SOURCE_DIR) + "/README.md");
  const std::string readme((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(readme.empty());
  const std::string model = "model: {path: /ckpt}\n";
  struct section {
    std::string prefix;  // "" for the top level
    std::string yaml;    // a config whose only fault is the unknown key zzz in that section
    bool table = true;   // keys in the table as `prefix.key`
  };
  const std::vector<section> sections = {
      {"", model + "zzz: 1\n"},
      {"model.", "model: {path: /ckpt, zzz: 1}\n"},
      {"parallel.", model + "parallel: {zzz: 1}\n"},
      {"cache.", model + "cache: {zzz: 1}\n"},
      {"cache.prefix.", model + "cache: {prefix: {zzz: 1}}\n"},
      {"scheduler.", model + "scheduler: {zzz: 1}\n"},
      {"server.", model + "server: {zzz: 1}\n"},
      {"worker.", model + "worker: {zzz: 1}\n"},
      {"sparsity.", model + "sparsity: {zzz: 1}\n", false},
      {"speculative.", model + "speculative: {zzz: 1}\n", false},
      {"chat.", model + "chat: {zzz: 1}\n", false},
  };
  for (const section& s : sections) {
    const std::vector<std::string> keys = known_keys(s.yaml);
    ASSERT_FALSE(keys.empty()) << "no known-key list for " << s.prefix;
    for (const std::string& key : keys) {
      if (s.table) {
        // A key that is a section itself has rows for its keys (`cache.prefix.enabled`).
        EXPECT_TRUE(readme.find("`" + s.prefix + key + "`") != std::string::npos ||
                    readme.find("`" + s.prefix + key + ".") != std::string::npos)
            << "README's configuration table has no row for `" << s.prefix << key << "`";
      } else {
        EXPECT_TRUE(readme.find("`" + key + "`") != std::string::npos ||
                    readme.find(key + ":") != std::string::npos)
            << "README does not document " << s.prefix << key;
      }
    }
  }
}

}  // namespace
}  // namespace hyserve
