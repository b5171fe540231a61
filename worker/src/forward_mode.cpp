#include "hyserve/worker/forward_mode.h"

#include <string>

#include "hyserve/common/error.h"

namespace hyserve::worker {

std::string_view forward_mode_name(forward_mode m) {
  switch (m) {
    case forward_mode::kExtend: return "extend";
    case forward_mode::kDecode: return "decode";
    case forward_mode::kMixed: return "mixed";
    case forward_mode::kIdle: return "idle";
    case forward_mode::kTargetVerify: return "target_verify";
    case forward_mode::kDraftExtend: return "draft_extend";
    case forward_mode::kDraft: return "draft";
  }
  // Only reachable through a cast of a value that is not an enumerator; names are used in
  // error messages, so this must not throw.
  return "unknown";
}

forward_mode forward_mode_from_byte(uint8_t byte) {
  for (forward_mode m : kAllForwardModes)
    if (static_cast<uint8_t>(m) == byte) return m;
  std::string supported;
  for (forward_mode m : kAllForwardModes) {
    if (!supported.empty()) supported += ", ";
    supported += std::to_string(static_cast<unsigned>(m)) + "=" + std::string(forward_mode_name(m));
  }
  throw invalid_argument_error("invalid forward mode byte " + std::to_string(static_cast<unsigned>(byte)) +
                               "; supported: " + supported);
}

bool is_extend_like(forward_mode m) {
  switch (m) {
    case forward_mode::kExtend:
    case forward_mode::kMixed:
    case forward_mode::kDraftExtend: return true;
    case forward_mode::kDecode:
    case forward_mode::kIdle:
    case forward_mode::kTargetVerify:
    case forward_mode::kDraft: return false;
  }
  throw_check_failure("is_extend_like", __FILE__, __LINE__,
                      "forward mode value " + std::to_string(static_cast<unsigned>(m)) + " is not an enumerator");
}

bool writes_step_scratch(forward_mode m) {
  switch (m) {
    case forward_mode::kTargetVerify:
    case forward_mode::kDraft: return true;
    case forward_mode::kExtend:
    case forward_mode::kDecode:
    case forward_mode::kMixed:
    case forward_mode::kIdle:
    case forward_mode::kDraftExtend: return false;
  }
  throw_check_failure("writes_step_scratch", __FILE__, __LINE__,
                      "forward mode value " + std::to_string(static_cast<unsigned>(m)) + " is not an enumerator");
}

}  // namespace hyserve::worker
