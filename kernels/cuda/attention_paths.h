#pragma once
// Path choice of the paged decode attention over a bf16 KV cache (attention.cu). Not
// thread-safe: set it before the calls it is meant for.
// CUDA-free: reachable as "cuda/attention_paths.h" by whoever links the kernels.
namespace hyserve::kernels {

// Which kernel serves decode and verify queries over a bf16 cache (head_dim 64 or 128, G = 1, 2,
// 4 or 8 query heads per kv head): CUDA-core FMAs on widened elements (kSimt,
// attention_decode.cuh) or tensor-core MMAs (kMma, attention_decode_mma.cuh: scores and P·V as
// bf16 products with q and p split exactly enough into two bf16 terms each that results stay at
// f32 accuracy). An f32 cache and other shapes always take kSimt. The two differ in summation
// order only; decode and verify queries of one process use the same path.
// kDefault: the op's kernels.attn_decode (exec_context::paths: simt or mma), else
// kAttnDecodeDefaultPath.
enum class attn_decode_path { kDefault = 0, kSimt = 1, kMma = 2 };
inline constexpr attn_decode_path kAttnDecodeDefaultPath = attn_decode_path::kMma;
void set_attn_decode_path(attn_decode_path path);
bool attn_decode_uses_mma();  // the path in effect for a bf16 cache

}  // namespace hyserve::kernels
