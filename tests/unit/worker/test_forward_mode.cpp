#include <gtest/gtest.h>

#include <string>

#include "hyserve/common/error.h"
#include "hyserve/worker/forward_batch.h"
#include "hyserve/worker/forward_mode.h"
#include "hyserve/worker/hybrid_metadata.h"

namespace hyserve::worker {
namespace {

constexpr const char* kSupported =
    "supported: 0=extend, 1=decode, 2=mixed, 3=idle, 4=target_verify, 5=draft_extend, 6=draft";

std::string error_of(uint8_t byte) {
  try {
    (void)forward_mode_from_byte(byte);
  } catch (const invalid_argument_error& e) {
    return e.what();
  }
  return "no error";
}

TEST(ForwardMode, NamesOfAllModes) {
  EXPECT_EQ(forward_mode_name(forward_mode::kExtend), "extend");
  EXPECT_EQ(forward_mode_name(forward_mode::kDecode), "decode");
  EXPECT_EQ(forward_mode_name(forward_mode::kMixed), "mixed");
  EXPECT_EQ(forward_mode_name(forward_mode::kIdle), "idle");
  EXPECT_EQ(forward_mode_name(forward_mode::kTargetVerify), "target_verify");
  EXPECT_EQ(forward_mode_name(forward_mode::kDraftExtend), "draft_extend");
  EXPECT_EQ(forward_mode_name(forward_mode::kDraft), "draft");
}

TEST(ForwardMode, EveryModeRoundTripsThroughItsByte) {
  for (forward_mode m : kAllForwardModes) EXPECT_EQ(forward_mode_from_byte(static_cast<uint8_t>(m)), m);
}

TEST(ForwardMode, InvalidByte7IsRejectedNamingValueAndSupportedSet) {
  EXPECT_THROW((void)forward_mode_from_byte(7), invalid_argument_error);
  EXPECT_EQ(error_of(7), std::string("invalid forward mode byte 7; ") + kSupported);
}

TEST(ForwardMode, InvalidByte255IsRejectedNamingValueAndSupportedSet) {
  EXPECT_THROW((void)forward_mode_from_byte(255), invalid_argument_error);
  EXPECT_EQ(error_of(255), std::string("invalid forward mode byte 255; ") + kSupported);
}

TEST(ForwardMode, ExtendLikeModes) {
  EXPECT_TRUE(is_extend_like(forward_mode::kExtend));
  EXPECT_TRUE(is_extend_like(forward_mode::kMixed));
  EXPECT_TRUE(is_extend_like(forward_mode::kDraftExtend));
  EXPECT_FALSE(is_extend_like(forward_mode::kDecode));
  EXPECT_FALSE(is_extend_like(forward_mode::kIdle));
  EXPECT_FALSE(is_extend_like(forward_mode::kTargetVerify));
  EXPECT_FALSE(is_extend_like(forward_mode::kDraft));
}

TEST(ForwardMode, StepScratchModes) {
  EXPECT_TRUE(writes_step_scratch(forward_mode::kTargetVerify));
  EXPECT_TRUE(writes_step_scratch(forward_mode::kDraft));
  EXPECT_FALSE(writes_step_scratch(forward_mode::kExtend));
  EXPECT_FALSE(writes_step_scratch(forward_mode::kDecode));
  EXPECT_FALSE(writes_step_scratch(forward_mode::kMixed));
  EXPECT_FALSE(writes_step_scratch(forward_mode::kIdle));
  EXPECT_FALSE(writes_step_scratch(forward_mode::kDraftExtend));
}

TEST(ForwardMode, MetadataOfModeCastFromInvalidByteIsRejected) {
  forward_batch b;
  b.mode = static_cast<forward_mode>(9);
  try {
    (void)build_hybrid_metadata(b);
    FAIL() << "expected invalid_argument_error";
  } catch (const invalid_argument_error& e) {
    EXPECT_EQ(std::string(e.what()), std::string("invalid forward mode byte 9; ") + kSupported);
  }
}

TEST(ForwardBatch, NumTokensSumsRows) {
  forward_batch b;
  EXPECT_EQ(b.num_tokens(), 0);
  b.rows.resize(3);
  b.rows[0].tokens = {1, 2, 3};
  b.rows[2].tokens = {4};
  EXPECT_EQ(b.num_tokens(), 4);
}

}  // namespace
}  // namespace hyserve::worker
