// Graph arenas (kernels/graph.h): a capture with a graph_arena carves every allocation of the
// captured code (tensors and the ops' scratch) from the arena, so the graph holds no memory
// nodes; an arena_footprint measured over an eager run of the same code sizes the arena
// exactly; the replays equal the eager run bit for bit (same kernels, same shapes); an arena
// too small falls back to graph memory nodes and still replays correctly.
// The captured code: rmsnorm into a fresh tensor, a bf16-weight GEMM of 16 rows (not skinny:
// the op converts A to bf16 in a scratch block), the rmsnorm output released, a second tensor
// (which reuses the released range), an f32 GEMM into it, a copy into a static output.
// A capture made on a thread that has exited replays on another thread: cuBLAS GEMMs of the
// decode shapes of the 9B model (m = 32) read a workspace the graph owns (arena scratch), not
// the capturing thread's handle workspace, which is freed with that thread.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <tuple>
#include <string>
#include <thread>
#include <vector>

#include "hyserve/kernels/device.h"

#if defined(HYSERVE_HAVE_CUDA)

#include "cuda_test_util.h"
#include "hyserve/common/dtype.h"
#include "hyserve/common/tensor.h"
#include "hyserve/kernels/gemm.h"
#include "hyserve/kernels/graph.h"
#include "hyserve/kernels/norm.h"

namespace hyserve::kernels {
namespace {

using cuda_test::random_floats;

constexpr int64_t kM = 16, kK = 256, kN = 128;

// Random weights stored as bf16 on the device.
device_array<uint16_t> bf16_weights(size_t count, uint32_t seed) {
  const std::vector<float> w = random_floats(count, seed);
  std::vector<uint16_t> bits(w.size());
  for (size_t i = 0; i < w.size(); ++i) bits[i] = f32_to_bf16(w[i]);
  return device_array<uint16_t>(bits);
}

// c[m, n] = a[m, k] · bᵀ with a bf16 b [n, k], all compact, on `stream`.
void gemm_bf16(const float* a, const uint16_t* b, float* c, int64_t m, int64_t n, int64_t k, void* stream) {
  gemm_params g;
  g.a = a;
  g.b = b;
  g.b_dtype = dtype::kBF16;
  g.c = c;
  g.m = m;
  g.n = n;
  g.k = k;
  g.lda = k;
  g.ldb = k;
  g.ldc = n;
  g.trans_b = true;
  run_cuda(g, stream);
}

struct arena_case {
  device_array<float> x, norm_w, w2, out;
  device_array<uint16_t> w1;  // bf16 [kN, kK]

  arena_case() {
    x = device_array<float>(random_floats(static_cast<size_t>(kM * kK), 11));
    norm_w = device_array<float>(random_floats(static_cast<size_t>(kK), 12, 0.5f, 1.5f));
    w2 = device_array<float>(random_floats(static_cast<size_t>(kN * kN), 13));
    w1 = bf16_weights(static_cast<size_t>(kN * kK), 14);
    out = device_array<float>(static_cast<size_t>(kM * kN));
  }

  // The code under capture; every op on `stream`.
  void body(void* stream) const {
    tensor xn = tensor::f32({kM, kK}, device_kind::kCuda);
    rmsnorm_params r;
    r.x = x.data();
    r.weight = norm_w.data();
    r.out = xn.as<float>();
    r.rows = kM;
    r.cols = kK;
    r.x_stride = r.out_stride = kK;
    run_cuda(r, stream);
    tensor y = tensor::f32({kM, kN}, device_kind::kCuda);
    gemm_bf16(xn.as<float>(), w1.data(), y.as<float>(), kM, kN, kK, stream);
    xn = tensor();  // released: the next tensor may take its range
    tensor z = tensor::f32({kM, kN}, device_kind::kCuda);
    gemm_params h;
    h.a = y.as<float>();
    h.b = w2.data();
    h.c = z.as<float>();
    h.m = kM;
    h.n = kN;
    h.k = kN;
    h.lda = h.ldb = h.ldc = kN;
    h.trans_b = true;
    run_cuda(h, stream);
    copy_d2d_async(out.data(), z.data(), z.nbytes(), stream);
  }
};

class GraphArenaCuda : public testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    install_device_allocators();
    stream_ = stream_create();
  }
  void TearDown() override {
    if (stream_ != nullptr) stream_destroy(stream_);
  }

  // One eager run of the body on the stream (inside an allocation scope of it); its output and
  // the arena footprint of its allocations.
  std::vector<float> eager(arena_case& c, size_t* footprint) {
    c.out.fill_bytes(0xff);
    {
      const allocation_stream_scope scope(stream_);
      const arena_footprint measure;
      c.body(stream_);
      *footprint = measure.bytes();
    }
    stream_synchronize(stream_);
    return c.out.download();
  }

  captured_graph capture(const arena_case& c, graph_arena* arena) {
    device_synchronize();
    captured_graph::capture_begin(stream_, arena);
    try {
      c.body(stream_);
    } catch (...) {
      captured_graph::capture_abort(stream_);
      throw;
    }
    return captured_graph::capture_end(stream_);
  }

  std::vector<float> replay(arena_case& c, const captured_graph& g) {
    c.out.fill_bytes(0xff);
    device_synchronize();
    g.launch(stream_);
    g.launch(stream_);
    stream_synchronize(stream_);
    return c.out.download();
  }

