#pragma once
// The seven forward modes of a step (docs/ARCHITECTURE.md, Forward modes and hybrid metadata), shared by the coordinator (which puts one
// in every step plan, as its byte) and the workers (which decode the byte and switch over the
// mode). Every switch over forward_mode has no default: and the build uses -Werror=switch, so
// a new mode cannot be added unhandled.
#include <array>
#include <cstdint>

namespace hyserve {

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

// The mode's byte in a step plan (wire::step_plan::mode).
constexpr uint8_t mode_byte(forward_mode m) { return static_cast<uint8_t>(m); }

}  // namespace hyserve
