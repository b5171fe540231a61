#pragma once
// Tree verify attention on the split-KV decode kernels (attention.cu): each draft node is a
// decode query over the row's prefix and its ancestors, in the order a decode step at that
// position reads them (attn_decode::tree_keys), so under determinism: batch_invariant a node's
// output is the bits of the decode step that would produce it. spec_decode.cu's run_cuda for
// paged_attention_tree_params takes this path where it applies and its warp-per-node kernel
// elsewhere.
#include <cuda_runtime.h>

#include "hyserve/kernels/attention.h"

namespace hyserve::kernels::cuda_detail {

// Whether the decode kernels serve this call: query heads per kv head from 1 to 8, a
// compiled head_dim, rows × nodes within the grid.
bool tree_on_decode_kernels(const paged_attention_tree_params& p);
// The call on the decode kernels (its checks done by the caller; `stream`-ordered scratch).
void launch_tree_on_decode_kernels(const paged_attention_tree_params& p, cudaStream_t stream);

}  // namespace hyserve::kernels::cuda_detail
