// Wire messages under damage: every truncation and payload byte flip rejected, bool bytes
// checked, counts beyond the limits rejected before allocating, and every checked field
// validated on encode and on decode with an error naming it.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "wire_test_support.h"

namespace hyserve::wire {
namespace {

// ---- truncation and corruption --------------------------------------------------------------

template <class Decode>
void expect_every_prefix_rejected(const bytes_t& good, Decode decode) {
  for (size_t n = 0; n < good.size(); ++n) {
    const bytes_t prefix(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(decode(prefix), wire_error) << "prefix length " << n;
    // With the header resealed the payload parser itself must find the missing bytes.
    if (n >= kHeaderBytes) {
      bytes_t sealed = prefix;
      reseal(sealed);
      const std::string msg = error_of([&] { decode(sealed); });
      EXPECT_NE(msg.find("truncated"), std::string::npos) << "payload prefix " << n << ": " << msg;
      EXPECT_NE(msg.find("at offset"), std::string::npos) << msg;
    }
  }
}

TEST(WireCorruption, EveryTruncationOfStepPlan) {
  expect_every_prefix_rejected(encode(sample_plan()), [](const bytes_t& b) { return decode_step_plan(b); });
}

TEST(WireCorruption, EveryTruncationOfStepResult) {
  expect_every_prefix_rejected(encode(sample_result()), [](const bytes_t& b) { return decode_step_result(b); });
}

TEST(WireCorruption, EveryTruncationOfHello) {
  expect_every_prefix_rejected(encode(sample_hello()), [](const bytes_t& b) { return decode_hello(b); });
}

template <class Decode>
void expect_every_payload_flip_detected(const bytes_t& good, Decode decode) {
  for (size_t i = kHeaderBytes; i < good.size(); ++i) {
    for (uint8_t mask : {0x01, 0x80, 0xff}) {
      bytes_t b = good;
      b[i] ^= mask;
      const std::string msg = error_of([&] { decode(b); });
      EXPECT_NE(msg.find("checksum mismatch"), std::string::npos) << "byte " << i << " mask " << int(mask) << ": " << msg;
    }
  }
}

TEST(WireCorruption, EveryPayloadByteFlipOfStepPlan) {
  expect_every_payload_flip_detected(encode(sample_plan()), [](const bytes_t& b) { return decode_step_plan(b); });
}

TEST(WireCorruption, EveryPayloadByteFlipOfStepResult) {
  expect_every_payload_flip_detected(encode(sample_result()), [](const bytes_t& b) { return decode_step_result(b); });
}

TEST(WireCorruption, EveryPayloadByteFlipOfHello) {
  expect_every_payload_flip_detected(encode(sample_hello()), [](const bytes_t& b) { return decode_hello(b); });
}

TEST(WireCorruption, TrailingPayloadBytes) {
  bytes_t b = encode(sample_plan());
  b.push_back(0);
  reseal(b);
  EXPECT_WIRE_ERROR(decode_step_plan(b), "1 trailing bytes after the step_plan payload");
  bytes_t s = encode_shutdown();
  s.insert(s.end(), {1, 2, 3});
  reseal(s);
  EXPECT_WIRE_ERROR(decode_shutdown(s), "3 trailing bytes after the shutdown payload");
}

TEST(WireCorruption, BoolByteMustBeZeroOrOne) {
  bytes_t b = encode(sample_plan());
  b[kPlanIsTree] = 2;
  reseal(b);
  EXPECT_WIRE_ERROR(decode_step_plan(b), "bool step_plan.is_tree is 2 (must be 0 or 1) at offset " + std::to_string(kPlanIsTree));
  bytes_t r = encode(sample_result());
  r[kResultOk] = 0xff;
  reseal(r);
  EXPECT_WIRE_ERROR(decode_step_result(r), "step_result.ok is 255");
  bytes_t d = encode(sample_plan());
  ASSERT_EQ(d[kPlanRow0DenseAttention], 1);
  d[kPlanRow0DenseAttention] = 3;
  reseal(d);
  EXPECT_WIRE_ERROR(decode_step_plan(d), "bool plan_row.dense_attention is 3 (must be 0 or 1) at offset " +
                                             std::to_string(kPlanRow0DenseAttention));
}

TEST(WireLimits, DecodeAttentionStatisticsAreChecked) {
  step_result m = sample_result();
  m.sparse_rows = 4;  // more sparse rows than decode rows
  EXPECT_WIRE_ERROR(encode(m), "step_result.sparse_rows 4 exceeds decode_rows 3");
  m = sample_result();
  m.decode_rows = -1;
  m.sparse_rows = 0;
  EXPECT_WIRE_ERROR(encode(m), "step_result.decode_rows is -1 (must be >= 0)");
  m = sample_result();
  m.pages_read = -5;
  EXPECT_WIRE_ERROR(encode(m), "step_result.pages_read is -5 (must be >= 0)");
  // The decoder checks the same: the statistics are the last 16 payload bytes.
  bytes_t b = encode(sample_result());
  set_u32(b, b.size() - 12, 9);  // sparse_rows 9 > decode_rows 3
  reseal(b);
  EXPECT_WIRE_ERROR(decode_step_result(b), "step_result.sparse_rows 9 exceeds decode_rows 3");
}

// ---- limits and semantic checks -------------------------------------------------------------

TEST(WireLimits, HugeCountsRejectedBeforeAllocating) {
  bytes_t b = encode(sample_plan());
  set_u32(b, kPlanRowCount, 0xffffffffu);
  reseal(b);
  EXPECT_WIRE_ERROR(decode_step_plan(b), "step_plan.rows count 4294967295 exceeds the limit 1048576");
  // Under the cap but more rows than the bytes left can hold.
  set_u32(b, kPlanRowCount, kMaxRows);
  reseal(b);
  g_alloc = {true, 0, 0};
  const std::string msg = error_of([&] { decode_step_plan(b); });
  g_alloc.on = false;
  EXPECT_NE(msg.find("truncated step_plan.rows: count 1048576 needs at least"), std::string::npos) << msg;
  EXPECT_LT(g_alloc.largest, 4096u);

  bytes_t r = encode(sample_result());
  set_u32(r, kResultErrorLen, kMaxStringBytes + 1);
  reseal(r);
  EXPECT_WIRE_ERROR(decode_step_result(r), "step_result.error count 1048577 exceeds the limit 1048576");
  set_u32(r, kResultErrorLen, kMaxStringBytes);
  reseal(r);
  EXPECT_WIRE_ERROR(decode_step_result(r), "truncated step_result.error");
}

TEST(WireLimits, EncodeRejectsOversizedVectors) {
  step_plan m;
  m.free_req_slots.resize(kMaxRows + 1);
  EXPECT_WIRE_ERROR(encode(m), "step_plan.free_req_slots has 1048577 entries (limit 1048576)");
  m = sample_plan();
  m.rows[0].tokens.resize(kMaxTokensPerRow + 1);
  EXPECT_WIRE_ERROR(encode(m), "step_plan.rows[0].tokens has 16777217 entries (limit 16777216)");
  hello h = sample_hello();
  h.host.assign(kMaxStringBytes + 1, 'x');
  EXPECT_WIRE_ERROR(encode(h), "hello.host has 1048577 entries");
}

// Offset of the one place a sentinel u32 appears in a message.
size_t find_u32(const bytes_t& b, uint32_t v) {
  size_t found = 0;
  int hits = 0;
  for (size_t i = kHeaderBytes; i + 4 <= b.size(); ++i)
    if (get_u32(b, i) == v) found = i, ++hits;
  EXPECT_EQ(hits, 1) << "sentinel " << v;
  return found;
}

// A value every checked int32 field accepts and the sample messages do not otherwise contain.
constexpr int32_t kSentinel = 0x2badf00d;

TEST(WireLimits, PlanFieldsValidatedOnEncodeAndDecode) {
  struct plan_case {
    const char* needle;
    int32_t bad;
    std::function<void(step_plan&, int32_t)> set;
  };
  const std::vector<plan_case> cases = {
      {"step_plan.rows[0].mamba_slot is -2 (must be >= -1)", -2, [](step_plan& m, int32_t v) { m.rows[0].mamba_slot = v; }},
      {"step_plan.rows[2].req_slot is -5", -5, [](step_plan& m, int32_t v) { m.rows[2].req_slot = v; }},
      {"step_plan.rows[1].prefix_len is -1 (must be >= 0)", -1, [](step_plan& m, int32_t v) { m.rows[1].prefix_len = v; }},
      {"step_plan.rows[0].first_page_pos is -1", -1, [](step_plan& m, int32_t v) { m.rows[0].first_page_pos = v; }},
      {"step_plan.rows[0].output_index is -3", -3, [](step_plan& m, int32_t v) { m.rows[0].output_index = v; }},
      {"step_plan.rows[0].draft_step is -1", -1, [](step_plan& m, int32_t v) { m.rows[0].draft_step = v; }},
      {"step_plan.rows[0].sample.top_k is -1", -1, [](step_plan& m, int32_t v) { m.rows[0].sample.top_k = v; }},
      {"step_plan.draft_len is -2147483648", std::numeric_limits<int32_t>::min(), [](step_plan& m, int32_t v) { m.draft_len = v; }},
      {"step_plan.rows[1].retrieve_next_token holds -2", -2, [](step_plan& m, int32_t v) { m.rows[1].retrieve_next_token[2] = v; }},
      {"step_plan.rows[1].retrieve_next_sibling holds -7", -7, [](step_plan& m, int32_t v) { m.rows[1].retrieve_next_sibling[0] = v; }},
      {"step_plan.free_req_slots holds -1", -1, [](step_plan& m, int32_t v) { m.free_req_slots[1] = v; }},
      {"step_plan.commits[1].mamba_slot is -2", -2, [](step_plan& m, int32_t v) { m.commits[1].mamba_slot = v; }},
      {"step_plan.commits[0].row is -1", -1, [](step_plan& m, int32_t v) { m.commits[0].row = v; }},
      {"step_plan.commits[0].accepted_step is -1", -1, [](step_plan& m, int32_t v) { m.commits[0].accepted_step = v; }},
  };
  for (const plan_case& c : cases) {
    step_plan m = sample_plan();
    c.set(m, c.bad);
    EXPECT_WIRE_ERROR(encode(m), c.needle);
    // The same value arriving from the wire.
    step_plan s = sample_plan();
    c.set(s, kSentinel);
    bytes_t b = encode(s);
    set_u32(b, find_u32(b, static_cast<uint32_t>(kSentinel)), static_cast<uint32_t>(c.bad));
    reseal(b);
    EXPECT_WIRE_ERROR(decode_step_plan(b), c.needle);
  }
  // -1 is the padding slot and passes.
  step_plan pad = sample_plan();
  pad.rows[0].mamba_slot = -1;
  EXPECT_EQ(decode_step_plan(encode(pad)).rows[0].mamba_slot, -1);
}

TEST(WireLimits, RetrieveVectorsEmptyOrEqualLength) {
  step_plan m = sample_plan();
  m.rows[1].retrieve_next_sibling.pop_back();
  EXPECT_WIRE_ERROR(encode(m), "step_plan.rows[1]: retrieve_next_token has 3 entries but retrieve_next_sibling has 2");
  m = sample_plan();
  m.rows[0].retrieve_next_sibling = {-1};
  EXPECT_WIRE_ERROR(encode(m), "retrieve_next_token has 0 entries but retrieve_next_sibling has 1");
  // From the wire: drop the last sibling entry and fix its count.
  m = sample_plan();
  m.rows[1].retrieve_next_sibling = {kSentinel, -1, -1};
  bytes_t b = encode(m);
  const size_t first = find_u32(b, static_cast<uint32_t>(kSentinel));
  ASSERT_EQ(get_u32(b, first - 4), 3u);
  set_u32(b, first - 4, 2);
  b.erase(b.begin() + static_cast<std::ptrdiff_t>(first + 8), b.begin() + static_cast<std::ptrdiff_t>(first + 12));
  reseal(b);
  EXPECT_WIRE_ERROR(decode_step_plan(b), "retrieve_next_token has 3 entries but retrieve_next_sibling has 2");
}

TEST(WireLimits, LogprobsEmptyOrOnePerToken) {
  step_result r = sample_result();
  r.rows[0].logprobs.pop_back();
  EXPECT_WIRE_ERROR(encode(r), "step_result.rows[0]: logprobs has 2 entries for 3 tokens");
  r = sample_result();
  r.rows[0].logprobs[0] = std::bit_cast<float>(static_cast<uint32_t>(kSentinel));
  bytes_t b = encode(r);
  const size_t first = find_u32(b, static_cast<uint32_t>(kSentinel));
  ASSERT_EQ(get_u32(b, first - 4), 3u);
  set_u32(b, first - 4, 4);
  b.insert(b.begin() + static_cast<std::ptrdiff_t>(first + 12), 4, 0);
  reseal(b);
  EXPECT_WIRE_ERROR(decode_step_result(b), "step_result.rows[0]: logprobs has 4 entries for 3 tokens");
}

TEST(WireLimits, HelloCountsValidatedOnEncodeAndDecode) {
  struct hello_case {
    const char* needle;
    int32_t bad;
    std::function<void(hello&, int32_t)> set;
  };
  const std::vector<hello_case> cases = {
      {"hello.dp_rank is -1", -1, [](hello& m, int32_t v) { m.dp_rank = v; }},
      {"hello.tp_size is 0 (must be >= 1)", 0, [](hello& m, int32_t v) { m.tp_size = v; }},
      {"hello.num_pages is -1", -1, [](hello& m, int32_t v) { m.num_pages = v; }},
      {"hello.mamba_slots is -1", -1, [](hello& m, int32_t v) { m.mamba_slots = v; }},
      {"hello.max_requests is -1", -1, [](hello& m, int32_t v) { m.max_requests = v; }},
      {"hello.max_context is -1", -1, [](hello& m, int32_t v) { m.max_context = v; }},
      {"hello.page_size is -1", -1, [](hello& m, int32_t v) { m.page_size = v; }},
  };
  for (const hello_case& c : cases) {
    hello m = sample_hello();
    c.set(m, c.bad);
    EXPECT_WIRE_ERROR(encode(m), c.needle);
    hello s = sample_hello();
    c.set(s, kSentinel);
    bytes_t b = encode(s);
    set_u32(b, find_u32(b, static_cast<uint32_t>(kSentinel)), static_cast<uint32_t>(c.bad));
    reseal(b);
    EXPECT_WIRE_ERROR(decode_hello(b), c.needle);
  }
  hello h = sample_hello();
  h.vocab_size = -1;
  EXPECT_WIRE_ERROR(encode(h), "hello.vocab_size is -1");
}

}  // namespace
}  // namespace hyserve::wire
