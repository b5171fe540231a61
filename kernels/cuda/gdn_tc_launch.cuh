#pragma once
// The tensor-core GDN prefill's launches for one (kSplit, K, kHalf, In) (the decomposition in
// gdn_chunked.cuh, its kernels in gdn_tc_intra.cuh and gdn_tc_state.cuh, or gdn_wy16_state.cuh
// for the bf16 path, kHalf): plan, intra (all chunks), state (row × head × slice); then the
// recurrent kernel gated on the overflow flag (it exits at once unless the batch needed more
// chunks than reserved). In is the element type of q, k, v and out (f32, or bf16 for the bf16
// path). Each (kSplit, K, kHalf, In) is instantiated in its own generated
// translation unit (CMakeLists.txt, gdn_tc_inst.cu.in) so that no single compile holds all the
// tensor-core kernels; gdn.cu dispatches on K.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "gdn_common.h"
#include "gdn_tc_intra.cuh"
#include "gdn_tc_state.cuh"
#include "gdn_wy16_state.cuh"
#include "hyserve/kernels/paths.h"
#include "launch.cuh"
#include "stream_alloc.h"

namespace hyserve::kernels::cuda_detail {

template <bool kSplit, int K, bool kHalf, class In>
void launch_gdn_tc_k(const gdn_chunk_scan_params& p, cudaStream_t stream, int stages) {
  static_assert(!(kSplit && kHalf), "the bf16 path has plain products");
  static_assert(kHalf || std::is_same_v<In, float>, "bf16 io is the bf16 path's");
  const gdn_io<In> io = [&] {
    if constexpr (std::is_same_v<In, float>) return f32_io(p);
    else return bf16_io(p);
  }();
  constexpr int kPack = 16 / sizeof(In);  // elements per 16-byte copy
  namespace tc = gdn_tc;
  const float scale = p.scale != 0.0f ? p.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.k_dim)));
  constexpr int C = tc::kChunk;
  const int64_t cap64 = ceil_div(gdn_tc_max_tokens(), C) + p.batch;
  const int cap = static_cast<int>(std::min<int64_t>(cap64, int64_t{1} << 30));
  // Workspace: chunk_off [batch + 1], overflow [1] (ints, rounded to 16 bytes), then per
  // (chunk, value head) tok [C, kTokFields] and R = P·T [C, C], T [C, C] in f32, or (kHalf) T and
  // P [C, C] in bf16 and per (chunk, key head) q̂ and k̂ [C, K] in bf16. Every part starts on a
  // 16-byte boundary (bulk copies).
  const int64_t n_ints = (p.batch + 2 + 3) / 4 * 4;
  const int64_t items = static_cast<int64_t>(cap) * p.heads_v;
  const int64_t tok_floats = items * C * tc::kTokFields;
  const int64_t f32_floats = kHalf ? 0 : 2 * items * C * C;
  const int64_t tp16_elems = kHalf ? 2 * items * C * C : 0;
  const int64_t qk16_elems = kHalf ? static_cast<int64_t>(cap) * p.heads_k * 2 * C * K : 0;
  void* raw = nullptr;
  const size_t bytes = sizeof(int) * static_cast<size_t>(n_ints) +
                       sizeof(float) * static_cast<size_t>(tok_floats + f32_floats) +
                       sizeof(__nv_bfloat16) * static_cast<size_t>(tp16_elems + qk16_elems);
  CUDA_CHECK(scratch_alloc(&raw, bytes, stream));
  tc::workspace ws;
  ws.chunk_off = static_cast<int*>(raw);
  ws.overflow = ws.chunk_off + p.batch + 1;
  ws.tok = reinterpret_cast<float*>(ws.chunk_off + n_ints);
  if constexpr (kHalf) {
    ws.tp16 = reinterpret_cast<__nv_bfloat16*>(ws.tok + tok_floats);
    ws.qk16 = ws.tp16 + tp16_elems;
  } else {
    ws.R = ws.tok + tok_floats;
    ws.T = ws.R + items * C * C;
  }
  ws.cap = cap;

  tc::plan_kernel<<<1, 1024, 0, stream>>>(p, ws);
  HYSERVE_CUDA_CHECK_LAUNCH();
  if (stages < 2) {
    CUDA_CHECK(scratch_free(raw, stream));
    return;
  }
  // Two value heads per intra block when consecutive pairs share a key head; q and k staged
  // with cp.async when their rows are 16-byte aligned.
  const bool vec_qk = vector_ok({io.q, io.k}, {p.q_stride, p.k_stride}, kPack);
  auto launch_intra = [&](auto g2, auto vq) {
    constexpr int kG = decltype(g2)::value ? 2 : 1;
    const auto kernel = &tc::intra_kernel<kSplit, K, kG, decltype(vq)::value, kHalf, In>;
    constexpr size_t smem = tc::intra_tiles<K, kG, kHalf, In, decltype(vq)::value>::kBytes;
    reserve_dynamic_shared(reinterpret_cast<const void*>(kernel), smem);
    // All of the unified L1 as shared memory: the bf16 path's blocks (73.5 KB with bf16
    // staging) fit three to an SM only in the largest carveout.
    static const bool carved = [&] {
      CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                      cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
      return true;
    }();
    (void)carved;
    const dim3 grid(static_cast<unsigned>(cap), static_cast<unsigned>(p.heads_v / kG));
    launch_pdl(kernel, grid, dim3(tc::kThreads), smem, stream, p, io.q, io.k, ws, scale);
    HYSERVE_CUDA_CHECK_LAUNCH();
  };
  const bool pairs = (p.heads_v / p.heads_k) % 2 == 0;
  if (pairs && vec_qk) launch_intra(std::true_type{}, std::true_type{});
  else if (pairs) launch_intra(std::true_type{}, std::false_type{});
  else if (vec_qk) launch_intra(std::false_type{}, std::true_type{});
  else launch_intra(std::false_type{}, std::false_type{});
  if (stages < 3) {
    CUDA_CHECK(scratch_free(raw, stream));
    return;
  }
  if constexpr (kHalf) {
    namespace w16 = gdn_wy16;
    const bool vec = vector_ok({io.v}, {p.v_stride, p.v_dim}, kPack);
    const auto kernel = vec ? &w16::state_kernel<K, true, In> : &w16::state_kernel<K, false, In>;
    constexpr size_t smem = w16::tiles<K, In>::kBytes;
    reserve_dynamic_shared(reinterpret_cast<const void*>(kernel), smem);
    const dim3 grid(static_cast<unsigned>(ceil_div(p.v_dim, w16::kRows)), static_cast<unsigned>(p.heads_v),
                    static_cast<unsigned>(p.batch));
    // The slices of a head as one cluster (tiles multicast) when the grid takes more than one
    // wave: 4 CTAs when the slices come in fours and the device holds a full wave of such
    // clusters, else 2, else none. (Measured on the H200, 16 × 1024 tokens: 788 µs with
    // clusters of 2 against 831 µs without; one 16384-token sequence, a single wave: 680 µs
    // without against 723 µs with, the lockstep of the cluster costing more than the L2 reads
    // it saves.)
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(w16::kThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;  // (launch.cuh)
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int dev = 0, sms = 0, per_sm = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, w16::kThreads, smem));
    const int64_t ctas = static_cast<int64_t>(grid.x) * grid.y * grid.z;
    const int64_t need = std::min<int64_t>(ctas, static_cast<int64_t>(sms) * per_sm * 95 / 100);
    auto fits = [&](unsigned nc) {
      if (grid.x % nc != 0) return false;
      attr[0].val.clusterDim.x = nc;
      attr[0].val.clusterDim.y = 1;
      attr[0].val.clusterDim.z = 1;
      int active = 0;
      if (cudaOccupancyMaxActiveClusters(&active, kernel, &cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
      }
      return static_cast<int64_t>(active) * nc >= need;
    };
    // kernels.gdn_cluster (1 | 2 | 4) asks for a cluster size (taken when the slices divide by
    // it and the device can co-schedule it); default (0): the automatic choice above.
    const auto asked = static_cast<unsigned>(current_paths().gdn_cluster);
    const bool waves = ctas > static_cast<int64_t>(sms) * per_sm;
    unsigned nc = 1;
    if (asked != 0) nc = asked == 1 || fits(asked) ? asked : 1;
    else if (waves && fits(4)) nc = 4;
    else if (waves && fits(2)) nc = 2;
    attr[0].val.clusterDim.x = nc;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.numAttrs = pdl_applies(stream) ? 2 : 1;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, p, io.v, io.out, ws));
    HYSERVE_CUDA_CHECK_LAUNCH();
  } else {
    // 16-byte copies of q, k and v rows (cp.async) when every row start is 16-byte aligned.
    const bool vec = vector_ok({p.q, p.k, p.v}, {p.q_stride, p.k_stride, p.v_stride, p.v_dim}, 4);
    const auto kernel = vec ? &tc::state_kernel<kSplit, K, true> : &tc::state_kernel<kSplit, K, false>;
    constexpr size_t smem = tc::state_tiles<K>::kBytes;
    reserve_dynamic_shared(reinterpret_cast<const void*>(kernel), smem);
    const dim3 grid(static_cast<unsigned>(ceil_div(p.v_dim, tc::kSlice)), static_cast<unsigned>(p.heads_v),
                    static_cast<unsigned>(p.batch));
    launch_pdl(kernel, grid, dim3(tc::kStateThreads), smem, stream, p, ws);
    HYSERVE_CUDA_CHECK_LAUNCH();
  }
  if constexpr (std::is_same_v<In, float>) {
    launch_gdn(p, p.query_start_loc, p.has_initial_state, "gdn_chunk_scan", stream, ws.overflow);
  } else {
    launch_gdn(p, p.query_start_loc, p.has_initial_state, "gdn_chunk_scan", stream, ws.overflow, &io);
  }
  CUDA_CHECK(scratch_free(raw, stream));
}

}  // namespace hyserve::kernels::cuda_detail
