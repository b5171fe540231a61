// Argmax and seeded sampling. One block per row; the vocabulary is read with coalesced
// strided loops.
//
// Sampling follows sample_cpu step by step without sorting the vocabulary. The CPU sorts the
// candidates by (logit descending, id ascending) and walks that order; here the order is a
// unique 64-bit key per element, (descending-logit bits << 32) | id, and every "walk the
// sorted list until a running sum passes a threshold" becomes a radix select over that key:
// 8 passes of 8 bits, each building a 256-bin histogram of weight (count or probability) of
// the elements that match the digits chosen so far, and keeping the first bin whose running
// sum passes the threshold. Top-k is a select by count, top-p and the final draw are selects
// by probability mass. The generator, the double-precision probabilities and the thresholds
// are those of sample_cpu; only the order of the double additions differs (parallel
// histograms), so a token differs from the CPU's only when the uniform draw lands within
// ~1e-16 (relative) of a boundary between two candidates. Logits must be free of NaN (the
// CPU's std::max_element result depends on where a NaN sits).
#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <limits>
#include <string>

#include "common.cuh"
#include "hyserve/kernels/sampling.h"
#include "launch.cuh"
#include "../cpu/dense_validate.h"
#include "../cpu/sampling_validate.h"

namespace hyserve::kernels {
namespace cuda_detail {
namespace {

constexpr int kArgmaxThreads = 512;
constexpr int kSampleThreads = 1024;
constexpr uint64_t kNoKey = ~0ull;        // no element (an element's key has bit 31 clear)


__device__ uint64_t block_max_u64(uint64_t v) {
  __shared__ uint64_t partial[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_warps = static_cast<int>(blockDim.x >> 5);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < n_warps ? partial[lane] : 0ull;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <class T>
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const argmax_params p) {
  pdl_begin();
  const T* row = reinterpret_cast<const T*>(p.logits) + static_cast<int64_t>(blockIdx.x) * p.stride;
  // Strict '>' from -inf, as the CPU: NaN and -inf are never chosen; a thread's indices
  // ascend, so it keeps its first maximum.
  float best = -INFINITY;
  int32_t best_i = INT_MAX;
  for (int64_t v = threadIdx.x; v < p.vocab; v += blockDim.x) {
    const float x = to_float(row[v]);
    if (x > best) {
      best = x;
      best_i = static_cast<int32_t>(v);
    }
  }
  block_best(best, best_i);
  if (threadIdx.x == 0) p.out[blockIdx.x] = best_i == INT_MAX ? 0 : best_i;
}

__device__ __forceinline__ uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Position of element (v, i) in sample_cpu's candidate order: logit descending (-0 == +0),
// then id ascending. Unique per element.
__device__ __forceinline__ uint64_t order_key(float v, int32_t i) {
  if (v == 0.0f) v = 0.0f;
  uint32_t u = __float_as_uint(v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // monotone in v
  return (static_cast<uint64_t>(~u) << 32) | static_cast<uint32_t>(i);
}

struct select_scratch {
  double weight[256];
  unsigned int count[256];
  int bin;             // chosen bin of the current pass, -1 for none
  unsigned int count_in_bin;
  double before;
  uint64_t key;        // the single element left, fetched on early exit
};

__device__ __forceinline__ double warp_sum_double(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Adds w to histogram bin `bin` (-1: nothing) for every lane, one shared atomic per distinct
// bin of the warp: early passes put most of the vocabulary into a handful of bins, and
// per-element atomics on one address would serialise. All 32 lanes must call it.
__device__ __forceinline__ void histogram_add(select_scratch& s, int bin, double w) {
  const int lane = threadIdx.x & 31;
  unsigned todo = __ballot_sync(0xffffffffu, bin >= 0);
  while (todo != 0u) {
    const int leader = __ffs(static_cast<int>(todo)) - 1;
    const int b = __shfl_sync(0xffffffffu, bin, leader);
    const unsigned peers = __ballot_sync(0xffffffffu, bin == b);
    const double sum = warp_sum_double(bin == b ? w : 0.0);
    if (lane == leader) {
      atomicAdd(&s.weight[b], sum);
      atomicAdd(&s.count[b], static_cast<unsigned>(__popc(static_cast<int>(peers))));
    }
    todo &= ~peers;
  }
}

// Key of the first element, in candidate order, of {key < limit} whose inclusive running
// weight passes target (> target when strict, >= otherwise); kNoKey when none does. The
// predicate is monotone along the order, so the answer lies in the first non-empty histogram
// bin whose running sum passes; once that bin holds a single element, one more pass fetches
// it. All threads of the block must call it; blockDim.x is a multiple of 32.
template <class Weight>
__device__ uint64_t select_first(const float* x, int32_t V, uint64_t limit, Weight weight, double target, bool strict,
                                 select_scratch& s) {
  const int lane = threadIdx.x & 31;
  uint64_t prefix = 0, mask = 0;
  double before = 0.0;  // weight of the set's elements ordered before the current prefix
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
      s.weight[b] = 0.0;
      s.count[b] = 0u;
    }
    __syncthreads();
    // Warp-uniform trip count: histogram_add needs every lane.
    for (int32_t base = static_cast<int32_t>(threadIdx.x) - lane; base < V; base += static_cast<int32_t>(blockDim.x)) {
      const int32_t i = base + lane;
      int bin = -1;
      double w = 0.0;
      if (i < V) {
        const float v = x[i];
        const uint64_t k = order_key(v, i);
        if (k < limit && (k & mask) == prefix) {
          bin = static_cast<int>((k >> shift) & 0xffu);
          w = weight(v);
        }
      }
      histogram_add(s, bin, w);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int found = -1;
      double cum = before;
      for (int b = 0; b < 256; ++b) {
        if (s.count[b] == 0u) continue;
        const double next = cum + s.weight[b];
        if (strict ? next > target : next >= target) {
          found = b;
          break;
        }
        cum = next;
      }
      s.bin = found;
      s.count_in_bin = found >= 0 ? s.count[found] : 0u;
      s.before = cum;
    }
    __syncthreads();
    // Thread 0 rewrites these only after the next pass's second barrier, which every thread
    // reaches after these reads.
    const int bin = s.bin;
    const unsigned count = s.count_in_bin;
    before = s.before;
    if (bin < 0) return kNoKey;
    prefix |= static_cast<uint64_t>(bin) << shift;
    mask |= 0xffull << shift;
    if (count == 1u && shift > 0) {
      for (int32_t i = threadIdx.x; i < V; i += blockDim.x) {
        const uint64_t k = order_key(x[i], i);
        if (k < limit && (k & mask) == prefix) s.key = k;  // exactly one element matches
      }
      __syncthreads();
      const uint64_t key = s.key;
      __syncthreads();  // s.key is read by all before any later call may rewrite it
      return key;
    }
  }
  return prefix;
}

// The settings of a row as sample_cpu would take them, values outside their ranges clamped to
// the nearest valid one (the host checked them; a captured step must not fail on the device).
struct row_settings {
  float temperature;
  int32_t top_k;
  float top_p;
  bool want_logprob;
  uint64_t seed;
  uint64_t counter;
};

__device__ __forceinline__ row_settings read_settings(const sample_settings& s) {
  row_settings r;
  r.temperature = (s.temperature > 0.0f && s.temperature <= FLT_MAX) ? s.temperature : 0.0f;
  r.top_k = s.top_k > 0 ? s.top_k : 0;
  r.top_p = s.top_p < 1.0f ? (s.top_p > 0.0f ? s.top_p : FLT_MIN) : 1.0f;
  r.want_logprob = s.want_logprob != 0;
  r.seed = s.seed;
  r.counter = s.counter;
  return r;
}

__global__ void __launch_bounds__(kSampleThreads) sample_kernel(const sample_rows_params p) {
  pdl_begin();
  __shared__ select_scratch scratch;
  const row_settings row = read_settings(p.settings[blockIdx.x]);
  const float* x = p.logits + static_cast<int64_t>(blockIdx.x) * p.stride;
  const auto V = static_cast<int32_t>(p.vocab);

  // First maximum (std::max_element): each thread's first maximum over its elements in
  // ascending order, then the block's best (a larger value, else the lower index). A 16-byte
  // aligned row is read as float4, four of them in flight a thread: the pass is bound by the
  // latency of the one block's loads (a 152K vocabulary: 37 float4 a thread, not 149 floats).
  float mx = -INFINITY;
  int32_t arg = INT_MAX;
  auto consider = [&](float v, int32_t i) {
    if (arg == INT_MAX || v > mx) {
      mx = v;
      arg = i;
    }
  };
  int32_t scalar_from = 0;
  if ((reinterpret_cast<uintptr_t>(x) & 15u) == 0) {
    const auto* x4 = reinterpret_cast<const float4*>(x);
    const int32_t V4 = V / 4;
#pragma unroll 4
    for (int32_t i = threadIdx.x; i < V4; i += blockDim.x) {
      const float4 q = x4[i];
      consider(q.x, 4 * i);
      consider(q.y, 4 * i + 1);
      consider(q.z, 4 * i + 2);
      consider(q.w, 4 * i + 3);
    }
    scalar_from = 4 * V4;
  }
  for (int32_t i = scalar_from + static_cast<int32_t>(threadIdx.x); i < V; i += blockDim.x) consider(x[i], i);
  block_best(mx, arg);

  int32_t token = arg;
  if (row.temperature != 0.0f) {
    const int32_t keep = (row.top_k > 0 && row.top_k < V) ? row.top_k : V;
    uint64_t limit = kNoKey;  // candidates: key < limit
    if (keep < V) {
      // The element at rank keep (0-based) is the first one left out.
      limit = select_first(
          x, V, kNoKey, [](float) { return 1.0; }, static_cast<double>(keep) + 1.0, false, scratch);
    }
    const double temperature = row.temperature;
    auto prob = [mx, temperature](float v) { return exp(static_cast<double>(v - mx) / temperature); };
    auto mass_below = [&](uint64_t lim) {
      double m = 0.0;
      for (int32_t i = threadIdx.x; i < V; i += blockDim.x) {
        const float v = x[i];
        if (order_key(v, i) < lim) m += prob(v);
      }
      return block_sum_double(m);
    };
    double mass = mass_below(limit);
    if (row.top_p < 1.0f) {
      // Smallest prefix whose share of the kept mass reaches top_p.
      const uint64_t last = select_first(x, V, limit, prob, static_cast<double>(row.top_p) * mass, false, scratch);
      if (last != kNoKey) {
        limit = last + 1;
        mass = mass_below(limit);
      }
    }
    const uint64_t r = mix(mix(row.seed + 0x9e3779b97f4a7c15ull) ^ (row.counter * 0xd1b54a32d192ed03ull));
    const double u = static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0) * mass;
    uint64_t key = select_first(x, V, limit, prob, u, true, scratch);
    if (key == kNoKey) {
      // u at or past the total through rounding: the CPU takes the last candidate.
      uint64_t last = 0;
      for (int32_t i = threadIdx.x; i < V; i += blockDim.x) {
        const uint64_t k = order_key(x[i], i);
        if (k < limit) last = max(last, k);
      }
      key = block_max_u64(last);
    }
    token = static_cast<int32_t>(key & 0xffffffffu);
  }
  float logprob = 0.0f;
  if (row.want_logprob) {
    // The log-softmax normaliser of the raw logits (a pass of exp over the row: only when asked).
    double z = 0.0;
    for (int32_t i = threadIdx.x; i < V; i += blockDim.x) z += exp(static_cast<double>(x[i] - mx));
    z = block_sum_double(z);
    logprob = static_cast<float>(static_cast<double>(x[token]) - (static_cast<double>(mx) + log(z)));
  }
  if (threadIdx.x == 0) {
    p.out[blockIdx.x].token = token;
    p.out[blockIdx.x].logprob = logprob;
  }
}

__global__ void last_token_scatter_kernel(const last_token_scatter_params p) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= p.rows) return;
  const int32_t slot = p.slots[r];
  if (slot >= 0 && slot < p.n_slots) p.last[slot] = p.sampled[r].token;
}

__global__ void token_resolve_kernel(const token_resolve_params p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.n) return;
  const int32_t id = p.ids[i];
  const int64_t slot = -static_cast<int64_t>(id) - 1;
  if (id < 0 && slot < p.n_slots) p.ids[i] = p.last[slot];
}

