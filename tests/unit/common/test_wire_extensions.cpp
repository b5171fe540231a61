// The step plan's extensions (after the base layout, each under its tag): speculative draft
// commits and KV moves, extend rows of a verify step, and the prefix cache's state copies.
// Plans that use none encode exactly as before the extensions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <string>

#include "wire_test_support.h"

namespace hyserve::wire {
namespace {

// ---- speculative extension of step_plan ------------------------------------------------------

TEST(WireSpecExtension, RoundTripsDraftCommits) {
  const step_plan in = spec_plan();
  const step_plan out = decode_step_plan(encode(in));
  EXPECT_TRUE(out == in);
  ASSERT_EQ(out.draft_commits.size(), 3u);
  EXPECT_EQ(out.draft_commits[0].accepted_step, 3);
}

// Without draft commits the encoding is the pre-extension layout: same bytes, and the extension
// adds exactly tag + count + 12 bytes per commit.
TEST(WireSpecExtension, AbsentWhenUnusedSoOldPlansAreUnchanged) {
  step_plan plain = sample_plan();
  const bytes_t a = encode(plain);
  const bytes_t b = encode(spec_plan());
  EXPECT_EQ(b.size(), a.size() + 1 + 4 + 3 * 12 + 4 + 12);
  EXPECT_TRUE(std::equal(a.begin() + kHeaderBytes, a.end(), b.begin() + kHeaderBytes));
  EXPECT_TRUE(decode_step_plan(a).draft_commits.empty());
  // Either list alone is enough to carry the extension.
  step_plan moves_only = sample_plan();
  moves_only.kv_moves = {{1, 5, 4}};
  EXPECT_TRUE(decode_step_plan(encode(moves_only)) == moves_only);
}

// Prefix caching: checkpoint restores and saves travel in their own extension, after the others.
TEST(WirePrefixExtension, StateCopiesRoundTripAndAreValidated) {
  step_plan restores = sample_plan();
  restores.state_restores = {{70, 3}, {71, 5}};
  EXPECT_TRUE(decode_step_plan(encode(restores)) == restores);
  step_plan saves = spec_plan();
  saves.extend_rows = 1;
  saves.draft_width = 2;
  saves.state_saves = {{4, 72}};
  EXPECT_TRUE(decode_step_plan(encode(saves)) == saves);
  EXPECT_EQ(encode(sample_plan()).size() + 1 + 4 + 2 * 8 + 4, encode(restores).size());
  step_plan bad = sample_plan();
  bad.state_saves = {{-1, 3}};
  const std::string msg = error_of([&] { (void)encode(bad); });
  EXPECT_NE(msg.find("step_plan.state_saves[0].src_slot"), std::string::npos) << msg;
  bytes_t empty = encode(sample_plan());
  empty.push_back(kPlanExtensionPrefix);
  for (int i = 0; i < 8; ++i) empty.push_back(0);
  reseal(empty);
  EXPECT_THROW(decode_step_plan(empty), wire_error);
}

TEST(WireSpecExtension, UnknownTagAndEmptyExtensionAreRejected) {
  bytes_t b = encode(spec_plan());
  const size_t tag_at = encode(sample_plan()).size();
  b[tag_at] = 9;
  reseal(b);
  const std::string msg = error_of([&] { decode_step_plan(b); });
  EXPECT_NE(msg.find("unknown extension tag 9"), std::string::npos) << msg;

  bytes_t empty = encode(sample_plan());
  empty.push_back(kPlanExtensionSpec);
  for (int i = 0; i < 8; ++i) empty.push_back(0);
  reseal(empty);
  EXPECT_THROW(decode_step_plan(empty), wire_error);
}

// A verify step carrying prefill rows: extend_rows travels in its own extension after the
// speculative one; alone, with it, and out of range.
TEST(WireSpecExtension, ExtendRowsOfAVerifyStepRoundTrip) {
  step_plan alone = sample_plan();
  alone.extend_rows = 1;
  EXPECT_TRUE(decode_step_plan(encode(alone)) == alone);
  step_plan both = spec_plan();
  both.extend_rows = static_cast<int32_t>(both.rows.size());
  EXPECT_TRUE(decode_step_plan(encode(both)) == both);
  step_plan wide = both;
  wide.draft_width = 3;
  EXPECT_TRUE(decode_step_plan(encode(wide)) == wide);
  step_plan too_many = sample_plan();
  too_many.extend_rows = static_cast<int32_t>(too_many.rows.size()) + 1;
  const std::string msg = error_of([&] { (void)encode(too_many); });
  EXPECT_NE(msg.find("step_plan.extend_rows"), std::string::npos) << msg;
  // The tag may not repeat.
  bytes_t twice = encode(alone);
  twice.push_back(kPlanExtensionMixed);
  for (int i = 0; i < 4; ++i) twice.push_back(i == 0 ? 1 : 0);
  reseal(twice);
  EXPECT_THROW(decode_step_plan(twice), wire_error);
}

TEST(WireSpecExtension, ValidatesDraftCommitAndKvMoveFields) {
  step_plan m = spec_plan();
  m.draft_commits[1].row = -1;
  std::string msg = error_of([&] { (void)encode(m); });
  EXPECT_NE(msg.find("draft_commits"), std::string::npos) << msg;
  m = spec_plan();
  m.kv_moves[0].from_pos = -3;
  msg = error_of([&] { (void)encode(m); });
  EXPECT_NE(msg.find("kv_moves"), std::string::npos) << msg;
}

// Every truncation is rejected, except the one that cuts exactly the whole extension off (that
// is a valid plan without draft commits).
TEST(WireSpecExtension, EveryTruncationRejectedOrTheBasePlan) {
  const bytes_t good = encode(spec_plan());
  const size_t base = encode(sample_plan()).size();
  for (size_t n = kHeaderBytes; n < good.size(); ++n) {
    bytes_t sealed(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    reseal(sealed);
    if (n == base) {
      EXPECT_TRUE(decode_step_plan(sealed) == sample_plan());
      continue;
    }
    EXPECT_THROW(decode_step_plan(sealed), wire_error) << "prefix " << n;
  }
}

}  // namespace
}  // namespace hyserve::wire
