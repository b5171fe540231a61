// Tensor parallelism under real mpirun: every rank runs the model sharded over the world and,
// locally, the unsharded model; the logits of Extend, Decode and Mixed steps must agree within
// 1e-5 on the CPU (MPI all-reduce/all-gather), and within 1e-4 on a CUDA device that every rank
// shares (parallel.device_collective: host; skipped without a device). Under determinism:
// batch_invariant a row's sharded logits do not depend on the rows beside it (TpInvariance).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <memory>
#include <string>

#include "fixture.h"
#include "hyserve/common/config.h"
#include "hyserve/common/error.h"
#include "hyserve/kernels/device.h"
#include "hyserve/worker/engine.h"
#include "hyserve/worker/host_collective.h"
#include "hyserve/worker/mpi_collective.h"
#include "hyserve/worker/tp_device.h"

namespace hyserve {
namespace {

using worker::engine;
using worker::forward_mode;
using worker::forward_options;
using worker::step_row;

constexpr float kTpTol = 1e-5f;      // TP=2 or 4 vs TP=1 logits (CPU, float32)
constexpr float kTpCudaTol = 1e-4f;  // the same on CUDA (other reduction orders than one rank's)

struct config_case {
  std::string name;
  std::string yaml;
  int max_tp = 0;  // the largest world its dimensions split over (0: any the suite runs at)
};

std::string synthetic_yaml(int n_groups, int kv_heads) {
  return "model:\n  synthetic: {arch: bamba, vocab_size: 256, hidden_size: 64, num_layers: 4, "
         "attn_layer_indices: [1, 3], num_attention_heads: 4, num_kv_heads: " +
         std::to_string(kv_heads) +
         ", head_dim: 16, intermediate_size: 128, mamba_n_heads: 4, mamba_d_head: 32, mamba_d_state: 16, "
         "mamba_n_groups: " +
         std::to_string(n_groups) + ", mamba_d_conv: 4, mamba_chunk_size: 8, seed: 11}\n";
}

class TpParity : public ::testing::TestWithParam<config_case> {
 protected:
  void SetUp() override {
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (GetParam().max_tp > 0 && world > GetParam().max_tp)
      GTEST_SKIP() << GetParam().name << " splits over at most " << GetParam().max_tp << " ranks";
  }
};

void check_parity(const std::string& yaml, device_kind device) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  service_config cfg = load_config_string(yaml);
  cfg.cache.max_requests = 4;
  cfg.cache.max_context = 128;
  cfg.cache.page_size = 16;
  cfg.cache.num_pages = 64;  // every rank's two engines share one device on CUDA
  cfg.device = device;
  const model_config mc = resolve_model_config(cfg);
  const kernels::exec_context ctx = kernels::open_device(device, 0);
  auto comm = device == device_kind::kCpu ? worker::make_mpi_collective(MPI_COMM_WORLD)
                                          : worker::make_host_staged_collective(MPI_COMM_WORLD, device, 60.0);
  engine sharded(worker::make_model(cfg, mc, worker::tp_placement{rank, world}, comm.get(), ctx), cfg.cache);
  engine whole(worker::make_model(cfg, mc, worker::tp_placement{0, 1}, nullptr, ctx), cfg.cache);
  const float tol = device == device_kind::kCpu ? kTpTol : kTpCudaTol;

