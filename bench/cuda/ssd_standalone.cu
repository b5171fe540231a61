// Standalone check and timing of the SSM CUDA ops (chunk scan and decode update) against the
// CPU op, built from the SSM sources alone (add -DHYSERVE_SSD_ABLATION for the ablate mode):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fopenmp \
//     -I kernels/include -I common/include -I kernels bench/cuda/ssd_standalone.cu \
//     kernels/cuda/ssd_scan.cu kernels/cuda/ssm_update.cu kernels/cpu/ssm.cpp common/src/error.cpp
// Prints relative L2 errors (CUDA vs CPU, same bf16/f32 inputs) and medians of event-timed runs
// with bytes moved, GB/s and the ratio to a 1 GiB device-to-device copy. bf16-io scans run both
// paths (seq: one block per row walking its chunks; par / par1: one chunk-parallel kernel with
// the state hand-off chained, persistent blocks staging ahead / a block per item; parf: par with
// the kOptFloatW and kOptOneFence
// variants of ssd_scan_chained.cuh; par2 / par4: claims of 2 / 4 heads; pary / par4y: parf / par4
// with y stored through shared memory; par8y: par4y claiming 8 heads) in the same run.
// Arguments: check | time | (none: both) | ablate (built with -DHYSERVE_SSD_ABLATION: timings of
// the chained kernel's variant flags and of stages left out, see ssd_scan_chained.cuh).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/check.h"
#include "cuda/ssd_scan_paths.h"
#include "hyserve/common/dtype.h"
#include "hyserve/kernels/ssm.h"

namespace hyserve::kernels::cuda_detail {
int sm_count() {
  static int n = [] {
    int v = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0));
    return v;
  }();
  return n;
}
int max_shared_per_block_optin() {
  static int n = [] {
    int v = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    return v;
  }();
  return n;
}
// Launch helpers of the full library that the SSM sources may call: no programmatic dependent
// launch in this driver.
bool pdl_applies(cudaStream_t) { return false; }
void reserve_dynamic_shared(const void* kernel, size_t bytes) {
  static std::map<const void*, size_t> done;
  if (done[kernel] >= bytes) return;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  done[kernel] = bytes;
}
}  // namespace hyserve::kernels::cuda_detail

using namespace hyserve;
using namespace hyserve::kernels;

namespace {

int g_failures = 0;

struct dbuf {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit dbuf(size_t n) : bytes(n) { CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(n, 16))); }
  dbuf(const void* host, size_t n) : dbuf(n) { CUDA_CHECK(cudaMemcpy(ptr, host, n, cudaMemcpyHostToDevice)); }
  ~dbuf() { cudaFree(ptr); }
  dbuf(const dbuf&) = delete;
  dbuf& operator=(const dbuf&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(ptr); }
};

// Host tensor of one element type (f32 or bf16 bits), filled from floats.
struct htensor {
  dtype t;
  std::vector<uint8_t> raw;
  htensor(dtype t_, const std::vector<float>& v) : t(t_), raw(v.size() * dtype_size(t_)) {
    for (size_t i = 0; i < v.size(); ++i) set(i, v[i]);
  }
  size_t size() const { return raw.size() / dtype_size(t); }
  float get(size_t i) const {
    if (t == dtype::kF32) { float f; std::memcpy(&f, raw.data() + 4 * i, 4); return f; }
    uint16_t h; std::memcpy(&h, raw.data() + 2 * i, 2); return bf16_to_f32(h);
  }
  void set(size_t i, float f) {
    if (t == dtype::kF32) std::memcpy(raw.data() + 4 * i, &f, 4);
    else { const uint16_t h = f32_to_bf16(f); std::memcpy(raw.data() + 2 * i, &h, 2); }
  }
  void* data() { return raw.data(); }
};

