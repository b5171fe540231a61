#include "hyserve/kernels/device.h"

namespace hyserve::kernels {

// Only linked when the CUDA backend is not built.
int cuda_device_count() { return 0; }

}  // namespace hyserve::kernels
