// Sparse selection in two phases around an all-reduce (tensor parallelism: every rank scores the
// pages with its own KV heads, the scores are summed, every rank selects from the sums), CUDA
// against the CPU op on the same shards:
//  - phase kScore: each shard's scores within 1e-4 + 1e-4·|want| of the CPU's (fp32 sums in
//    another order than the CPU's double sums); rows that do not choose are left untouched;
//  - phase kSelect: from the same summed scores, page tables and lengths identical (the same
//    float keys, ties to the lower page index).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "hyserve/kernels/device.h"

#if defined(HYSERVE_HAVE_CUDA)

#include "cuda_test_util.h"
#include "hyserve/kernels/sparse_attention.h"

namespace hyserve::kernels {
namespace {

using cuda_test::expect_match;
using cuda_test::random_floats;

struct shard_data {
  int64_t q_heads = 0, kv_heads = 0;
  std::vector<float> q, key_min, key_max;
};

constexpr int64_t kKvHeads = 4, kGqa = 2, kD = 16, kPs = 16;

struct phases_scene {
  std::vector<int32_t> lens, qsl, table;
  int64_t stride = 0, num_pages = 0;
  shard_data whole;

  // Rank `part` of `parts`: its KV heads with their query heads.
  shard_data shard(int64_t parts, int64_t part) const {
    shard_data s;
    s.kv_heads = kKvHeads / parts;
    s.q_heads = s.kv_heads * kGqa;
    const auto bs = static_cast<int64_t>(lens.size());
    s.q.resize(static_cast<size_t>(bs * s.q_heads * kD));
    for (int64_t t = 0; t < bs; ++t)
      std::copy_n(whole.q.begin() + (t * whole.q_heads + part * s.q_heads) * kD, s.q_heads * kD,
                  s.q.begin() + t * s.q_heads * kD);
    s.key_min.resize(static_cast<size_t>(num_pages * s.kv_heads * kD));
    s.key_max.resize(s.key_min.size());
    for (int64_t pg = 0; pg < num_pages; ++pg) {
      std::copy_n(whole.key_min.begin() + (pg * kKvHeads + part * s.kv_heads) * kD, s.kv_heads * kD,
                  s.key_min.begin() + pg * s.kv_heads * kD);
      std::copy_n(whole.key_max.begin() + (pg * kKvHeads + part * s.kv_heads) * kD, s.kv_heads * kD,
                  s.key_max.begin() + pg * s.kv_heads * kD);
    }
    return s;
  }
};

// Rows above and below the budget, partial last pages, and an 8192-page row (several scoring
// blocks, the radix select over keys re-read from the workspace).
phases_scene make_scene(uint32_t seed) {
  phases_scene s;
  s.lens = {40 * 16 + 3, 9 * 16, 2 * 16, 23 * 16 + 9, 8192 * 16 - 5};
  for (int32_t len : s.lens) s.stride = std::max<int64_t>(s.stride, (len + kPs - 1) / kPs);
  int64_t total = 0;
  for (int32_t len : s.lens) total += (len + kPs - 1) / kPs;
  s.num_pages = total + 5;
  std::vector<int32_t> ids(static_cast<size_t>(s.num_pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  s.table.assign(s.lens.size() * static_cast<size_t>(s.stride), -1);
  size_t next = 0;
  for (size_t b = 0; b < s.lens.size(); ++b)
    for (int64_t i = 0; i < (s.lens[b] + kPs - 1) / kPs; ++i) s.table[b * static_cast<size_t>(s.stride) + i] = ids[next++];
  s.qsl.resize(s.lens.size() + 1);
  std::iota(s.qsl.begin(), s.qsl.end(), 0);
  s.whole.kv_heads = kKvHeads;
  s.whole.q_heads = kKvHeads * kGqa;
  s.whole.q = random_floats(s.lens.size() * static_cast<size_t>(s.whole.q_heads * kD), seed + 1);
  s.whole.key_min = random_floats(static_cast<size_t>(s.num_pages * kKvHeads * kD), seed + 2, -2.0f, 0.0f);
  s.whole.key_max = random_floats(s.whole.key_min.size(), seed + 3, 0.0f, 2.0f);
  return s;
}

sparse_select_params params(const phases_scene& s, const shard_data& sh, int64_t budget) {
  sparse_select_params p;
  p.batch = static_cast<int64_t>(s.lens.size());
  p.q_heads = sh.q_heads;
  p.kv_heads = sh.kv_heads;
  p.head_dim = kD;
  p.page_size = kPs;
  p.page_table_stride = p.out_page_table_stride = s.stride;
  p.q_stride = sh.q_heads * kD;
  p.page_budget = budget;
  p.sink_pages = 1;
  p.recent_pages = 2;
  return p;
}

// The op on the host (CUDA false) or the device, in `mode`, over `scores`; returns the scores
// (kScore) or fills table / lens (kSelect).
struct run_result {
  std::vector<float> scores;
  std::vector<int32_t> table, lens;
};
run_result run_phase(const phases_scene& s, const shard_data& sh, int64_t budget, sparse_select_params::phase mode,
                     const std::vector<float>& scores_in, bool cuda) {
  sparse_select_params p = params(s, sh, budget);
  p.mode = mode;
  run_result r{scores_in, std::vector<int32_t>(s.table.size(), -3), std::vector<int32_t>(s.lens.size(), -3)};
  if (!cuda) {
    p.q = sh.q.data();
    p.query_start_loc = s.qsl.data();
    p.seq_lens = {s.lens.data(), p.batch, nullptr};
    p.page_table = s.table.data();
    p.key_min = sh.key_min.data();
    p.key_max = sh.key_max.data();
    p.scores = r.scores.data();
    p.out_page_table = r.table.data();
    p.out_seq_lens = r.lens.data();
    run_cpu(p);
    return r;
  }
  device_array<float> q(sh.q), kmin(sh.key_min), kmax(sh.key_max), scores(r.scores);
  device_array<int32_t> qsl(s.qsl), lens(s.lens), table(s.table), out_table(r.table), out_lens(r.lens);
  p.q = q.data();
  p.query_start_loc = qsl.data();
  p.seq_lens = {lens.data(), p.batch, s.lens.data()};
  p.page_table = table.data();
  p.key_min = kmin.data();
  p.key_max = kmax.data();
  p.scores = scores.data();
  p.out_page_table = out_table.data();
  p.out_seq_lens = out_lens.data();
  run_cuda(p, nullptr);
  device_synchronize();
  r.scores = scores.download();
  r.table = out_table.download();
  r.lens = out_lens.download();
  return r;
}

TEST(SparseSelectPhasesCuda, ShardScoresAndSelectionFromSumsMatchCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const phases_scene s = make_scene(77u);
  using phase = sparse_select_params::phase;
  for (int64_t parts : {1, 2, 4}) {
    for (int64_t budget : {6, 64}) {
      const std::string what = std::to_string(parts) + " ranks, budget " + std::to_string(budget);
      const std::vector<float> zeros(s.lens.size() * static_cast<size_t>(s.stride), 0.0f);
      std::vector<float> sum = zeros;
      for (int64_t part = 0; part < parts; ++part) {
        const shard_data sh = s.shard(parts, part);
        const run_result want = run_phase(s, sh, budget, phase::kScore, zeros, false);
        const run_result got = run_phase(s, sh, budget, phase::kScore, zeros, true);
        expect_match(got.scores, want.scores, 1e-4, 1e-4, what + " scores of rank " + std::to_string(part));
        EXPECT_TRUE(std::all_of(got.table.begin(), got.table.end(), [](int32_t v) { return v == -3; })) << what;
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += want.scores[i];
      }
      const shard_data first = s.shard(parts, 0);
      const run_result want = run_phase(s, first, budget, phase::kSelect, sum, false);
      const run_result got = run_phase(s, first, budget, phase::kSelect, sum, true);
      EXPECT_EQ(got.lens, want.lens) << what;
      EXPECT_EQ(got.table, want.table) << what;
      // The 8192-page row really chose: fewer selected pages than it has.
      EXPECT_LT(want.lens.back(), s.lens.back()) << what;
    }
  }
}

}  // namespace
}  // namespace hyserve::kernels

#endif  // HYSERVE_HAVE_CUDA
