// Reading and writing the `model:` section of a config: model.name chooses the family, and the
// family's keys, under the family's own names, set the architecture options of ModelConfig.
#pragma once
#include <string>

#include "config/map_reader.h"
#include "config/model_config.h"

namespace YAML {
class Emitter;
}

namespace anvil {

// model.name, then that family's keys: GPT-2's few; LLM Foundry's mpt_causal_lm keys, its
// attn_config and ffn_config included; Llama's. A key of another family is an unknown key, and a
// value anvil cannot honour an error naming it. Sizes are checked later (train_config.cpp), once
// the top-level max_seq_len is known.
void read_model_section(MapReader& m, ModelConfig& out, const std::string& file);
// The section under the family's names, so that reading it back gives the same ModelConfig.
void write_model_section(YAML::Emitter& e, const ModelConfig& c);

}  // namespace anvil
