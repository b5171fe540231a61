// Wire messages (hyserve/common/wire.h): round trips of every message with every field set, the
// header's layout and checks, and peek_type. Truncation, corruption and limits are in
// test_wire_corruption.cpp, the step plan's extensions in test_wire_extensions.cpp, fuzzing in
// test_wire_fuzz.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "wire_test_support.h"

namespace hyserve::wire {
namespace {

// ---- round trips ----------------------------------------------------------------------------

TEST(WireRoundTrip, StepPlanAllFieldsSet) {
  const step_plan in = sample_plan();
  const bytes_t bytes = encode(in);
  EXPECT_EQ(peek_type(bytes), message_type::kStepPlan);
  const step_plan out = decode_step_plan(bytes);
  EXPECT_TRUE(out == in);
  ASSERT_EQ(out.rows.size(), 3u);
  EXPECT_EQ(out.rows[1].retrieve_next_token, (std::vector<int32_t>{1, 2, -1}));
  EXPECT_EQ(out.rows[0].sample.seed, 0xfedcba9876543210ULL);
  EXPECT_EQ(out.commits[0].accepted_step, 2);
  EXPECT_EQ(encode(out), bytes);
}

// Logits processing travels in its extension for the rows that set it; other rows and plans are
// byte-identical to plans without it. Top logprobs come back only for the rows that asked.
TEST(WireRoundTrip, LogitsProcessingExtension) {
  step_plan in = sample_plan();
  const size_t plain_size = encode(in).size();
  in.rows[1].processing.repetition_penalty = 1.25f;
  in.rows[1].processing.presence_penalty = -0.5f;
  in.rows[1].processing.frequency_penalty = 0.75f;
  in.rows[1].processing.min_tokens = 4;
  in.rows[1].processing.prompt_len = 9;
  in.rows[1].processing.top_logprobs = 20;
  in.rows[1].processing.logprobs = true;
  in.rows[1].processing.min_tokens_mask = {2, 7};
  in.rows[1].processing.bias_ids = {5, 11};
  in.rows[1].processing.bias_values = {100.0f, -100.0f};
  in.rows[2].processing.logprobs = true;
  const bytes_t bytes = encode(in);
  EXPECT_GT(bytes.size(), plain_size);
  const step_plan out = decode_step_plan(bytes);
  EXPECT_TRUE(out == in);
  EXPECT_FALSE(out.rows[0].processing.any());
  EXPECT_TRUE(out.rows[1].processing.changes_logits());
  EXPECT_FALSE(out.rows[2].processing.changes_logits());
  step_plan bad = in;
  bad.rows[1].processing.top_logprobs = 21;
  EXPECT_THROW(encode(bad), wire_error);
  bad = in;
  bad.rows[1].processing.bias_values.pop_back();
  EXPECT_THROW(encode(bad), wire_error);

  step_result res = sample_result();
  res.rows[1].top_n = 2;
  res.rows[1].top_ids.assign(res.rows[1].tokens.size() * 2, 3);
  res.rows[1].top_logprobs.assign(res.rows[1].tokens.size() * 2, -1.5f);
  const step_result back = decode_step_result(encode(res));
  EXPECT_TRUE(back == res);
  EXPECT_EQ(back.rows[0].top_n, 0);
  res.rows[1].top_ids.pop_back();
  EXPECT_THROW(encode(res), wire_error);
}

TEST(WireRoundTrip, StepPlanIdleEmpty) {
  step_plan in;
  in.mode = 3;
  const step_plan out = decode_step_plan(encode(in));
  EXPECT_TRUE(out == in);
  EXPECT_TRUE(out.rows.empty());
}

TEST(WireRoundTrip, StepPlanModeByteAndSamplingFloatsPassThrough) {
  step_plan in = sample_plan();
  in.mode = 0xee;  // not an enumerator: the worker rejects it, the wire does not
  in.rows[0].sample.temperature = std::numeric_limits<float>::quiet_NaN();
  in.rows[0].sample.top_p = std::numeric_limits<float>::infinity();
  const step_plan out = decode_step_plan(encode(in));
  EXPECT_EQ(out.mode, 0xee);
  EXPECT_TRUE(std::isnan(out.rows[0].sample.temperature));
  EXPECT_TRUE(std::isinf(out.rows[0].sample.top_p));
  EXPECT_TRUE(out == in);
}

TEST(WireRoundTrip, StepPlanManyRows) {
  std::mt19937 rng(7);
  step_plan in;
  in.step_id = 5;
  for (int i = 0; i < 2000; ++i) {
    plan_row r;
    r.request_id = i;
    r.req_slot = i;
    r.mamba_slot = i % 7 == 0 ? -1 : i;
    r.tokens.resize(rng() % 9);
    for (auto& t : r.tokens) t = static_cast<int32_t>(rng() % 150000);
    r.sample.seed = rng();
    in.rows.push_back(std::move(r));
  }
  EXPECT_TRUE(decode_step_plan(encode(in)) == in);
}

TEST(WireRoundTrip, StepResultAllFieldsSet) {
  const step_result in = sample_result();
  const bytes_t bytes = encode(in);
  EXPECT_EQ(peek_type(bytes), message_type::kStepResult);
  const step_result out = decode_step_result(bytes);
  EXPECT_TRUE(out == in);
  EXPECT_EQ(out.error, in.error);
  ASSERT_EQ(out.rows.size(), 3u);
  EXPECT_TRUE(std::signbit(out.rows[0].logprobs[2]));
  EXPECT_EQ(out.step_ms, 12.375);
  EXPECT_EQ(out.decode_rows, 3);
  EXPECT_EQ(out.sparse_rows, 2);
  EXPECT_EQ(out.pages_read, 0x123456789LL);
}

TEST(WireRoundTrip, StepPlanDenseAttentionFlagPerRow) {
  const step_plan out = decode_step_plan(encode(sample_plan()));
  ASSERT_EQ(out.rows.size(), 3u);
  EXPECT_TRUE(out.rows[0].dense_attention);
  EXPECT_FALSE(out.rows[1].dense_attention);
  EXPECT_FALSE(out.rows[2].dense_attention);
  EXPECT_FALSE(plan_row{}.dense_attention);  // sparse attention is allowed unless a request opts out
}

TEST(WireRoundTrip, StepResultOk) {
  step_result in;
  in.step_id = 1;
  in.rows = {{3, {17}, {-0.25f}}};
  in.step_ms = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(decode_step_result(encode(in)) == in);
}

TEST(WireRoundTrip, HelloAllFieldsSet) {
  const hello in = sample_hello();
  const bytes_t bytes = encode(in);
  EXPECT_EQ(peek_type(bytes), message_type::kHello);
  EXPECT_TRUE(decode_hello(bytes) == in);
}

TEST(WireRoundTrip, Shutdown) {
  const bytes_t bytes = encode_shutdown();
  EXPECT_EQ(bytes.size(), kHeaderBytes);
  EXPECT_EQ(peek_type(bytes), message_type::kShutdown);
  EXPECT_NO_THROW(decode_shutdown(bytes));
}

TEST(WireRoundTrip, HeaderLayoutIsLittleEndian) {
  const bytes_t bytes = encode(sample_hello());
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 4), "HYSV");
  EXPECT_EQ(bytes[4], 2);
  EXPECT_EQ(bytes[5], 0);
  EXPECT_EQ(bytes[6], static_cast<uint8_t>(message_type::kHello));
  EXPECT_EQ(bytes[7], 0);
  EXPECT_EQ(get_u32(bytes, 8), bytes.size() - kHeaderBytes);
  EXPECT_EQ(get_u32(bytes, 16), 3u);  // dp_rank
}

