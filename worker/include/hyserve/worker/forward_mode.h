#pragma once
// The seven forward modes of a step (DESIGN.md §4). Every switch over forward_mode has no
// default: and the build uses -Werror=switch, so a new mode cannot be added unhandled.
#include <array>
#include <cstdint>
#include <string_view>

namespace hyserve::worker {

enum class forward_mode : uint8_t {
  kExtend = 0,
  kDecode = 1,
  kMixed = 2,
  kIdle = 3,
  kTargetVerify = 4,
  kDraftExtend = 5,
  kDraft = 6,
};

inline constexpr std::array<forward_mode, 7> kAllForwardModes = {
    forward_mode::kExtend,       forward_mode::kDecode,      forward_mode::kMixed, forward_mode::kIdle,
    forward_mode::kTargetVerify, forward_mode::kDraftExtend, forward_mode::kDraft};

std::string_view forward_mode_name(forward_mode m);

// Decodes a mode byte from the wire. Throws invalid_argument_error naming the value and the
// supported set ("invalid forward mode byte 9; supported: 0=extend, 1=decode, …").
forward_mode forward_mode_from_byte(uint8_t byte);

// Modes whose rows carry several tokens that extend the cached prefix (prefill-like).
bool is_extend_like(forward_mode m);
// Modes that must not modify persistent SSM state (they write per-step scratch instead).
bool writes_step_scratch(forward_mode m);

}  // namespace hyserve::worker
