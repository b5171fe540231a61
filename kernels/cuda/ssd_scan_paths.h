#pragma once
// Explicit choice between the two bf16-io SSD chunk scan implementations (tests and benchmarks
// run both in one process). run_cuda(ssd_chunk_scan_params) picks one from the op's
// kernels.ssd_scan (exec_context::paths; see ssd_scan.cu); other shapes and f32 io take their own kernels whichever path is asked.
// CUDA-free: reachable as "cuda/ssd_scan_paths.h" by whoever links the kernels.
#include "hyserve/kernels/ssm.h"

namespace hyserve::kernels {

enum class ssd_scan_path {
  automatic,   // kernels.ssd_scan (see ssd_scan.cu); sequential for batches of more than 64 rows
  sequential,  // one block per (row, head, state slice) walking the row's chunks in order
  parallel,         // one kernel over (chunk, head) items, persistent blocks staging the next
                    // item while finishing the current one; only the state hand-off is chained
  parallel_single,  // the same kernel, one block per item (no staging ahead)
  parallel_fast,    // parallel with f32 weights (one ex2 each) and one release per warp hand-off
  parallel_pair,    // parallel_fast, 2 heads of a group per claim (B and C staged once)
  parallel_quad,    // parallel_fast, 4 heads of a group per claim
  parallel_y,       // parallel_fast, y stored through shared memory as 16-byte vectors
  parallel_quad_y,  // parallel_quad, y stored through shared memory as 16-byte vectors
  parallel_oct_y,   // parallel_quad_y, 8 heads of a group per claim
  general,          // the CUDA-core kernel of other shapes, one block per (head, row): any shape
                    // and io type (benchmarks: the tensor-core kernels against it)
};

void run_cuda(const ssd_chunk_scan_params& p, ssd_scan_path path, void* stream = nullptr);

// The path run_cuda(p, stream) takes for bf16 io (kernels.ssd_scan of the current paths).
ssd_scan_path ssd_scan_default_path();

#ifdef HYSERVE_SSD_ABLATION
// Benchmarks only (built with -DHYSERVE_SSD_ABLATION): the persistent chained kernel with the
// variant and ablation flags of ssd_scan_chained.cuh (ssd_chain::kOpt*, kAbl*); ablations give
// wrong results.
void run_cuda_ssd_chain_flags(const ssd_chunk_scan_params& p, int flags, void* stream = nullptr);
#endif

}  // namespace hyserve::kernels
