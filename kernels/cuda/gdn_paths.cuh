#pragma once
// Explicit choice between the CUDA GDN prefill implementations, and between the decode
// kernels (tests and benchmarks run all of them in one process). run_cuda(gdn_chunk_scan_params)
// takes the path its params name (gdn_chunk_scan_params::kernel, which models set from their
// dtype or model.gdn_prefill), or with kDefault gdn_prefill_default_path(), the op's
// kernels.gdn_prefill (exec_context::paths, kernels/paths.h: recurrent | tc | tf32 | bf16;
// default: tc; benchmarks and direct calls); run_cuda(gdn_state_update_params) takes
// gdn_decode_default_path(), from kernels.gdn_decode (grid | persistent | persistent8 | tiles8;
// default: tiles8).
// Shapes the tensor-core kernels are not built for (key dims other than 32, 64, 128) take the
// recurrent kernel whichever path is asked; gdn_prefill_tc_supports says which. bf16 io
// (gdn_chunk_scan_params::io_dtype) runs on the bf16 path (automatic: the default path, or bf16
// when the default is tc or tf32) or the recurrent kernel; asking tc or tf32 for it is an error
// naming io_dtype (their point, fp32-level accuracy, is moot on bf16 inputs).
// CUDA-free (host declarations only): reachable as "cuda/gdn_paths.cuh" by whoever links the
// kernels.
#include "hyserve/kernels/gdn.h"

namespace hyserve::kernels {

enum class gdn_prefill_path {
  automatic,  // gdn_prefill_default_path()
  recurrent,  // one block per (value head, row, value-row slice), token by token (CUDA cores)
  tc,         // chunked WY form on the tensor cores, 3xTF32 (fp32-level accuracy)
  tf32,       // the same kernels with plain TF32 products (about 1e-3 relative; faster)
  bf16,       // the same decomposition with bf16 products, as the flash-linear-attention kernels
              // compute it (about 1e-2 relative), state chain per warp (gdn_wy16_state.cuh)
};

void run_cuda(const gdn_chunk_scan_params& p, gdn_prefill_path path, void* stream = nullptr);

gdn_prefill_path gdn_prefill_default_path();

// Whether the tensor-core paths take these shapes (else they run the recurrent kernel).
bool gdn_prefill_tc_supports(const gdn_chunk_scan_params& p);

const char* gdn_prefill_path_name(gdn_prefill_path path);

// Benchmark aid: a tensor-core path's launches up to `stages` only (1: plan, 2: plan and the
// intra-chunk kernel, 3: everything), for timing the stages by difference. With stages < 3
// outputs and states are not computed.
void run_cuda_tc_stages(const gdn_chunk_scan_params& p, gdn_prefill_path path, int stages, void* stream = nullptr);

enum class gdn_decode_path {
  automatic,    // gdn_decode_default_path()
  grid,         // one block per (value head, row, slice of 16 value rows)
  persistent,   // resident blocks stride over the tiles, next tile loaded while one is stored; 4 rows per lane
  persistent8,  // the same with 8 rows per lane (32 value rows per tile)
  tiles8,       // one block per tile of 32 value rows (8 per lane), no prefetch
};

void run_cuda(const gdn_state_update_params& p, gdn_decode_path path, void* stream = nullptr);

gdn_decode_path gdn_decode_default_path();

const char* gdn_decode_path_name(gdn_decode_path path);

}  // namespace hyserve::kernels