  const int64_t vocab = mc.vocab_size;
  std::vector<std::vector<int32_t>> prompts = {
      {5, 17, 33, 2, 99, 7, 120, 45, 3, 77, 8, 250, 19},
      {64, 12, 200, 31, 9},
      {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22}};
  std::vector<int32_t> rs(3), rw(3);
  for (int i = 0; i < 3; ++i) {
    rs[static_cast<size_t>(i)] = sharded.open_request();
    rw[static_cast<size_t>(i)] = whole.open_request();
  }
  forward_options all;
  all.all_logits = true;
  auto compare = [&](forward_mode mode, const std::vector<std::pair<int, std::vector<int32_t>>>& rows,
                     const forward_options& opts, const std::string& what) {
    std::vector<step_row> a, b;
    for (const auto& [i, toks] : rows) {
      a.push_back({rs[static_cast<size_t>(i)], toks});
      b.push_back({rw[static_cast<size_t>(i)], toks});
    }
    const host_tensor la = sharded.step(mode, a, opts);
    const host_tensor lb = whole.step(mode, b, opts);
    ASSERT_EQ(la.shape(), lb.shape()) << what;
    ASSERT_EQ(la.shape()[1], vocab) << what;
    EXPECT_LE(test::max_abs_diff(la.as<float>(), lb.as<float>(), la.numel()), tol) << what << " on rank " << rank;
  };
  compare(forward_mode::kExtend, {{0, prompts[0]}, {1, prompts[1]}}, all, "extend");
  for (int s = 0; s < 3; ++s)
    compare(forward_mode::kDecode, {{0, {static_cast<int32_t>(40 + s)}}, {1, {static_cast<int32_t>(90 + s)}}}, {},
            "decode " + std::to_string(s));
  compare(forward_mode::kMixed, {{0, {7}}, {2, prompts[2]}, {1, {8}}}, {}, "mixed");
  compare(forward_mode::kDecode, {{0, {9}}, {1, {10}}, {2, {11}}}, {}, "decode after mixed");
}

TEST_P(TpParity, ShardedLogitsEqualUnshardedOverExtendDecodeMixed) { check_parity(GetParam().yaml, device_kind::kCpu); }

// Every rank on CUDA device 0, reductions through the host (parallel.device_collective: host).
TEST_P(TpParity, CudaHostCollectiveSharedDeviceEqualsUnsharded) {
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  check_parity(GetParam().yaml, device_kind::kCuda);
}

INSTANTIATE_TEST_SUITE_P(
    Models, TpParity,
    ::testing::Values(config_case{"bamba_tiny_groups1_replicated",
                                  "model: {path: " + test::fixture_dir("bamba-tiny") + "}\n"},
                      config_case{"synthetic_groups2_split", synthetic_yaml(2, 2)},
                      config_case{"synthetic_groups1_kv1_replicated", synthetic_yaml(1, 1)},
                      // 2 linear-attention key heads: up to TP=2.
                      config_case{"qwen3next_tiny", "model: {path: " + test::fixture_dir("qwen3next-tiny") + "}\n", 2},
                      // 4 B/C groups split over the ranks (per-group gated norm stays local).
                      config_case{"bamba_groups_split", "model: {path: " + test::fixture_dir("bamba-groups") + "}\n"},
                      // Mamba2 (4 groups split), attention without rope, relu² MLP layers.
                      config_case{"nemotronh_tiny", "model: {path: " + test::fixture_dir("nemotronh-tiny") + "}\n"},
                      // One group replicated; experts and the shared MLP split like Qwen3-Next's.
                      config_case{"granite4h_tiny", "model: {path: " + test::fixture_dir("granite4h-tiny") + "}\n"},
                      // Parallel attention + Mamba2 (2 groups, norm before gate): split at TP=2; at
                      // TP=4 each norm group spans two ranks, which all-reduce its Σy².
                      config_case{"falconh1_tiny", "model: {path: " + test::fixture_dir("falconh1-tiny") + "}\n"}),
    [](const auto& param_info) { return param_info.param.name; });

// determinism: batch_invariant at TP = the world (the service's collective, make_model_collective:
// above 2 ranks the all-reduce sums in rank order, collective.h): a row's logits are the same
// bits alone as beside two long prompts in an Extend step, and beside two rows in Decode steps.
TEST(TpInvariance, ARowAloneEqualsTheRowAmongOthersBitForBit) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world < 2) GTEST_SKIP() << "needs at least 2 ranks";
  service_config cfg = load_config_string(synthetic_yaml(2, 2) + "determinism: batch_invariant\n");
  cfg.cache.max_requests = 4;
  cfg.cache.max_context = 512;
  cfg.cache.page_size = 16;
  cfg.parallel.tp = world;
  const model_config mc = resolve_model_config(cfg);
  const kernels::exec_context ctx = kernels::open_device(device_kind::kCpu, 0, cfg.kernels);
  auto comm = worker::make_model_collective(cfg, MPI_COMM_WORLD, world, 0);
  engine alone(worker::make_model(cfg, mc, worker::tp_placement{rank, world}, comm.get(), ctx), cfg.cache);
  engine among(worker::make_model(cfg, mc, worker::tp_placement{rank, world}, comm.get(), ctx), cfg.cache);
  const int32_t a0 = alone.open_request();
  const int32_t b0 = among.open_request(), b1 = among.open_request(), b2 = among.open_request();
  auto prompt = [](int len, int seed) {
    std::vector<int32_t> p(static_cast<size_t>(len));
    for (int i = 0; i < len; ++i) p[static_cast<size_t>(i)] = (i * 37 + seed * 101 + 5) % 256;
    return p;
  };
  const std::vector<int32_t> mine = prompt(21, 1);
  // The row goes last among the others: its elements sit at the end of each reduced message.
  auto same_row = [&](const host_tensor& la, const host_tensor& lb, const std::string& what) {
    ASSERT_EQ(la.shape()[1], lb.shape()[1]) << what;
    const int64_t v = la.shape()[1];
    EXPECT_EQ(std::memcmp(la.as<float>(), lb.as<float>() + (lb.shape()[0] - 1) * v, static_cast<size_t>(v) * sizeof(float)),
              0)
        << what << ": the row's logits differ on rank " << rank;
  };
  same_row(alone.step(forward_mode::kExtend, {{a0, mine}}, {}),
           among.step(forward_mode::kExtend, {{b1, prompt(300, 2)}, {b2, prompt(150, 3)}, {b0, mine}}, {}), "extend");
  for (int s = 0; s < 4; ++s) {
    const auto t = static_cast<int32_t>(40 + s);
    same_row(alone.step(forward_mode::kDecode, {{a0, {t}}}, {}),
             among.step(forward_mode::kDecode, {{b1, {static_cast<int32_t>(90 + s)}}, {b2, {7}}, {b0, {t}}}, {}),
             "decode " + std::to_string(s));
  }
}

