// `anvil export`: a checkpoint as a directory that transformers' from_pretrained loads as it is:
// config.json, generation_config.json, the weights as model.safetensors (or shards with
// model.safetensors.index.json above a size limit, named as save_pretrained names them), and the
// tokenizer's files.
#pragma once
#include <cstdint>
#include <string>

namespace anvil {

struct HfExportOptions {
  std::string dtype = "fp32";              // fp32, bf16 or fp16: the stored tensors' type
  uint64_t max_shard_bytes = 5000000000;   // transformers' default max_shard_size, 5GB
  std::string tokenizer;                   // a tokenizer name; "": the checkpoint's tokenizer.name
};

struct HfExportResult {
  size_t tensors = 0;
  int files = 0;          // safetensors files written
  uint64_t bytes = 0;     // of tensor data
  std::string architecture;
};

// checkpoint: a checkpoint directory or a run directory (its latest). out_dir must not exist: it
// is written under a temporary name and renamed when complete.
HfExportResult export_hf(const std::string& checkpoint, const std::string& out_dir, const HfExportOptions& opt);

}  // namespace anvil
