#pragma once
// Shared by the wire tests (test_wire*.cpp): field-by-field equality of the messages, sample
// messages with every field set, byte-level helpers to edit an encoding and reseal its header,
// and the hostile-input harness (fuzz_one: decode or reject cleanly, allocate no more than the
// input can describe, re-encode to the same bytes) with its allocation accounting
// (wire_alloc_tracking.cpp replaces the global operator new to record it).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <boost/crc.hpp>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "hyserve/common/wire.h"

// While `on` on a thread, every operator new of that thread records its size
// (wire_alloc_tracking.cpp).
struct wire_alloc_stats {
  bool on = false;
  size_t largest = 0;
  size_t total = 0;
};
extern thread_local wire_alloc_stats g_alloc;

namespace hyserve::wire {

// Field-by-field equality for the round-trip tests. Floats compare by bits so NaN payloads count.
inline bool same_bits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }
inline bool same_bits(double a, double b) { return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b); }

inline bool operator==(const sampling& a, const sampling& b) {
  return same_bits(a.temperature, b.temperature) && a.top_k == b.top_k && same_bits(a.top_p, b.top_p) && a.seed == b.seed;
}
inline bool operator==(const logits_processing& a, const logits_processing& b) {
  return same_bits(a.repetition_penalty, b.repetition_penalty) && same_bits(a.presence_penalty, b.presence_penalty) &&
         same_bits(a.frequency_penalty, b.frequency_penalty) && a.min_tokens == b.min_tokens &&
         a.prompt_len == b.prompt_len && a.logprobs == b.logprobs && a.top_logprobs == b.top_logprobs &&
         a.min_tokens_mask == b.min_tokens_mask && a.bias_ids == b.bias_ids && a.bias_values == b.bias_values;
}
inline bool operator==(const plan_row& a, const plan_row& b) {
  return a.processing == b.processing && a.request_id == b.request_id && a.req_slot == b.req_slot && a.mamba_slot == b.mamba_slot &&
         a.prefix_len == b.prefix_len && a.tokens == b.tokens && a.first_page_pos == b.first_page_pos &&
         a.new_pages == b.new_pages && a.sample == b.sample && a.output_index == b.output_index &&
         a.is_decode == b.is_decode && a.reset_state == b.reset_state && a.dense_attention == b.dense_attention &&
         a.draft_step == b.draft_step &&
         a.retrieve_next_token == b.retrieve_next_token && a.retrieve_next_sibling == b.retrieve_next_sibling;
}
inline bool operator==(const commit_op& a, const commit_op& b) {
  return a.mamba_slot == b.mamba_slot && a.row == b.row && a.accepted_step == b.accepted_step;
}
inline bool operator==(const kv_move_op& a, const kv_move_op& b) {
  return a.req_slot == b.req_slot && a.from_pos == b.from_pos && a.to_pos == b.to_pos;
}
inline bool operator==(const state_copy_op& a, const state_copy_op& b) {
  return a.src_slot == b.src_slot && a.dst_slot == b.dst_slot;
}
inline bool operator==(const step_plan& a, const step_plan& b) {
  return a.state_restores == b.state_restores && a.state_saves == b.state_saves && a.step_id == b.step_id && a.mode == b.mode && a.draft_len == b.draft_len && a.is_tree == b.is_tree &&
         a.want_logprobs == b.want_logprobs && a.rows == b.rows && a.free_req_slots == b.free_req_slots &&
         a.commits == b.commits && a.draft_commits == b.draft_commits && a.kv_moves == b.kv_moves &&
         a.extend_rows == b.extend_rows && a.draft_width == b.draft_width;
}
inline bool operator==(const row_result& a, const row_result& b) {
  return a.request_id == b.request_id && a.tokens == b.tokens && a.top_n == b.top_n && a.top_ids == b.top_ids &&
         a.top_logprobs == b.top_logprobs && std::equal(a.logprobs.begin(), a.logprobs.end(), b.logprobs.begin(), b.logprobs.end(),
                    [](float x, float y) { return same_bits(x, y); });
}
inline bool operator==(const step_result& a, const step_result& b) {
  return a.step_id == b.step_id && a.ok == b.ok && a.error == b.error && a.rows == b.rows && same_bits(a.step_ms, b.step_ms) &&
         a.decode_rows == b.decode_rows && a.sparse_rows == b.sparse_rows && a.pages_read == b.pages_read;
}
inline bool operator==(const hello& a, const hello& b) {
  return a.dp_rank == b.dp_rank && a.tp_size == b.tp_size && a.num_pages == b.num_pages && a.mamba_slots == b.mamba_slots &&
         a.max_requests == b.max_requests && a.max_context == b.max_context && a.page_size == b.page_size &&
         a.vocab_size == b.vocab_size && a.host == b.host;
}

using bytes_t = std::vector<uint8_t>;

// Every field differs from its default; row 1 is a tree verify row, row 2 a padding row.
inline step_plan sample_plan() {
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

inline step_result sample_result() {
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

inline hello sample_hello() {
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

inline uint32_t get_u32(const bytes_t& b, size_t at) {
  return uint32_t(b[at]) | uint32_t(b[at + 1]) << 8 | uint32_t(b[at + 2]) << 16 | uint32_t(b[at + 3]) << 24;
}
inline void set_u32(bytes_t& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
}
inline void set_u16(bytes_t& b, size_t at, uint16_t v) {
  b[at] = static_cast<uint8_t>(v);
  b[at + 1] = static_cast<uint8_t>(v >> 8);
}

// Makes payload_len and crc consistent with whatever payload follows the header, so that the
// payload parser itself sees the bytes.
inline void reseal(bytes_t& b) {
  boost::crc_32_type crc;
  crc.process_bytes(b.data() + kHeaderBytes, b.size() - kHeaderBytes);
  set_u32(b, 8, static_cast<uint32_t>(b.size() - kHeaderBytes));
  set_u32(b, 12, crc.checksum());
}

inline std::string error_of(const std::function<void()>& f) {
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
inline constexpr size_t kPlanMode = kHeaderBytes + 8;
inline constexpr size_t kPlanDraftLen = kPlanMode + 1;
inline constexpr size_t kPlanIsTree = kPlanDraftLen + 4;
inline constexpr size_t kPlanRowCount = kPlanIsTree + 2;
// Row 0 of sample_plan(): request_id, req_slot, mamba_slot, prefix_len, 4 tokens, first_page_pos,
// 2 new pages, sampling, output_index, is_decode, reset_state, then dense_attention.
inline constexpr size_t kPlanRow0DenseAttention = kPlanRowCount + 4 + 8 + 4 + 4 + 4 + (4 + 16) + 4 + (4 + 8) + 20 + 4 + 1 + 1;
inline constexpr size_t kResultOk = kHeaderBytes + 8;
inline constexpr size_t kResultErrorLen = kResultOk + 1;

// sample_plan() with the speculative extension's draft commits and KV moves.
inline step_plan spec_plan() {
  step_plan m = sample_plan();
  m.draft_commits = {{5, 0, 3}, {-1, 2, 0}, {0, 1, 1}};
  m.kv_moves = {{7, 36, 34}};
  return m;
}

// ---- hostile input ------------------------------------------------------------------------------

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

inline void fuzz_all_decoders(const bytes_t& in, fuzz_counts& counts) {
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

}  // namespace hyserve::wire