std::vector<float> rnd(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

struct err_stat {
  double num = 0, den = 0, max_abs = 0;
  void add(double got, double want) {
    num += (got - want) * (got - want);
    den += want * want;
    if (!(std::fabs(got - want) <= max_abs)) max_abs = std::fabs(got - want);  // NaN sticks
  }
  double rel() const { return std::sqrt(num / std::max(den, 1e-30)); }
};

struct problem {
  int64_t T, H, P, N, G, slots;
  dtype io, st;
  std::vector<int32_t> qsl, idx;
  std::vector<uint8_t> init;
  htensor x, dt, bc, y, states;
  std::vector<float> dt_bias, A_log, D;
  int64_t x_stride, dt_stride, bc_stride, y_stride;
  problem(int64_t T_, int64_t H_, int64_t P_, int64_t N_, int64_t G_, int64_t slots_, dtype io_, dtype st_, uint32_t seed,
          bool pad_strides)
      : T(T_), H(H_), P(P_), N(N_), G(G_), slots(slots_), io(io_), st(st_),
        x(io_, rnd(static_cast<size_t>(T_ * (H_ * P_ + (pad_strides ? 3 : 0))), seed + 1)),
        dt(io_, rnd(static_cast<size_t>(T_ * (H_ + (pad_strides ? 1 : 0))), seed + 2, -3.0f, 0.5f)),
        bc(io_, rnd(static_cast<size_t>(T_ * (2 * G_ * N_ + (pad_strides ? 3 : 0))), seed + 3)),
        y(io_, std::vector<float>(static_cast<size_t>(T_ * (H_ * P_ + (pad_strides ? 3 : 0))), 768.0f)),
        states(st_, rnd(static_cast<size_t>((slots_ + 1) * H_ * P_ * N_), seed + 4, -0.5f, 0.5f)) {
    dt_bias = rnd(static_cast<size_t>(H), seed + 5, -0.5f, 0.5f);
    A_log = rnd(static_cast<size_t>(H), seed + 6, -1.0f, 1.5f);
    D = rnd(static_cast<size_t>(H), seed + 7);
    x_stride = y_stride = H * P + (pad_strides ? 3 : 0);
    dt_stride = H + (pad_strides ? 1 : 0);
    bc_stride = 2 * G * N + (pad_strides ? 3 : 0);
  }
  void fill(ssm_common_params& p, const void* xp, const void* dtp, const void* bcp, void* yp, void* sp, const float* bias,
            const float* alog, const float* d, const int32_t* ip) const {
    const size_t es = dtype_size(io);
    p.x = xp;
    p.dt = dtp;
    p.B = bcp;
    p.C = static_cast<const uint8_t*>(bcp) + G * N * es;
    p.y = yp;
    p.ssm_states = sp;
    p.dt_bias = bias;
    p.A_log = alog;
    p.D = d;
    p.state_indices = ip;
    p.batch = static_cast<int64_t>(idx.size());
    p.heads = H;
    p.head_dim = P;
    p.d_state = N;
    p.n_groups = G;
    p.x_stride = x_stride;
    p.dt_stride = dt_stride;
    p.bc_stride = bc_stride;
    p.y_stride = y_stride;
    p.io_dtype = io;
    p.state_dtype = st;
  }
};

const char* dn(dtype t) { return t == dtype::kF32 ? "f32" : "bf16"; }
const char* path_name(ssd_scan_path path) {
  return path == ssd_scan_path::sequential ? " seq"
         : path == ssd_scan_path::parallel ? " par"
         : path == ssd_scan_path::parallel_single ? " par1"
         : path == ssd_scan_path::parallel_fast   ? " parf"
         : path == ssd_scan_path::parallel_pair   ? " par2"
         : path == ssd_scan_path::parallel_quad   ? " par4"
         : path == ssd_scan_path::parallel_y      ? " pary"
         : path == ssd_scan_path::parallel_quad_y ? " par4y"
         : path == ssd_scan_path::parallel_oct_y  ? " par8y"
                                           : "";
}

// Scan: CUDA vs CPU on the same inputs; lens per row (-1: padding row of 3 tokens).
void check_scan(int64_t H, int64_t P, int64_t N, int64_t G, std::vector<int> lens, int init_mode, dtype io, dtype st,
                bool pad_strides, uint32_t seed, ssd_scan_path path = ssd_scan_path::automatic,
                int flags = -1) {
  std::vector<int32_t> qsl{0}, idx;
  std::vector<uint8_t> init;
  const int64_t B = static_cast<int64_t>(lens.size());
  for (int64_t b = 0; b < B; ++b) {
    qsl.push_back(qsl.back() + (lens[b] < 0 ? 3 : lens[b]));
    idx.push_back(lens[b] < 0 ? -1 : static_cast<int32_t>(2 * B - 2 * b));
    init.push_back(init_mode == 1 || (init_mode == 2 && b % 2 == 0));
  }
  problem pr(std::max<int64_t>(qsl.back(), 1), H, P, N, G, 2 * B + 1, io, st, seed, pad_strides);
  pr.qsl = qsl;
  pr.idx = idx;
  pr.init = init;
  dbuf dx(pr.x.data(), pr.x.raw.size()), ddt(pr.dt.data(), pr.dt.raw.size()), dbc(pr.bc.data(), pr.bc.raw.size()),
      dy(pr.y.data(), pr.y.raw.size()), ds(pr.states.data(), pr.states.raw.size());
  dbuf dbias(pr.dt_bias.data(), 4 * H), dalog(pr.A_log.data(), 4 * H), dd(pr.D.data(), 4 * H);
  dbuf didx(idx.data(), 4 * idx.size()), dqsl(qsl.data(), 4 * qsl.size()), dinit(init.data(), init.size());
  ssd_chunk_scan_params pc, pg;
  pr.fill(pc, pr.x.data(), pr.dt.data(), pr.bc.data(), pr.y.data(), pr.states.data(), pr.dt_bias.data(), pr.A_log.data(),
          pr.D.data(), idx.data());
  pc.query_start_loc = qsl.data();
  pc.has_initial_state = init_mode ? init.data() : nullptr;
  pc.chunk_size = 256;
  pr.fill(pg, dx.ptr, ddt.ptr, dbc.ptr, dy.ptr, ds.ptr, dbias.as<float>(), dalog.as<float>(), dd.as<float>(),
          didx.as<int32_t>());
  pg.query_start_loc = dqsl.as<int32_t>();
  pg.has_initial_state = init_mode ? dinit.as<uint8_t>() : nullptr;
  pg.chunk_size = 256;
#ifdef HYSERVE_SSD_ABLATION
  if (flags >= 0) run_cuda_ssd_chain_flags(pg, flags, nullptr);
  else run_cuda(pg, path, nullptr);
#else
  run_cuda(pg, path, nullptr);
#endif
  CUDA_CHECK(cudaDeviceSynchronize());
  run_cpu(pc);
  htensor gy = pr.y, gs = pr.states;
  CUDA_CHECK(cudaMemcpy(gy.data(), dy.ptr, gy.raw.size(), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(gs.data(), ds.ptr, gs.raw.size(), cudaMemcpyDeviceToHost));
  err_stat ey, es;
  bool untouched = true;
  for (size_t i = 0; i < gy.size(); ++i) {
    ey.add(gy.get(i), pr.y.get(i));
    if (pr.y.get(i) == 768.0f && gy.get(i) != 768.0f) untouched = false;
  }
  for (size_t i = 0; i < gs.size(); ++i) es.add(gs.get(i), pr.states.get(i));
  const double tol = io == dtype::kF32 && st == dtype::kF32 ? 1e-5 : 1e-2;
  const bool ok = ey.rel() <= tol && es.rel() <= tol && untouched;
  if (!ok) ++g_failures;
  std::string ls;
  for (int l : lens) ls += std::to_string(l) + ",";
  char fl[24] = "";
  if (flags >= 0) std::snprintf(fl, sizeof fl, " flags 0x%04x", flags);
  std::printf("%s scan%s%s H%ld P%ld N%ld G%ld lens[%s] init%d io=%s st=%s%s: y rel %.2e max %.2e | states rel %.2e max %.2e%s\n",
              ok ? "PASS" : "FAIL", flags >= 0 ? "" : path_name(path), fl, H, P, N, G, ls.c_str(), init_mode, dn(io), dn(st),
              pad_strides ? " padded" : "",
              ey.rel(), ey.max_abs, es.rel(), es.max_abs, untouched ? "" : " (sentinel overwritten)");
}

void check_update(int64_t H, int64_t P, int64_t N, int64_t G, int64_t B, dtype io, dtype st, uint32_t seed) {
  problem pr(B, H, P, N, G, B + 2, io, st, seed, false);
  for (int64_t b = 0; b < B; ++b) pr.idx.push_back(b == 1 ? -1 : static_cast<int32_t>(B + 1 - b));
  dbuf dx(pr.x.data(), pr.x.raw.size()), ddt(pr.dt.data(), pr.dt.raw.size()), dbc(pr.bc.data(), pr.bc.raw.size()),
      dy(pr.y.data(), pr.y.raw.size()), ds(pr.states.data(), pr.states.raw.size());
  dbuf dbias(pr.dt_bias.data(), 4 * H), dalog(pr.A_log.data(), 4 * H), dd(pr.D.data(), 4 * H);
  dbuf didx(pr.idx.data(), 4 * pr.idx.size());
  selective_state_update_params pc, pg;
  pr.fill(pc, pr.x.data(), pr.dt.data(), pr.bc.data(), pr.y.data(), pr.states.data(), pr.dt_bias.data(), pr.A_log.data(),
          pr.D.data(), pr.idx.data());
  pr.fill(pg, dx.ptr, ddt.ptr, dbc.ptr, dy.ptr, ds.ptr, dbias.as<float>(), dalog.as<float>(), dd.as<float>(),
          didx.as<int32_t>());
  run_cuda(pg, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  run_cpu(pc);
  htensor gy = pr.y, gs = pr.states;
  CUDA_CHECK(cudaMemcpy(gy.data(), dy.ptr, gy.raw.size(), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(gs.data(), ds.ptr, gs.raw.size(), cudaMemcpyDeviceToHost));
  err_stat ey, es;
  size_t state_diff = 0;
  for (size_t i = 0; i < gy.size(); ++i) ey.add(gy.get(i), pr.y.get(i));
  for (size_t i = 0; i < gs.size(); ++i) {
    es.add(gs.get(i), pr.states.get(i));
    if (gs.get(i) != pr.states.get(i)) ++state_diff;
  }
  const double tol = io == dtype::kF32 && st == dtype::kF32 ? 1e-5 : 1e-2;
  const bool ok = ey.rel() <= tol && es.rel() <= tol;
  if (!ok) ++g_failures;
  std::printf("%s update H%ld P%ld N%ld G%ld B%ld io=%s st=%s: y rel %.2e max %.2e | states rel %.2e max %.2e (%zu elems differ)\n",
              ok ? "PASS" : "FAIL", H, P, N, G, B, dn(io), dn(st), ey.rel(), ey.max_abs, es.rel(), es.max_abs, state_diff);
}

template <class F>
double median_ms(F&& f, int reps) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f(i);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> ts;
  for (int i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaEventRecord(a));
    f(i);
    CUDA_CHECK(cudaEventRecord(b));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

double g_copy_gbs = 0;

void time_copy() {
  const size_t bytes = size_t{1} << 30;
  dbuf a(bytes), b(bytes);
  CUDA_CHECK(cudaMemset(a.ptr, 1, bytes));
  const double ms = median_ms([&](int) { CUDA_CHECK(cudaMemcpyAsync(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice)); }, 20);
  g_copy_gbs = 2.0 * bytes / ms / 1e6;
  std::printf("copy 1 GiB d2d: %.3f ms, %.1f GB/s (read + write)\n", ms, g_copy_gbs);
}

void report(const char* what, double ms, double bytes) {
  const double gbs = bytes / ms / 1e6;
  std::printf("TIME %-52s %9.1f us  %8.1f MB  %7.1f GB/s  %5.1f%% copy\n", what, ms * 1e3, bytes / 1e6, gbs,
              100.0 * gbs / g_copy_gbs);
}

// flags >= 0 (built with -DHYSERVE_SSD_ABLATION): the persistent chained kernel with those
// variant / ablation flags (ssd_scan_chained.cuh) instead of `path`.
void time_scan(int64_t bs, int64_t len, dtype io, dtype st, ssd_scan_path path = ssd_scan_path::automatic,
               int flags = -1) {
  const int64_t H = 128, P = 64, N = 128, G = 8, T = bs * len;
  const size_t es = dtype_size(io), ss = dtype_size(st);
  std::vector<int32_t> qsl(static_cast<size_t>(bs + 1)), idx(static_cast<size_t>(bs));
  std::vector<uint8_t> init(static_cast<size_t>(bs), 1);
  for (int64_t b = 0; b <= bs; ++b) qsl[b] = static_cast<int32_t>(b * len);
  for (int64_t b = 0; b < bs; ++b) idx[b] = static_cast<int32_t>(b);
  htensor hx(io, rnd(static_cast<size_t>(T * H * P), 1)), hdt(io, rnd(static_cast<size_t>(T * H), 2, -3.0f, 0.0f)),
      hbc(io, rnd(static_cast<size_t>(T * 2 * G * N), 3)), hs(st, rnd(static_cast<size_t>(bs * H * P * N), 4, -0.5f, 0.5f));
  auto alog = rnd(H, 5), d = rnd(H, 6);
  dbuf dx(hx.data(), hx.raw.size()), ddt(hdt.data(), hdt.raw.size()), dbc(hbc.data(), hbc.raw.size()),
      dy(static_cast<size_t>(T * H * P) * es), ds(hs.data(), hs.raw.size()), dalog(alog.data(), 4 * H), dd(d.data(), 4 * H),
      didx(idx.data(), 4 * idx.size()), dqsl(qsl.data(), 4 * qsl.size()), dinit(init.data(), init.size());
  ssd_chunk_scan_params p;
  p.x = dx.ptr;
  p.dt = ddt.ptr;
  p.B = dbc.ptr;
  p.C = dbc.as<uint8_t>() + G * N * es;
  p.y = dy.ptr;
  p.ssm_states = ds.ptr;
  p.A_log = dalog.as<float>();
  p.D = dd.as<float>();
  p.state_indices = didx.as<int32_t>();
  p.query_start_loc = dqsl.as<int32_t>();
  p.has_initial_state = dinit.as<uint8_t>();
  p.batch = bs;
  p.heads = H;
  p.head_dim = P;
  p.d_state = N;
  p.n_groups = G;
  p.x_stride = p.y_stride = H * P;
  p.dt_stride = H;
  p.bc_stride = 2 * G * N;
  p.chunk_size = 256;
  p.io_dtype = io;
  p.state_dtype = st;
  const double ms = median_ms(
      [&](int) {
#ifdef HYSERVE_SSD_ABLATION
        if (flags >= 0) return run_cuda_ssd_chain_flags(p, flags, nullptr);
#endif
        run_cuda(p, path, nullptr);
      },
      15);
  const double bytes = es * static_cast<double>(T) * (2.0 * H * P + 2.0 * G * N + H) + 2.0 * ss * bs * H * P * N;
  char what[128];
  if (flags >= 0) {
    std::snprintf(what, sizeof what, "ssd_scan flags 0x%04x T%ld bs%ld io=%s st=%s", flags, T, bs, dn(io), dn(st));
  } else {
    std::snprintf(what, sizeof what, "ssd_scan%s T%ld bs%ld io=%s st=%s", path_name(path), T, bs, dn(io), dn(st));
  }
  report(what, ms, bytes);
}

void time_update(int64_t bs, dtype io, dtype st) {
  const int64_t H = 128, P = 64, N = 128, G = 8;
  const size_t es = dtype_size(io), ss = dtype_size(st);
  const size_t state_bytes = static_cast<size_t>(bs * H * P * N) * ss;
  const int sets = static_cast<int>(std::clamp<size_t>((size_t{400} << 20) / state_bytes, 1, 16));
  std::vector<std::unique_ptr<dbuf>> s;
  htensor hs(st, rnd(static_cast<size_t>(bs * H * P * N), 4, -0.5f, 0.5f));
  for (int i = 0; i < sets; ++i) s.push_back(std::make_unique<dbuf>(hs.data(), hs.raw.size()));
  htensor hx(io, rnd(static_cast<size_t>(bs * H * P), 1)), hdt(io, rnd(static_cast<size_t>(bs * H), 2, -3.0f, 0.0f)),
      hbc(io, rnd(static_cast<size_t>(bs * 2 * G * N), 3));
  auto alog = rnd(H, 5), d = rnd(H, 6);
  std::vector<int32_t> idx(static_cast<size_t>(bs));
  for (int64_t b = 0; b < bs; ++b) idx[b] = static_cast<int32_t>(b);
  dbuf dx(hx.data(), hx.raw.size()), ddt(hdt.data(), hdt.raw.size()), dbc(hbc.data(), hbc.raw.size()),
      dy(static_cast<size_t>(bs * H * P) * es), dalog(alog.data(), 4 * H), dd(d.data(), 4 * H), didx(idx.data(), 4 * idx.size());
  selective_state_update_params p;
  p.x = dx.ptr;
  p.dt = ddt.ptr;
  p.B = dbc.ptr;
  p.C = dbc.as<uint8_t>() + G * N * es;
  p.y = dy.ptr;
  p.A_log = dalog.as<float>();
  p.D = dd.as<float>();
  p.state_indices = didx.as<int32_t>();
  p.batch = bs;
  p.heads = H;
  p.head_dim = P;
  p.d_state = N;
  p.n_groups = G;
  p.x_stride = p.y_stride = H * P;
  p.dt_stride = H;
  p.bc_stride = 2 * G * N;
  p.io_dtype = io;
  p.state_dtype = st;
  const double ms = median_ms(
      [&](int i) {
        p.ssm_states = s[static_cast<size_t>(i % sets)]->ptr;
        run_cuda(p, nullptr);
      },
      50);
  const double bytes = 2.0 * ss * bs * H * P * N + es * (2.0 * bs * H * P + 2.0 * bs * G * N + bs * H);
  char what[128];
  std::snprintf(what, sizeof what, "ssm_update bs%ld io=%s st=%s", bs, dn(io), dn(st));
  report(what, ms, bytes);
}

}  // namespace

int main(int argc, char** argv) {
  const bool ablate = argc >= 2 && std::strcmp(argv[1], "ablate") == 0;
  const bool check = !ablate && (argc < 2 || std::strcmp(argv[1], "time") != 0);
  const bool timing = !ablate && (argc < 2 || std::strcmp(argv[1], "check") != 0);
  try {
    const dtype F = dtype::kF32, Bf = dtype::kBF16;
    const ssd_scan_path Seq = ssd_scan_path::sequential, Par = ssd_scan_path::parallel,
                        Par1 = ssd_scan_path::parallel_single, ParF = ssd_scan_path::parallel_fast,
                        Par2 = ssd_scan_path::parallel_pair, Par4 = ssd_scan_path::parallel_quad,
                        ParY = ssd_scan_path::parallel_y, Par4Y = ssd_scan_path::parallel_quad_y,
                        Par8Y = ssd_scan_path::parallel_oct_y;
    if (check) {
      for (dtype io : {F, Bf}) {
        for (dtype st : {F, Bf}) {
          // tensor-core path (P64 N128), lengths around the kernels' chunks (64, 256); bf16 io: both paths
          for (ssd_scan_path path : {Seq, Par, Par1, ParF, Par2, Par4, ParY, Par4Y, Par8Y}) {
            if (io == F && path != Seq) continue;  // f32 io has one tensor-core path
            if (io == F) path = ssd_scan_path::automatic;
            check_scan(8, 64, 128, 2, {1, 63, 64, 65, -1, 200, 256, 257, 0, 700}, 2, io, st, false, 11, path);
            check_scan(8, 64, 128, 2, {129, 5, 330}, 1, io, st, true, 12, path);
            check_scan(8, 64, 128, 2, {300, 77}, 0, io, st, false, 13, path);
            if (io == Bf) {
              check_scan(8, 64, 128, 2, {1, 63, 64, 65, 127, 128, 129, 255, 256, 257, 700, 4096, 0, -1}, 2, io, st,
                         false, 20, path);
              check_scan(4, 64, 128, 1, {4096}, 1, io, st, true, 21, path);
            }
          }
          // fallback kernel shapes
          check_scan(4, 8, 16, 2, {37, 16, 1, -1}, 2, io, st, false, 14);
          check_scan(4, 32, 64, 1, {100, 3}, 1, io, st, true, 15);
          for (int64_t n : {16, 64, 128, 256}) check_update(8, 64, n, 2, 5, io, st, 16);
          check_update(4, 8, 32, 4, 3, io, st, 17);
        }
      }
      for (ssd_scan_path path : {Seq, Par, Par1, ParF, Par2, Par4, ParY, Par4Y, Par8Y}) {
        check_scan(128, 64, 128, 8, {1000, 530}, 2, Bf, F, false, 18, path);  // production head shape
        check_scan(128, 64, 128, 8, {1000, 530}, 2, Bf, Bf, false, 19, path);
        check_scan(128, 64, 128, 8, {2048, 700, 0, 129, -1}, 1, Bf, F, false, 22, path);
      }
      // More chunks than the parallel_single path reserves by default: the general kernel
      // takes the batch there (the parallel path takes it itself).
      check_scan(2, 64, 128, 1, {17000}, 1, Bf, F, false, 23, Par);
      check_scan(2, 64, 128, 1, {17000}, 1, Bf, F, false, 23, Par1);
      check_scan(2, 64, 128, 1, {17000}, 1, Bf, F, false, 23, ParF);
      check_scan(2, 64, 128, 1, {17000}, 1, Bf, F, false, 23, Par4);  // 2 heads per group: pairs
      check_scan(2, 64, 128, 1, {17000}, 1, Bf, F, false, 23, ParY);
      check_scan(2, 64, 128, 1, {17000}, 1, Bf, F, false, 23, Par4Y);
      check_scan(2, 64, 128, 1, {17000}, 1, Bf, F, false, 23, Par8Y);
#ifdef HYSERVE_SSD_ABLATION
      // The variant flags that no path takes (correct results; the kAbl* flags are not).
      for (int flags : {0x5b, 0x73, 0x9b, 0xb3, 0x401b, 0x4033}) {
        check_scan(128, 64, 128, 8, {1000, 530}, 2, Bf, F, false, 18, Par, flags);
        check_scan(128, 64, 128, 8, {2048, 700, 0, 129, -1}, 1, Bf, F, false, 22, Par, flags);
        check_scan(8, 64, 128, 2, {1, 63, 64, 65, -1, 200, 256, 257, 0, 700}, 2, Bf, Bf, false, 11, Par, flags);
      }
#endif
      std::printf("checks: %d failures\n", g_failures);
    }
    if (ablate) {
#ifdef HYSERVE_SSD_ABLATION
      // Variant flags (1 f32 weights, 2 one fence, 4 / 8 claims of 2 / 4 heads, 0x10 y through
      // shared memory, 0x20 claims of 8 heads, 0x40 L2 prefetch of a new claim's B and C, 0x80
      // C·S_in early in warps 0-3, 0x4000 one intra-chunk block at a time) and stages left out
      // (0x100 chain, 0x200 intra-chunk products, 0x400 C·S_in, 0x800 S_loc, 0x1000 loads, 0x2000
      // y stores) of the persistent chained kernel; the paths for reference. 0x11b, 0x41b, 0x101b,
      // 0x201b: stages left out of 0x1b (0x2000 there leaves out only the global y stores).
      time_copy();
      for (ssd_scan_path path : {Seq, Par, ParF, Par2, Par4, ParY, Par4Y, Par8Y}) time_scan(1, 16384, Bf, F, path);
      for (int flags : {0, 1, 2, 3, 7, 11, 0x13, 0x17, 0x1b, 0x33, 0x5b, 0x73, 0x9b, 0xb3, 0x401b, 0x4033, 0x10b,
                        0x103, 0x203, 0x403, 0x803, 0x1003, 0x2003, 0x3103, 0x11b, 0x41b, 0x101b, 0x201b}) {
        time_scan(1, 16384, Bf, F, Par, flags);
      }
      for (int flags : {0, 3, 7, 11, 0x13, 0x1b, 0x33, 0x5b, 0x9b, 0x103, 0x203, 0x403}) {
        time_scan(64, 256, Bf, F, Par, flags);
      }
#else
      std::printf("ablate: build with -DHYSERVE_SSD_ABLATION\n");
#endif
    }
    if (timing) {
      time_copy();
      for (dtype st : {F, Bf}) {
        for (ssd_scan_path path : {Seq, Par, Par1, ParF, Par2, Par4, ParY, Par4Y, Par8Y}) time_scan(1, 16384, Bf, st, path);
      }
      for (dtype st : {F, Bf}) time_scan(1, 16384, F, st);
      for (ssd_scan_path path : {Seq, Par, Par1, ParF, Par2, Par4, ParY, Par4Y, Par8Y}) {
        time_scan(16, 1024, Bf, F, path);
        time_scan(64, 256, Bf, F, path);
        time_scan(256, 64, Bf, F, path);
      }
      for (dtype io : {F, Bf}) {
        for (dtype st : {F, Bf}) {
          for (int64_t bs : {1, 16, 64, 256}) time_update(bs, io, st);
        }
      }
    }
  } catch (const std::exception& e) {
    std::printf("ERROR: %s\n", e.what());
    return 2;
  }
  return g_failures == 0 ? 0 : 1;
}
