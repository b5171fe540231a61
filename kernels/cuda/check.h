#pragma once
// Error checks for CUDA runtime and cuBLAS calls. A failed call throws hyserve::error naming
// the statement, the error and file:line; launches are followed by HYSERVE_CUDA_CHECK_LAUNCH()
// so that a bad configuration surfaces at its launch site, not at the next synchronisation.
// Host-only and free of device code: device_buffer.cpp (plain C++) includes it too.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "hyserve/common/error.h"

namespace hyserve::kernels::cuda_detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* stmt, const char* file, int line) {
  throw error(std::string("CUDA call failed: ") + stmt + " → " + cudaGetErrorName(status) + " (" +
              cudaGetErrorString(status) + ") at " + file + ":" + std::to_string(line));
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const char* stmt, const char* file, int line) {
  throw error(std::string("cuBLAS call failed: ") + stmt + " → " + cublasGetStatusName(status) + " (" +
              cublasGetStatusString(status) + ") at " + file + ":" + std::to_string(line));
}

// Adds to the process's device → host byte count (kernels::device_to_host_bytes).
void count_device_to_host(size_t bytes);

}  // namespace hyserve::kernels::cuda_detail

#define CUDA_CHECK(stmt)                                                                      \
  do {                                                                                        \
    const cudaError_t hyserve_cuda_status_ = (stmt);                                          \
    if (hyserve_cuda_status_ != cudaSuccess)                                                  \
      ::hyserve::kernels::cuda_detail::throw_cuda_error(hyserve_cuda_status_, #stmt, __FILE__, \
                                                        __LINE__);                            \
  } while (0)

#define CUBLAS_CHECK(stmt)                                                                      \
  do {                                                                                          \
    const cublasStatus_t hyserve_cublas_status_ = (stmt);                                       \
    if (hyserve_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                        \
      ::hyserve::kernels::cuda_detail::throw_cublas_error(hyserve_cublas_status_, #stmt, __FILE__, \
                                                          __LINE__);                            \
  } while (0)

// After a <<<...>>> launch: configuration errors (too much shared memory, bad grid) are
// reported here; faults inside the kernel surface at the next synchronising call.
#define HYSERVE_CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
