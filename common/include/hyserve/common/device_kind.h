#pragma once
// The devices a tensor can live on. Kept apart from tensor.h so that CUDA translation units
// (built with the CUDA compiler's language level) can name it.
#include <cstdint>

namespace hyserve {

enum class device_kind : uint8_t { kCpu, kCuda };

}  // namespace hyserve
