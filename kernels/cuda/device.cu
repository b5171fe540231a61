#include <cuda_runtime.h>

#include "hyserve/kernels/device.h"

namespace hyserve::kernels {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return n;
}

}  // namespace hyserve::kernels