// Loading yaml's model over this job's ranks fails at start-up, before any collective, with a
// config_error whose text contains `names`.
void expect_startup_error(const std::string& yaml, int rank, int world, const std::string& names) {
  const service_config cfg = load_config_string(yaml);
  const model_config mc = resolve_model_config(cfg);
  auto comm = worker::make_mpi_collective(MPI_COMM_WORLD);
  try {
    worker::make_model(cfg, mc, worker::tp_placement{rank, world}, comm.get());
    FAIL() << "expected a start-up error";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
  }
}

TEST(TpStartup, UnsupportedSplitNamesTheDimension) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world < 2) GTEST_SKIP() << "needs at least 2 ranks";
  // 3 attention heads cannot be split over 2 ranks; loading fails before any collective.
  std::string yaml = synthetic_yaml(1, 1);
  yaml.replace(yaml.find("num_attention_heads: 4"), 22, "num_attention_heads: 3");
  expect_startup_error(yaml, rank, world, "num_attention_heads");
}

TEST(TpStartup, GroupsNeitherDividingNorDividedByTpNameTheField) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != 2 && world != 4) GTEST_SKIP() << "runs at 2 or 4 ranks";
  // 3 B/C groups over 2 or 4 ranks (12 heads split evenly): neither split nor one per rank.
  std::string yaml = synthetic_yaml(3, 1);
  yaml.replace(yaml.find("mamba_n_heads: 4"), 16, "mamba_n_heads: 12");
  expect_startup_error(yaml, rank, world, "mamba_n_groups = 3");
}

// Sparse attention scores a page over every KV head (the ranks' partial scores are summed):
// with fewer KV heads than ranks a head's query heads are split and its score cannot be formed.
TEST(TpStartup, SparseAttentionWithReplicatedKvHeadsNamesTheLimit) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world < 2) GTEST_SKIP() << "needs at least 2 ranks";
  const std::string sparse = "sparsity: {algorithm: quest, page_budget: 4}\n";
  expect_startup_error(synthetic_yaml(1, 1) + sparse, rank, world, "num_key_value_heads = 1 must be a multiple of tp");
  // Two KV heads split over two ranks load (and select through the summed scores).
  if (world == 2) {
    service_config cfg = load_config_string(synthetic_yaml(2, 2) + sparse);
    auto comm = worker::make_mpi_collective(MPI_COMM_WORLD);
    EXPECT_NO_THROW(worker::make_model(cfg, resolve_model_config(cfg), worker::tp_placement{rank, world}, comm.get()));
  }
}

}  // namespace
}  // namespace hyserve

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {  // one rank reports; every rank still runs and asserts
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS();
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return failed;
}