template <class T>
void launch_argmax(const argmax_params& p, cudaStream_t stream) {
  launch_pdl(argmax_kernel<T>, dim3(static_cast<unsigned>(p.rows)), dim3(kArgmaxThreads), 0, stream, p);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

#define HYSERVE_INSTANTIATE(T) template void launch_argmax<T>(const argmax_params&, cudaStream_t);
HYSERVE_CUDA_FOR_EACH_TYPE(HYSERVE_INSTANTIATE)
#undef HYSERVE_INSTANTIATE

}  // namespace
}  // namespace cuda_detail

using namespace cuda_detail;

void run_cuda(const argmax_params& p, void* stream) {
  constexpr const char* op = "argmax";
  cpu_detail::check_argmax(p, op);
  if (p.rows > std::numeric_limits<int32_t>::max()) fail(op, "rows", p.rows, "exceeds the CUDA grid");
  launch_argmax<float>(p, as_stream(stream));
}

void run_cuda(const sample_rows_params& p, void* stream) {
  if (!cpu_detail::check_call(p)) return;
  launch_pdl(sample_kernel, dim3(static_cast<unsigned>(p.rows)), dim3(kSampleThreads), 0, as_stream(stream), p);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

void run_cuda(const last_token_scatter_params& p, void* stream) {
  if (!cpu_detail::check_call(p)) return;
  last_token_scatter_kernel<<<static_cast<unsigned>((p.rows + 127) / 128), 128, 0, as_stream(stream)>>>(p);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

void run_cuda(const token_resolve_params& p, void* stream) {
  if (!cpu_detail::check_call(p)) return;
  token_resolve_kernel<<<static_cast<unsigned>((p.n + 255) / 256), 256, 0, as_stream(stream)>>>(p);
  HYSERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace hyserve::kernels
