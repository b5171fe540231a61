#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <boost/crc.hpp>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <new>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "hyserve/common/wire.h"

// Allocation accounting for the decode-under-hostile-input tests: while enabled on a thread, every
// operator new records its size. Replacing the global operators is the only way to observe the
// allocations std::vector makes inside the decoder.
namespace {
struct alloc_stats {
  bool on = false;
  size_t largest = 0;
  size_t total = 0;
};
constinit thread_local alloc_stats g_alloc{};

void* tracked_alloc(std::size_t n) {
  if (g_alloc.on) {
    g_alloc.largest = std::max(g_alloc.largest, n);
    g_alloc.total += n;
  }
  return std::malloc(n == 0 ? 1 : n);
}

// Out of line so the compiler does not see operator new's pointer reach free() and warn.
[[gnu::noinline]] void tracked_free(void* p) noexcept { std::free(p); }
}  // namespace

void* operator new(std::size_t n) {
  if (void* p = tracked_alloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return tracked_alloc(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return tracked_alloc(n); }
void operator delete(void* p) noexcept { tracked_free(p); }
void operator delete[](void* p) noexcept { tracked_free(p); }
void operator delete(void* p, std::size_t) noexcept { tracked_free(p); }
void operator delete[](void* p, std::size_t) noexcept { tracked_free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { tracked_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { tracked_free(p); }

namespace hyserve::wire {

// Field-by-field equality for the round-trip tests. Floats compare by bits so NaN payloads count.
static bool same_bits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }
static bool same_bits(double a, double b) { return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b); }

static bool operator==(const sampling& a, const sampling& b) {
  return same_bits(a.temperature, b.temperature) && a.top_k == b.top_k && same_bits(a.top_p, b.top_p) && a.seed == b.seed;
}
static bool operator==(const logits_processing& a, const logits_processing& b) {
  return same_bits(a.repetition_penalty, b.repetition_penalty) && same_bits(a.presence_penalty, b.presence_penalty) &&
         same_bits(a.frequency_penalty, b.frequency_penalty) && a.min_tokens == b.min_tokens &&
         a.prompt_len == b.prompt_len && a.logprobs == b.logprobs && a.top_logprobs == b.top_logprobs &&
         a.min_tokens_mask == b.min_tokens_mask && a.bias_ids == b.bias_ids && a.bias_values == b.bias_values;
}
static bool operator==(const plan_row& a, const plan_row& b) {
  return a.processing == b.processing && a.request_id == b.request_id && a.req_slot == b.req_slot && a.mamba_slot == b.mamba_slot &&
         a.prefix_len == b.prefix_len && a.tokens == b.tokens && a.first_page_pos == b.first_page_pos &&
         a.new_pages == b.new_pages && a.sample == b.sample && a.output_index == b.output_index &&
         a.is_decode == b.is_decode && a.reset_state == b.reset_state && a.dense_attention == b.dense_attention &&
         a.draft_step == b.draft_step &&
         a.retrieve_next_token == b.retrieve_next_token && a.retrieve_next_sibling == b.retrieve_next_sibling;
}
static bool operator==(const commit_op& a, const commit_op& b) {
  return a.mamba_slot == b.mamba_slot && a.row == b.row && a.accepted_step == b.accepted_step;
}
static bool operator==(const kv_move_op& a, const kv_move_op& b) {
  return a.req_slot == b.req_slot && a.from_pos == b.from_pos && a.to_pos == b.to_pos;
}
static bool operator==(const state_copy_op& a, const state_copy_op& b) {
  return a.src_slot == b.src_slot && a.dst_slot == b.dst_slot;
}
static bool operator==(const step_plan& a, const step_plan& b) {
  return a.state_restores == b.state_restores && a.state_saves == b.state_saves && a.step_id == b.step_id && a.mode == b.mode && a.draft_len == b.draft_len && a.is_tree == b.is_tree &&
         a.want_logprobs == b.want_logprobs && a.rows == b.rows && a.free_req_slots == b.free_req_slots &&
         a.commits == b.commits && a.draft_commits == b.draft_commits && a.kv_moves == b.kv_moves &&
         a.extend_rows == b.extend_rows && a.draft_width == b.draft_width;
}
static bool operator==(const row_result& a, const row_result& b) {
  return a.request_id == b.request_id && a.tokens == b.tokens && a.top_n == b.top_n && a.top_ids == b.top_ids &&
         a.top_logprobs == b.top_logprobs && std::equal(a.logprobs.begin(), a.logprobs.end(), b.logprobs.begin(), b.logprobs.end(),
                    [](float x, float y) { return same_bits(x, y); });
}
static bool operator==(const step_result& a, const step_result& b) {
  return a.step_id == b.step_id && a.ok == b.ok && a.error == b.error && a.rows == b.rows && same_bits(a.step_ms, b.step_ms) &&
         a.decode_rows == b.decode_rows && a.sparse_rows == b.sparse_rows && a.pages_read == b.pages_read;
}
static bool operator==(const hello& a, const hello& b) {
  return a.dp_rank == b.dp_rank && a.tp_size == b.tp_size && a.num_pages == b.num_pages && a.mamba_slots == b.mamba_slots &&
         a.max_requests == b.max_requests && a.max_context == b.max_context && a.page_size == b.page_size &&
         a.vocab_size == b.vocab_size && a.host == b.host;
}

namespace {

using bytes_t = std::vector<uint8_t>;

// Every field differs from its default; row 1 is a tree verify row, row 2 a padding row.
step_plan sample_plan() {
  step_plan m;
  m.step_id = 0x0123456789abcdefULL;
  m.mode = 4;
  m.draft_len = 3;
  m.is_tree = true;
  m.want_logprobs = true;
  plan_row a;
  a.request_id = std::numeric_limits<int64_t>::max();
  a.req_slot = 7;
  a.mamba_slot = 5;
  a.prefix_len = 33;
  a.tokens = {11, -2, 70000, std::numeric_limits<int32_t>::max()};
  a.first_page_pos = 32;
  a.new_pages = {9, 10};
  a.sample = {0.75f, 40, 0.9f, 0xfedcba9876543210ULL};
  a.output_index = 12;
  a.is_decode = true;
  a.reset_state = true;
  a.dense_attention = true;
  a.draft_step = 2;
  plan_row b = a;
  b.request_id = -42;
  b.req_slot = 0;
  b.mamba_slot = 0;
  b.tokens = {1, 2, 3};
  b.new_pages = {};
  b.sample = {1.5f, 1, 0.5f, 1};
  b.is_decode = false;
  b.dense_attention = false;
  b.retrieve_next_token = {1, 2, -1};
  b.retrieve_next_sibling = {-1, -1, -1};
  plan_row pad;
  pad.request_id = 99;
  pad.req_slot = -1;
  pad.mamba_slot = -1;
  pad.tokens = {0};
  m.rows = {a, b, pad};
  m.free_req_slots = {3, 4, 1000};
  m.commits = {{5, 0, 2}, {0, 1, 0}};
  return m;
}

step_result sample_result() {
  step_result m;
  m.step_id = 77;
  m.ok = false;
  m.error = "mode byte 9 not supported (supported: extend, decode, …)";
  m.rows = {{5, {1, 2, 3}, {-0.5f, -1.25f, -0.0f}}, {-6, {42}, {}}, {std::numeric_limits<int64_t>::min(), {}, {}}};
  m.step_ms = 12.375;
  m.decode_rows = 3;
  m.sparse_rows = 2;
  m.pages_read = 0x123456789LL;  // over 32 bits
  return m;
}

hello sample_hello() {
  hello m;
  m.dp_rank = 3;
  m.tp_size = 4;
  m.num_pages = 4096;
  m.mamba_slots = 256;
  m.max_requests = 128;
  m.max_context = 32768;
  m.page_size = 16;
  m.vocab_size = 151936;
  m.host = "node-07.cluster";
  return m;
}

uint32_t get_u32(const bytes_t& b, size_t at) {
  return uint32_t(b[at]) | uint32_t(b[at + 1]) << 8 | uint32_t(b[at + 2]) << 16 | uint32_t(b[at + 3]) << 24;
}
void set_u32(bytes_t& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
}
void set_u16(bytes_t& b, size_t at, uint16_t v) {
  b[at] = static_cast<uint8_t>(v);
  b[at + 1] = static_cast<uint8_t>(v >> 8);
}

// Makes payload_len and crc consistent with whatever payload follows the header, so that the
// payload parser itself sees the bytes.
void reseal(bytes_t& b) {
  boost::crc_32_type crc;
  crc.process_bytes(b.data() + kHeaderBytes, b.size() - kHeaderBytes);
  set_u32(b, 8, static_cast<uint32_t>(b.size() - kHeaderBytes));
  set_u32(b, 12, crc.checksum());
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const wire_error& e) {
    return e.what();
  }
  return "<no error>";
}

#define EXPECT_WIRE_ERROR(stmt, needle)                           \
  do {                                                            \
    const std::string msg_ = error_of([&] { (void)(stmt); });     \
    EXPECT_NE(msg_.find(needle), std::string::npos) << msg_;      \
  } while (0)

// Payload offsets in the encoding of sample_plan().
constexpr size_t kPlanMode = kHeaderBytes + 8;
constexpr size_t kPlanDraftLen = kPlanMode + 1;
constexpr size_t kPlanIsTree = kPlanDraftLen + 4;
constexpr size_t kPlanRowCount = kPlanIsTree + 2;
// Row 0 of sample_plan(): request_id, req_slot, mamba_slot, prefix_len, 4 tokens, first_page_pos,
// 2 new pages, sampling, output_index, is_decode, reset_state, then dense_attention.
constexpr size_t kPlanRow0DenseAttention = kPlanRowCount + 4 + 8 + 4 + 4 + 4 + (4 + 16) + 4 + (4 + 8) + 20 + 4 + 1 + 1;
constexpr size_t kResultOk = kHeaderBytes + 8;
constexpr size_t kResultErrorLen = kResultOk + 1;

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

// ---- fuzz -----------------------------------------------------------------------------------

enum class outcome { kDecoded, kRejected };

// Runs one decoder on hostile bytes: it must decode or throw wire_error, allocate no more than
// the input can describe, and a decoded message must re-encode to exactly the input.
template <class Decode>
outcome fuzz_one(const bytes_t& in, Decode decode) {
  g_alloc = {true, 0, 0};
  outcome result = outcome::kRejected;
  bytes_t reencoded;
  try {
    if constexpr (std::is_void_v<decltype(decode(in))>) {
      decode(in);
      reencoded = in;
      result = outcome::kDecoded;
    } else {
      auto m = decode(in);
      result = outcome::kDecoded;
      g_alloc.on = false;
      reencoded = encode(m);
    }
  } catch (const wire_error&) {
  } catch (const std::exception& e) {
    ADD_FAILURE() << "non-wire exception: " << e.what();
  }
  g_alloc.on = false;
  // Decoded objects take at most a few times their encoded size (a 16-byte row_result becomes a
  // 56-byte struct); error messages add a little.
  EXPECT_LE(g_alloc.largest, 4 * in.size() + 1024) << "input of " << in.size() << " bytes";
  EXPECT_LE(g_alloc.total, 8 * in.size() + 8192) << "input of " << in.size() << " bytes";
  if (result == outcome::kDecoded) {
    EXPECT_EQ(reencoded, in);
  }
  return result;
}

struct fuzz_counts {
  int decoded = 0;
  int rejected = 0;
};

void fuzz_all_decoders(const bytes_t& in, fuzz_counts& counts) {
  auto tally = [&](outcome o) { (o == outcome::kDecoded ? counts.decoded : counts.rejected)++; };
  tally(fuzz_one(in, [](const bytes_t& b) { return decode_step_plan(b); }));
  tally(fuzz_one(in, [](const bytes_t& b) { return decode_step_result(b); }));
  tally(fuzz_one(in, [](const bytes_t& b) { return decode_hello(b); }));
  tally(fuzz_one(in, [](const bytes_t& b) { decode_shutdown(b); }));
  try {
    (void)peek_type(in);
  } catch (const wire_error&) {
  }
}

TEST(WireFuzz, RandomBytes) {
  std::mt19937 rng(20240601);
  fuzz_counts counts;
  for (int iter = 0; iter < 3000; ++iter) {
    bytes_t b(rng() % 513);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    fuzz_all_decoders(b, counts);
  }
  EXPECT_EQ(counts.decoded, 0);
}

TEST(WireFuzz, RandomPayloadsWithValidHeader) {
  std::mt19937 rng(7);
  fuzz_counts counts;
  for (int iter = 0; iter < 3000; ++iter) {
    bytes_t b(kHeaderBytes + rng() % 497);
    for (auto& x : b) x = static_cast<uint8_t>(rng() % 4 == 0 ? 0 : rng());
    set_u32(b, 0, kMagic);
    set_u16(b, 4, kVersion);
    set_u16(b, 6, static_cast<uint16_t>(1 + rng() % 4));
    reseal(b);
    fuzz_all_decoders(b, counts);
  }
  EXPECT_GT(counts.rejected, 0);
}

TEST(WireFuzz, MutatedValidMessagesWithResealedChecksum) {
  const std::vector<bytes_t> seeds = {encode(sample_plan()), encode(sample_result()), encode(sample_hello()),
                                      encode_shutdown(), encode(step_plan{}), encode(step_result{})};
  constexpr uint32_t kInteresting[] = {0, 1, 2, 0x7f, 0xff, 0x7fffffff, 0x80000000, 0xffffffff, 0xfffffffe,
                                       kMaxRows, kMaxRows + 1, kMaxTokensPerRow, kMaxStringBytes, 3, 70};
  std::mt19937 rng(1234);
  fuzz_counts counts;
  for (int iter = 0; iter < 6000; ++iter) {
    bytes_t b = seeds[rng() % seeds.size()];
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < mutations; ++k) {
      const size_t payload = b.size() - kHeaderBytes;
      const size_t at = kHeaderBytes + (payload == 0 ? 0 : rng() % payload);
      switch (rng() % 5) {
        case 0:  // random byte
          if (payload > 0) b[at] = static_cast<uint8_t>(rng());
          break;
        case 1:  // interesting u32 (counts, lengths, slots)
          if (payload >= 4) set_u32(b, kHeaderBytes + rng() % (payload - 3), kInteresting[rng() % std::size(kInteresting)]);
          break;
        case 2:  // insert bytes
          b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), 1 + rng() % 8, static_cast<uint8_t>(rng()));
          break;
        case 3:  // erase bytes
          if (payload > 0) b.erase(b.begin() + static_cast<std::ptrdiff_t>(at), b.begin() + static_cast<std::ptrdiff_t>(std::min(b.size(), at + 1 + rng() % 8)));
          break;
        case 4:  // truncate the payload
          b.resize(at);
          break;
      }
    }
    reseal(b);
    fuzz_all_decoders(b, counts);
  }
  // Both paths are exercised: some mutations keep a valid message, most do not.
  EXPECT_GT(counts.decoded, 100);
  EXPECT_GT(counts.rejected, 1000);
}

