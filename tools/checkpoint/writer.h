#pragma once
// Writes the synthetic model of a configuration (`model.synthetic`) as a Hugging Face checkpoint
// directory: config.json (the fields read_hf_config reads) and model.safetensors, or shards
// model-0000k-of-0000n.safetensors with model.safetensors.index.json past max_shard_bytes.
// Tensors are streamed block by block: memory stays at one block whatever the model's size.
// Loading the directory (`model: {path: DIR}`) gives the same model as the synthetic section:
// linear weights, embedding and lm_head are stored in `type`, the tensors the model keeps in f32
// (norms, conv, A_log, D, dt_bias) in f32, so the loaded weights are bit-identical.
#include <cstdint>
#include <string>
#include <vector>

#include "hyserve/common/config.h"
#include "hyserve/common/dtype.h"
#include "hyserve/common/model_config.h"
#include "hyserve/common/tensor.h"

namespace hyserve::tools {

struct checkpoint_tensor {
  std::string name;
  shape_t shape;
  bool in_weight_dtype = false;  // stored in the model's weight dtype (else f32)
};

// Every tensor of a Bamba model of configuration mc, in checkpoint order (config_error for other
// architectures).
std::vector<checkpoint_tensor> bamba_checkpoint_tensors(const model_config& mc);

// The config.json of a Bamba model (BambaForCausalLM).
std::string bamba_hf_config_json(const model_config& mc);

struct checkpoint_write_options {
  dtype type = dtype::kBF16;                        // of the linear weights: f32 or bf16
  uint64_t max_shard_bytes = 5000000000;  // one file up to this size (5 GB), else shards
  bool progress = false;                            // a line on stderr every two seconds
};

struct checkpoint_write_result {
  int files = 0;
  int64_t tensors = 0;
  uint64_t bytes = 0;  // tensor data written
};

// Writes synthetic model `syn` into out_dir (created when missing; existing files of the same
// names are replaced). Errors name the file.
checkpoint_write_result write_synthetic_checkpoint(const synthetic_model_config& syn, const std::string& out_dir,
                                                   const checkpoint_write_options& opts = {});

}  // namespace hyserve::tools
