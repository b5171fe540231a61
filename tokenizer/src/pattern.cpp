#include "pattern.h"

#if HYSERVE_TOKENIZER_HAS_REGEX
#include <pcre2.h>
#endif

#include "hyserve/common/error.h"
#include "utf8_scan.h"

namespace hyserve::tokenizer {

#if HYSERVE_TOKENIZER_HAS_REGEX

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof(buf));
  return n < 0 ? "PCRE2 error " + std::to_string(code) : std::string(reinterpret_cast<const char*>(buf));
}

// Largest JIT stack a single match may grow to (very long runs of one character class with
// lookahead backtracking); the default 32 KiB is tried first.
constexpr size_t kJitStackMax = size_t{64} << 20;

}  // namespace

struct split_pattern::regex_code {
  pcre2_code* code = nullptr;
  bool jit = false;  // JIT-compiled: pcre2_jit_match skips the interpreter's option checks
  ~regex_code() { pcre2_code_free(code); }
};

struct match_scratch::state {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;  // null until a match overflows the default stack
  ~state() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

match_scratch::match_scratch() = default;
match_scratch::~match_scratch() = default;

match_scratch::state& match_scratch::get() {
  if (!state_) {
    auto s = std::make_unique<state>();
    // One ovector pair is enough: only the whole-match range is read (a pattern with groups
    // then returns 0, "ovector too small", which still reports the match).
    s->data = pcre2_match_data_create(1, nullptr);
    s->context = pcre2_match_context_create(nullptr);
    if (!s->data || !s->context) throw std::bad_alloc();
    state_ = std::move(s);
  }
  return *state_;
}

split_pattern::~split_pattern() = default;

std::unique_ptr<split_pattern> split_pattern::regex(std::string_view pattern, std::string& error) {
  int code = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                 PCRE2_UTF | PCRE2_UCP, &code, &offset, nullptr);
  if (!re) {
    error = pcre2_message(code) + " at offset " + std::to_string(offset);
    return nullptr;
  }
  // JIT is optional: without it (or on a platform it does not support) the interpreter runs.
  const bool jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
  std::unique_ptr<split_pattern> p(new split_pattern());
  p->code_ = std::make_unique<regex_code>();
  p->code_->code = re;
  p->code_->jit = jit;
  p->source_ = std::string(pattern);
  return p;
}

#else  // !HYSERVE_TOKENIZER_HAS_REGEX: literal patterns only

struct split_pattern::regex_code {};
struct match_scratch::state {};

match_scratch::match_scratch() = default;
match_scratch::~match_scratch() = default;

match_scratch::state& match_scratch::get() {
  if (!state_) state_ = std::make_unique<state>();
  return *state_;
}

split_pattern::~split_pattern() = default;

std::unique_ptr<split_pattern> split_pattern::regex(std::string_view, std::string& error) {
  error = "this build has no regex support (PCRE2 was not found when it was built: install libpcre2-dev and rebuild)";
  return nullptr;
}

#endif  // HYSERVE_TOKENIZER_HAS_REGEX

std::unique_ptr<split_pattern> split_pattern::literal(std::string_view text) {
  std::unique_ptr<split_pattern> p(new split_pattern());
  p->source_ = std::string(text);
  return p;
}

bool split_pattern::find_next(std::string_view subject, size_t offset, match_scratch& scratch, text_range& out) const {
  const size_t n = subject.size();
  if (!code_) {
    if (source_.empty() || offset >= n) return false;
    const size_t pos = subject.find(source_, offset);
    if (pos == std::string_view::npos) return false;
    out = {pos, pos + source_.size()};
    return true;
  }
#if HYSERVE_TOKENIZER_HAS_REGEX
  match_scratch::state& st = scratch.get();
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  while (offset < n) {
    // The caller validated the whole text once; checking again per call would be quadratic
    // (pcre2_jit_match never checks).
    const auto run = [&] {
      return code_->jit ? pcre2_jit_match(code_->code, s, n, offset, 0, st.data, st.context)
                        : pcre2_match(code_->code, s, n, offset, PCRE2_NO_UTF_CHECK, st.data, st.context);
    };
    int rc = run();
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !st.jit_stack) {
      st.jit_stack = pcre2_jit_stack_create(size_t{32} << 10, kJitStackMax, nullptr);
      if (!st.jit_stack) throw std::bad_alloc();
      pcre2_jit_stack_assign(st.context, nullptr, st.jit_stack);
      rc = run();
    }
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      throw invalid_argument_error("tokenizer: pattern " + source_ + " failed on the input: " + pcre2_message(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out = {b, e};
      return true;
    }
    // Empty match (or \K trickery): step over one character so the scan always advances.
    const size_t at = e > offset ? e : offset;
    if (at >= n) return false;
    offset = at + utf8_lead_len(static_cast<unsigned char>(subject[at]));
  }
  return false;
#else
  (void)scratch;
  return false;  // unreachable: regex() never builds a pattern without PCRE2
#endif
}

}  // namespace hyserve::tokenizer
