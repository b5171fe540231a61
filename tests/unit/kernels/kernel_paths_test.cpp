// The kernel paths' way from the execution context to the launchers (kernels/paths.h): outside
// any scope the defaults, inside the innermost scope's paths, restored when a scope ends;
// open_device puts the paths it is given into the context. Host-only: no device needed.
#include "hyserve/kernels/paths.h"

#include <gtest/gtest.h>

#include <thread>

#include "hyserve/kernels/device.h"

namespace hyserve::kernels {
namespace {

TEST(KernelPaths, DefaultsOutsideAnyScope) {
  const kernel_paths& k = current_paths();
  EXPECT_EQ(k.skinny, kernel_paths::skinny_kind::kDefault);
  EXPECT_EQ(k.sparse_select, kernel_paths::sparse_select_kind::kDefault);
  EXPECT_TRUE(k.pdl);
  EXPECT_TRUE(k.norm_linear);
  EXPECT_EQ(k.attn_decode_waves, 0);
  EXPECT_EQ(k.attn_decode_max_slices, 0);
}

TEST(KernelPaths, ScopesNestAndRestore) {
  kernel_paths outer;
  outer.skinny = kernel_paths::skinny_kind::kMma;
  kernel_paths inner;
  inner.pdl = false;
  {
    const paths_scope a(outer);
    EXPECT_EQ(current_paths().skinny, kernel_paths::skinny_kind::kMma);
    {
      const paths_scope b(inner);
      EXPECT_EQ(current_paths().skinny, kernel_paths::skinny_kind::kDefault);
      EXPECT_FALSE(current_paths().pdl);
    }
    EXPECT_EQ(current_paths().skinny, kernel_paths::skinny_kind::kMma);
    EXPECT_TRUE(current_paths().pdl);
  }
  EXPECT_EQ(current_paths().skinny, kernel_paths::skinny_kind::kDefault);
}

// A scope is per thread: another thread's ops keep their own paths.
TEST(KernelPaths, ScopeIsPerThread) {
  kernel_paths mine;
  mine.sparse_select = kernel_paths::sparse_select_kind::kV1;
  const paths_scope scope(mine);
  kernel_paths::sparse_select_kind seen = kernel_paths::sparse_select_kind::kV1;
  std::thread([&] { seen = current_paths().sparse_select; }).join();
  EXPECT_EQ(seen, kernel_paths::sparse_select_kind::kDefault);
  EXPECT_EQ(current_paths().sparse_select, kernel_paths::sparse_select_kind::kV1);
}

TEST(KernelPaths, OpenDeviceCarriesThePaths) {
  kernel_paths k;
  k.ssd_scan = kernel_paths::ssd_scan_kind::kParallelOctY;
  k.gdn_cluster = 2;
  const exec_context ctx = open_device(device_kind::kCpu, 0, k);
  EXPECT_EQ(ctx.device, device_kind::kCpu);
  EXPECT_EQ(ctx.paths.ssd_scan, kernel_paths::ssd_scan_kind::kParallelOctY);
  EXPECT_EQ(ctx.paths.gdn_cluster, 2);
  EXPECT_EQ(open_device(device_kind::kCpu).paths.ssd_scan, kernel_paths::ssd_scan_kind::kDefault);
}

}  // namespace
}  // namespace hyserve::kernels
