// The training config as field tables (config/schema.h), one per section: what load_train_config
// reads, what to_yaml writes back, and what docs/config.md's key tables say.
#pragma once
#include <string>
#include <vector>

#include "config/schema.h"
#include "config/train_config.h"

namespace anvil {

// What the top level's readers hand back besides the config: hf_causal_lm's transformers
// directory, when its weights are to be loaded ("" otherwise).
struct TopContext {
  std::string* pretrained_weights;
};

const std::vector<Field<TrainConfig, TopContext>>& train_config_fields();

// docs/config.md's key tables, by the name its markers give them: "main" (every key but the
// model families' own) and "finetuning" (a finetuning loader's dataset keys).
std::vector<std::string> key_doc_table_names();
std::string key_doc_table(const std::string& name);

}  // namespace anvil
