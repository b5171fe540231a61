// The `kernels:` section (kernel path choices, hyserve/common/kernel_paths.h): every key parsed,
// the defaults (what the kernels choose on their own), and each bad value's error naming the key
// and the values it takes.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <utility>

#include "common_test_support.h"
#include "hyserve/common/config.h"
#include "hyserve/common/error.h"
#include "hyserve/common/model_config.h"

namespace hyserve {
namespace {

const std::string kModel = "model: {path: /ckpt}\n";

service_config with_kernels(const std::string& section) { return load_config_string(kModel + "kernels: " + section); }

using kp = kernel_paths;

TEST(ConfigKernels, DefaultsAreTheKernelsOwnChoices) {
  for (const std::string& text : {kModel, kModel + "kernels:\n", kModel + "kernels: {}\n"}) {
    const kernel_paths k = load_config_string(text).kernels;
    EXPECT_EQ(k.attn_decode, kp::attn_decode_kind::kDefault);
    EXPECT_EQ(k.attn_decode_waves, 0);
    EXPECT_EQ(k.gdn_cluster, 0);
    EXPECT_EQ(k.gdn_decode, kp::gdn_decode_kind::kDefault);
    EXPECT_EQ(k.gdn_max_tokens, 0);
    EXPECT_EQ(k.gdn_prefill, kp::gdn_prefill_kind::kDefault);
    EXPECT_EQ(k.moe_decode, kp::moe_decode_kind::kDefault);
    EXPECT_EQ(k.moe_tile_order, kp::moe_tile_order_kind::kDefault);
    EXPECT_EQ(k.moe_wgmma_rows, 0);
    EXPECT_TRUE(k.moe_wgmma_persistent);
    EXPECT_TRUE(k.moe_wgmma_tma_x);
    EXPECT_TRUE(k.moe_wgmma_early_release);
    EXPECT_FALSE(k.moe_wgmma_tile_handoff);
    EXPECT_TRUE(k.attn_extend_fill);
    EXPECT_EQ(k.attn_decode_cluster, 0);
    EXPECT_EQ(k.attn_decode_cluster_size, 0);
    EXPECT_FALSE(k.attn_decode_mma_hd256);
    EXPECT_FALSE(k.attn_decode_early_loads);
    EXPECT_TRUE(k.norm_linear);
    EXPECT_EQ(k.norm_linear_blocks_per_sm, 0);
    EXPECT_FALSE(k.norm_linear_gate);
    EXPECT_FALSE(k.norm_linear_wide);
    EXPECT_FALSE(k.norm_linear_spread);
    EXPECT_FALSE(k.linear_wgmma);
    EXPECT_TRUE(k.moe_wgmma);
    EXPECT_TRUE(k.ssd_seq_bf16);
    EXPECT_EQ(k.ssd_seq_slice, 0);
    EXPECT_TRUE(k.pdl);
    EXPECT_EQ(k.smem_carveout, 0);
    EXPECT_EQ(k.moe_decode_ring_kb, 0);
    EXPECT_EQ(k.skinny, kp::skinny_kind::kDefault);
    EXPECT_EQ(k.sparse_select, kp::sparse_select_kind::kDefault);
    EXPECT_EQ(k.ssd_max_tokens, 0);
    EXPECT_EQ(k.ssd_scan, kp::ssd_scan_kind::kDefault);
    EXPECT_EQ(k.ssm_update_unroll, 0);
    EXPECT_EQ(k.norm_linear_rows, 0);
    EXPECT_FALSE(k.batch_invariant);
  }
}

TEST(ConfigKernels, EveryKeyParses) {
  const kernel_paths k = with_kernels(R"(
  attn_decode: simt
  attn_decode_waves: 2
  attn_decode_cluster: 2048
  attn_decode_cluster_size: 4
  attn_decode_mma_hd256: true
  attn_decode_early_loads: true
  attn_extend_fill: false
  gdn_cluster: 4
  gdn_decode: persistent8
  gdn_max_tokens: 32768
  gdn_prefill: tf32
  invariant_gemm: cublaslt
  moe_decode: split
  moe_decode_ring_kb: 192
  moe_tile_order: outputs
  moe_wgmma_rows: 192
  norm_linear: false
  norm_linear_blocks_per_sm: 3
  norm_linear_gate: true
  norm_linear_wide: true
  norm_linear_spread: true
  linear_wgmma: true
  moe_wgmma: false
  moe_wgmma_persistent: false
  moe_wgmma_tma_x: false
  moe_wgmma_early_release: false
  moe_wgmma_tile_handoff: true
  ssd_seq_bf16: false
  ssd_seq_slice: 16
  pdl: false
  smem_carveout: 72
  skinny: mma
  sparse_select: v1
  ssd_max_tokens: 65536
  ssd_scan: parallel_oct_y
  ssm_update_unroll: 8
  norm_linear_rows: 4
)").kernels;
  EXPECT_EQ(k.attn_decode, kp::attn_decode_kind::kSimt);
  EXPECT_EQ(k.attn_decode_waves, 2);
  EXPECT_FALSE(k.attn_extend_fill);
  EXPECT_EQ(k.attn_decode_cluster, 2048);
  EXPECT_EQ(k.attn_decode_cluster_size, 4);
  EXPECT_TRUE(k.attn_decode_mma_hd256);
  EXPECT_TRUE(k.attn_decode_early_loads);
  EXPECT_EQ(k.gdn_cluster, 4);
  EXPECT_EQ(k.gdn_decode, kp::gdn_decode_kind::kPersistent8);
  EXPECT_EQ(k.gdn_max_tokens, 32768);
  EXPECT_EQ(k.gdn_prefill, kp::gdn_prefill_kind::kTf32);
  EXPECT_EQ(k.invariant_gemm, kp::invariant_gemm_kind::kCublasLt);
  EXPECT_EQ(k.moe_decode, kp::moe_decode_kind::kSplit);
  EXPECT_EQ(k.moe_decode_ring_kb, 192);
  EXPECT_EQ(k.moe_tile_order, kp::moe_tile_order_kind::kOutputs);
  EXPECT_EQ(k.moe_wgmma_rows, 192);
  EXPECT_FALSE(k.norm_linear);
  EXPECT_EQ(k.norm_linear_blocks_per_sm, 3);
  EXPECT_TRUE(k.norm_linear_gate);
  EXPECT_TRUE(k.norm_linear_wide);
  EXPECT_TRUE(k.norm_linear_spread);
  EXPECT_TRUE(k.linear_wgmma);
  EXPECT_FALSE(k.moe_wgmma);
  EXPECT_FALSE(k.moe_wgmma_persistent);
  EXPECT_FALSE(k.moe_wgmma_tma_x);
  EXPECT_FALSE(k.moe_wgmma_early_release);
  EXPECT_TRUE(k.moe_wgmma_tile_handoff);
  EXPECT_FALSE(k.ssd_seq_bf16);
  EXPECT_EQ(k.ssd_seq_slice, 16);
  EXPECT_FALSE(k.pdl);
  EXPECT_EQ(k.smem_carveout, 72);
  EXPECT_EQ(k.skinny, kp::skinny_kind::kMma);
  EXPECT_EQ(k.sparse_select, kp::sparse_select_kind::kV1);
  EXPECT_EQ(k.ssd_max_tokens, 65536);
  EXPECT_EQ(k.ssd_scan, kp::ssd_scan_kind::kParallelOctY);
  EXPECT_EQ(k.ssm_update_unroll, 8);
  EXPECT_EQ(k.norm_linear_rows, 4);
}

// Each enumerated value maps to its own variant, and `default` to the automatic choice.
TEST(ConfigKernels, EveryNamedValueParses) {
  EXPECT_EQ(with_kernels("{invariant_gemm: kernels}").kernels.invariant_gemm, kp::invariant_gemm_kind::kKernels);
  EXPECT_EQ(with_kernels("{invariant_gemm: wgmma}").kernels.invariant_gemm, kp::invariant_gemm_kind::kWgmma);
  EXPECT_EQ(with_kernels("{attn_decode: mma}").kernels.attn_decode, kp::attn_decode_kind::kMma);
  EXPECT_EQ(with_kernels("{attn_decode: default}").kernels.attn_decode, kp::attn_decode_kind::kDefault);
  EXPECT_EQ(with_kernels("{attn_decode_waves: default}").kernels.attn_decode_waves, 0);
  EXPECT_EQ(with_kernels("{attn_decode_waves: 8}").kernels.attn_decode_waves, 8);
  EXPECT_EQ(with_kernels("{attn_decode_max_slices: default}").kernels.attn_decode_max_slices, 0);
  EXPECT_EQ(with_kernels("{attn_decode_max_slices: 1}").kernels.attn_decode_max_slices, 1);
  EXPECT_EQ(with_kernels("{attn_decode_max_slices: 256}").kernels.attn_decode_max_slices, 256);
  EXPECT_ERROR_WITH(with_kernels("{attn_decode_max_slices: 257}"), config_error,
                    "kernels.attn_decode_max_slices: must be default or an integer in [1, 256], got '257'");
  EXPECT_ERROR_WITH(with_kernels("{attn_decode_cluster: 8}"), config_error,
                    "kernels.attn_decode_cluster: must be default, off or an integer in [16, 1048576], got '8'");
  EXPECT_EQ(with_kernels("{attn_decode_cluster: off}").kernels.attn_decode_cluster, -1);
  EXPECT_EQ(with_kernels("{gdn_cluster: 1}").kernels.gdn_cluster, 1);
  EXPECT_EQ(with_kernels("{gdn_cluster: 2}").kernels.gdn_cluster, 2);
  EXPECT_EQ(with_kernels("{gdn_cluster: default}").kernels.gdn_cluster, 0);
  EXPECT_EQ(with_kernels("{gdn_decode: grid}").kernels.gdn_decode, kp::gdn_decode_kind::kGrid);
  EXPECT_EQ(with_kernels("{gdn_decode: persistent}").kernels.gdn_decode, kp::gdn_decode_kind::kPersistent);
  EXPECT_EQ(with_kernels("{gdn_decode: tiles8}").kernels.gdn_decode, kp::gdn_decode_kind::kTiles8);
  EXPECT_EQ(with_kernels("{gdn_max_tokens: default}").kernels.gdn_max_tokens, 0);
  EXPECT_EQ(with_kernels("{gdn_prefill: recurrent}").kernels.gdn_prefill, kp::gdn_prefill_kind::kRecurrent);
  EXPECT_EQ(with_kernels("{gdn_prefill: tc}").kernels.gdn_prefill, kp::gdn_prefill_kind::kTc);
  EXPECT_EQ(with_kernels("{gdn_prefill: bf16}").kernels.gdn_prefill, kp::gdn_prefill_kind::kBf16);
  EXPECT_TRUE(with_kernels("{norm_linear: true, pdl: true}").kernels.norm_linear);
  EXPECT_EQ(with_kernels("{norm_linear_blocks_per_sm: 1}").kernels.norm_linear_blocks_per_sm, 1);
  EXPECT_EQ(with_kernels("{skinny: fma}").kernels.skinny, kp::skinny_kind::kFma);
  EXPECT_EQ(with_kernels("{sparse_select: v2}").kernels.sparse_select, kp::sparse_select_kind::kV2);
  EXPECT_EQ(with_kernels("{ssd_max_tokens: 1}").kernels.ssd_max_tokens, 1);
  const std::pair<const char*, kp::ssd_scan_kind> scans[] = {
      {"sequential", kp::ssd_scan_kind::kSequential},
      {"parallel", kp::ssd_scan_kind::kParallel},
      {"parallel_single", kp::ssd_scan_kind::kParallelSingle},
      {"parallel_fast", kp::ssd_scan_kind::kParallelFast},
      {"parallel_pair", kp::ssd_scan_kind::kParallelPair},
      {"parallel_quad", kp::ssd_scan_kind::kParallelQuad},
      {"parallel_y", kp::ssd_scan_kind::kParallelY},
      {"parallel_quad_y", kp::ssd_scan_kind::kParallelQuadY},
      {"parallel_oct_y", kp::ssd_scan_kind::kParallelOctY},
      {"default", kp::ssd_scan_kind::kDefault},
  };
  for (const auto& [name, kind] : scans)
    EXPECT_EQ(with_kernels(std::string("{ssd_scan: ") + name + "}").kernels.ssd_scan, kind) << name;
  EXPECT_EQ(with_kernels("{ssm_update_unroll: 4}").kernels.ssm_update_unroll, 4);
  EXPECT_EQ(with_kernels("{ssm_update_unroll: default}").kernels.ssm_update_unroll, 0);
  EXPECT_EQ(with_kernels("{norm_linear_rows: 2}").kernels.norm_linear_rows, 2);
  EXPECT_ERROR_WITH(with_kernels("{norm_linear_rows: 3}"), config_error,
                    "kernels.norm_linear_rows: unknown row count '3' (known: default, 2, 4)");
}

TEST(ConfigKernels, BadValuesNameTheKeyAndTheAllowedValues) {
  EXPECT_ERROR_WITH(with_kernels("{attn_decode: wmma}"), config_error,
                    "kernels.attn_decode: unknown path 'wmma' (known: default, simt, mma)");
  EXPECT_ERROR_WITH(with_kernels("{attn_decode_waves: 9}"), config_error,
                    "kernels.attn_decode_waves: must be default or an integer in [1, 8], got '9'");
  EXPECT_ERROR_WITH(with_kernels("{attn_decode_waves: 0}"), config_error,
                    "kernels.attn_decode_waves: must be default or an integer in [1, 8], got '0'");
  EXPECT_ERROR_WITH(with_kernels("{attn_decode_waves: two}"), config_error,
                    "kernels.attn_decode_waves: must be default or an integer in [1, 8], got 'two'");
  EXPECT_ERROR_WITH(with_kernels("{gdn_cluster: 3}"), config_error,
                    "kernels.gdn_cluster: unknown cluster size '3' (known: default, 1, 2, 4)");
  EXPECT_ERROR_WITH(with_kernels("{gdn_decode: tiles4}"), config_error,
                    "kernels.gdn_decode: unknown path 'tiles4' (known: default, grid, persistent, persistent8, tiles8)");
  EXPECT_ERROR_WITH(with_kernels("{gdn_max_tokens: -1}"), config_error,
                    "kernels.gdn_max_tokens: must be default or an integer in [1, 1073741824], got '-1'");
  EXPECT_ERROR_WITH(with_kernels("{gdn_prefill: auto}"), config_error,
                    "kernels.gdn_prefill: unknown path 'auto' (known: default, recurrent, tc, tf32, bf16)");
  EXPECT_ERROR_WITH(with_kernels("{norm_linear: 0}"), config_error,
                    "kernels.norm_linear: expected a boolean (true or false), got '0'");
  EXPECT_ERROR_WITH(with_kernels("{norm_linear_blocks_per_sm: 16}"), config_error,
                    "kernels.norm_linear_blocks_per_sm: must be default or an integer in [1, 8], got '16'");
  EXPECT_ERROR_WITH(with_kernels("{pdl: sometimes}"), config_error,
                    "kernels.pdl: expected a boolean (true or false), got 'sometimes'");
  EXPECT_ERROR_WITH(with_kernels("{skinny: wgmma}"), config_error,
                    "kernels.skinny: unknown path 'wgmma' (known: default, fma, mma)");
  EXPECT_ERROR_WITH(with_kernels("{sparse_select: v3}"), config_error,
                    "kernels.sparse_select: unknown path 'v3' (known: default, v1, v2)");
  EXPECT_ERROR_WITH(with_kernels("{ssd_max_tokens: 0}"), config_error,
                    "kernels.ssd_max_tokens: must be default or an integer in [1, 1073741824], got '0'");
  // The three-kernel "phased" scan lost every measurement and left the product.
  EXPECT_ERROR_WITH(with_kernels("{ssd_scan: phased}"), config_error, "kernels.ssd_scan: unknown path 'phased'");
  EXPECT_ERROR_WITH(with_kernels("{ssd_scan: chained}"), config_error,
                    "kernels.ssd_scan: unknown path 'chained' (known: default, sequential, parallel, parallel_single, "
                    "parallel_fast, parallel_pair, parallel_quad, parallel_y, parallel_quad_y, parallel_oct_y)");
  EXPECT_ERROR_WITH(with_kernels("{ssm_update_unroll: 2}"), config_error,
                    "kernels.ssm_update_unroll: unknown unroll '2' (known: default, 4, 8)");
  EXPECT_ERROR_WITH(with_kernels("{skiny: mma}"), config_error,
                    "kernels.skiny: unknown key (known: attn_decode, attn_decode_cluster, attn_decode_cluster_size, "
                    "attn_decode_early_loads, attn_decode_max_slices, attn_decode_mma_hd256, attn_decode_waves, "
                    "attn_extend_fill, gdn_cluster,");
  EXPECT_ERROR_WITH(with_kernels("{moe_wgmma_rows: 256}"), config_error,
                    "kernels.moe_wgmma_rows: unknown row count '256' (known: default, 128, 192)");
  EXPECT_ERROR_WITH(with_kernels("{moe_decode: grouped}"), config_error,
                    "kernels.moe_decode: unknown path 'grouped' (known: default, fused, single, split)");
  EXPECT_ERROR_WITH(with_kernels("[skinny]"), config_error, "kernels: expected a mapping");
  EXPECT_ERROR_WITH(with_kernels("{skinny: [mma]}"), config_error, "kernels.skinny: expected one of: default, fma, mma");
}

// `determinism` (top level): fast (the default) or batch_invariant, which the kernels read from
// kernel_paths; batch_invariant raises the GDN prefill workspace to the step's token budget and
// refuses the choices it cannot honour, naming them.
TEST(ConfigKernels, DeterminismSelectsBatchInvariantKernels) {
  EXPECT_FALSE(load_config_string(kModel + "determinism: fast\n").kernels.batch_invariant);
  const kernel_paths inv = load_config_string(kModel + "determinism: batch_invariant\n").kernels;
  EXPECT_TRUE(inv.batch_invariant);
  EXPECT_EQ(inv.gdn_max_tokens, 16384);  // the default workspace, now explicit: >= max_batch_tokens (4096)
  EXPECT_EQ(load_config_string(kModel + "determinism: batch_invariant\nscheduler: {max_batch_tokens: 40000}\n")
                .kernels.gdn_max_tokens,
            40000);
  EXPECT_EQ(load_config_string(kModel + "determinism: batch_invariant\nkernels: {gdn_max_tokens: 8192, skinny: mma}\n")
                .kernels.gdn_max_tokens,
            8192);
  EXPECT_ERROR_WITH(load_config_string(kModel + "determinism: exact\n"), config_error,
                    "determinism: unknown mode 'exact' (known: fast, batch_invariant)");
  EXPECT_ERROR_WITH(load_config_string(kModel + "determinism: batch_invariant\nkernels: {skinny: fma}\n"), config_error,
                    "kernels.skinny: fma is not row-invariant across row counts");
  EXPECT_ERROR_WITH(load_config_string(kModel + "determinism: batch_invariant\nkernels: {gdn_max_tokens: 1000}\n"),
                    config_error, "kernels.gdn_max_tokens: must be >= scheduler.max_batch_tokens = 4096");
}

// determinism: batch_invariant with the prefix cache: the cache cuts and resumes prompts only at
// multiples of cache.prefix.state_interval, so that must be a multiple of the recurrent scans'
// chunk, and the prefill chunk a multiple of it (check_invariant_prefix, with the model).
TEST(ConfigKernels, BatchInvariantPrefixCacheNeedsScanAlignedIntervals) {
  model_config mamba;
  mamba.layer_kinds = {layer_kind::kMamba2, layer_kind::kAttention};
  mamba.mamba_chunk_size = 256;
  model_config gdn;
  gdn.layer_kinds = {layer_kind::kGatedDeltaNet, layer_kind::kAttention};
  const std::string inv = kModel + "determinism: batch_invariant\nscheduler: {chunked_prefill: 2048}\n";
  // The defaults (interval 256, chunks of 2048) hold for both.
  EXPECT_NO_THROW(check_invariant_prefix(load_config_string(inv + "cache: {prefix: {enabled: true}}\n"), mamba));
  EXPECT_NO_THROW(check_invariant_prefix(load_config_string(inv + "cache: {prefix: {enabled: true}}\n"), gdn));
  // Not checked without the cache or in fast mode.
  EXPECT_NO_THROW(
      check_invariant_prefix(load_config_string(inv + "cache: {prefix: {enabled: false, state_interval: 48}}\n"), mamba));
  EXPECT_NO_THROW(check_invariant_prefix(
      load_config_string(kModel + "cache: {prefix: {enabled: true, state_interval: 48}}\n"), mamba));
  EXPECT_ERROR_WITH(
      check_invariant_prefix(load_config_string(inv + "cache: {prefix: {enabled: true, state_interval: 128}}\n"), mamba),
      config_error, "cache.prefix.state_interval: 128", "multiple of the model's mamba_chunk_size 256");
  EXPECT_ERROR_WITH(
      check_invariant_prefix(load_config_string(inv + "cache: {prefix: {enabled: true, state_interval: 48}}\n"), gdn),
      config_error, "cache.prefix.state_interval: 48", "multiple of the Gated DeltaNet chunk 64");
  EXPECT_ERROR_WITH(check_invariant_prefix(load_config_string(kModel +
                                                              "determinism: batch_invariant\nscheduler: {chunked_prefill: "
                                                              "1000}\ncache: {prefix: {enabled: true, state_interval: 256}}\n"),
                                           mamba),
                    config_error, "scheduler.chunked_prefill", "1000 must be a multiple of cache.prefix.state_interval 256");
}

// A bfloat16 Mamba2 state is rounded where each prefill call ends; an uncached prompt ends calls
// only at multiples of the prefill chunk, so with the cache under batch_invariant the interval
// is that chunk: the default, and any other value is refused.
TEST(ConfigKernels, BatchInvariantPrefixCacheWithBf16StateCutsOnlyAtThePrefillChunk) {
  model_config mamba;
  mamba.layer_kinds = {layer_kind::kMamba2, layer_kind::kAttention};
  mamba.mamba_chunk_size = 64;
  const std::string inv = kModel + "determinism: batch_invariant\nscheduler: {chunked_prefill: 1024, max_batch_tokens: 512}\n";
  const service_config dflt =
      load_config_string(inv + "cache: {ssm_state_dtype: bfloat16, prefix: {enabled: true}}\n");
  EXPECT_EQ(dflt.cache.state_interval(), 512);
  EXPECT_NO_THROW(check_invariant_prefix(dflt, mamba));
  EXPECT_ERROR_WITH(check_invariant_prefix(
                        load_config_string(inv + "cache: {ssm_state_dtype: bfloat16, prefix: {enabled: true, "
                                                 "state_interval: 128}}\n"),
                        mamba),
                    config_error, "cache.prefix.state_interval: 128",
                    "must equal min(scheduler.chunked_prefill, scheduler.max_batch_tokens) = 512",
                    "ssm_state_dtype: bfloat16");
  // A float32 state keeps the finer interval; fast mode keeps the 256-token default.
  EXPECT_NO_THROW(check_invariant_prefix(
      load_config_string(inv + "cache: {prefix: {enabled: true, state_interval: 128}}\n"), mamba));
  EXPECT_EQ(load_config_string(kModel + "cache: {ssm_state_dtype: bfloat16, prefix: {enabled: true}}\n")
                .cache.state_interval(),
            256);
}

// On by default: under batch_invariant the interval defaults to gcd(256, the prefill chunk); where
// the check cannot hold and the YAML leaves cache.prefix.enabled unset, settle_prefix_cache turns
// the cache off and says why; set to true, it is the start-up error.
TEST(ConfigKernels, BatchInvariantPrefixCacheTurnsItselfOffOnlyWhenNotAskedFor) {
  model_config mamba;
  mamba.layer_kinds = {layer_kind::kMamba2, layer_kind::kAttention};
  mamba.mamba_chunk_size = 16;
  model_config gdn;
  gdn.layer_kinds = {layer_kind::kGatedDeltaNet, layer_kind::kAttention};
  const std::string inv = kModel + "determinism: batch_invariant\nscheduler: {chunked_prefill: 48}\n";
  service_config m = load_config_string(inv);
  EXPECT_TRUE(m.cache.prefix.enabled);
  EXPECT_EQ(m.cache.state_interval(), 16);  // gcd(256, 48)
  EXPECT_EQ(settle_prefix_cache(m, mamba), "");
  EXPECT_TRUE(m.cache.prefix.enabled);
  EXPECT_EQ(m.cache.checkpoint_slots(), 64);
  // Gated DeltaNet scans 64-token chunks: 16 is no multiple of it.
  service_config g = load_config_string(inv);
  const std::string why = settle_prefix_cache(g, gdn);
  EXPECT_FALSE(g.cache.prefix.enabled);
  EXPECT_EQ(g.cache.checkpoint_slots(), 0);
  EXPECT_NE(why.find("prefix caching is off"), std::string::npos) << why;
  EXPECT_NE(why.find("multiple of the Gated DeltaNet chunk 64"), std::string::npos) << why;
  service_config asked = load_config_string(inv + "cache: {prefix: {enabled: true}}\n");
  EXPECT_ERROR_WITH(settle_prefix_cache(asked, gdn), config_error, "cache.prefix.state_interval: 16",
                    "multiple of the Gated DeltaNet chunk 64");
  // A chunk of 64 holds for both; fast mode is never turned off.
  service_config g64 = load_config_string(kModel + "determinism: batch_invariant\nscheduler: {chunked_prefill: 64}\n");
  EXPECT_EQ(g64.cache.state_interval(), 64);
  EXPECT_EQ(settle_prefix_cache(g64, gdn), "");
  EXPECT_TRUE(g64.cache.prefix.enabled);
  service_config fast = load_config_string(kModel + "scheduler: {chunked_prefill: 48}\n");
  EXPECT_EQ(settle_prefix_cache(fast, gdn), "");
  EXPECT_TRUE(fast.cache.prefix.enabled);
  EXPECT_EQ(fast.cache.state_interval(), 256);
}

// A file's errors carry its name and the line of the bad value, like every config error.
TEST(ConfigKernels, FileErrorsNameTheLine) {
  const std::string path = testing::TempDir() + "/kernels_bad.yaml";
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("model: {path: /tmp}\nkernels:\n  pdl: true\n  skinny: tensor\n", f);
    std::fclose(f);
  }
  EXPECT_ERROR_WITH(load_config_file(path), config_error, path + ":4: kernels.skinny: unknown path 'tensor'");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace hyserve