TEST(WireFuzz, EveryPayloadOffsetOverwrittenWithCounts) {
  // Lands plausible and hostile counts on every count field (and everything else) of each
  // message, so an allocation sized from a count before checking it against the bytes left
  // shows up in the allocation bound.
  const std::vector<bytes_t> seeds = {encode(sample_plan()), encode(sample_result()), encode(sample_hello())};
  constexpr uint32_t kCounts[] = {2, 3, 5, 9, 17, 33, 65, 129, 257, 1025, 65537, kMaxRows, kMaxTokensPerRow, 0xffffffff};
  fuzz_counts counts;
  for (const bytes_t& seed : seeds) {
    for (size_t at = kHeaderBytes; at + 4 <= seed.size(); ++at) {
      for (uint32_t c : kCounts) {
        bytes_t b = seed;
        set_u32(b, at, c);
        reseal(b);
        fuzz_all_decoders(b, counts);
      }
    }
  }
  EXPECT_GT(counts.rejected, 0);
}

TEST(WirePeek, EachType) {
  EXPECT_EQ(peek_type(encode(sample_hello())), message_type::kHello);
  EXPECT_EQ(peek_type(encode(sample_plan())), message_type::kStepPlan);
  EXPECT_EQ(peek_type(encode(sample_result())), message_type::kStepResult);
  EXPECT_EQ(peek_type(encode_shutdown()), message_type::kShutdown);
}

}  // namespace
}  // namespace hyserve::wire

// ---- speculative extension of step_plan ------------------------------------------------------

namespace hyserve::wire {
namespace {

step_plan spec_plan() {
  step_plan m = sample_plan();
  m.draft_commits = {{5, 0, 3}, {-1, 2, 0}, {0, 1, 1}};
  m.kv_moves = {{7, 36, 34}};
  return m;
}

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

TEST(WireSpecExtension, FuzzedExtensionsDecodeOrRejectCleanly) {
  std::mt19937 rng(99);
  const bytes_t good = encode(spec_plan());
  const size_t base = encode(sample_plan()).size();
  fuzz_counts counts;
  for (int iter = 0; iter < 2000; ++iter) {
    bytes_t b = good;
    b.resize(base + rng() % (good.size() - base + 8));
    for (size_t i = base; i < b.size(); ++i)
      if (rng() % 3 == 0) b[i] = static_cast<uint8_t>(rng() % 4 == 0 ? rng() : rng() % 3);
    reseal(b);
    fuzz_all_decoders(b, counts);
  }
  EXPECT_GT(counts.rejected, 0);
  EXPECT_GT(counts.decoded, 0);
}

}  // namespace
}  // namespace hyserve::wire
