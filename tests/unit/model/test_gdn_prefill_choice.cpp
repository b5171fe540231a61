// The model's dtype chooses the Gated DeltaNet prefill kernel (gdn_layer.h, gdn_prefill_for):
// bf16 models take the bf16 tensor-core path, f32 models tc; model.gdn_prefill overrides.
#include <gtest/gtest.h>

#include "../../../worker/model/gdn_layer.h"

namespace hyserve::worker::layers {
namespace {

using kernels::gdn_prefill_kernel;

TEST(GdnPrefillChoice, AutoFollowsTheWeightType) {
  EXPECT_EQ(gdn_prefill_for(gdn_prefill_choice::kAuto, dtype::kBF16), gdn_prefill_kernel::kBf16);
  EXPECT_EQ(gdn_prefill_for(gdn_prefill_choice::kAuto, dtype::kF32), gdn_prefill_kernel::kTc);
}

TEST(GdnPrefillChoice, ANamedPathWins) {
  EXPECT_EQ(gdn_prefill_for(gdn_prefill_choice::kTc, dtype::kBF16), gdn_prefill_kernel::kTc);
  EXPECT_EQ(gdn_prefill_for(gdn_prefill_choice::kBf16, dtype::kF32), gdn_prefill_kernel::kBf16);
  EXPECT_EQ(gdn_prefill_for(gdn_prefill_choice::kTf32, dtype::kF32), gdn_prefill_kernel::kTf32);
  EXPECT_EQ(gdn_prefill_for(gdn_prefill_choice::kRecurrent, dtype::kBF16), gdn_prefill_kernel::kRecurrent);
}

}  // namespace
}  // namespace hyserve::worker::layers
