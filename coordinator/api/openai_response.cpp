#include "coordinator/api/openai_response.h"

#include <string>

namespace hyserve::coordinator::api {

boost::json::object openai_envelope(const completion_state& state, std::string_view id_prefix, const char* object,
                                    boost::json::object choice) {
  boost::json::object out;
  out["id"] = std::string(id_prefix) + std::to_string(state.id);
  out["object"] = object;
  out["created"] = state.created;
  out["model"] = state.model;
  boost::json::array choices;
  choices.emplace_back(std::move(choice));
  out["choices"] = std::move(choices);
  return out;
}

boost::json::object openai_usage(const completion_state& state) {
  boost::json::object u;
  const auto completion = static_cast<int64_t>(state.output_ids.size());
  u["prompt_tokens"] = state.prompt_tokens;
  u["completion_tokens"] = completion;
  u["total_tokens"] = state.prompt_tokens + completion;
  boost::json::object details;
  details["cached_tokens"] = state.cached_tokens;  // served from the prefix cache
  u["prompt_tokens_details"] = std::move(details);
  return u;
}

boost::json::value finish_reason_value(const completion_state& state) {
  if (!state.finished) return nullptr;
  return boost::json::string(finish_reason_name(*state.finished));
}

}  // namespace hyserve::coordinator::api
