// Hugging Face's transformers formats for anvil's models, as each family describes them
// (config/families/): the tensor map between anvil's flat parameter layout and transformers'
// state dict, and the config.json export writes (config/hf_model_config.h reads one). The map is
// data (one row per transformers tensor: the anvil tensor, which of its rows, transposed or not),
// so export and import read the same rows in opposite directions.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/families/family.h"

namespace anvil {

// transformers' tensors of the model, in the order transformers lists them. A model that its
// family's transformers class cannot hold (an MPT with learned positions, a Llama with GELU) is
// an error naming the option.
std::vector<HfTensor> hf_tensors(const ModelConfig& cfg);

// Where block l's modules are in transformers' model: "transformer.h.3." (GPT-2),
// "model.layers.3." (Llama), "transformer.blocks.3." (MPT). A LoRA module's path is this followed
// by its name in the block (LoraModule::name).
std::string hf_block_prefix(const ModelConfig& cfg, int l);

// config.json for the model: architectures, model_type and the family's own fields, with
// torch_dtype ("float32", "bfloat16", "float16") and the tokenizer's special token ids.
nlohmann::ordered_json hf_config(const ModelConfig& cfg, const std::string& torch_dtype, int bos_token_id,
                                 int eos_token_id);

}  // namespace anvil