TEST(WireRoundTrip, EncodedSizesOfMinimalMessages) {
  // Pins the layout: a plan is 27 fixed bytes + 71 per empty row + 12 per commit; a result is
  // 41 fixed bytes + 16 per empty row; hello is 40 bytes + the host.
  step_plan p;
  p.rows.resize(3);
  p.commits.resize(2, commit_op{0, 0, 0});
  EXPECT_EQ(encode(p).size(), kHeaderBytes + 27 + 3 * 71 + 2 * 12);
  EXPECT_TRUE(decode_step_plan(encode(p)) == p);
  step_result r;
  r.rows.resize(4);
  EXPECT_EQ(encode(r).size(), kHeaderBytes + 41 + 4 * 16);
  EXPECT_TRUE(decode_step_result(encode(r)) == r);
  hello h;
  EXPECT_EQ(encode(h).size(), kHeaderBytes + 40);
  EXPECT_TRUE(decode_hello(encode(h)) == h);
}

TEST(WireRoundTrip, MessageTypeNames) {
  EXPECT_STREQ(message_type_name(message_type::kHello), "hello");
  EXPECT_STREQ(message_type_name(message_type::kStepPlan), "step_plan");
  EXPECT_STREQ(message_type_name(message_type::kStepResult), "step_result");
  EXPECT_STREQ(message_type_name(message_type::kShutdown), "shutdown");
  EXPECT_STREQ(message_type_name(static_cast<message_type>(99)), "unknown");
}

