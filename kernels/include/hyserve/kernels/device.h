#pragma once
// Device discovery. Always declared; without the CUDA backend cuda_device_count() returns 0.

namespace hyserve::kernels {

// Number of usable CUDA devices (0 when the backend is not built or no driver/device exists).
int cuda_device_count();

}  // namespace hyserve::kernels
