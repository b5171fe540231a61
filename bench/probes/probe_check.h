#pragma once
// The device probes' error checks (bench/probes/*.cu, built alone with nvcc): a failed CUDA or
// cuBLAS call prints where and exits.
#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                   \
  do {                                                                          \
    cudaError_t e_ = (x);                                                       \
    if (e_ != cudaSuccess) {                                                    \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));    \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)
#define CB(x)                                                                   \
  do {                                                                          \
    cublasStatus_t s_ = (x);                                                    \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                          \
      std::printf("%s:%d cublas status %d\n", __FILE__, __LINE__, int(s_));     \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)