// ---- header ---------------------------------------------------------------------------------

TEST(WireHeader, BadMagic) {
  bytes_t b = encode(sample_plan());
  b[0] ^= 0x20;
  EXPECT_WIRE_ERROR(decode_step_plan(b), "bad magic");
  EXPECT_WIRE_ERROR(peek_type(b), "bad magic");
}

TEST(WireHeader, UnsupportedVersion) {
  bytes_t b = encode(sample_plan());
  set_u16(b, 4, 3);
  EXPECT_WIRE_ERROR(decode_step_plan(b), "unsupported wire version 3 (supported: 2)");
  set_u16(b, 4, 1);  // the format before plan_row.dense_attention and the step statistics
  EXPECT_WIRE_ERROR(decode_step_plan(b), "unsupported wire version 1 (supported: 2)");
  set_u16(b, 4, 0);
  EXPECT_WIRE_ERROR(peek_type(b), "unsupported wire version 0 (supported: 2)");
}

TEST(WireHeader, WrongType) {
  const bytes_t plan = encode(sample_plan());
  EXPECT_WIRE_ERROR(decode_step_result(plan), "expected step_result, got step_plan");
  EXPECT_WIRE_ERROR(decode_hello(plan), "expected hello, got step_plan");
  EXPECT_WIRE_ERROR(decode_shutdown(plan), "expected shutdown, got step_plan");
  bytes_t b = plan;
  set_u16(b, 6, static_cast<uint16_t>(message_type::kStepResult));
  EXPECT_WIRE_ERROR(decode_step_plan(b), "expected step_plan, got step_result");
  EXPECT_WIRE_ERROR(decode_step_plan(encode_shutdown()), "expected step_plan, got shutdown");
}

TEST(WireHeader, UnknownType) {
  for (uint16_t t : {0, 5, 99, 0xffff}) {
    bytes_t b = encode(sample_plan());
    set_u16(b, 6, t);
    EXPECT_WIRE_ERROR(peek_type(b), "unknown message type " + std::to_string(t));
    EXPECT_WIRE_ERROR(decode_step_plan(b), "unknown message type " + std::to_string(t));
  }
}

TEST(WireHeader, PayloadLengthMismatch) {
  const bytes_t good = encode(sample_result());
  const uint32_t len = get_u32(good, 8);
  for (uint32_t bad : {len - 1, len + 1, 0u, 0xffffffffu}) {
    bytes_t b = good;
    set_u32(b, 8, bad);
    EXPECT_WIRE_ERROR(decode_step_result(b), "payload_len " + std::to_string(bad));
  }
  bytes_t trailing = good;
  trailing.push_back(0);
  EXPECT_WIRE_ERROR(decode_step_result(trailing), "trailing");
  EXPECT_WIRE_ERROR(peek_type(trailing), "trailing");
}

TEST(WireHeader, TruncatedHeader) {
  const bytes_t good = encode_shutdown();
  for (size_t n = 0; n < kHeaderBytes; ++n)
    EXPECT_WIRE_ERROR(peek_type(std::span<const uint8_t>(good.data(), n)), "truncated header");
}

TEST(WireHeader, ChecksumField) {
  bytes_t b = encode(sample_hello());
  b[13] ^= 0x01;
  EXPECT_WIRE_ERROR(decode_hello(b), "checksum mismatch");
  EXPECT_WIRE_ERROR(peek_type(b), "checksum mismatch");
}

// ---- peek ---------------------------------------------------------------------------------

TEST(WirePeek, EachType) {
  EXPECT_EQ(peek_type(encode(sample_hello())), message_type::kHello);
  EXPECT_EQ(peek_type(encode(sample_plan())), message_type::kStepPlan);
  EXPECT_EQ(peek_type(encode(sample_result())), message_type::kStepResult);
  EXPECT_EQ(peek_type(encode_shutdown()), message_type::kShutdown);
}

}  // namespace
}  // namespace hyserve::wire
