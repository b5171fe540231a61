// Gated DeltaNet kernels on the device (Qwen3-Next shapes: 16 key heads, 32 value heads,
// K = V = 128, fp32 state), as ratios to the copy bandwidth measured in the same run:
//   - gdn_decode: the recurrent state update at batch 1/16/64/256 (bytes: the state read and
//     written once per row, plus the token's q, k, v, a, b and output), once per decode kernel
//     (cuda/gdn_paths.cuh): gdn_decode_grid (one block per tile of 16 rows), gdn_decode_persistent
//     and gdn_decode_persistent8 (resident blocks striding over tiles, next tile prefetched),
//     gdn_decode_tiles8 (one block per tile of 32 rows);
//   - gdn_prefill: the varlen chunked prefill of 16384 tokens as one sequence and as 16 × 1024
//     (bytes: inputs read and output written once, final states written; the op is
//     compute-bound, so the time is the figure to compare), once per CUDA path
//     (cuda/gdn_paths.cuh): gdn_prefill_recurrent (token by token, CUDA cores),
//     gdn_prefill_tc (chunked on the tensor cores, 3xTF32), gdn_prefill_tf32 (plain TF32) and
//     gdn_prefill_bf16 (bf16 products, the precision of the flash-linear-attention kernels);
//     gdn_prefill_bf16_io: the bf16 path with q, k, v and out in bf16 (the io of those kernels,
//     and of the anchor figure), with its _plan and _plan+intra rows;
//     rows *_plan and *_plan+intra time the first launches of a tensor-core path alone (the
//     state pass is the full time minus plan+intra). After the table, the tensor-core paths'
//     product work per shape: the multiply-adds of the chunked decomposition (per 64-token
//     chunk and value head: the Gram products C²K, R = P·T C³/6, the state pass 3CVK + C²V) and
//     the rate of MMA work achieved (3 TF32 MMAs per product for tc, 1 for tf32 and bf16), to
//     set against the device's TF32 (or, for bf16, BF16) tensor peak.
//   hyserve-bench-gdn
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "cuda/gdn_paths.cuh"
#include "hyserve/kernels/device.h"
#include "hyserve/kernels/gdn.h"

