#include "coordinator/api/text_support.h"

#include <algorithm>
#include <string_view>

namespace hyserve::coordinator::api {

namespace {

// Walks the chat format over the messages: the format's own text (bos, the message template
// around its placeholders, the generation prompt) goes to markup, each role and content to
// text. Placeholders are substituted in one pass over the template, so a "{content}" written
// by the user inside a role (or the other way round) is left as it is.
template <class Markup, class Text>
void walk_chat(const chat_format& format, std::span<const chat_message> messages, Markup&& markup, Text&& text) {
  constexpr std::string_view kRole = "{role}", kContent = "{content}";
  markup(std::string_view(format.bos));
  const std::string_view t = format.message_template;
  for (const chat_message& m : messages) {
    size_t pos = 0;
    while (pos < t.size()) {
      const size_t role = t.find(kRole, pos);
      const size_t content = t.find(kContent, pos);
      const size_t next = std::min(role, content);
      if (next == std::string_view::npos) {
        markup(t.substr(pos));
        break;
      }
      markup(t.substr(pos, next - pos));
      text(next == role ? m.role : m.content);
      pos = next + (next == role ? kRole.size() : kContent.size());
    }
  }
  markup(std::string_view(format.generation_prompt));
}

}  // namespace

std::string render_chat(const chat_format& format, std::span<const chat_message> messages) {
  std::string out;
  walk_chat(format, messages, [&](std::string_view s) { out += s; }, [&](const std::string& s) { out += s; });
  return out;
}

std::vector<int32_t> encode_chat(const tokenizer::bpe_tokenizer& tok, const chat_format& format,
                                 std::span<const chat_message> messages) {
  tokenizer::encode_options markup;  // the format's own text: its special tokens are recognised
  markup.add_special_tokens = false;
  tokenizer::encode_options user = markup;  // roles and content: plain text
  user.match_special_tokens = false;
  std::vector<int32_t> out;
  std::string pending;  // format text not encoded yet (encoded whole, up to the next role or content)
  auto flush = [&] {
    if (!pending.empty()) tok.encode_into(pending, out, markup);
    pending.clear();
  };
  walk_chat(
      format, messages, [&](std::string_view s) { pending += s; },
      [&](const std::string& text) {
        flush();
        if (!text.empty()) tok.encode_into(text, out, user);
      });
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
