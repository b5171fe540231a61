#pragma once
// Path choices of the bf16 skinny GEMM (bf16 weights, m <= 8 rows of activations; see
// gemm.cu). Not thread-safe: set them before the calls they are meant for.
//
// Benchmark aid for the FMA path: force the rows of B one warp streams, 2, 4 or 8 (at most 2
// for m <= 2 and 4 for m <= 4), or 0 for the measured choice (the default). Results are
// bitwise the same whatever the choice (each output's chunk order and reduction do not depend
// on it); only the speed changes.
// CUDA-free: reachable as "cuda/gemm_paths.h" by whoever links the kernels.
#include <cstdint>

namespace hyserve::kernels {

void set_skinny_rows(int rows);

// Which kernel computes the bf16 skinny GEMM (and the fused SwiGLU projection) for m <= 8:
// CUDA-core FMAs (kFma) or tensor-core MMAs with the f32 activations split exactly into three
// bf16 terms (kMma). Each path is row-invariant on its own (a row's bits do not depend on m);
// the two differ in summation order, so a process uses one for every m (the fused
// rmsnorm_linear decode kernel shares the FMA path's arithmetic and is used only with it).
// kDefault: the op's kernels.skinny (exec_context::paths: fma or mma), else kSkinnyDefaultPath.
enum class skinny_path { kDefault = 0, kFma = 1, kMma = 2 };
inline constexpr skinny_path kSkinnyDefaultPath = skinny_path::kFma;
void set_skinny_path(skinny_path path);
// The path in effect: always the tensor-core one under determinism: batch_invariant
// (kernel_paths::batch_invariant), where it computes GEMMs of every row count.
bool skinny_uses_mma();

// Benchmark aid for determinism: batch_invariant: calls of at least min_rows activation rows run
// the tiled kernel, fewer the skinny kernel in groups of 8 rows (0: the default, 256). Both sum
// in the same order: the bits do not depend on the choice, only the speed.
void set_invariant_tiled_rows(int64_t min_rows);

// determinism: batch_invariant, bf16 weights: the row-invariant GEMMs on cuBLASLt with split-K 1
// (the default; gemm_lt.cuh; each output one MMA chain over k, which
// bench/probes/cublaslt_invariance_probe.cu checked on the device), on hyserve's kernels, or on
// the warpgroup-MMA linear kernel (kWgmma: gemm_wgmma_launch.cuh; not yet measured). A
// config's kernels.invariant_gemm (exec_context::paths) wins over this process default. Layouts
// without 16-byte rows stay on the kernels.
enum class invariant_gemm_backend { kKernels = 0, kCublasLt = 1, kWgmma = 2 };
void set_invariant_gemm_backend(invariant_gemm_backend backend);
invariant_gemm_backend current_invariant_gemm_backend();

}  // namespace hyserve::kernels
