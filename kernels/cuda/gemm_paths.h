#pragma once
// Benchmark aid for the bf16 skinny GEMM (bf16 weights, m <= 8 rows of activations; see
// gemm.cu): force the rows of B one warp streams, 2, 4 or 8 (at most 2 for m <= 2 and 4 for
// m <= 4), or 0 for the measured choice (the default). Results are bitwise the same whatever
// the choice (each output's chunk order and reduction do not depend on it); only the speed
// changes. Not thread-safe: set it before the calls it is meant for.
// CUDA-free: reachable as "cuda/gemm_paths.h" by whoever links the kernels.
namespace hyserve::kernels {

void set_skinny_rows(int rows);

}  // namespace hyserve::kernels
