#include "coordinator/api/text_support.h"

#include <algorithm>
#include <string_view>

namespace hyserve::coordinator::api {

std::string render_chat(const chat_format& format, std::span<const chat_message> messages) {
  std::string out = format.bos;
  for (const chat_message& m : messages) {
    // Placeholders are substituted in one pass over the template, so a "{content}" written by
    // the user inside a role (or the other way round) is left as it is.
    const std::string& t = format.message_template;
    size_t pos = 0;
    while (pos < t.size()) {
      const size_t role = t.find("{role}", pos);
      const size_t content = t.find("{content}", pos);
      const size_t next = std::min(role, content);
      if (next == std::string::npos) {
        out.append(t, pos, std::string::npos);
        break;
      }
      out.append(t, pos, next - pos);
      if (next == role) {
        out += m.role;
        pos = next + std::string_view("{role}").size();
      } else {
        out += m.content;
        pos = next + std::string_view("{content}").size();
      }
    }
  }
  out += format.generation_prompt;
  return out;
}

std::vector<int32_t> encode_chat(const tokenizer::bpe_tokenizer& tok, const chat_format& format,
                                 std::span<const chat_message> messages) {
  tokenizer::encode_options markup;  // the format's own text: its special tokens are recognised
  markup.add_special_tokens = false;
  tokenizer::encode_options user = markup;  // roles and content: plain text
  user.match_special_tokens = false;
  std::vector<int32_t> out;
  std::string pending = format.bos;  // format text not encoded yet
  auto flush = [&] {
    if (!pending.empty()) tok.encode_into(pending, out, markup);
    pending.clear();
  };
  for (const chat_message& m : messages) {
    const std::string& t = format.message_template;
    size_t pos = 0;
    while (pos < t.size()) {
      const size_t role = t.find("{role}", pos);
      const size_t content = t.find("{content}", pos);
      const size_t next = std::min(role, content);
      if (next == std::string::npos) {
        pending.append(t, pos, std::string::npos);
        break;
      }
      pending.append(t, pos, next - pos);
      flush();
      const std::string& text = next == role ? m.role : m.content;
      if (!text.empty()) tok.encode_into(text, out, user);
      pos = next + (next == role ? std::string_view("{role}").size() : std::string_view("{content}").size());
    }
  }
  pending += format.generation_prompt;
  flush();
  return out;
}

text_stream::text_stream(const tokenizer::bpe_tokenizer& tok, std::vector<std::string> stop_strings,
                         int32_t min_tokens)
    : detok_(tok), matcher_(std::move(stop_strings)), min_tokens_(min_tokens) {}

text_stream::update text_stream::push(std::span<const int32_t> ids) {
  update u;
  std::string piece;
  for (int32_t id : ids) {
    if (matcher_.stopped()) break;
    ++u.consumed;
    const bool early = ++pushed_ <= min_tokens_;
    piece.clear();
    detok_.push(id, piece);
    if (piece.empty()) continue;
    if (early) {
      u.delta += piece;  // before min_tokens: no stop string can end the output
      continue;
    }
    tokenizer::stop_string_matcher::result r = matcher_.push(piece);
    u.delta += r.text;
    if (r.stopped) u.stopped = true;
  }
  text_ += u.delta;
  return u;
}

std::string text_stream::finish() {
  if (matcher_.stopped()) return {};
  std::string out;
  tokenizer::stop_string_matcher::result r = matcher_.push(detok_.finish());
  out = std::move(r.text);
  if (!r.stopped) out += matcher_.finish();
  text_ += out;
  return out;
}

}  // namespace hyserve::coordinator::api
