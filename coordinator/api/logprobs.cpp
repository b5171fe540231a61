#include "coordinator/api/logprobs.h"

#include <cmath>
#include <cstdio>
#include <string_view>

#include <boost/json.hpp>

#include "hyserve/tokenizer/utf8.h"

namespace hyserve::coordinator::api {
namespace {

std::string_view raw_bytes(const completion_state& state, int32_t id) {
  return state.tokenizer ? state.tokenizer->token_bytes(id) : std::string_view{};
}

boost::json::value logprob_value(float lp) {
  if (!std::isfinite(lp)) return nullptr;
  return static_cast<double>(lp);
}

boost::json::array byte_array(std::string_view b) {
  boost::json::array a;
  for (unsigned char c : b) a.emplace_back(static_cast<int64_t>(c));
  return a;
}

}  // namespace

std::string token_text(const completion_state& state, int32_t id) {
  if (!state.tokenizer) return "token_id:" + std::to_string(id);
  const std::string_view b = raw_bytes(state, id);
  if (tokenizer::utf8_is_valid(b)) return std::string(b);
  std::string out = "bytes:";
  for (unsigned char c : b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02x", c);
    out += hex;
  }
  return out;
}

boost::json::object completion_logprobs(const completion_state& state, size_t from, size_t to) {
  boost::json::array tokens, token_logprobs, top, offsets;
  size_t offset = state.echo_text ? state.echo_text->size() : 0;
  for (size_t i = 0; i < from && i < state.output_ids.size(); ++i)
    offset += state.tokenizer ? raw_bytes(state, state.output_ids[i]).size() : token_text(state, state.output_ids[i]).size();
  for (size_t i = from; i < to && i < state.output_ids.size(); ++i) {
    const int32_t id = state.output_ids[i];
    const std::string text = token_text(state, id);
    const float lp = i < state.output_logprobs.size() ? state.output_logprobs[i] : NAN;
    tokens.emplace_back(text);
    token_logprobs.emplace_back(logprob_value(lp));
    boost::json::object alts;
    if (i < state.output_top_logprobs.size())
      for (const auto& [tid, tlp] : state.output_top_logprobs[i]) alts[token_text(state, tid)] = logprob_value(tlp);
    // The sampled token is always among the alternatives (as vLLM reports them).
    if (!alts.contains(text)) alts[text] = logprob_value(lp);
    top.emplace_back(std::move(alts));
    offsets.emplace_back(static_cast<int64_t>(offset));
    offset += state.tokenizer ? raw_bytes(state, id).size() : text.size();
  }
  boost::json::object out;
  out["tokens"] = std::move(tokens);
  out["token_logprobs"] = std::move(token_logprobs);
  out["top_logprobs"] = std::move(top);
  out["text_offset"] = std::move(offsets);
  return out;
}

boost::json::object chat_logprobs(const completion_state& state, size_t from, size_t to) {
  boost::json::array content;
  auto entry = [&](int32_t id, float lp) {
    boost::json::object e;
    e["token"] = token_text(state, id);
    e["logprob"] = logprob_value(lp);
    e["bytes"] = byte_array(state.tokenizer ? raw_bytes(state, id) : std::string_view{});
    return e;
  };
  for (size_t i = from; i < to && i < state.output_ids.size(); ++i) {
    const float lp = i < state.output_logprobs.size() ? state.output_logprobs[i] : NAN;
    boost::json::object e = entry(state.output_ids[i], lp);
    boost::json::array alts;
    if (i < state.output_top_logprobs.size())
      for (const auto& [tid, tlp] : state.output_top_logprobs[i]) alts.emplace_back(entry(tid, tlp));
    e["top_logprobs"] = std::move(alts);
    content.emplace_back(std::move(e));
  }
  boost::json::object out;
  out["content"] = std::move(content);
  return out;
}

void add_generate_logprobs(const completion_state& state, boost::json::object& meta) {
  if (!state.logprobs && state.top_logprobs == 0) return;
  boost::json::array lps, tops;
  for (size_t i = 0; i < state.output_ids.size(); ++i) {
    const float lp = i < state.output_logprobs.size() ? state.output_logprobs[i] : NAN;
    lps.emplace_back(boost::json::array{logprob_value(lp), state.output_ids[i]});
    if (state.top_logprobs > 0) {
      boost::json::array alts;
      if (i < state.output_top_logprobs.size())
        for (const auto& [tid, tlp] : state.output_top_logprobs[i])
          alts.emplace_back(boost::json::array{logprob_value(tlp), tid});
      tops.emplace_back(std::move(alts));
    }
  }
  meta["output_token_logprobs"] = std::move(lps);
  if (state.top_logprobs > 0) meta["output_top_logprobs"] = std::move(tops);
}

}  // namespace hyserve::coordinator::api
