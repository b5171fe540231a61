#include "hyserve/common/wire.h"

#include <bit>
#include <boost/crc.hpp>
#include <limits>
#include <utility>

namespace hyserve::wire {
namespace {

// Minimum encoded size of one vector element; a count is rejected unless count * size fits in
// the bytes left, which bounds every reservation by the size of the input.
constexpr size_t kPlanRowMinBytes = 8 + 4 + 4 + 4 + 4 + 4 + 4 + (4 + 4 + 4 + 8) + 4 + 1 + 1 + 1 + 4 + 4 + 4;
constexpr size_t kCommitBytes = 4 + 4 + 4;
constexpr size_t kRowResultMinBytes = 8 + 4 + 4;

uint32_t crc32_of(std::span<const uint8_t> bytes) {
  boost::crc_32_type crc;
  crc.process_bytes(bytes.data(), bytes.size());
  return crc.checksum();
}

[[noreturn]] void fail(const std::string& msg) { throw wire_error("wire: " + msg); }

// Appends little-endian fields. The header is written last, once the payload size is known.
class writer {
 public:
  writer() : buf_(kHeaderBytes, 0) {}

  void u8(uint8_t v) { buf_.push_back(v); }
  void u32(uint32_t v) { put_le(v, 4); }
  void u64(uint64_t v) { put_le(v, 8); }
  void i32(int32_t v) { u32(static_cast<uint32_t>(v)); }
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void f32(float v) { u32(std::bit_cast<uint32_t>(v)); }
  void f64(double v) { u64(std::bit_cast<uint64_t>(v)); }
  void boolean(bool v) { u8(v ? 1 : 0); }

  void count(size_t n, uint32_t limit, const char* what) {
    if (n > limit) fail(std::string("cannot encode ") + what + ": " + std::to_string(n) + " exceeds the limit " + std::to_string(limit));
    u32(static_cast<uint32_t>(n));
  }
  void str(const std::string& s, const char* what) {
    count(s.size(), kMaxStringBytes, what);
    buf_.insert(buf_.end(), s.begin(), s.end());
  }
  void i32s(const std::vector<int32_t>& v, uint32_t limit, const char* what) {
    count(v.size(), limit, what);
    for (int32_t x : v) i32(x);
  }
  void f32s(const std::vector<float>& v, uint32_t limit, const char* what) {
    count(v.size(), limit, what);
    for (float x : v) f32(x);
  }

  std::vector<uint8_t> finish(message_type type) {
    const size_t payload = buf_.size() - kHeaderBytes;
    if (payload > std::numeric_limits<uint32_t>::max())
      fail("cannot encode " + std::string(message_type_name(type)) + ": payload of " + std::to_string(payload) + " bytes exceeds 4 GiB");
    const uint32_t crc = crc32_of(std::span<const uint8_t>(buf_).subspan(kHeaderBytes));
    put_le_at(0, kMagic, 4);
    put_le_at(4, kVersion, 2);
    put_le_at(6, static_cast<uint16_t>(type), 2);
    put_le_at(8, static_cast<uint32_t>(payload), 4);
    put_le_at(12, crc, 4);
    return std::move(buf_);
  }

 private:
  void put_le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void put_le_at(size_t at, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) buf_[at + i] = static_cast<uint8_t>(v >> (8 * i));
  }

  std::vector<uint8_t> buf_;
};

// Bounds-checked little-endian reads over a payload. Offsets in errors count from the start of
// the message (header included).
class reader {
 public:
  explicit reader(std::span<const uint8_t> payload) : p_(payload) {}

  uint8_t u8(const char* what) { return static_cast<uint8_t>(get_le(1, what)); }
  uint32_t u32(const char* what) { return static_cast<uint32_t>(get_le(4, what)); }
  uint64_t u64(const char* what) { return get_le(8, what); }
  int32_t i32(const char* what) { return static_cast<int32_t>(u32(what)); }
  int64_t i64(const char* what) { return static_cast<int64_t>(u64(what)); }
  float f32(const char* what) { return std::bit_cast<float>(u32(what)); }
  double f64(const char* what) { return std::bit_cast<double>(u64(what)); }
  bool boolean(const char* what) {
    const size_t at = offset();
    const uint8_t v = u8(what);
    if (v > 1) fail(std::string("bool ") + what + " is " + std::to_string(v) + " (must be 0 or 1) at offset " + std::to_string(at));
    return v == 1;
  }

