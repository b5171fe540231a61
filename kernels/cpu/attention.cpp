#include "hyserve/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "dtype_dispatch.h"
#include "dense_validate.h"
#include "validate.h"

namespace hyserve::kernels {

using namespace cpu_detail;

void run_cpu(const kv_write_params& p) {
  constexpr const char* op = "kv_write";
  check_kv_write(p, op);
  const int64_t row = p.kv_heads * p.head_dim;  // one token of the cache
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    if (p.locs[t] < -1) fail(op, "locs[" + std::to_string(t) + "]", p.locs[t], "must be a location >= 0 or -1");
  }
  if (p.rope.rotary_dim > 0) run_cpu(p.rope);  // q and k rotated in place first

  dispatch_storage(p.kv_dtype, op, "kv_dtype", [&](auto tag) {
    using T = typename host_storage<decltype(tag)::value>::type;
    T* k_cache = static_cast<T*>(p.k_cache);
    T* v_cache = static_cast<T*>(p.v_cache);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < p.n_tokens; ++t) {
      const int64_t loc = p.locs[t];
      if (loc < 0) continue;  // padding token
      const float* k = p.k + t * p.k_stride;
      const float* v = p.v + t * p.v_stride;
      T* kd = k_cache + loc * row;
      T* vd = v_cache + loc * row;
      if constexpr (std::is_same_v<T, float>) {
        std::memcpy(kd, k, sizeof(float) * static_cast<size_t>(row));
        std::memcpy(vd, v, sizeof(float) * static_cast<size_t>(row));
      } else {
        for (int64_t i = 0; i < row; ++i) {
          kd[i] = from_f32<T>(k[i]);
          vd[i] = from_f32<T>(v[i]);
        }
      }
    }
  });
}

namespace {

// The attention of run_cpu(paged_attention_params) over a cache of element type T (widened
// to f32 on read).
template <class T>
void attend(const paged_attention_params& p, const std::vector<int32_t>& token_row, int64_t first, int64_t n_tokens,
            int64_t max_len) {
  const int64_t D = p.head_dim;
  const int64_t kv_row = p.kv_heads * D;  // elements per cached token
  const int64_t group = p.q_heads / p.kv_heads;
  const T* k_cache = static_cast<const T*>(p.k_cache);
  const T* v_cache = static_cast<const T*>(p.v_cache);

#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(max_len));
    std::vector<float> acc(static_cast<size_t>(D));
#pragma omp for collapse(2) schedule(dynamic, 4)
    for (int64_t ti = 0; ti < n_tokens; ++ti) {
      for (int64_t h = 0; h < p.q_heads; ++h) {
        const int64_t t = first + ti;
        const int64_t b = token_row[ti];
        const int64_t q_len = p.query_start_loc[b + 1] - p.query_start_loc[b];
        const int64_t pos = p.seq_lens[b] - q_len + (t - p.query_start_loc[b]);  // attends keys 0..pos
        const int32_t* pages = p.page_table + b * p.page_table_stride;
        const int64_t kvh = h / group;
        const float* q = p.q + t * p.q_stride + h * D;
        auto cache_offset = [&](int64_t s) {
          return (static_cast<int64_t>(pages[s / p.page_size]) * p.page_size + s % p.page_size) * kv_row + kvh * D;
        };

        // Softmax in fp32 with the running max subtracted, then Σ p_s · v_s / Σ p_s.
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t s = 0; s <= pos; ++s) {
          const T* k = k_cache + cache_offset(s);
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t d = 0; d < D; ++d) dot += q[d] * to_f32(k[d]);
          scores[s] = dot * p.scale;
          m = std::max(m, scores[s]);
        }
        float denom = 0.0f;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t s = 0; s <= pos; ++s) {
          const float w = std::exp(scores[s] - m);
          denom += w;
          const T* v = v_cache + cache_offset(s);
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) acc[d] += w * to_f32(v[d]);
        }
        float* o = p.out + t * p.out_stride + h * D;
        const float inv = 1.0f / denom;
        for (int64_t d = 0; d < D; ++d) o[d] = acc[d] * inv;
      }
    }
  }
}

}  // namespace

void run_cpu(const paged_attention_params& p) {
  constexpr const char* op = "paged_attention";
  check_paged_attention(p, op);
  require_query_start_loc(p.query_start_loc, p.batch, op);
  int64_t max_len = 0;
  // Rows without queries (q_len 0, e.g. batch padding) read nothing; their pages are not checked.
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t q_len = p.query_start_loc[b + 1] - p.query_start_loc[b];
    if (q_len == 0) continue;
    const int64_t len = p.seq_lens[b];
    if (len < q_len) {
      fail(op, "seq_lens[" + std::to_string(b) + "]", len,
           ("must be >= the row's query count " + std::to_string(q_len)).c_str());
    }
    const int64_t n_pages = (len + p.page_size - 1) / p.page_size;
    if (n_pages > p.page_table_stride) {
      fail(op, "page_table_stride", p.page_table_stride,
           ("row " + std::to_string(b) + " needs " + std::to_string(n_pages) + " pages").c_str());
    }
    for (int64_t i = 0; i < n_pages; ++i) {
      const int32_t page = p.page_table[b * p.page_table_stride + i];
      if (page < 0) {
        fail(op, "page_table[" + std::to_string(b) + "][" + std::to_string(i) + "]", page, "must be a page >= 0");
      }
    }
    max_len = std::max(max_len, len);
  }

  const int64_t first = p.query_start_loc[0];
  const int64_t n_tokens = p.query_start_loc[p.batch] - first;
  if (n_tokens == 0) return;
  std::vector<int32_t> token_row(static_cast<size_t>(n_tokens));  // packed token → batch row
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t t = p.query_start_loc[b]; t < p.query_start_loc[b + 1]; ++t)
      token_row[t - first] = static_cast<int32_t>(b);
  }

  dispatch_storage(p.kv_dtype, op, "kv_dtype", [&](auto tag) {
    using T = typename host_storage<decltype(tag)::value>::type;
    attend<T>(p, token_row, first, n_tokens, max_len);
  });
}

}  // namespace hyserve::kernels
