// Hugging Face transformers model configs as anvil models: a config.json read into a ModelConfig,
// and LLM Foundry's `model.name: hf_causal_lm` section, which names one (a local transformers
// directory, or a bare published architecture name such as gpt2) with its config_overrides.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/map_reader.h"
#include "config/model_config.h"

namespace anvil {

// The model of a transformers config.json (its model_type's family reads it: config/families/),
// read through anvil's config reader so that it equals what the same model section of a config
// gives. A field anvil cannot honour (rope_scaling, a sliding window in a Llama, biases on only
// some Llama products, an MPT with qk_ln) is an error naming the field; `where` names the file.
ModelConfig hf_model_config(const nlohmann::json& config, const std::string& where);

// LLM Foundry's hf_causal_lm model section: the model is pretrained_model_name_or_path's config
// with config_overrides applied (a key the config does not have is an error, as in Foundry), and
// with `pretrained: true` (Foundry's default) its weights are that directory's. A bare published
// name (gpt2, gpt2-medium, gpt2-large, gpt2-xl) gives its published architecture; its weights
// would come from the hub, which anvil does not reach, so it needs `pretrained: false`.
struct HfCausalLm {
  ModelConfig model;
  std::string weights_dir;  // the transformers directory to load weights from; "" for none
  std::vector<std::string> notes;  // what the run log should say of the section
};
HfCausalLm read_hf_causal_lm(MapReader& m, const std::string& file);

}  // namespace anvil
