// The warpgroup-MMA kernels of kernels/cuda, instantiated as the library does, for the ptxas
// check (wgmma_serial_check.cmake): ptxas must not serialise their wgmma instructions. When it
// cannot prove that an accumulator is not read while an MMA is in flight it inserts waits after
// every wgmma and says so ("wgmma.mma_async instructions are serialized", C7514-C7518); the
// kernels then run at a fraction of the tensor cores' rate, with the same results, so no
// correctness test notices.
#include "gemm_wgmma_launch.cuh"
#include "moe_gemm_wgmma.cuh"

namespace hyserve::kernels::cuda_detail {

void wgmma_serial_check(const gg_args& g, const gemm_params& p, const __nv_bfloat16* x16, int64_t rows,
                        cudaStream_t stream) {
  launch_moe_wgmma<true>(g, rows, stream);
  launch_moe_wgmma<false>(g, rows, stream);
  launch_wgmma_linear(p, x16, stream);
  launch_wgmma_invariant(wgmma_call_of(p), x16, stream);
}

}  // namespace hyserve::kernels::cuda_detail