namespace hyserve::kernels {
namespace {

using bench::bench_row;

constexpr int64_t HK = 16, HV = 32, K = 128, V = 128;
constexpr int64_t kQkvDim = 2 * HK * K + HV * V;  // the conv output row: q | k | v

void fill_common(gdn_common_params& p, const device_array<float>& qkv, const device_array<float>& ab,
                 const device_array<float>& a_log, const device_array<float>& dt_bias, device_array<float>& out,
                 const device_array<int32_t>& slots, int64_t batch) {
  p.q = qkv.data();
  p.k = qkv.data() + HK * K;
  p.v = qkv.data() + 2 * HK * K;
  p.a = ab.data();
  p.b = ab.data() + HV;
  p.A_log = a_log.data();
  p.dt_bias = dt_bias.data();
  p.out = out.data();
  p.state_indices = slots.data();
  p.batch = batch;
  p.heads_k = HK;
  p.heads_v = HV;
  p.k_dim = K;
  p.v_dim = V;
  p.q_stride = p.k_stride = p.v_stride = kQkvDim;
  p.a_stride = p.b_stride = 2 * HV;
  p.out_stride = HV * V;
}

void bench_decode(cudaStream_t stream, std::vector<bench_row>& rows) {
  for (int bs : {1, 16, 64, 256}) {
    const size_t state_elems = static_cast<size_t>(bs) * HV * V * K;
    const int n_sets = bench::sets_for(state_elems * sizeof(float));
    std::vector<device_array<float>> states;
    for (int s = 0; s < n_sets; ++s) states.push_back(bench::random_device_hash(state_elems, 10 + s, -0.1f, 0.1f));
    auto qkv = bench::random_device(static_cast<size_t>(bs * kQkvDim), 1);
    auto ab = bench::random_device(static_cast<size_t>(bs * 2 * HV), 2);
    auto a_log = bench::random_device(HV, 3, -1.0f, 0.5f);
    auto dt_bias = bench::random_device(HV, 4);
    device_array<float> out(static_cast<size_t>(bs * HV * V));
    std::vector<int32_t> slot(static_cast<size_t>(bs));
    for (int b = 0; b < bs; ++b) slot[static_cast<size_t>(b)] = b;
    device_array<int32_t> slots(slot);
    gdn_state_update_params p;
    fill_common(p, qkv, ab, a_log, dt_bias, out, slots, bs);
    const double bytes = 4.0 * (2.0 * static_cast<double>(state_elems) + bs * (kQkvDim + 2 * HV + HV * V));
    for (gdn_decode_path path : {gdn_decode_path::grid, gdn_decode_path::persistent, gdn_decode_path::persistent8,
                                 gdn_decode_path::tiles8}) {
      const double us = bench::time_call_us(stream, n_sets, [&](int s) {
        p.states = states[static_cast<size_t>(s)].data();
        run_cuda(p, path, stream);
      });
      rows.push_back({std::string("gdn_decode_") + gdn_decode_path_name(path), "HK16 HV32 K128 V128 f32", bs, us, bytes});
    }
  }
}

// Multiply-adds of the tensor-core decomposition's products for n_chunks chunks (gdn_chunked.cuh).
__global__ void to_bf16_kernel(const float* in, __nv_bfloat16* out, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);
}

double prefill_product_macs(int64_t n_chunks) {
  constexpr double C = 64.0, k = static_cast<double>(K), v = static_cast<double>(V);
  const double per_item = C * C * k + C * C * C / 6.0 + 3.0 * C * v * k + C * C * v;
  return per_item * static_cast<double>(n_chunks) * static_cast<double>(HV);
}

void bench_prefill(cudaStream_t stream, std::vector<bench_row>& rows, std::vector<std::string>& notes) {
  const int64_t T = 16384;
  for (int64_t seqs : {int64_t{1}, int64_t{16}}) {
    const int64_t len = T / seqs;
    auto qkv = bench::random_device_hash(static_cast<size_t>(T * kQkvDim), 1);
    auto ab = bench::random_device_hash(static_cast<size_t>(T * 2 * HV), 2);
    auto a_log = bench::random_device(HV, 3, -1.0f, 0.5f);
    auto dt_bias = bench::random_device(HV, 4);
    device_array<float> out(static_cast<size_t>(T * HV * V));
    device_array<float> states(static_cast<size_t>((seqs + 1) * HV * V * K));
    std::vector<int32_t> slot(static_cast<size_t>(seqs)), qsl(static_cast<size_t>(seqs + 1));
    for (int64_t b = 0; b < seqs; ++b) slot[static_cast<size_t>(b)] = static_cast<int32_t>(b);
    for (int64_t b = 0; b <= seqs; ++b) qsl[static_cast<size_t>(b)] = static_cast<int32_t>(b * len);
    device_array<int32_t> slots(slot), dqsl(qsl);
    gdn_chunk_scan_params p;
    fill_common(p, qkv, ab, a_log, dt_bias, out, slots, seqs);
    p.states = states.data();
    p.query_start_loc = dqsl.data();
    const double bytes = 4.0 * (static_cast<double>(T) * (kQkvDim + 2 * HV + HV * V) +
                                static_cast<double>(seqs) * HV * V * K);
    char shape[64];
    std::snprintf(shape, sizeof shape, "HK16 HV32 K128 len%lld", static_cast<long long>(len));
    const double gflop = 2.0 * prefill_product_macs(seqs * ((len + 63) / 64)) / 1e9;
    std::string note = std::string(shape) + " x" + std::to_string(seqs) + ": products " +
                       std::to_string(static_cast<int>(gflop + 0.5)) + " GFLOP;";
    for (gdn_prefill_path path :
         {gdn_prefill_path::recurrent, gdn_prefill_path::tc, gdn_prefill_path::tf32, gdn_prefill_path::bf16}) {
      const double us = bench::time_call_us(stream, 1, [&](int) { run_cuda(p, path, stream); });
      rows.push_back({std::string("gdn_prefill_") + gdn_prefill_path_name(path), shape, static_cast<int>(seqs), us, bytes});
      if (path == gdn_prefill_path::recurrent) continue;
      const double mmas = path == gdn_prefill_path::tc ? 3.0 : 1.0;
      char buf[96];
      std::snprintf(buf, sizeof buf, " %s %.1f TFLOP/s of MMA work (%.0f MMA per product)", gdn_prefill_path_name(path),
                    mmas * gflop / 1e3 / (us * 1e-6), mmas);
      note += buf;
    }
    notes.push_back(note);
    // Stages of the tensor-core paths (the state pass is the full time minus plan + intra).
    for (gdn_prefill_path path : {gdn_prefill_path::tc, gdn_prefill_path::tf32, gdn_prefill_path::bf16}) {
      for (int stages : {1, 2}) {
        const double us = bench::time_call_us(stream, 1, [&](int) { run_cuda_tc_stages(p, path, stages, stream); });
        rows.push_back({std::string("gdn_prefill_") + gdn_prefill_path_name(path) + (stages == 1 ? "_plan" : "_plan+intra"),
                        shape, static_cast<int>(seqs), us, bytes});
      }
    }
    // The bf16 path with bf16 io: the same values rounded to bf16.
    device_array<__nv_bfloat16> qkv16(qkv.size()), out16(out.size());
    to_bf16_kernel<<<1024, 256, 0, stream>>>(qkv.data(), qkv16.data(), qkv.size());
    CUDA_CHECK(cudaGetLastError());
    gdn_chunk_scan_params p16 = p;
    p16.q = p16.k = p16.v = nullptr;
    p16.out = nullptr;
    p16.io_dtype = hyserve::dtype::kBF16;
    const auto* q16 = reinterpret_cast<const uint16_t*>(qkv16.data());
    p16.q_bf16 = q16;
    p16.k_bf16 = q16 + HK * K;
    p16.v_bf16 = q16 + 2 * HK * K;
    p16.out_bf16 = reinterpret_cast<uint16_t*>(out16.data());
    const double bytes16 = 2.0 * static_cast<double>(T) * (kQkvDim + HV * V) +
                           4.0 * (static_cast<double>(T) * 2 * HV + static_cast<double>(seqs) * HV * V * K);
    for (int stages : {1, 2, 3}) {
      const double us = bench::time_call_us(stream, 1, [&](int) {
        run_cuda_tc_stages(p16, gdn_prefill_path::bf16, stages, stream);
      });
      rows.push_back({std::string("gdn_prefill_bf16_io") + (stages == 1 ? "_plan" : stages == 2 ? "_plan+intra" : ""), shape,
                      static_cast<int>(seqs), us, bytes16});
    }
  }
}

}  // namespace
}  // namespace hyserve::kernels

int main() {
  using namespace hyserve::kernels;
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "hyserve-bench-gdn: no CUDA device\n");
    return 1;
  }
  try {
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const double copy_bw = bench::copy_bandwidth(stream);
    bench::print_device(copy_bw);
    std::vector<bench::bench_row> rows;
    bench_decode(stream, rows);
    std::vector<std::string> notes;
    bench_prefill(stream, rows, notes);
    bench::print_rows(rows, copy_bw);
    std::printf("\ntensor-core prefill paths, product work:\n");
    for (const std::string& n : notes) std::printf("  %s\n", n.c_str());
    CUDA_CHECK(cudaStreamDestroy(stream));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hyserve-bench-gdn: %s\n", e.what());
    return 1;
  }
  return 0;
}
