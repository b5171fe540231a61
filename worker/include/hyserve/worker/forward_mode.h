#pragma once
// The worker's side of the forward modes (the enum is shared: hyserve/common/forward_mode.h):
// names, decoding of the wire byte, and the modes' properties.
#include <array>
#include <cstdint>
#include <string_view>

#include "hyserve/common/forward_mode.h"

namespace hyserve::worker {

using hyserve::forward_mode;  // hyserve/common/forward_mode.h
using hyserve::kAllForwardModes;
using hyserve::mode_byte;

std::string_view forward_mode_name(forward_mode m);

// Decodes a mode byte from the wire. Throws invalid_argument_error naming the value and the
// supported set ("invalid forward mode byte 9; supported: 0=extend, 1=decode, …").
forward_mode forward_mode_from_byte(uint8_t byte);

// Modes whose rows carry several tokens that extend the cached prefix (prefill-like).
bool is_extend_like(forward_mode m);
// Modes that must not modify persistent SSM state (they write per-step scratch instead).
bool writes_step_scratch(forward_mode m);

}  // namespace hyserve::worker