  void* stream_ = nullptr;
};

void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) ++bad;
  EXPECT_EQ(bad, 0u) << what << ": elements differing from the eager run";
}

TEST_F(GraphArenaCuda, CaptureHoldsNoMemoryNodesAndReplaysEqualEager) {
  arena_case c;
  size_t footprint = 0;
  const std::vector<float> want = eager(c, &footprint);
  // xn, y, z, the GEMM's bf16 copy of A and one cuBLAS workspace at a time (32 MiB, released
  // after each call); z reuses xn's range, so less than their sum.
  const size_t workspace = size_t{32} << 20;
  const size_t sum = static_cast<size_t>(kM * kK * 4 + 2 * kM * kN * 4 + kM * kK * 2) + workspace;
  EXPECT_GT(footprint, workspace);
  EXPECT_LT(footprint, sum);
  size_t again = 0;
  EXPECT_EQ(eager(c, &again), want) << "eager runs differ";
  EXPECT_EQ(again, footprint);

  graph_arena arena(footprint);
  const captured_graph g = capture(c, &arena);
  EXPECT_EQ(g.stats().mem_allocs, 0);
  EXPECT_EQ(g.stats().mem_frees, 0);
  EXPECT_GE(g.stats().kernels, 3);
  EXPECT_EQ(g.stats().arena_bytes, static_cast<int64_t>(footprint));
  expect_bitwise(replay(c, g), want, "replay from the arena");
  // Eager allocations after the capture do not touch the arena the graph still uses.
  EXPECT_EQ(eager(c, &again), want);
  expect_bitwise(replay(c, g), want, "replay after an eager run");
}

TEST_F(GraphArenaCuda, ArenaTooSmallFallsBackToMemoryNodes) {
  arena_case c;
  size_t footprint = 0;
  const std::vector<float> want = eager(c, &footprint);
  graph_arena arena(256);  // holds none of the blocks
  const captured_graph g = capture(c, &arena);
  EXPECT_GT(g.stats().mem_allocs, 0);
  EXPECT_EQ(g.stats().mem_allocs, g.stats().mem_frees);
  expect_bitwise(replay(c, g), want, "replay with memory nodes");
}

TEST_F(GraphArenaCuda, WithoutArenaTheCaptureUsesMemoryNodes) {
  arena_case c;
  size_t footprint = 0;
  const std::vector<float> want = eager(c, &footprint);
  const captured_graph g = capture(c, nullptr);
  EXPECT_GE(g.stats().mem_allocs, 3);  // xn, y, z (and the GEMM's scratch)
  EXPECT_EQ(g.stats().arena_bytes, 0);
  expect_bitwise(replay(c, g), want, "replay with memory nodes");
}

// C = A·Bᵀ with a bf16 B [n, k] and m rows (cuBLAS: m is above the skinny kernel's 8).
struct gemm_case {
  int64_t m, n, k;
  device_array<float> a, c;
  device_array<uint16_t> b;

  gemm_case(int64_t m_, int64_t n_, int64_t k_) : m(m_), n(n_), k(k_) {
    a = device_array<float>(random_floats(static_cast<size_t>(m * k), 21));
    b = bf16_weights(static_cast<size_t>(n * k), 22);
    c = device_array<float>(static_cast<size_t>(m * n));
  }
  void body(void* stream) const { gemm_bf16(a.data(), b.data(), c.data(), m, n, k, stream); }
};

TEST_F(GraphArenaCuda, GraphCapturedOnAnExitedThreadReplays) {
  // The 9B model's decode GEMMs at batch 32: down_proj, out_proj, in_proj.
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{32, 4096, 14336}, {32, 4096, 8192},
                                {32, 16768, 4096}}) {
    const std::string shape = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
    gemm_case c(m, n, k);
    c.c.fill_bytes(0xff);
    c.body(nullptr);
    device_synchronize();
    const std::vector<float> want = c.c.download();

    std::shared_ptr<graph_arena> arena;
    std::optional<captured_graph> g;
    std::string failure;
    std::thread capturer([&] {
      try {
        void* s = stream_create();
        size_t footprint = 0;
        {
          const allocation_stream_scope scope(s);
          const arena_footprint measure;
          c.body(s);
          footprint = measure.bytes();
        }
        stream_synchronize(s);
        arena = std::make_shared<graph_arena>(footprint);
        captured_graph::capture_begin(s, arena.get());
        c.body(s);
        g.emplace(captured_graph::capture_end(s));
        stream_destroy(s);
      } catch (const std::exception& e) {
        failure = e.what();
      }
    });
    capturer.join();  // its cuBLAS handle and that handle's workspace are gone now
    ASSERT_TRUE(failure.empty()) << shape << ": " << failure;
    ASSERT_TRUE(g.has_value());
    EXPECT_EQ(g->stats().mem_allocs, 0) << shape;
    c.c.fill_bytes(0xff);
    g->launch(stream_);
    g->launch(stream_);
    stream_synchronize(stream_);
    expect_bitwise(c.c.download(), want, "replay on another thread, " + shape);
  }
}

}  // namespace
}  // namespace hyserve::kernels

#endif  // HYSERVE_HAVE_CUDA
