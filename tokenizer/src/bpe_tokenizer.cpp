// Encoding and decoding; loading is in tokenizer_json.cpp.
#include "hyserve/tokenizer/bpe_tokenizer.h"

#include "hyserve/common/error.h"
#include "hyserve/tokenizer/utf8.h"
#include "tokenizer_impl.h"

namespace hyserve::tokenizer {

namespace {

// Buffers of one encode call.
struct encode_state {
  explicit encode_state(size_t steps) : prefixed(steps) {}
  match_scratch match;
  bpe_scratch bpe;
  std::vector<std::string> prefixed;  // per pre-tokenizer step: the piece with its prefix space
  std::vector<text_segment> segments;
};

// Runs pre-tokenizer step `k` on `piece` and recurses into the next step for every piece it
// produces; past the last step the piece is a word, handed to `word`.
template <class WordSink>
void pre_tokenize_piece(const bpe_tokenizer::impl& t, size_t k, std::string_view piece, encode_state& st,
                        WordSink& word) {
  if (k == t.pre_steps.size()) {
    word(piece);
    return;
  }
  const pre_split_step& step = t.pre_steps[k];
  std::string_view subject = piece;
  if (step.prefix_space && piece.front() != ' ') {
    // Deeper steps use their own buffer, so this one stays valid while they run.
    std::string& buf = st.prefixed[k];
    buf.assign(1, ' ');
    buf.append(piece);
    subject = buf;
  }
  split_piece(step, subject, st.match, [&](size_t b, size_t e) {
    pre_tokenize_piece(t, k + 1, subject.substr(b, e - b), st, word);
  });
}

// Splits `text` at added tokens and runs every plain segment through the normalizer and the
// pre-tokenizer: on_token(id) for added tokens, on_word(bytes) for words, in order.
template <class TokenSink, class WordSink>
void run_pipeline(const bpe_tokenizer::impl& t, std::string_view text, const encode_options& options,
                  encode_state& st, TokenSink&& on_token, WordSink&& on_word) {
  const size_t bad = utf8_valid_prefix(text);
  if (bad != text.size()) {
    throw invalid_argument_error("tokenizer: text is not valid UTF-8 (byte " + std::to_string(bad) + ")");
  }
  t.added.split(text, options.match_special_tokens, st.match, st.segments);
  std::string normalized;
  for (const text_segment& seg : st.segments) {
    if (seg.token_id >= 0) {
      on_token(seg.token_id);
      continue;
    }
    std::string_view piece = text.substr(seg.begin, seg.end - seg.begin);
    if (!t.normalizers.empty()) {
      normalized = normalize(t.normalizers, piece, st.match);
      piece = normalized;
    }
    if (!piece.empty()) pre_tokenize_piece(t, 0, piece, st, on_word);
  }
}

}  // namespace

bpe_tokenizer::bpe_tokenizer(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
bpe_tokenizer::bpe_tokenizer(bpe_tokenizer&&) noexcept = default;
bpe_tokenizer& bpe_tokenizer::operator=(bpe_tokenizer&&) noexcept = default;
bpe_tokenizer::~bpe_tokenizer() = default;

std::vector<int32_t> bpe_tokenizer::encode(std::string_view text, const encode_options& options) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  encode_into(text, out, options);
  return out;
}

void bpe_tokenizer::encode_into(std::string_view text, std::vector<int32_t>& out, const encode_options& options) const {
  const impl& t = *impl_;
  encode_state st(t.pre_steps.size());
  const size_t first = out.size();
  if (options.add_special_tokens) out.insert(out.end(), t.prefix_ids.begin(), t.prefix_ids.end());
  try {
    run_pipeline(
        t, text, options, st, [&](int32_t id) { out.push_back(id); },
        [&](std::string_view word) { t.model.encode_word(word, st.bpe, out); });
  } catch (...) {
    out.resize(first);
    throw;
  }
  if (options.add_special_tokens) out.insert(out.end(), t.suffix_ids.begin(), t.suffix_ids.end());
}

std::vector<std::string> bpe_tokenizer::pre_tokenize(std::string_view text, const encode_options& options) const {
  const impl& t = *impl_;
  encode_state st(t.pre_steps.size());
  std::vector<std::string> words;
  run_pipeline(
      t, text, options, st, [](int32_t) {}, [&](std::string_view word) { words.emplace_back(word); });
  return words;
}

std::string bpe_tokenizer::decode(std::span<const int32_t> ids, const decode_options& options) const {
  const impl& t = *impl_;
  std::string bytes;
  for (const int32_t id : ids) {
    if (!is_known(id)) continue;
    if (options.skip_special_tokens && (t.id_flags[id] & impl::kSpecial)) continue;
    bytes += t.id_bytes[id];
  }
  if (utf8_is_valid(bytes)) return bytes;
  std::string text;
  utf8_append_lossy(bytes, text);
  return text;
}

std::string_view bpe_tokenizer::token_bytes(int32_t id) const {
  return is_known(id) ? std::string_view(impl_->id_bytes[id]) : std::string_view();
}

bool bpe_tokenizer::is_known(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->id_flags.size() && (impl_->id_flags[id] & impl::kKnown);
}

bool bpe_tokenizer::is_special(int32_t id) const { return is_known(id) && (impl_->id_flags[id] & impl::kSpecial); }

std::optional<int32_t> bpe_tokenizer::token_to_id(std::string_view token) const {
  const auto it = impl_->string_to_id.find(token);
  if (it == impl_->string_to_id.end()) return std::nullopt;
  return it->second;
}

std::string_view bpe_tokenizer::id_to_token(int32_t id) const {
  return is_known(id) ? std::string_view(impl_->id_strings[id]) : std::string_view();
}

int32_t bpe_tokenizer::vocab_size() const { return int32_t(impl_->id_flags.size()); }

std::span<const int32_t> bpe_tokenizer::template_prefix() const { return impl_->prefix_ids; }
std::span<const int32_t> bpe_tokenizer::template_suffix() const { return impl_->suffix_ids; }

}  // namespace hyserve::tokenizer
