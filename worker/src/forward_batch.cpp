#include "hyserve/worker/forward_batch.h"

namespace hyserve::worker {

int64_t forward_batch::num_tokens() const {
  int64_t n = 0;
  for (const batch_row& r : rows) n += static_cast<int64_t>(r.tokens.size());
  return n;
}

}  // namespace hyserve::worker
