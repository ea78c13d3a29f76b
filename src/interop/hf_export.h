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
  bool merge_lora = false;                 // a LoRA checkpoint: its adapters folded into its base
};

struct HfExportResult {
  size_t tensors = 0;
  int files = 0;          // safetensors files written
  uint64_t bytes = 0;     // of tensor data
  std::string architecture;
};

// checkpoint: a checkpoint directory or a run directory (its latest). out_dir must not exist: it
// is written under a temporary name and renamed when complete. A LoRA checkpoint needs
// merge_lora: the model written is its base (read from where the checkpoint names it, and checked
// against the digest it recorded) with the adapters folded in.
HfExportResult export_hf(const std::string& checkpoint, const std::string& out_dir, const HfExportOptions& opt);

// A LoRA checkpoint's adapters as PEFT saves them, for PeftModel.from_pretrained on top of the
// base (exported with export_hf): adapter_config.json (r, lora_alpha, lora_dropout, the modules
// adapted, use_rslora, the base's path as base_model_name_or_path) and adapter_model.safetensors
// (base_model.model.<module path>.lora_A.weight (r, in) and lora_B.weight (out, r)), in dtype
// (fp32, bf16, fp16). Written as export_hf writes.
HfExportResult export_peft_adapter(const std::string& checkpoint, const std::string& out_dir, const std::string& dtype);

}  // namespace anvil