  // Reads a u32 count and checks it against the limit and against the bytes left, before the
  // caller reserves anything.
  uint32_t count(uint32_t limit, size_t min_element_bytes, const char* what) {
    const size_t at = offset();
    const uint32_t n = u32(what);
    if (n > limit) fail(std::string(what) + " count " + std::to_string(n) + " exceeds the limit " + std::to_string(limit) + " at offset " + std::to_string(at));
    if (static_cast<uint64_t>(n) * min_element_bytes > remaining())
      fail(std::string("truncated ") + what + ": count " + std::to_string(n) + " needs at least " +
           std::to_string(static_cast<uint64_t>(n) * min_element_bytes) + " bytes, " + std::to_string(remaining()) +
           " left at offset " + std::to_string(offset()));
    return n;
  }
  std::string str(const char* what) {
    const uint32_t n = count(kMaxStringBytes, 1, what);
    std::string s(reinterpret_cast<const char*>(p_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  std::vector<int32_t> i32s(uint32_t limit, const char* what) {
    const uint32_t n = count(limit, 4, what);
    std::vector<int32_t> v;
    v.reserve(n);
    for (uint32_t i = 0; i < n; ++i) v.push_back(i32(what));
    return v;
  }
  std::vector<float> f32s(uint32_t limit, const char* what) {
    const uint32_t n = count(limit, 4, what);
    std::vector<float> v;
    v.reserve(n);
    for (uint32_t i = 0; i < n; ++i) v.push_back(f32(what));
    return v;
  }

  bool at_end() const { return pos_ == p_.size(); }
  size_t left() const { return p_.size() - pos_; }
  size_t where() const { return kHeaderBytes + pos_; }

  void expect_end(message_type type) const {
    if (pos_ != p_.size())
      fail(std::to_string(p_.size() - pos_) + " trailing bytes after the " + message_type_name(type) + " payload at offset " +
           std::to_string(offset()));
  }

 private:
  size_t remaining() const { return p_.size() - pos_; }
  size_t offset() const { return kHeaderBytes + pos_; }

  uint64_t get_le(size_t n, const char* what) {
    if (n > remaining())
      fail(std::string("truncated ") + what + ": need " + std::to_string(n) + " bytes, " + std::to_string(remaining()) +
           " left at offset " + std::to_string(offset()));
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(p_[pos_ + i]) << (8 * i);
    pos_ += n;
    return v;
  }

  std::span<const uint8_t> p_;
  size_t pos_ = 0;
};

uint64_t read_le(std::span<const uint8_t> b, size_t at, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(b[at + i]) << (8 * i);
  return v;
}

std::string hex32(uint32_t v) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s = "0x";
  for (int shift = 28; shift >= 0; shift -= 4) s += kHex[(v >> shift) & 0xf];
  return s;
}

bool is_known(uint16_t type) {
  return type >= static_cast<uint16_t>(message_type::kHello) && type <= static_cast<uint16_t>(message_type::kShutdown);
}

// Validates the header and checksum; returns the type and the payload.
std::pair<message_type, std::span<const uint8_t>> open_message(std::span<const uint8_t> bytes) {
  if (bytes.size() < kHeaderBytes)
    fail("truncated header: " + std::to_string(bytes.size()) + " bytes, need " + std::to_string(kHeaderBytes) + " at offset 0");
  const auto magic = static_cast<uint32_t>(read_le(bytes, 0, 4));
  if (magic != kMagic) fail("bad magic " + hex32(magic) + " (expected " + hex32(kMagic) + ", \"HYSV\")");
  const auto version = static_cast<uint16_t>(read_le(bytes, 4, 2));
  if (version != kVersion)
    fail("unsupported wire version " + std::to_string(version) + " (supported: " + std::to_string(kVersion) + ")");
  const auto type = static_cast<uint16_t>(read_le(bytes, 6, 2));
  if (!is_known(type)) fail("unknown message type " + std::to_string(type) + " (supported: 1 hello, 2 step_plan, 3 step_result, 4 shutdown)");
  const auto payload_len = static_cast<uint32_t>(read_le(bytes, 8, 4));
  const size_t after_header = bytes.size() - kHeaderBytes;
  if (payload_len != after_header)
    fail("payload_len " + std::to_string(payload_len) + " does not match the " + std::to_string(after_header) +
         " bytes after the header" + (payload_len < after_header ? " (trailing bytes)" : " (truncated)"));
  const auto crc = static_cast<uint32_t>(read_le(bytes, 12, 4));
  const auto payload = bytes.subspan(kHeaderBytes);
  const uint32_t actual = crc32_of(payload);
  if (crc != actual) fail("checksum mismatch: header says " + hex32(crc) + ", payload has " + hex32(actual));
  return {static_cast<message_type>(type), payload};
}

std::span<const uint8_t> open_expecting(std::span<const uint8_t> bytes, message_type expected) {
  const auto [type, payload] = open_message(bytes);
  if (type != expected) fail(std::string("expected ") + message_type_name(expected) + ", got " + message_type_name(type));
  return payload;
}

// ---- semantic validation, shared by encode and decode ---------------------------------------

// Names a field for an error, built only when a check fails (decode runs every step):
// "step_plan.rows[3].mamba_slot", or "hello.tp_size" when list is null.
struct field_ref {
  const char* list;
  size_t index;
  const char* field;
};

std::string name_of(const field_ref& f) {
  if (f.list == nullptr) return f.field;
  return std::string(f.list) + "[" + std::to_string(f.index) + "]" + (f.field[0] != '\0' ? "." : "") + f.field;
}

void check_at_least(int64_t v, int64_t min, const field_ref& f) {
  if (v < min) fail(name_of(f) + " is " + std::to_string(v) + " (must be >= " + std::to_string(min) + ")");
}

void check_size(size_t n, uint32_t limit, const field_ref& f) {
  if (n > limit) fail(name_of(f) + " has " + std::to_string(n) + " entries (limit " + std::to_string(limit) + ")");
}

void check_all_at_least(const std::vector<int32_t>& v, int32_t min, const field_ref& f) {
  for (int32_t x : v)
    if (x < min) fail(name_of(f) + " holds " + std::to_string(x) + " (entries must be >= " + std::to_string(min) + ")");
}

void validate(const step_plan& m) {
  constexpr const char* kRows = "step_plan.rows";
  check_at_least(m.draft_len, 0, {nullptr, 0, "step_plan.draft_len"});
  check_size(m.rows.size(), kMaxRows, {nullptr, 0, kRows});
  check_size(m.free_req_slots.size(), kMaxRows, {nullptr, 0, "step_plan.free_req_slots"});
  check_size(m.commits.size(), kMaxRows, {nullptr, 0, "step_plan.commits"});
  check_size(m.draft_commits.size(), kMaxRows, {nullptr, 0, "step_plan.draft_commits"});
  check_size(m.kv_moves.size(), kMaxRows, {nullptr, 0, "step_plan.kv_moves"});
  check_at_least(m.extend_rows, 0, {nullptr, 0, "step_plan.extend_rows"});
  check_at_least(m.draft_width, 1, {nullptr, 0, "step_plan.draft_width"});
  if (static_cast<size_t>(m.extend_rows) > m.rows.size())
    fail("step_plan.extend_rows = " + std::to_string(m.extend_rows) + " exceeds the " + std::to_string(m.rows.size()) +
         " rows of the plan");
  for (size_t i = 0; i < m.kv_moves.size(); ++i) {
    check_at_least(m.kv_moves[i].req_slot, 0, {"step_plan.kv_moves", i, "req_slot"});
    check_at_least(m.kv_moves[i].from_pos, 0, {"step_plan.kv_moves", i, "from_pos"});
    check_at_least(m.kv_moves[i].to_pos, 0, {"step_plan.kv_moves", i, "to_pos"});
  }
  for (size_t i = 0; i < m.rows.size(); ++i) {
    const plan_row& r = m.rows[i];
    check_at_least(r.req_slot, -1, {kRows, i, "req_slot"});
    check_at_least(r.mamba_slot, -1, {kRows, i, "mamba_slot"});
    check_at_least(r.prefix_len, 0, {kRows, i, "prefix_len"});
    check_at_least(r.first_page_pos, 0, {kRows, i, "first_page_pos"});
    check_at_least(r.output_index, 0, {kRows, i, "output_index"});
    check_at_least(r.draft_step, 0, {kRows, i, "draft_step"});
    check_at_least(r.sample.top_k, 0, {kRows, i, "sample.top_k"});
    check_size(r.tokens.size(), kMaxTokensPerRow, {kRows, i, "tokens"});
    check_size(r.new_pages.size(), kMaxTokensPerRow, {kRows, i, "new_pages"});
    check_size(r.retrieve_next_token.size(), kMaxTokensPerRow, {kRows, i, "retrieve_next_token"});
    check_size(r.retrieve_next_sibling.size(), kMaxTokensPerRow, {kRows, i, "retrieve_next_sibling"});
    if (r.retrieve_next_token.size() != r.retrieve_next_sibling.size())
      fail(name_of({kRows, i, ""}) + ": retrieve_next_token has " + std::to_string(r.retrieve_next_token.size()) +
           " entries but retrieve_next_sibling has " + std::to_string(r.retrieve_next_sibling.size()) +
           " (must be equal, or both empty)");
    check_all_at_least(r.retrieve_next_token, -1, {kRows, i, "retrieve_next_token"});
    check_all_at_least(r.retrieve_next_sibling, -1, {kRows, i, "retrieve_next_sibling"});
    const logits_processing& lp = r.processing;
    check_at_least(lp.min_tokens, 0, {kRows, i, "processing.min_tokens"});
    check_at_least(lp.prompt_len, 0, {kRows, i, "processing.prompt_len"});
    check_at_least(lp.top_logprobs, 0, {kRows, i, "processing.top_logprobs"});
    if (lp.top_logprobs > kMaxTopLogprobs)
      fail(name_of({kRows, i, "processing.top_logprobs"}) + " = " + std::to_string(lp.top_logprobs) + " exceeds " +
           std::to_string(kMaxTopLogprobs));
    check_size(lp.min_tokens_mask.size(), kMaxTokensPerRow, {kRows, i, "processing.min_tokens_mask"});
    check_size(lp.bias_ids.size(), kMaxTokensPerRow, {kRows, i, "processing.bias_ids"});
    if (lp.bias_ids.size() != lp.bias_values.size())
      fail(name_of({kRows, i, ""}) + ": processing.bias_ids has " + std::to_string(lp.bias_ids.size()) +
           " entries but bias_values has " + std::to_string(lp.bias_values.size()));
  }
  check_all_at_least(m.free_req_slots, 0, {nullptr, 0, "step_plan.free_req_slots"});
  for (size_t i = 0; i < m.commits.size(); ++i) {
    const commit_op& c = m.commits[i];
    check_at_least(c.mamba_slot, -1, {"step_plan.commits", i, "mamba_slot"});
    check_at_least(c.row, 0, {"step_plan.commits", i, "row"});
    check_at_least(c.accepted_step, 0, {"step_plan.commits", i, "accepted_step"});
  }
  check_size(m.state_restores.size(), kMaxRows, {nullptr, 0, "step_plan.state_restores"});
  check_size(m.state_saves.size(), kMaxRows, {nullptr, 0, "step_plan.state_saves"});
  for (size_t i = 0; i < m.state_restores.size(); ++i) {
    check_at_least(m.state_restores[i].src_slot, 0, {"step_plan.state_restores", i, "src_slot"});
    check_at_least(m.state_restores[i].dst_slot, 0, {"step_plan.state_restores", i, "dst_slot"});
  }
  for (size_t i = 0; i < m.state_saves.size(); ++i) {
    check_at_least(m.state_saves[i].src_slot, 0, {"step_plan.state_saves", i, "src_slot"});
    check_at_least(m.state_saves[i].dst_slot, 0, {"step_plan.state_saves", i, "dst_slot"});
  }
  for (size_t i = 0; i < m.draft_commits.size(); ++i) {
    const commit_op& c = m.draft_commits[i];
    check_at_least(c.mamba_slot, -1, {"step_plan.draft_commits", i, "mamba_slot"});
    check_at_least(c.row, 0, {"step_plan.draft_commits", i, "row"});
    check_at_least(c.accepted_step, 0, {"step_plan.draft_commits", i, "accepted_step"});
  }
}

void validate(const step_result& m) {
  constexpr const char* kRows = "step_result.rows";
  check_size(m.error.size(), kMaxStringBytes, {nullptr, 0, "step_result.error"});
  check_size(m.rows.size(), kMaxRows, {nullptr, 0, kRows});
  for (size_t i = 0; i < m.rows.size(); ++i) {
    const row_result& r = m.rows[i];
    check_size(r.tokens.size(), kMaxTokensPerRow, {kRows, i, "tokens"});
    if (!r.logprobs.empty() && r.logprobs.size() != r.tokens.size())
      fail(name_of({kRows, i, ""}) + ": logprobs has " + std::to_string(r.logprobs.size()) + " entries for " +
           std::to_string(r.tokens.size()) + " tokens (must be equal, or empty)");
    if (r.top_n < 0 || r.top_n > kMaxTopLogprobs)
      fail(name_of({kRows, i, "top_n"}) + " = " + std::to_string(r.top_n) + " (must be in [0, " +
           std::to_string(kMaxTopLogprobs) + "])");
    const size_t top = r.tokens.size() * static_cast<size_t>(r.top_n);
    if (r.top_ids.size() != top || r.top_logprobs.size() != top)
      fail(name_of({kRows, i, ""}) + ": top_ids / top_logprobs have " + std::to_string(r.top_ids.size()) + " / " +
           std::to_string(r.top_logprobs.size()) + " entries for " + std::to_string(r.tokens.size()) +
           " tokens of top_n " + std::to_string(r.top_n));
  }
  check_at_least(m.decode_rows, 0, {nullptr, 0, "step_result.decode_rows"});
  check_at_least(m.sparse_rows, 0, {nullptr, 0, "step_result.sparse_rows"});
  if (m.sparse_rows > m.decode_rows)
    fail("step_result.sparse_rows " + std::to_string(m.sparse_rows) + " exceeds decode_rows " +
         std::to_string(m.decode_rows));
  check_at_least(m.pages_read, int64_t{0}, {nullptr, 0, "step_result.pages_read"});
}

void validate(const hello& m) {
  check_at_least(m.dp_rank, 0, {nullptr, 0, "hello.dp_rank"});
  check_at_least(m.tp_size, 1, {nullptr, 0, "hello.tp_size"});
  check_at_least(m.num_pages, 0, {nullptr, 0, "hello.num_pages"});
  check_at_least(m.mamba_slots, 0, {nullptr, 0, "hello.mamba_slots"});
  check_at_least(m.max_requests, 0, {nullptr, 0, "hello.max_requests"});
  check_at_least(m.max_context, 0, {nullptr, 0, "hello.max_context"});
  check_at_least(m.page_size, 0, {nullptr, 0, "hello.page_size"});
  check_at_least(m.vocab_size, 0, {nullptr, 0, "hello.vocab_size"});
  check_size(m.host.size(), kMaxStringBytes, {nullptr, 0, "hello.host"});
}

}  // namespace

const char* message_type_name(message_type t) {
  switch (t) {
    case message_type::kHello: return "hello";
    case message_type::kStepPlan: return "step_plan";
    case message_type::kStepResult: return "step_result";
    case message_type::kShutdown: return "shutdown";
  }
  return "unknown";
}

// ---- encode ---------------------------------------------------------------------------------

std::vector<uint8_t> encode(const step_plan& m) {
  validate(m);
  writer w;
  w.u64(m.step_id);
  w.u8(m.mode);
  w.i32(m.draft_len);
  w.boolean(m.is_tree);
  w.boolean(m.want_logprobs);
  w.count(m.rows.size(), kMaxRows, "step_plan.rows");
  for (const plan_row& r : m.rows) {
    w.i64(r.request_id);
    w.i32(r.req_slot);
    w.i32(r.mamba_slot);
    w.i32(r.prefix_len);
    w.i32s(r.tokens, kMaxTokensPerRow, "plan_row.tokens");
    w.i32(r.first_page_pos);
    w.i32s(r.new_pages, kMaxTokensPerRow, "plan_row.new_pages");
    w.f32(r.sample.temperature);
    w.i32(r.sample.top_k);
    w.f32(r.sample.top_p);
    w.u64(r.sample.seed);
    w.i32(r.output_index);
    w.boolean(r.is_decode);
    w.boolean(r.reset_state);
    w.boolean(r.dense_attention);
    w.i32(r.draft_step);
    w.i32s(r.retrieve_next_token, kMaxTokensPerRow, "plan_row.retrieve_next_token");
    w.i32s(r.retrieve_next_sibling, kMaxTokensPerRow, "plan_row.retrieve_next_sibling");
  }
  w.i32s(m.free_req_slots, kMaxRows, "step_plan.free_req_slots");
  w.count(m.commits.size(), kMaxRows, "step_plan.commits");
  for (const commit_op& c : m.commits) {
    w.i32(c.mamba_slot);
    w.i32(c.row);
    w.i32(c.accepted_step);
  }
  // Optional trailing extension: written only when used, so a plan without it is byte-identical
  // to a version-1 plan from before the extension.
  if (!m.draft_commits.empty() || !m.kv_moves.empty()) {
    w.u8(kPlanExtensionSpec);
    w.count(m.draft_commits.size(), kMaxRows, "step_plan.draft_commits");
    for (const commit_op& c : m.draft_commits) {
      w.i32(c.mamba_slot);
      w.i32(c.row);
      w.i32(c.accepted_step);
    }
    w.count(m.kv_moves.size(), kMaxRows, "step_plan.kv_moves");
    for (const kv_move_op& k : m.kv_moves) {
      w.i32(k.req_slot);
      w.i32(k.from_pos);
      w.i32(k.to_pos);
    }
  }
  if (m.extend_rows > 0) {
    w.u8(kPlanExtensionMixed);
    w.i32(m.extend_rows);
  }
  if (m.draft_width > 1) {
    w.u8(kPlanExtensionDraftWidth);
    w.i32(m.draft_width);
  }
  size_t processed = 0;
  for (const plan_row& r : m.rows) processed += r.processing.any() ? 1 : 0;
  if (processed > 0) {
    w.u8(kPlanExtensionProcessing);
    w.count(processed, kMaxRows, "step_plan.processing");
    for (size_t i = 0; i < m.rows.size(); ++i) {
      const logits_processing& lp = m.rows[i].processing;
      if (!lp.any()) continue;
      w.i32(static_cast<int32_t>(i));
      w.f32(lp.repetition_penalty);
      w.f32(lp.presence_penalty);
      w.f32(lp.frequency_penalty);
      w.i32(lp.min_tokens);
      w.i32(lp.prompt_len);
      w.boolean(lp.logprobs);
      w.i32(lp.top_logprobs);
      w.i32s(lp.min_tokens_mask, kMaxTokensPerRow, "logits_processing.min_tokens_mask");
      w.i32s(lp.bias_ids, kMaxTokensPerRow, "logits_processing.bias_ids");
      w.f32s(lp.bias_values, kMaxTokensPerRow, "logits_processing.bias_values");
    }
  }
  if (!m.state_restores.empty() || !m.state_saves.empty()) {
    w.u8(kPlanExtensionPrefix);
    for (const auto* ops : {&m.state_restores, &m.state_saves}) {
      w.count(ops->size(), kMaxRows, "step_plan.state_copies");
      for (const state_copy_op& c : *ops) {
        w.i32(c.src_slot);
        w.i32(c.dst_slot);
      }
    }
  }
  return w.finish(message_type::kStepPlan);
}

std::vector<uint8_t> encode(const step_result& m) {
  validate(m);
  writer w;
  w.u64(m.step_id);
  w.boolean(m.ok);
  w.str(m.error, "step_result.error");
  w.count(m.rows.size(), kMaxRows, "step_result.rows");
  for (const row_result& r : m.rows) {
    w.i64(r.request_id);
    w.i32s(r.tokens, kMaxTokensPerRow, "row_result.tokens");
    w.f32s(r.logprobs, kMaxTokensPerRow, "row_result.logprobs");
  }
  w.f64(m.step_ms);
  w.i32(m.decode_rows);
  w.i32(m.sparse_rows);
  w.i64(m.pages_read);
  size_t with_top = 0;
  for (const row_result& r : m.rows) with_top += r.top_n > 0 ? 1 : 0;
  if (with_top > 0) {
    w.u8(kResultExtensionTopLogprobs);
    w.count(with_top, kMaxRows, "step_result.top_logprobs");
    for (size_t i = 0; i < m.rows.size(); ++i) {
      const row_result& r = m.rows[i];
      if (r.top_n == 0) continue;
      w.i32(static_cast<int32_t>(i));
      w.i32(r.top_n);
      w.i32s(r.top_ids, kMaxTokensPerRow, "row_result.top_ids");
      w.f32s(r.top_logprobs, kMaxTokensPerRow, "row_result.top_logprobs");
    }
  }
  return w.finish(message_type::kStepResult);
}

std::vector<uint8_t> encode(const hello& m) {
  validate(m);
  writer w;
  w.i32(m.dp_rank);
  w.i32(m.tp_size);
  w.i32(m.num_pages);
  w.i32(m.mamba_slots);
  w.i32(m.max_requests);
  w.i32(m.max_context);
  w.i32(m.page_size);
  w.i64(m.vocab_size);
  w.str(m.host, "hello.host");
  return w.finish(message_type::kHello);
}

std::vector<uint8_t> encode_shutdown() { return writer().finish(message_type::kShutdown); }

// ---- decode ---------------------------------------------------------------------------------

message_type peek_type(std::span<const uint8_t> bytes) { return open_message(bytes).first; }

step_plan decode_step_plan(std::span<const uint8_t> bytes) {
  reader r(open_expecting(bytes, message_type::kStepPlan));
  step_plan m;
  m.step_id = r.u64("step_plan.step_id");
  m.mode = r.u8("step_plan.mode");
  m.draft_len = r.i32("step_plan.draft_len");
  m.is_tree = r.boolean("step_plan.is_tree");
  m.want_logprobs = r.boolean("step_plan.want_logprobs");
  const uint32_t rows = r.count(kMaxRows, kPlanRowMinBytes, "step_plan.rows");
  m.rows.reserve(rows);
  for (uint32_t i = 0; i < rows; ++i) {
    plan_row& row = m.rows.emplace_back();
    row.request_id = r.i64("plan_row.request_id");
    row.req_slot = r.i32("plan_row.req_slot");
    row.mamba_slot = r.i32("plan_row.mamba_slot");
    row.prefix_len = r.i32("plan_row.prefix_len");
    row.tokens = r.i32s(kMaxTokensPerRow, "plan_row.tokens");
    row.first_page_pos = r.i32("plan_row.first_page_pos");
    row.new_pages = r.i32s(kMaxTokensPerRow, "plan_row.new_pages");
    row.sample.temperature = r.f32("plan_row.sample.temperature");
    row.sample.top_k = r.i32("plan_row.sample.top_k");
    row.sample.top_p = r.f32("plan_row.sample.top_p");
    row.sample.seed = r.u64("plan_row.sample.seed");
    row.output_index = r.i32("plan_row.output_index");
    row.is_decode = r.boolean("plan_row.is_decode");
    row.reset_state = r.boolean("plan_row.reset_state");
    row.dense_attention = r.boolean("plan_row.dense_attention");
    row.draft_step = r.i32("plan_row.draft_step");
    row.retrieve_next_token = r.i32s(kMaxTokensPerRow, "plan_row.retrieve_next_token");
    row.retrieve_next_sibling = r.i32s(kMaxTokensPerRow, "plan_row.retrieve_next_sibling");
  }
  m.free_req_slots = r.i32s(kMaxRows, "step_plan.free_req_slots");
  const uint32_t commits = r.count(kMaxRows, kCommitBytes, "step_plan.commits");
  m.commits.reserve(commits);
  for (uint32_t i = 0; i < commits; ++i) {
    commit_op& c = m.commits.emplace_back();
    c.mamba_slot = r.i32("commit_op.mamba_slot");
    c.row = r.i32("commit_op.row");
    c.accepted_step = r.i32("commit_op.accepted_step");
  }
  // Optional trailing extensions, each at most once and in tag order.
  uint8_t last_ext = 0;
  while (!r.at_end()) {
    const size_t trailing = r.left();
    const size_t at = r.where();
    const uint8_t ext = r.u8("step_plan.extension");
    if (ext != kPlanExtensionSpec && ext != kPlanExtensionMixed && ext != kPlanExtensionDraftWidth &&
        ext != kPlanExtensionProcessing && ext != kPlanExtensionPrefix)
      fail(std::to_string(trailing) + " trailing bytes after the step_plan payload at offset " + std::to_string(at) +
           " (unknown extension tag " + std::to_string(ext) + "; supported, in order: " +
           std::to_string(kPlanExtensionSpec) + " speculative commits, " + std::to_string(kPlanExtensionMixed) +
           " extend rows of a verify step, " + std::to_string(kPlanExtensionDraftWidth) + " draft width, " +
           std::to_string(kPlanExtensionProcessing) + " logits processing, " +
           std::to_string(kPlanExtensionPrefix) + " prefix-cache state copies)");
    if (ext <= last_ext)
      fail("step_plan extension tag " + std::to_string(ext) + " at offset " + std::to_string(at) +
           " repeats or follows a later tag (each extension at most once, in tag order)");
    last_ext = ext;
    if (ext == kPlanExtensionMixed) {
      m.extend_rows = r.i32("step_plan.extend_rows");
      if (m.extend_rows <= 0) throw wire_error("step_plan: the extend-rows extension is present but not positive");
      continue;
    }
    if (ext == kPlanExtensionDraftWidth) {
      m.draft_width = r.i32("step_plan.draft_width");
      if (m.draft_width <= 1) throw wire_error("step_plan: the draft-width extension is present but not > 1");
      continue;
    }
    if (ext == kPlanExtensionProcessing) {
      const uint32_t n = r.count(kMaxRows, 41, "step_plan.processing");
      if (n == 0) throw wire_error("step_plan: the processing extension is present but empty");
      int32_t last_row = -1;
      for (uint32_t k = 0; k < n; ++k) {
        const int32_t row = r.i32("logits_processing.row");
        if (row <= last_row || row >= static_cast<int32_t>(m.rows.size()))
          fail("step_plan.processing[" + std::to_string(k) + "].row = " + std::to_string(row) +
               " (rows ascending, each at most once, below " + std::to_string(m.rows.size()) + ")");
        last_row = row;
        logits_processing& lp = m.rows[static_cast<size_t>(row)].processing;
        lp.repetition_penalty = r.f32("logits_processing.repetition_penalty");
        lp.presence_penalty = r.f32("logits_processing.presence_penalty");
        lp.frequency_penalty = r.f32("logits_processing.frequency_penalty");
        lp.min_tokens = r.i32("logits_processing.min_tokens");
        lp.prompt_len = r.i32("logits_processing.prompt_len");
        lp.logprobs = r.boolean("logits_processing.logprobs");
        lp.top_logprobs = r.i32("logits_processing.top_logprobs");
        lp.min_tokens_mask = r.i32s(kMaxTokensPerRow, "logits_processing.min_tokens_mask");
        lp.bias_ids = r.i32s(kMaxTokensPerRow, "logits_processing.bias_ids");
        lp.bias_values = r.f32s(kMaxTokensPerRow, "logits_processing.bias_values");
      }
      continue;
    }
    if (ext == kPlanExtensionPrefix) {
      for (auto* ops : {&m.state_restores, &m.state_saves}) {
        const uint32_t n = r.count(kMaxRows, 8, "step_plan.state_copies");
        ops->reserve(n);
        for (uint32_t i = 0; i < n; ++i) {
          state_copy_op& c = ops->emplace_back();
          c.src_slot = r.i32("state_copy_op.src_slot");
          c.dst_slot = r.i32("state_copy_op.dst_slot");
        }
      }
      if (m.state_restores.empty() && m.state_saves.empty())
        throw wire_error("step_plan: the prefix-cache extension is present but empty");
      continue;
    }
    const uint32_t n = r.count(kMaxRows, kCommitBytes, "step_plan.draft_commits");
    m.draft_commits.reserve(n);
    for (uint32_t i = 0; i < n; ++i) {
      commit_op& c = m.draft_commits.emplace_back();
      c.mamba_slot = r.i32("draft_commit_op.mamba_slot");
      c.row = r.i32("draft_commit_op.row");
      c.accepted_step = r.i32("draft_commit_op.accepted_step");
    }
    const uint32_t moves = r.count(kMaxRows, 12, "step_plan.kv_moves");
    m.kv_moves.reserve(moves);
    for (uint32_t i = 0; i < moves; ++i) {
      kv_move_op& k = m.kv_moves.emplace_back();
      k.req_slot = r.i32("kv_move_op.req_slot");
      k.from_pos = r.i32("kv_move_op.from_pos");
      k.to_pos = r.i32("kv_move_op.to_pos");
    }
    if (m.draft_commits.empty() && m.kv_moves.empty())
      throw wire_error("step_plan: the speculative extension is present but empty");
  }
  r.expect_end(message_type::kStepPlan);
  validate(m);
  return m;
}

step_result decode_step_result(std::span<const uint8_t> bytes) {
  reader r(open_expecting(bytes, message_type::kStepResult));
  step_result m;
  m.step_id = r.u64("step_result.step_id");
  m.ok = r.boolean("step_result.ok");
  m.error = r.str("step_result.error");
  const uint32_t rows = r.count(kMaxRows, kRowResultMinBytes, "step_result.rows");
  m.rows.reserve(rows);
  for (uint32_t i = 0; i < rows; ++i) {
    row_result& row = m.rows.emplace_back();
    row.request_id = r.i64("row_result.request_id");
    row.tokens = r.i32s(kMaxTokensPerRow, "row_result.tokens");
    row.logprobs = r.f32s(kMaxTokensPerRow, "row_result.logprobs");
  }
  m.step_ms = r.f64("step_result.step_ms");
  m.decode_rows = r.i32("step_result.decode_rows");
  m.sparse_rows = r.i32("step_result.sparse_rows");
  m.pages_read = r.i64("step_result.pages_read");
  if (!r.at_end()) {
    const size_t at = r.where();
    const uint8_t ext = r.u8("step_result.extension");
    if (ext != kResultExtensionTopLogprobs)
      fail("unknown step_result extension tag " + std::to_string(ext) + " at offset " + std::to_string(at) +
           " (supported: " + std::to_string(kResultExtensionTopLogprobs) + " top logprobs)");
    const uint32_t n = r.count(kMaxRows, 16, "step_result.top_logprobs");
    if (n == 0) throw wire_error("step_result: the top-logprobs extension is present but empty");
    int32_t last_row = -1;
    for (uint32_t k = 0; k < n; ++k) {
      const int32_t row = r.i32("row_result.row");
      if (row <= last_row || row >= static_cast<int32_t>(m.rows.size()))
        fail("step_result.top_logprobs[" + std::to_string(k) + "].row = " + std::to_string(row) +
             " (rows ascending, each at most once, below " + std::to_string(m.rows.size()) + ")");
      last_row = row;
      row_result& rr = m.rows[static_cast<size_t>(row)];
      rr.top_n = r.i32("row_result.top_n");
      if (rr.top_n <= 0) fail("step_result.top_logprobs[" + std::to_string(k) + "].top_n must be > 0");
      rr.top_ids = r.i32s(kMaxTokensPerRow, "row_result.top_ids");
      rr.top_logprobs = r.f32s(kMaxTokensPerRow, "row_result.top_logprobs");
    }
  }
  r.expect_end(message_type::kStepResult);
  validate(m);
  return m;
}

hello decode_hello(std::span<const uint8_t> bytes) {
  reader r(open_expecting(bytes, message_type::kHello));
  hello m;
  m.dp_rank = r.i32("hello.dp_rank");
  m.tp_size = r.i32("hello.tp_size");
  m.num_pages = r.i32("hello.num_pages");
  m.mamba_slots = r.i32("hello.mamba_slots");
  m.max_requests = r.i32("hello.max_requests");
  m.max_context = r.i32("hello.max_context");
  m.page_size = r.i32("hello.page_size");
  m.vocab_size = r.i64("hello.vocab_size");
  m.host = r.str("hello.host");
  r.expect_end(message_type::kHello);
  validate(m);
  return m;
}

void decode_shutdown(std::span<const uint8_t> bytes) {
  reader r(open_expecting(bytes, message_type::kShutdown));
  r.expect_end(message_type::kShutdown);
}

}  // namespace hyserve::wire
