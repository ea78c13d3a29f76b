// Hugging Face's transformers formats for anvil's families: which of transformers' architectures a
// model is (GPT2LMHeadModel, LlamaForCausalLM, MPT's MptForCausalLM), the config.json export
// writes (config/hf_model_config.h reads one), and the name map between anvil's flat parameter
// layout and transformers' state-dict tensors. The map is data (one row per transformers tensor: the anvil tensor, which of its rows, transposed or not),
// so export and import read the same rows in opposite directions.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/model_config.h"

namespace anvil {

// One transformers tensor: rows [row0, row0 + rows) of anvil's tensor `source` (all of its rows
// when rows is 0), stored as it is or transposed (GPT-2's Conv1D weights are input × output).
struct HfTensor {
  std::string name;                // transformers' key, e.g. "model.layers.3.self_attn.k_proj.weight"
  std::string source;              // anvil's tensor, e.g. "h.3.qkvw"
  std::vector<int64_t> shape;      // transformers' shape
  int64_t row0 = 0, rows = 0;
  bool transposed = false;
};

// transformers' tensors of the model, in the order transformers lists them. A model that none of
// transformers' architectures for its family can hold (an MPT with learned positions, a Llama
// with GELU) is an error naming the option.
std::vector<HfTensor> hf_tensors(const ModelConfig& cfg);

// Where block l's modules are in transformers' model: "transformer.h.3." (GPT-2),
// "model.layers.3." (Llama), "transformer.blocks.3." (MPT). A LoRA module's path is this followed
// by its name in the block (config/lora_config.h).
std::string hf_block_prefix(const ModelConfig& cfg, int l);

// config.json for the model: architectures, model_type and the family's own fields, with
// torch_dtype ("float32", "bfloat16", "float16") and the tokenizer's special token ids.
nlohmann::ordered_json hf_config(const ModelConfig& cfg, const std::string& torch_dtype, int bos_token_id,
                                 int eos_token_id);

}  // namespace anvil
