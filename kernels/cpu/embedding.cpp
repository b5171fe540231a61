#include "hyserve/kernels/embedding.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "dtype_dispatch.h"
#include "dense_validate.h"
#include "validate.h"

namespace hyserve::kernels {

using namespace cpu_detail;

void run_cpu(const embedding_params& p) {
  constexpr const char* op = "embedding";
  check_embedding(p, op);
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    if (p.ids[t] < 0) fail(op, "ids[" + std::to_string(t) + "]", p.ids[t], "token ids must be >= 0");
  }

  // Ids owned by another vocab shard give zero rows; the tp all-reduce sums the shards.
  dispatch_storage(p.table_dtype, op, "table_dtype", [&](auto tag) {
    using T = typename host_storage<decltype(tag)::value>::type;
    const T* table = static_cast<const T*>(p.table);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < p.n_tokens; ++t) {
      const int64_t id = p.ids[t];
      float* dst = p.out + t * p.hidden;
      if (id >= p.vocab_start && id < p.vocab_end) {
        const T* src = table + (id - p.vocab_start) * p.hidden;
        if constexpr (std::is_same_v<T, float>) {
          std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(p.hidden));
        } else {
          for (int64_t i = 0; i < p.hidden; ++i) dst[i] = to_f32(src[i]);
        }
      } else {
        std::fill(dst, dst + p.hidden, 0.0f);
      }
    }
  });
}

}  // namespace hyserve::kernels
